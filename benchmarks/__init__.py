"""wrapgen's benchmark harness: eager PyTorch, torch.compile (Inductor) and every wrapgen target,
measured side by side on a fixed set of workloads.

    python -m benchmarks.run --device cpu|cuda [--workloads a,b] [--repeats N] [--quick]
    make bench

Modules, one job each:
    workloads   the models and their input sizes per device
    contenders  how each contender is built (eager, torch.compile, wrapgen targets), with fresh caches
    measure     timing, peak memory, copy bandwidth, the correctness check
    machine     date, machine, versions: what a result file is named after
    report      the markdown table, the PNG chart and a JSON dump of the raw numbers
    run         the command line and the loop over workloads x contenders
"""
