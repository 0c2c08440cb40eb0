"""The sanitizer (config.sanitize) names the line and the buffer of each kind of fault injected
into a program: a reuse of live storage, an undeclared write, a view past its storage, a stale read
after free, an undeclared alias and a symbol outside its range; on the interpret and python targets."""

from __future__ import annotations

import dataclasses

import pytest
import sympy
import torch

import wrapgen
from wrapgen.backends import InterpretEmitter
from wrapgen.errors import SanitizerError
from wrapgen.wrapper_ir import (
    OBSERVED,
    Allocate,
    AllocateFromPool,
    AssertInput,
    BindSymbol,
    ExternKernel,
    Free,
    KernelCall,
    Output,
    Program,
    Reinterpret,
    ReuseBuffer,
    SymbolicCallArg,
    SymbolInfo,
    TensorInput,
    TensorRef,
    TensorType,
    WrapperLine,
)

CPU, F32 = torch.device("cpu"), torch.float32
TARGETS = ["interpret", "python"]
Int = sympy.Integer


def f32(*sizes: int) -> TensorType:
    strides = tuple(Int(int(torch.tensor(sizes[i + 1 :]).prod())) for i in range(len(sizes)))
    return TensorType(F32, CPU, tuple(Int(s) for s in sizes), strides)


X = f32(4, 8)


def out(op: str, args: tuple, dst: str, **kw) -> ExternKernel:
    return ExternKernel(None, op, tuple(TensorRef(a) if isinstance(a, str) else a for a in args),
                        tuple(kw.items()) + (("out", TensorRef(dst)),), None, (dst,))


def program(lines: list[WrapperLine]) -> Program:
    header = [AssertInput("x", F32, CPU, X.sizes, X.strides)]
    return Program("p", (TensorInput("x", X),), (), (), tuple(header + lines))


def base_lines() -> list[WrapperLine]:
    """y = relu(x) + (-x), then squared: three buffers, the first two alive together."""
    return [
        Allocate("buf0", X),                                         # 2
        out("aten::relu.out", ("x",), "buf0"),                        # 3
        Allocate("buf1", X),                                         # 4
        out("aten::neg.out", ("x",), "buf1"),                         # 5
        Allocate("buf2", X),                                         # 6
        out("aten::add.out", ("buf0", "buf1"), "buf2"),               # 7
        Free("buf0"),                                                # 8
        Free("buf1"),                                                # 9
        Allocate("buf3", X),                                         # 10
        out("aten::mul.out", ("buf2", "buf2"), "buf3"),               # 11
        Free("buf2"),                                                # 12
        Output((TensorRef("buf3"),)),                                # 13
    ]


def expected(x: torch.Tensor) -> torch.Tensor:
    return (x.relu() - x) ** 2


def run(lines: list[WrapperLine], target: str, sanitize: bool = True, x: torch.Tensor | None = None):
    x = torch.randn(4, 8) if x is None else x
    with wrapgen.config.patch(sanitize=sanitize, memory_planning="none"):
        artifact = wrapgen.build(program(lines), target)
    return artifact.call([x.clone()])[0], x


def replaced(lines: list[WrapperLine], number: int, *new: WrapperLine) -> list[WrapperLine]:
    """`lines` with line `number` (1-based, counting the AssertInput header line) replaced."""
    index = number - 2
    return lines[:index] + list(new) + lines[index + 1 :]


def raises_at(target: str, lines: list[WrapperLine], number: int, buffer: str | None, match: str) -> SanitizerError:
    with pytest.raises(SanitizerError, match=match) as caught:
        run(lines, target)
    error = caught.value
    assert (error.line_number, error.buffer) == (number, buffer), str(error)
    assert str(error).startswith(f"line {number} ({program(lines).lines[number - 1].format()}): ")
    return error


@pytest.mark.parametrize("target", TARGETS)
def test_base_program_is_clean(target):
    result, x = run(base_lines(), target)
    torch.testing.assert_close(result, expected(x))


