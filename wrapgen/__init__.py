"""wrapgen: a compiler for PyTorch programs built around a typed Wrapper IR.

    fn = wrapgen.compile(model, example_inputs, target=None, dynamic=False)
    prog = wrapgen.lower(model, example_inputs)      # str(prog) is the IR text
    torch.compile(model, backend="wrapgen", options={"target": "python"})
"""

from wrapgen import backends, config, wrapper_ir
from wrapgen.aot import aot_compile, load_package
from wrapgen.api import build, compile, lower
from wrapgen.compiled import CompiledFunction
from wrapgen.errors import LoweringError, UnsupportedLineError, WrapgenError
from wrapgen.packaging import PackageDamagedError, PackageError

__all__ = [
    "CompiledFunction",
    "LoweringError",
    "PackageDamagedError",
    "PackageError",
    "UnsupportedLineError",
    "WrapgenError",
    "aot_compile",
    "backends",
    "build",
    "compile",
    "config",
    "load_package",
    "lower",
    "wrapper_ir",
]
__version__ = "0.1.0"
