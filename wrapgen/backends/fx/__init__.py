"""The "fx" target: a runnable `torch.fx.GraphModule`, its expression nodes and run-time ops."""

from wrapgen.backends.fx.emitter import FxEmitter

__all__ = ["FxEmitter"]