@pytest.mark.parametrize("target", TARGETS)
def test_reuse_of_live_storage(target):
    """buf1 takes buf0's storage while line 7, which does not write buf1, still reads buf0."""
    lines = [
        Allocate("buf0", X),                                         # 2
        out("aten::relu.out", ("x",), "buf0"),                        # 3
        ReuseBuffer("buf1", "buf0", X),                              # 4: buf0 is not dead
        out("aten::neg.out", ("x",), "buf1"),                         # 5
        Allocate("buf2", X),                                         # 6
        out("aten::add.out", ("buf0", "buf1"), "buf2"),               # 7
        Free("buf0"),
        Free("buf1"),
        Allocate("buf3", X),
        out("aten::mul.out", ("buf2", "buf2"), "buf3"),
        Free("buf2"),
        Output((TensorRef("buf3"),)),
    ]
    raises_at(target, lines, 4, "buf0", r"gives buf1 storage that buf0 still uses \(until line 7\)")
    # Without the sanitizer the program silently computes something else.
    result, x = run(lines, target, sanitize=False)
    assert not torch.allclose(result, expected(x))


@pytest.mark.parametrize("target", TARGETS)
def test_in_place_reuse_is_not_a_fault(target):
    """Memory planning's in-place case: the source dies at the elementwise line writing the new buffer."""
    lines = replaced(base_lines(), 10, ReuseBuffer("buf3", "buf2", X))
    result, x = run(lines, target)
    torch.testing.assert_close(result, expected(x))


@pytest.mark.parametrize("target", TARGETS)
def test_undeclared_write(target):
    lines = base_lines()
    lines[3] = dataclasses.replace(lines[3], writes=())  # line 5 writes buf1 but does not say so
    raises_at(target, lines, 5, "buf1", "writes buf1 .*which the line does not declare written")


@pytest.mark.parametrize("target", TARGETS)
def test_view_past_its_storage(target):
    view = Reinterpret("buf4", "buf3", F32, CPU, (Int(4), Int(8)), (Int(8), Int(1)), Int(4))
    lines = base_lines()
    lines[-1:] = [view, Output((TensorRef("buf4"),))]
    raises_at(target, lines, 13, "buf3", r"a view of buf3 spans bytes \[16, 144\).* past buf3's storage \(bytes \[0, 128\)\)")


@pytest.mark.parametrize("target", TARGETS)
def test_pooled_buffer_past_its_pool(target):
    pool = Allocate("pool0", TensorType(torch.uint8, CPU, (Int(192),), (Int(1),)))
    lines = replaced(base_lines(), 6, pool, AllocateFromPool("buf2", "pool0", Int(128), X))
    lines.insert(lines.index(Free("buf2")) + 1, Free("pool0"))
    raises_at(target, lines, 7, "pool0", r"buf2, placed in pool0 spans bytes \[128, 256\)")


@pytest.mark.parametrize("target", TARGETS)
def test_stale_read_after_free(target):
    """buf1 is freed and its storage handed to buf4, which line 11 reads before anything wrote it."""
    lines = [
        Allocate("buf0", X),                                         # 2
        out("aten::relu.out", ("x",), "buf0"),                        # 3
        Allocate("buf1", X),                                         # 4
        out("aten::neg.out", ("x",), "buf1"),                         # 5
        Allocate("buf2", X),                                         # 6
        out("aten::add.out", ("buf0", "buf1"), "buf2"),               # 7
        Free("buf0"),                                                # 8
        ReuseBuffer("buf4", "buf1", X),                              # 9: buf1 is dead, its storage goes to buf4
        Free("buf1"),                                                # 10
        Allocate("buf3", X),                                         # 11
        out("aten::mul.out", ("buf2", "buf4"), "buf3"),               # 12: reads buf4, never written
        Free("buf2"),
        Free("buf4"),
        Output((TensorRef("buf3"),)),
    ]
    error = raises_at(target, lines, 12, "buf4", "reads buf4, whose data is stale: its storage was handed to buf4 at line 9")
    assert "not written since" in str(error)
    # Without the sanitizer the stale read goes unnoticed: it reads -x, left over in buf1.
    result, x = run(lines, target, sanitize=False)
    torch.testing.assert_close(result, (x.relu() - x) * -x)


