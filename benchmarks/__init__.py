"""wrapgen's benchmark harness: eager PyTorch, torch.compile (Inductor) and every wrapgen target,
measured side by side on a fixed set of micro workloads, and on real models.

    python -m benchmarks.run --device cpu|cuda [--workloads a,b] [--repeats N] [--quick]
    python -m benchmarks.run --models all|gpt2,llama,bert,resnet50,vit_b16 [--dtype bf16]
    python -m benchmarks.model_lowering [--models ...]     generated kernels vs library calls
    make bench

Results go to benchmarks/results/ as `<suite>-<device>-<YYYY-MM-DD>-<machine>-<commit>.{md,png,json}`
(`machine.file_stem`); benchmarks/results/README.md indexes the current page of each suite.

Modules, one job each:
    workloads       the micro workloads and their input sizes per device
    models          the real models (GPT-2, Llama-style GQA, BERT, ResNet-50, ViT-B/16) from configs
    training        a training step (forward + backward, gradients returned) as a workload
    contenders      how each contender is built (eager, torch.compile, wrapgen targets), with fresh caches
    measure         timing, peak memory, copy bandwidth, the correctness check
    harness         the loop over workloads x contenders in rounds: build, check, time, measure
    machine         date, machine, versions, commit: what a result file is named after
    report          the markdown table, the PNG chart and a JSON dump of the raw numbers
    model_suite     the models as workloads, their contenders, tolerances and result files
    model_report    the markdown page of a model run
    model_lowering  per model: generated kernels, launches and ExternKernel lines by op
    graphs_latency  batch-1 decoders: reduce-overhead vs wrapgen with CUDA graphs, interleaved
    interleaved     the real models' warm calls, every contender kept and timed in rotating rounds
    optimizer       torch.compile(opt.step) (Adam/AdamW/SGD) vs eager foreach and fused, state checked
    decode          greedy decode of a Llama-style LM with a StaticCache: ms/token, tokens checked
    step_rounds     what optimizer, decode and distributed share: rotating rounds with per-contender failures, files
    suite/          the broad model suite (transformers, timm, torchvision lists; both wrapgen entry points)
    distributed     sharded models on several ranks under torchrun (tensor parallelism, FSDP2): per-step time,
                    exposed communication, peak per rank (distributed_models: the models; distributed_report: the page)
    run             the command line
"""
