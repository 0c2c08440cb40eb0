"""The broad model suite, modeled on PyTorch's dashboard suites: transformers (`huggingface.py`),
timm and torchvision (`vision.py`) models as harness workloads (`catalog.py`), run through eager,
torch.compile and both wrapgen entry points (`run.py`, `python -m benchmarks.suite`), written as one
page per run (`page.py`)."""