@pytest.mark.parametrize("target", TARGETS)
def test_stale_read_from_a_pool(target):
    pool = Allocate("pool0", TensorType(torch.uint8, CPU, (Int(128),), (Int(1),)))
    lines = [
        pool,
        AllocateFromPool("buf0", "pool0", Int(0), X),                  # 3
        out("aten::relu.out", ("x",), "buf0"),
        Allocate("buf1", X),
        out("aten::neg.out", ("buf0",), "buf1"),
        Free("buf0"),                                                # 7
        AllocateFromPool("buf2", "pool0", Int(0), X),                  # 8
        Allocate("buf3", X),
        out("aten::add.out", ("buf1", "buf2"), "buf3"),              # 10: reads buf2 before it is written
        Free("buf2"),
        Free("pool0"),
        Free("buf1"),
        Output((TensorRef("buf3"),)),
    ]
    raises_at(target, lines, 10, "buf2", "reads buf2, whose data is stale: its storage was handed to buf2 at line 8")


@pytest.mark.parametrize("target", TARGETS)
def test_read_of_a_never_written_buffer(target):
    lines = base_lines()
    del lines[3]  # nothing writes buf1
    raises_at(target, lines, 6, "buf1", r"reads buf1, whose data is stale: it was allocated at line 4 .* and never written")


def test_freed_storage_is_poisoned():
    """Freed storage no live name needs holds NaN (an out-of-bounds read inside a kernel, which no
    check sees by name, then shows in the results); the caller's inputs are never poisoned."""
    freed: dict[str, torch.Tensor] = {}

    class Recording(InterpretEmitter):
        def emit_free(self, line):
            freed[line.name] = self.env[line.name]  # after the sanitizer's before-hook poisoned it
            super().emit_free(line)

    lines = base_lines()
    lines.insert(lines.index(Allocate("buf2", X)), Free("x"))  # the program drops its input early
    with wrapgen.config.patch(sanitize=True, memory_planning="none"):
        artifact = Recording().compile(program(lines))
    x = torch.randn(4, 8)
    result = artifact.call([x])[0]
    torch.testing.assert_close(result, expected(x))
    assert set(freed) == {"x", "buf0", "buf1", "buf2"}
    assert all(bool(freed[name].isnan().all()) for name in ("buf0", "buf1", "buf2"))
    assert bool(torch.isfinite(x).all())


@pytest.mark.parametrize("target", TARGETS)
def test_undeclared_alias(target):
    """A library call returning a view of its argument without `alias_of`: memory planning would
    take the argument's storage as dead at its Free."""
    lines = base_lines()
    lines[-1:] = [ExternKernel("buf4", "aten::t.default", (TensorRef("buf3"),), (), TensorType(F32, CPU, (Int(8), Int(4)))),
                  Output((TensorRef("buf4"),))]
    raises_at(target, lines, 13, "buf3", "returns a tensor sharing storage with buf3.*alias_of")


s0 = sympy.Symbol("s0", integer=True, positive=True)


@pytest.mark.parametrize("target", TARGETS)
def test_symbol_outside_its_assumed_range(target):
    """A computed symbol the program assumes to be at least 8 (SymbolInfo) is 4 at run time."""
    dyn = TensorType(F32, CPU, (s0, Int(8)), (Int(8), Int(1)))
    k0 = sympy.Symbol("k0", integer=True, positive=True)
    lines = [
        BindSymbol(s0, "x", "size", 0, OBSERVED, 2, None),
        AssertInput("x", F32, CPU, dyn.sizes, dyn.strides),
        SymbolicCallArg(k0, s0 * 1),
        Output((TensorRef("x"), k0)),
    ]
    prog = Program("p", (TensorInput("x", dyn),), (SymbolInfo(s0, 4, 2), SymbolInfo(k0, 16, 8)), (), tuple(lines))
    with wrapgen.config.patch(sanitize=True, memory_planning="none"):
        artifact = wrapgen.build(prog, target)
    assert artifact.call([torch.randn(9, 8)])[1] == 9
    with pytest.raises(SanitizerError, match=r"line 3 \(k0 = s0\): size symbol k0 = 4 is outside \[8, inf\]"):
        artifact.call([torch.randn(4, 8)])


def test_undeclared_write_of_a_generated_kernel():
    """A lowered program's kernel call with its `writes` dropped: the kernel path is checked too."""
    program_ = wrapgen.lower(lambda x: (x.sin() * 2).sum(-1), (torch.randn(4, 8),))
    number, call = next((n, c) for n, c in enumerate(program_.lines, 1) if isinstance(c, KernelCall) and c.writes)
    broken = program_.with_lines(program_.lines[: number - 1] + (dataclasses.replace(call, writes=(), may_alias=()),)
                                 + program_.lines[number:])
    for target in TARGETS:
        with wrapgen.config.patch(sanitize=True, memory_planning="none"):
            artifact = wrapgen.build(broken, target)
        with pytest.raises(SanitizerError, match=f"line {number} .*writes {call.writes[0]}") as caught:
            artifact.call([torch.randn(4, 8)])
        assert caught.value.buffer == call.writes[0]


