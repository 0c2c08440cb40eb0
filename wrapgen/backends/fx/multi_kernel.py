"""The FX target's MultiKernelCall: one node calling `multi_kernel_call`, which looks up the
cached choice for the key (timing the candidates on a new key, `kernels/choice.py`) and
launches the chosen candidate the way the graph launches any Triton kernel, through torch's
`triton_kernel_wrapper_mutation` with the kernels registered in torch's kernel side table.

The candidates' launch facts (side-table indices, parameter names) live in a registry in
`fx/runtime.py` (with `multi_kernel_call`), keyed by a token the node carries; the node's arguments are the key, each
candidate's arguments, the distinct grids and the buffers the choice writes."""

from __future__ import annotations

from wrapgen.backends.fx.runtime import MULTI_KERNEL_CHOICES, MULTI_KERNEL_TOKENS, multi_kernel_call
from wrapgen.kernels.choice import KernelChoice
from wrapgen.wrapper_ir.multi_kernel import MultiKernelCall


class FxMultiKernelMixin:
    """Mixed into FxEmitter (uses its kernels, kernel_state, value, lookup, node and refuse)."""

    def emit_multi_kernel_call(self, line: MultiKernelCall) -> None:
        choices = self.__dict__.setdefault("fx_choices", {})
        choice = choices.setdefault(line.choice, KernelChoice(line.choice))
        grids = line.grids()
        candidates = []
        for call in line.candidates:
            definition = self.kernels.get(call.kernel)  # type: ignore[attr-defined]
            if definition is None or definition.language != "triton":
                self.refuse(f"candidate {call.kernel} is not a Triton kernel defined earlier")  # type: ignore[attr-defined]
            kernel_idx, constants_idx, names = self.kernel_state[call.kernel]  # type: ignore[attr-defined]
            if len(names) != len(call.args):
                self.refuse(f"{len(call.args)} arguments but {call.kernel} names {len(names)} parameters")  # type: ignore[attr-defined]
            candidates.append((kernel_idx, constants_idx, tuple(names), grids.index(tuple(call.grid))))
        token = next(MULTI_KERNEL_TOKENS)
        MULTI_KERNEL_CHOICES[token] = (choice, tuple(candidates), line.bucketed, line.serves)
        args = tuple(tuple(self.value(a) for a in call.args) for call in line.candidates)  # type: ignore[attr-defined]
        grid_values = tuple(tuple(self.value(g) for g in grid) for grid in grids)  # type: ignore[attr-defined]
        key = tuple(self.value(k) for k in line.key)  # type: ignore[attr-defined]
        writes = tuple(self.lookup(w) for w in line.writes)  # type: ignore[attr-defined]
        self.node(multi_kernel_call, (token, key, args, grid_values, writes), name=line.choice)  # type: ignore[attr-defined]
