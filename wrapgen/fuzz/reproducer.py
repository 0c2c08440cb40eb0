"""A failing program as a runnable file: the program, its inputs, the variant that failed, and a
check against eager. It needs only torch and wrapgen, and raises while the failure is there."""

from __future__ import annotations

from pathlib import Path

from wrapgen.fuzz.generator import FuzzProgram
from wrapgen.fuzz.runner import TOLERANCES, Outcome

TEMPLATE = '''"""wrapgen fuzz reproducer: {name}, {label}, {shape}.

Found ({kind}): {message}

`python {file}` raises while the failure is there and prints "no mismatch" once it is fixed.
"""

import torch

import wrapgen

F = torch.nn.functional
INPUTS = {inputs!r}  # (dims, dtype, layout) per argument; a dim is a size name or 1
SIZES = {sizes!r}  # compiled for the first; a dynamic program is called at both
TARGET, MEMORY_PLANNING, SANITIZE, KERNELS, DYNAMIC = {target!r}, {planning!r}, {sanitize!r}, {kernels!r}, {dynamic!r}
RTOL = {rtol!r}  # atol: RTOL times each expected result's largest magnitude (at least 1)


{source}

def make_inputs(sizes, data_seed):
    g = torch.Generator().manual_seed(data_seed)
    out = []
    for dims, dtype, layout in INPUTS:
        shape = [sizes[d] if isinstance(d, str) else d for d in dims]
        full = list(shape)
        if layout == "transposed":
            full[-2:] = full[-2:][::-1]
        elif layout == "strided":
            full[-1] *= 2
        elif layout == "offset":
            full[0] += 1
        if dtype == "int64":
            t = torch.randint(-4, 5, full, generator=g)
        else:
            t = torch.randn(full, generator=g).to(getattr(torch, dtype))
        if layout == "transposed":
            t = t.mT
        elif layout == "strided":
            t = t[..., ::2]
        elif layout == "offset":
            t = t[1:]
        out.append(t)
    return out


def check(actual, expected):
    assert len(actual) == len(expected), (len(actual), len(expected))
    for a, e in zip(actual, expected):
        scale = max(1.0, float(e.abs().max())) if e.is_floating_point() and e.numel() else 1.0
        torch.testing.assert_close(a, e, rtol=RTOL, atol=RTOL * scale, equal_nan=True)


def main():
    with wrapgen.config.patch(memory_planning=MEMORY_PLANNING, sanitize=SANITIZE, kernels=KERNELS):
        compiled = wrapgen.compile(program, make_inputs(dict(SIZES[0]), 0), target=TARGET, dynamic=DYNAMIC)
    for sizes in SIZES[: 2 if DYNAMIC else 1]:
        args = make_inputs(dict(sizes), 1)
        eager_args, compiled_args = [a.clone() for a in args], [a.clone() for a in args]
        with torch.no_grad():
            expected = program(*eager_args)
            actual = compiled(*compiled_args)
        check(list(actual) + compiled_args, list(expected) + eager_args)  # results, then inputs as updated
    print("no mismatch")


if __name__ == "__main__":
    main()
'''


def reproducer_source(program: FuzzProgram, outcome: Outcome, file: str) -> str:
    variant = outcome.variant
    message = " ".join(outcome.message.split()).replace("\\", "/").replace('"' * 3, "'" * 3)
    target = "python" if variant.target == "lower" else variant.target  # lowering fails for every target
    return TEMPLATE.format(
        name=program.name, label=variant.label, shape="dynamic" if program.dynamic else "static",
        kind=outcome.kind, message=message[:400] + (" ..." if len(message) > 400 else ""), file=file,
        inputs=[(spec.dims, spec.dtype, spec.layout) for spec in program.inputs], sizes=program.sizes,
        target=target, planning=variant.memory_planning, sanitize=variant.sanitize, kernels=variant.kernels,
        dynamic=program.dynamic, rtol=TOLERANCES[program.precision()], source=program.source(),
    )


def write_reproducer(program: FuzzProgram, outcome: Outcome, directory: Path) -> Path:
    """Write the reproducer under `directory` (created if needed); returns its path."""
    directory.mkdir(parents=True, exist_ok=True)
    variant = outcome.variant
    stem = f"{program.name}_{variant.target}_{variant.memory_planning}{'' if variant.kernels else '_library_calls'}"
    path = directory / f"{stem}.py"
    path.write_text(reproducer_source(program, outcome, str(path)))
    return path