def test_python_target_without_sanitize_is_unchanged():
    fn = lambda x: (x.sin() * 2).sum(-1)  # noqa: E731
    with wrapgen.config.patch(sanitize=False):
        plain = wrapgen.compile(fn, (torch.randn(4, 8),))
    with wrapgen.config.patch(sanitize=True):
        checked = wrapgen.compile(fn, (torch.randn(4, 8),))
    assert "_san" not in plain.source and "sanitize" not in plain.source.lower()
    assert "_san.before(" in checked.source
    x = torch.randn(4, 8)
    torch.testing.assert_close(checked(x), plain(x))


@pytest.mark.parametrize("target", TARGETS)
def test_reuse_may_grow_back_to_its_storage(target):
    """A buffer reused with a smaller layout hands on the whole storage behind it: a later reuse
    may take all of it again (what the reuse planner does; found by the fuzzer)."""
    half = f32(2, 8)
    lines = [
        Allocate("buf0", X),                                          # 2
        out("aten::relu.out", ("x",), "buf0"),
        Allocate("buf1", X),
        out("aten::neg.out", ("buf0",), "buf1"),
        ReuseBuffer("buf2", "buf0", half),                            # 6: 64 of buf0's 128 bytes
        Free("buf0"),
        Reinterpret("buf3", "buf1", F32, CPU, half.sizes, half.strides),
        out("aten::abs.out", ("buf3",), "buf2"),
        Allocate("buf4", half),
        out("aten::mul.out", ("buf2", "buf2"), "buf4"),
        ReuseBuffer("buf5", "buf2", X),                               # 12: all 128 bytes again
        Free("buf2"),
        out("aten::add.out", ("buf1", "buf1"), "buf5"),
        Free("buf3"),
        Free("buf1"),
        Output((TensorRef("buf4"), TensorRef("buf5"))),
    ]
    x = torch.randn(4, 8)
    with wrapgen.config.patch(sanitize=True, memory_planning="none"):
        artifact = wrapgen.build(program(lines), target)
    first, second = artifact.call([x.clone()])
    torch.testing.assert_close(first, x.relu()[:2] ** 2)
    torch.testing.assert_close(second, -2 * x.relu())
    too_big = lines[:10] + [ReuseBuffer("buf5", "buf2", f32(4, 9))] + lines[11:]
    with pytest.raises(SanitizerError, match=r"line 12 .*buf5, placed in buf2 spans bytes \[0, 144\).*\[0, 128\)"):
        with wrapgen.config.patch(sanitize=True, memory_planning="none"):
            wrapgen.build(program(too_big), target).call([x.clone()])


def state_lines(reader_first: bool) -> list[WrapperLine]:
    """buf0 = -x read before x *= 2 writes x in place; each call declares the version of x it sees."""
    reader = dataclasses.replace(out("aten::neg.out", ("x",), "buf0"), state=(("x", 0),))
    writer = ExternKernel(None, "aten::mul_.Scalar", (TensorRef("x"), 2.0), writes=("x",), state=(("x", 0),))
    calls = [reader, writer] if reader_first else [writer, reader]
    return [Allocate("buf0", X), *calls, Output((TensorRef("buf0"),))]


@pytest.mark.parametrize("target", TARGETS)
def test_state_read_moved_past_its_write(target):
    """A reordering the verifier refuses, emitted without it (a pass or an emitter moving a line
    after verification): the sanitizer names the call that sees the wrong version of x."""
    from wrapgen.backends import get_backend

    x = torch.randn(4, 8)
    with wrapgen.config.patch(sanitize=True, memory_planning="none"):
        good = get_backend(target)().compile(program(state_lines(reader_first=True)))
        torch.testing.assert_close(good.call([x.clone()])[0], -x)
        planted = get_backend(target)().compile(program(state_lines(reader_first=False)))
    with pytest.raises(SanitizerError, match=r"state out of order: must see x at version 0 but runs after") as caught:
        planted.call([x.clone()])
    assert caught.value.line_number == 4 and "aten::neg.out" in caught.value.line_text, str(caught.value)
