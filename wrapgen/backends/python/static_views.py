"""Views of static inputs kept between calls: a mixin of `PythonEmitter`.

Under torch.compile the parameters are inputs of the program (`TensorInput.static`), and each
linear layer's transposed weight is a `Reinterpret` of one: made anew on every call, about a
microsecond of host time each (72 of them in a ViT-B forward), where `wrapgen.compile` makes the
same views of its constants once, at load. Here the view is made on the first call and kept in
module state beside the address of the storage it was made from; each later call compares one
`data_ptr()` per input and reuses the views, or makes them again when the caller handed other
storage (a parameter replaced, `.data` assigned). Sizes, strides, dtype and device are the
input check's: they cannot differ from the first call's.

Only inputs the program never writes qualify, through views made at the top level of `call`
(not in a CUDA-graph region, not under a multi-kernel choice) from the input or from such a view,
with static sizes, and never returned (a caller would get the same tensor object each call).
"""

from __future__ import annotations

from collections.abc import Callable

from wrapgen.wrapper_ir.lines import Output, Reinterpret
from wrapgen.wrapper_ir.passes.graph_partition import written_inputs
from wrapgen.wrapper_ir.program import Program
from wrapgen.wrapper_ir.values import TensorRef


class PythonStaticViews:
    """`emit_reinterpret`'s cached form, for an emitter with PythonEmitter's state."""

    def begin_static_views(self, program: Program) -> None:
        returned = {v.name for line in program.lines if isinstance(line, Output) for v in line.values
                    if isinstance(v, TensorRef)}
        self._static_roots: set[str] = set(program.static_input_names()) - written_inputs(program)
        self._static_returned = returned
        self._view_root: dict[str, str] = {}  # a kept view -> the static input it derives from
        self._refreshes: dict[str, list[str]] = {}  # static input -> its refresh function's body

    def kept_view(self, line: Reinterpret, view: Callable[[str], str]) -> bool:
        """Emit `line` as a kept view and return True, or return False (emitted as usual).
        `view(source)` is the expression of the view taken of `source`."""
        if not self._static_roots or line.name in self._static_returned or line.symbols_used():
            return False
        if self.depth != 1 or getattr(self, "_open_region", None) is not None or self.sanitizer is not None:  # type: ignore[attr-defined]
            return False
        root = line.source if line.source in self._static_roots else self._view_root.get(line.source)
        if root is None:
            return False
        body = self._refreshes.get(root)
        if body is None:  # the input's first kept view: check its address once per call here
            body = self._refreshes[root] = []
            self.writeline(f"if {root}.data_ptr() != _kept_address_{root}:")  # type: ignore[attr-defined]
            with self.indent():  # type: ignore[attr-defined]
                self.writeline(f"_keep_views_of_{root}({root})")  # type: ignore[attr-defined]
        source = "source" if line.source == root else f"_kept_{line.source}"
        body.append(f"_kept_{line.name} = {view(source)}")
        self._view_root[line.name] = root
        self.writeline(f"{line.name} = _kept_{line.name}")  # type: ignore[attr-defined]
        return True

    def static_views_source(self) -> list[str]:
        """Module-level state and one function per static input that (re)makes its kept views."""
        lines: list[str] = []
        for root, body in self._refreshes.items():
            kept = [text.split(" = ", 1)[0] for text in body]
            lines += [f"_kept_address_{root} = None", *(f"{name} = None" for name in kept), "", ""]
            lines += [f"def _keep_views_of_{root}(source):",
                      f"    global _kept_address_{root}, {', '.join(kept)}",
                      *(f"    {text}" for text in body),
                      f"    _kept_address_{root} = source.data_ptr()", "", ""]
        return lines
