"""The interpret target's MultiKernelCall: the same per-key timing and caching as the Python
target (`kernels/choice.py`), the choices kept with the program's built kernels so that they
last across calls; the chosen candidate then runs like any KernelCall."""

from __future__ import annotations

from wrapgen.kernels.choice import KernelChoice, bucket
from wrapgen.wrapper_ir.multi_kernel import MultiKernelCall


class InterpretMultiKernelMixin:
    """Mixed into InterpretEmitter (uses its kernels, value, ints and env)."""

    def emit_multi_kernel_call(self, line: MultiKernelCall) -> None:
        kernels = self.kernels  # type: ignore[attr-defined]
        choices: dict[str, KernelChoice] = kernels.__dict__.setdefault("choices", {})
        choice = choices.setdefault(line.choice, KernelChoice(line.choice))
        key = tuple(self.ints(line.key))  # type: ignore[attr-defined]
        if line.bucketed:
            key = tuple(bucket(k) for k in key)

        def launch(index: int) -> None:
            call = line.candidates[index]
            kernels.launch(call.kernel, [self.value(a) for a in call.args], self.ints(call.grid))  # type: ignore[attr-defined]

        chosen = choice.chosen.get(key)
        if chosen is None:
            writes = [self.env[name] for name in line.writes]  # type: ignore[attr-defined]
            chosen = choice.choose(key, [lambda i=i: launch(i) for i in range(len(line.candidates))], writes, line.serves)
        launch(chosen)
