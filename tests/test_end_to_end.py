"""End to end: compiled programs agree with eager on fresh inputs.

Every numerical case runs through both public entry points, `wrapgen.compile(...)` and
`torch.compile(..., backend="wrapgen")`, and is checked against eager PyTorch with
`torch.testing.assert_close` on inputs the compiler never saw.
"""

from __future__ import annotations

import copy
import re

import pytest
import torch
import torch.nn.functional as F
from torch import nn
from torch._dynamo.testing import CompileCounterWithBackend
from torch.utils import _pytree as pytree

import wrapgen
from wrapgen.errors import InputMismatchError

MODES = ["wrapgen.compile", "torch.compile"]


# -- helpers --------------------------------------------------------------------------------


def compile_as(mode: str, model, example_inputs: tuple, dynamic: bool = False):
    """Compile `model` through one of the two public entry points."""
    if mode == "wrapgen.compile":
        return wrapgen.compile(model, example_inputs, dynamic=dynamic)
    return torch.compile(model, backend="wrapgen", dynamic=dynamic, fullgraph=True)


def assert_same_result(actual, expected, **tolerances) -> None:
    """Same output structure (tuple / list / namedtuple / single tensor), same values and dtypes."""
    assert pytree.tree_structure(actual) == pytree.tree_structure(expected)
    torch.testing.assert_close(actual, expected, **tolerances)


def check_fresh_calls(model, compiled, make_inputs, calls: int = 2, **tolerances) -> None:
    """Call eager and compiled on `calls` fresh sets of inputs (inference)."""
    for _ in range(calls):
        inputs = make_inputs()
        with torch.no_grad():
            expected = model(*inputs)
            actual = compiled(*inputs)
        assert_same_result(actual, expected, **tolerances)


def storage_of(t: torch.Tensor) -> int:
    return t.untyped_storage().data_ptr()


def assert_same_aliasing(actual, expected, inputs_actual, inputs_expected) -> None:
    """Each output aliases the same inputs and the same other outputs that eager's does."""
    flat_a, flat_e = pytree.tree_leaves(actual), pytree.tree_leaves(expected)
    for i, (a, e) in enumerate(zip(flat_a, flat_e)):
        for j, (xa, xe) in enumerate(zip(inputs_actual, inputs_expected)):
            assert (storage_of(a) == storage_of(xa)) == (storage_of(e) == storage_of(xe)), (
                f"output {i} aliasing of input {j} differs from eager"
            )
        for k in range(i):
            same_a = storage_of(a) == storage_of(flat_a[k])
            same_e = storage_of(e) == storage_of(flat_e[k])
            assert same_a == same_e, f"outputs {k} and {i}: aliasing differs from eager"


def assert_compiled_once(backend_calls: list[int]) -> None:
    """`backend_calls[i]`: how often dynamo had called the backend after call i.

    The first call may call it more than once without a recompile (dynamo restarts its
    analysis after specializing float attributes under dynamic=True: every aot backend
    does this); no later call may call it again.
    """
    assert backend_calls[0] >= 1, "the wrapgen backend compiled the graph"
    assert backend_calls[-1] == backend_calls[0], f"recompiled: backend calls after each call {backend_calls}"


def fresh_randn(*shape):
    return lambda: (torch.randn(*shape),)


# -- models -----------------------------------------------------------------------------------


class MLP(nn.Module):
    def __init__(self, d_in: int = 8, hidden: int = 16, d_out: int = 4) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(d_in, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.Tanh(),
            nn.Linear(hidden, d_out),
        )

    def forward(self, x):
        return self.net(x)


class ConvNet(nn.Module):
    """conv -> batch-norm -> ReLU -> max-pool -> conv -> ReLU -> avg-pool -> flatten -> linear."""

    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.bn = nn.BatchNorm2d(8)
        self.conv2 = nn.Conv2d(8, 8, 3, padding=1, bias=False)
        self.pool = nn.MaxPool2d(2)
        self.avg = nn.AvgPool2d(2)
        self.fc = nn.Linear(8 * 2 * 2, 5)
        with torch.no_grad():  # non-trivial running statistics and affine parameters
            self.bn.running_mean.uniform_(-0.5, 0.5)
            self.bn.running_var.uniform_(0.5, 2.0)
            self.bn.weight.uniform_(0.5, 1.5)
            self.bn.bias.uniform_(-0.5, 0.5)

    def forward(self, x):
        x = self.pool(F.relu(self.bn(self.conv1(x))))
        x = self.avg(F.relu(self.conv2(x)))
        return self.fc(torch.flatten(x, 1))


class MHABlock(nn.Module):
    """Pre-norm transformer block: LayerNorm -> nn.MultiheadAttention -> residual -> LayerNorm -> GELU MLP -> residual."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.ln1 = nn.LayerNorm(d)
        self.attn = nn.MultiheadAttention(d, heads, dropout=0.0, batch_first=True)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x):
        h = self.ln1(x)
        x = x + self.attn(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.ln2(x))


class SDPABlock(nn.Module):
    """Transformer block with a fused qkv projection and causal F.scaled_dot_product_attention."""

    def __init__(self, d: int = 16, heads: int = 2) -> None:
        super().__init__()
        self.heads = heads
        self.ln1 = nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)
        self.ln2 = nn.LayerNorm(d)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(approximate="tanh"), nn.Linear(4 * d, d))

    def forward(self, x):
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.mlp(self.ln2(x))


# -- 1-3: models ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_mlp(mode):
    model = MLP().eval()
    compiled = compile_as(mode, model, (torch.randn(4, 8),))
    check_fresh_calls(model, compiled, fresh_randn(4, 8), calls=3)


def test_mlp_torch_compile_with_grad_enabled():
    """Without no_grad, torch.compile takes aot_autograd's training path; the forward still matches."""
    model = MLP().eval()
    compiled = torch.compile(model, backend="wrapgen", dynamic=False, fullgraph=True)
    for _ in range(2):
        x = torch.randn(4, 8)
        torch.testing.assert_close(compiled(x), model(x))


@pytest.mark.parametrize("mode", MODES)
def test_conv_bn_pool_net(mode):
    model = ConvNet().eval()
    compiled = compile_as(mode, model, (torch.randn(2, 3, 8, 8),))
    check_fresh_calls(model, compiled, fresh_randn(2, 3, 8, 8))


@pytest.mark.parametrize("block", [MHABlock, SDPABlock], ids=["multihead_attention", "sdpa"])
@pytest.mark.parametrize("mode", MODES)
def test_transformer_block(mode, block):
    model = block().eval()
    compiled = compile_as(mode, model, (torch.randn(2, 5, 16),))
    check_fresh_calls(model, compiled, fresh_randn(2, 5, 16), rtol=1e-5, atol=1e-5)


# -- 4: multi-output ops ----------------------------------------------------------------------


def topk_largest(x):
    return torch.topk(x, 3)  # a torch.return_types.topk namedtuple


def sort_descending(x):
    return torch.sort(x, dim=-1, descending=True)  # a torch.return_types.sort namedtuple


def topk_sort_variants(x):
    values, indices = x.topk(3, dim=-1)
    smallest = torch.topk(x, 2, dim=0, largest=False, sorted=True)
    ties = (x * 4).floor().sort(dim=0, stable=True)  # repeated values: the stable order is defined
    return (
        values * 2,
        indices + 1,
        torch.gather(x, -1, indices),
        smallest.values,
        smallest.indices,
        ties.values,
        ties.indices,
    )


@pytest.mark.parametrize("fn", [topk_largest, sort_descending, topk_sort_variants])
@pytest.mark.parametrize("mode", MODES)
def test_topk_sort(mode, fn):
    compiled = compile_as(mode, fn, (torch.randn(6, 7),))
    for _ in range(2):
        x = torch.randn(6, 7)
        expected, actual = fn(x), compiled(x)
        assert_same_result(actual, expected)  # values and indices (int64, compared exactly)
        assert all(a.dtype == e.dtype for a, e in zip(actual, expected))


# -- 5: outputs that are views ----------------------------------------------------------------


def views_of_input(x):
    z = x.t()[1:].unsqueeze(0)  # a view of a view
    return x.t(), x[1:, ::2], x.view(-1), x.view(3, 4, 4).transpose(0, 2), x.diagonal(), x[2], z, z.squeeze(0).sum(0), x


def views_of_intermediate(x):
    y = x * 2 + 1
    return y.t(), y[1:, ::2], y.view(-1), y, y.unsqueeze(1)[:, :, 2:]


def split_of_intermediate(x):
    y = torch.relu(x)
    return y.split(3, dim=1)


@pytest.mark.parametrize("fn", [views_of_input, views_of_intermediate, split_of_intermediate])
@pytest.mark.parametrize("mode", MODES)
def test_view_outputs(mode, fn):
    compiled = compile_as(mode, fn, (torch.randn(6, 8),))
    for _ in range(2):
        x = torch.randn(6, 8)
        expected, actual = fn(x), compiled(x)
        assert_same_result(actual, expected)
        assert_same_aliasing(actual, expected, [x], [x])
        for a, e in zip(pytree.tree_leaves(actual), pytree.tree_leaves(expected)):
            if storage_of(e) == storage_of(x):  # a view of the input has eager's exact layout
                assert (a.stride(), a.storage_offset()) == (e.stride(), e.storage_offset())


# -- 6: non-contiguous inputs -----------------------------------------------------------------

NONCONTIGUOUS = {
    "transposed": lambda: torch.randn(7, 4).t(),
    "sliced": lambda: torch.randn(9, 12)[1:5, ::2],
    "expanded": lambda: torch.randn(4, 1).expand(4, 6),
    "channels_last": lambda: torch.randn(2, 3, 4, 5).to(memory_format=torch.channels_last),
}


def pointwise_reduce_reshape(x):
    y = torch.sin(x) * 2 + x.mean(-1, keepdim=True)
    return y, x.reshape(-1), x[..., :2], x.sum()


@pytest.mark.parametrize("layout", list(NONCONTIGUOUS))
@pytest.mark.parametrize("mode", MODES)
def test_noncontiguous_input(mode, layout):
    make = NONCONTIGUOUS[layout]
    example = make()
    assert not example.is_contiguous()
    compiled = compile_as(mode, pointwise_reduce_reshape, (example,))
    for _ in range(2):
        x = make()
        expected, actual = pointwise_reduce_reshape(x), compiled(x)
        assert_same_result(actual, expected)
        assert_same_aliasing(actual, expected, [x], [x])


def matmul_two_inputs(a, b):
    return a @ b, (a.t() * 2).contiguous(), b.sum(0)


@pytest.mark.parametrize("mode", MODES)
def test_noncontiguous_matmul_operands(mode):
    def make():
        return torch.randn(6, 4).t(), torch.randn(12, 5)[::2]

    compiled = compile_as(mode, matmul_two_inputs, make())
    for _ in range(2):
        a, b = make()
        assert_same_result(compiled(a, b), matmul_two_inputs(a, b))


# -- 7: int, bool and 0-dim outputs -----------------------------------------------------------


def int_bool_and_zero_dim_outputs(x):
    return (
        x.argmax(-1),
        x.argmin(),
        x > 0,
        x.eq(x.amax(-1, keepdim=True)),
        (x > 0).sum(),
        (x < 0).any(),
        x.max(dim=0).indices,
        x.sum(),
        x.mean(),
        x.abs().sum().sqrt(),
    )


def int_and_bool_inputs(i, b, x):
    return (
        i * 3 + 1,
        i // 2,
        i % 3,
        (i > 2).any(),
        i.sum(),
        i.float().mean(),
        b & (x > 0),
        ~b,
        torch.where(b, x, -x),
        b.sum(),
    )


def zero_dim_input(s, x):
    return x * s, s + 1, (x.sum() > s)


CASES_7 = {
    "float_to_int_bool_0dim": (int_bool_and_zero_dim_outputs, lambda: (torch.randn(5, 6),)),
    "int_and_bool_inputs": (
        int_and_bool_inputs,
        lambda: (torch.randint(-10, 10, (4, 5)), torch.rand(4, 5) > 0.5, torch.randn(4, 5)),
    ),
    "zero_dim_input": (zero_dim_input, lambda: (torch.randn(()), torch.randn(3, 4))),
}


@pytest.mark.parametrize("case", list(CASES_7))
@pytest.mark.parametrize("mode", MODES)
def test_int_bool_and_zero_dim(mode, case):
    fn, make = CASES_7[case]
    compiled = compile_as(mode, fn, make())
    for _ in range(2):
        inputs = make()
        expected, actual = fn(*inputs), compiled(*inputs)
        assert_same_result(actual, expected)  # assert_close checks dtype (int64, bool) and shape (0-dim)
        for a, e in zip(actual, expected):
            assert a.dtype == e.dtype and a.shape == e.shape


# -- 8: in-place updates ----------------------------------------------------------------------


def inplace_intermediate(x):
    y = x * 2
    y.add_(1)
    y.relu_()
    return y


def inplace_input(x):
    x.add_(1)
    return x * 2


def inplace_input_returned(x):
    x.mul_(2)
    return x


def inplace_input_slice(x):
    x[0].mul_(3)
    x[:, 1] = 0.0
    return x.sum(1)


def inplace_one_of_two_inputs(x, y):
    y.add_(x)
    return x - y


INPLACE = {
    "intermediate": (inplace_intermediate, lambda: (torch.randn(4, 5),)),
    "input": (inplace_input, lambda: (torch.randn(4, 5),)),
    "input_returned": (inplace_input_returned, lambda: (torch.randn(4, 5),)),
    "input_slice": (inplace_input_slice, lambda: (torch.randn(4, 5),)),
    "one_of_two_inputs": (inplace_one_of_two_inputs, lambda: (torch.randn(4, 5), torch.randn(4, 5))),
}


@pytest.mark.parametrize("case", list(INPLACE))
@pytest.mark.parametrize("mode", MODES)
def test_inplace(mode, case):
    fn, make = INPLACE[case]
    compiled = compile_as(mode, fn, tuple(t.clone() for t in make()))
    for _ in range(2):
        inputs = make()
        eager_inputs = [t.clone() for t in inputs]
        compiled_inputs = [t.clone() for t in inputs]
        expected = fn(*eager_inputs)
        actual = compiled(*compiled_inputs)
        assert_same_result(actual, expected)
        # inputs are mutated exactly as eager mutates them (and untouched ones stay untouched)
        torch.testing.assert_close(compiled_inputs, eager_inputs)
        assert_same_aliasing(actual, expected, compiled_inputs, eager_inputs)


class CountingModule(nn.Module):
    """Updates a registered buffer in place during forward."""

    def __init__(self) -> None:
        super().__init__()
        self.register_buffer("calls", torch.zeros(()))
        self.register_buffer("total", torch.zeros(3))

    def forward(self, x):
        self.calls.add_(1)
        self.total.add_(x.sum(0))
        return x * self.calls


@pytest.mark.parametrize("mode", MODES)
def test_inplace_buffer_update(mode):
    eager, model = CountingModule(), CountingModule()
    compiled = compile_as(mode, model, (torch.randn(2, 3),))
    model.load_state_dict(eager.state_dict())  # whatever tracing did, start both from the same state
    for _ in range(3):
        x = torch.randn(2, 3)
        with torch.no_grad():
            assert_same_result(compiled(x), eager(x))
        torch.testing.assert_close(dict(model.named_buffers()), dict(eager.named_buffers()))


# -- 9: dynamic shapes -----------------------------------------------------------------------


def softmax_over_last(x):
    return torch.softmax(x, -1) * x.shape[0], x.sum(0)


def cat_with_doubled(x, y):
    """y's leading size is 2 * x's: the program sees an input whose size is an expression."""
    return torch.cat([x, x]) + y, y[::2] - x


def flatten_add(x, y):
    """y's size is the product of both of x's sizes."""
    return x.reshape(-1) + y, x.t()


def views_dynamic(x):
    return x.t(), x[1:], (x + 1).view(-1)


DYNAMIC = {
    # name: (model or function, input maker taking a size)
    "mlp": (lambda: MLP().eval(), lambda n: (torch.randn(n, 8),)),
    "softmax": (lambda: softmax_over_last, lambda n: (torch.randn(n, n + 2),)),
    "views": (lambda: views_dynamic, lambda n: (torch.randn(n, 4),)),
    "cat_with_doubled": (lambda: cat_with_doubled, lambda n: (torch.randn(n, 4), torch.randn(2 * n, 4))),
    "flatten_add": (lambda: flatten_add, lambda n: (torch.randn(n, n + 1), torch.randn(n * (n + 1)))),
    "sdpa_block_seq": (lambda: SDPABlock().eval(), lambda n: (torch.randn(2, n, 16),)),
}
# The first size is the example. None is 0 or 1 (torch specializes those) or equal to another
# dimension of the inputs (duck sizing would tie the two together).
DYNAMIC_SIZES = (5, 6, 7)


def check_dynamic(model, compiled, make, calls_per_size: int = 2) -> None:
    for n in DYNAMIC_SIZES:
        for _ in range(calls_per_size):
            inputs = make(n)
            with torch.no_grad():
                expected = model(*inputs)
                actual = compiled(*inputs)
            assert_same_result(actual, expected, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("case", ["mlp", "softmax", "views"])
def test_dynamic_wrapgen_compile(case):
    build, make = DYNAMIC[case]
    model = build()
    compiled = wrapgen.compile(model, make(DYNAMIC_SIZES[0]), dynamic=True)
    assert compiled.program.symbols, "a dynamic program has size symbols"
    check_dynamic(model, compiled, make)  # the one compiled object serves every size


def test_dynamic_input_size_is_an_expression():
    """An input whose size is 2*s0 (torch.export relates it to another input's size) is bound and checked."""
    make = DYNAMIC["cat_with_doubled"][1]
    compiled = wrapgen.compile(cat_with_doubled, make(DYNAMIC_SIZES[0]), dynamic=True)
    ir = str(compiled.program)
    assert re.search(r"\[2\*s0, s1\]", ir), ir
    assert len(compiled.program.symbols) == 2
    check_dynamic(cat_with_doubled, compiled, make)
    with pytest.raises(InputMismatchError):
        compiled(torch.randn(3, 4), torch.randn(7, 4))  # 7 != 2 * 3


def test_dynamic_input_size_is_a_product_of_symbols():
    make = DYNAMIC["flatten_add"][1]
    compiled = wrapgen.compile(flatten_add, make(DYNAMIC_SIZES[0]), dynamic=True)
    assert re.search(r"\[s0\*s1\]", str(compiled.program)), str(compiled.program)
    check_dynamic(flatten_add, compiled, make)
    with pytest.raises(InputMismatchError):
        compiled(torch.randn(3, 5), torch.randn(14))  # 14 != 3 * 5


@pytest.mark.parametrize("case", list(DYNAMIC))
def test_dynamic_torch_compile(case):
    build, make = DYNAMIC[case]
    model = build()
    counter = CompileCounterWithBackend("wrapgen")
    compiled = torch.compile(model, backend=counter, dynamic=True, fullgraph=True)
    compiles = []

    def counted(*inputs):
        out = compiled(*inputs)
        compiles.append(counter.frame_count)
        return out

    check_dynamic(model, counted, make)
    assert_compiled_once(compiles)


# Reductions over the batch dim and a middle dim beside a row reduction: the row kernel is
# generated first and names the host size s0*s1*s2, but runs last (after the kernels it reads),
# so the size must be defined before the first call that takes it, not where it was named.
DYNAMIC_REDUCTIONS = {
    "var_with_softmax": lambda x: torch.softmax(x, 1) + x.var(dim=(0, 1)) * x.sum((0, 2), keepdim=True),
    "log_softmax_minus_batch_mean": lambda x: torch.log_softmax(x, 1) - x.mean((0, 1)),
    "layer_norm_times_batch_std": lambda x: F.layer_norm(x, x.shape[-1:]) * x.std((0, 1)),
    "several_outputs": lambda x: (x.var(dim=(0, 1)), x.sum((0, 2)), torch.softmax(x, 1), x.mean((0, 1))),
}
# Batch, middle and last sizes all vary; none is 0, 1 or equal to another (see DYNAMIC_SIZES).
REDUCTION_SHAPES = ((4, 5, 6), (7, 3, 9), (2, 8, 3))


def check_dynamic_reductions(case: str, target: str) -> None:
    fn = DYNAMIC_REDUCTIONS[case]
    compiled = wrapgen.compile(fn, (torch.randn(REDUCTION_SHAPES[0]),), dynamic=True, target=target)
    assert compiled.program.symbols, "a dynamic program has size symbols"
    for shape in REDUCTION_SHAPES:
        x = torch.randn(shape)
        assert_same_result(compiled(x), fn(x), rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("target", ["python", "fx", "cpp"])
@pytest.mark.parametrize("case", list(DYNAMIC_REDUCTIONS))
def test_dynamic_reductions_over_batch_and_middle(case, target):
    check_dynamic_reductions(case, target)


# -- 10: training through torch.compile -------------------------------------------------------

TRAINING = {
    "mlp": (lambda: MLP(), lambda n: torch.randn(n, 8), lambda n: torch.randn(n, 4)),
    "conv_bn_train": (lambda: ConvNet(), lambda n: torch.randn(n, 3, 8, 8), lambda n: torch.randn(n, 5)),
    "mha_block": (lambda: MHABlock(), lambda n: torch.randn(n, 4, 16), lambda n: torch.randn(n, 4, 16)),
    "sdpa_block": (lambda: SDPABlock(), lambda n: torch.randn(n, 4, 16), lambda n: torch.randn(n, 4, 16)),
}
TRAIN_TOL = {"rtol": 1e-4, "atol": 1e-5}


def train_step(model, x, target):
    loss = F.mse_loss(model(x), target)
    loss.backward()
    return loss


def assert_same_training_state(compiled_model, eager_model, x_compiled, x_eager):
    grads_c = {n: p.grad for n, p in compiled_model.named_parameters()}
    grads_e = {n: p.grad for n, p in eager_model.named_parameters()}
    assert all(g is not None for g in grads_e.values())
    torch.testing.assert_close(grads_c, grads_e, **TRAIN_TOL)
    torch.testing.assert_close(x_compiled.grad, x_eager.grad, **TRAIN_TOL)
    # batch-norm in train mode updates its running statistics
    torch.testing.assert_close(dict(compiled_model.named_buffers()), dict(eager_model.named_buffers()), **TRAIN_TOL)


@pytest.mark.parametrize(
    "case, dynamic",
    [(case, False) for case in TRAINING] + [("mlp", True), ("conv_bn_train", True), ("sdpa_block", True)],
    ids=lambda v: v if isinstance(v, str) else ("dynamic" if v else "static"),
)
def test_training_step(case, dynamic):
    build, make_x, make_target = TRAINING[case]
    eager_model = build().train()
    model = copy.deepcopy(eager_model)
    counter = CompileCounterWithBackend("wrapgen")
    compiled = torch.compile(model, backend=counter, dynamic=dynamic, fullgraph=True)
    sizes = (5, 6, 7) if dynamic else (5, 5, 5)
    compiles = []
    for n in sizes:
        x, target = make_x(n), make_target(n)
        x_eager, x_compiled = x.clone().requires_grad_(), x.clone().requires_grad_()
        eager_model.zero_grad(set_to_none=True)
        model.zero_grad(set_to_none=True)
        loss_e = train_step(eager_model, x_eager, target)
        loss_c = train_step(compiled, x_compiled, target)
        torch.testing.assert_close(loss_c, loss_e, **TRAIN_TOL)
        assert_same_training_state(model, eager_model, x_compiled, x_eager)
        with torch.no_grad():  # the step itself (eager) keeps both copies in lockstep
            for p_c, p_e in zip(model.parameters(), eager_model.parameters()):
                p_e -= 0.1 * p_e.grad
                p_c.copy_(p_e)
        compiles.append(counter.frame_count)
    assert_compiled_once(compiles)


# -- 11: bad inputs and bad arguments -----------------------------------------------------------


class TwoInputs(nn.Module):
    def forward(self, x, weight):
        return x @ weight


@pytest.fixture(scope="module")
def static_program():
    return wrapgen.compile(TwoInputs(), (torch.randn(4, 6), torch.randn(6, 3)))


BAD_WEIGHTS = {
    # name: (bad second input, regexes that must appear in the message)
    "shape": (lambda: torch.randn(5, 3), [r"\(6, 3\)", r"\(5, 3\)", "shape"]),
    "stride": (lambda: torch.randn(3, 6).t(), [r"\(3, 1\)", r"\(1, 6\)", "stride"]),
    "dtype": (lambda: torch.randn(6, 3, dtype=torch.float64), ["float32", "float64"]),
    "device": (lambda: torch.randn(6, 3, device="meta"), ["cpu", "meta"]),
}


@pytest.mark.parametrize("problem", list(BAD_WEIGHTS))
def test_bad_input_raises(static_program, problem):
    make, patterns = BAD_WEIGHTS[problem]
    with pytest.raises(InputMismatchError) as info:
        static_program(torch.randn(4, 6), make())
    assert isinstance(info.value, ValueError)
    message = str(info.value)
    assert "weight" in message, message  # names the offending input
    for pattern in patterns:  # shows expected and actual
        assert re.search(pattern, message), f"{pattern!r} not in {message!r}"
    static_program(torch.randn(4, 6), torch.randn(6, 3))  # still usable afterwards


def test_bad_input_names_function_parameter():
    compiled = wrapgen.compile(lambda a, b: a + b, (torch.randn(3), torch.randn(3)))
    with pytest.raises(InputMismatchError, match=r"\(3,\).*\(4,\)|\(4,\).*\(3,\)") as info:
        compiled(torch.randn(3), torch.randn(4))
    assert re.search(r"\bb\b|args_1", str(info.value)), str(info.value)


def test_many_inputs_are_checked_at_once_and_still_named_when_wrong():
    """Twelve inputs: the python target checks them in one C++ call (runtime.input_guard); an
    input it refuses goes through the one-by-one checks, which name it."""
    def total(*xs):
        return sum(x * (i + 1) for i, x in enumerate(xs))

    inputs = [torch.randn(3, 4) for _ in range(12)]
    compiled = wrapgen.compile(total, tuple(inputs))
    for _ in range(2):
        fresh = [torch.randn(3, 4) for _ in range(12)]
        torch.testing.assert_close(compiled(*fresh), total(*fresh))
    assert "input_guard" in compiled.source
    for bad, pattern in [(torch.randn(3, 5), r"\(3, 5\)"), (torch.randn(4, 3).t(), "stride"),
                         (torch.randn(3, 4, dtype=torch.float64), "float64")]:
        with pytest.raises(InputMismatchError, match=pattern) as info:
            compiled(*fresh[:7], bad, *fresh[8:])
        assert re.search(r"args_7|\b7\b", str(info.value)), str(info.value)
    grads = [x.clone().requires_grad_() for x in fresh]  # the guard refuses, the checks accept
    with torch.no_grad():
        torch.testing.assert_close(compiled(*grads), total(*fresh))
    torch.testing.assert_close(compiled(*fresh), total(*fresh))


def test_wrong_number_or_structure_of_arguments(static_program):
    with pytest.raises((TypeError, ValueError)):
        static_program(torch.randn(4, 6))
    with pytest.raises((TypeError, ValueError)):
        static_program(torch.randn(4, 6), torch.randn(6, 3), torch.randn(1))
    with pytest.raises((TypeError, ValueError)):
        static_program(torch.randn(4, 6), [1.0, 2.0])


@pytest.mark.parametrize(
    "kwargs, error",
    [
        ({"example_inputs": torch.randn(3)}, TypeError),
        ({"example_inputs": None}, TypeError),
        ({"dynamic": "yes"}, TypeError),
        ({"dynamic": 1}, TypeError),
        ({"target": "nonexistent"}, ValueError),
        ({"target": 3}, TypeError),
        ({"model": "not a model"}, TypeError),
    ],
    ids=["bare_tensor", "none_inputs", "dynamic_str", "dynamic_int", "unknown_target", "target_not_str", "model_str"],
)
def test_bad_compile_arguments(kwargs, error):
    arguments = {"model": torch.sin, "example_inputs": (torch.randn(3),), **kwargs}
    with pytest.raises(error):
        wrapgen.compile(**arguments)


@pytest.mark.parametrize("options", [{"no_such_option": 1}, {"target": "nonexistent"}, {"check_finite": "yes"}])
def test_bad_torch_compile_options(options):
    compiled = torch.compile(torch.sin, backend="wrapgen", options=options)
    with pytest.raises(Exception) as info:  # noqa: B017 - dynamo wraps backend errors; the cause is checked
        compiled(torch.randn(3))
    chain, error = [], info.value
    while error is not None:
        chain.append(error)
        error = error.__cause__ or error.__context__
    assert any(isinstance(e, (TypeError, ValueError)) for e in chain), chain


# -- 12: check_finite ---------------------------------------------------------------------------


def log_of(x):
    return torch.log(x) + 1


@pytest.mark.parametrize("mode", MODES)
def test_check_finite(mode):
    with wrapgen.config.patch(check_finite=True):
        compiled = compile_as(mode, log_of, (torch.rand(5) + 0.5,))
        x = torch.rand(5) + 0.5
        torch.testing.assert_close(compiled(x), log_of(x))  # finite: no error
        with pytest.raises(FloatingPointError):
            compiled(torch.tensor([1.0, -1.0, 2.0, 3.0, 4.0]))  # log(-1) is NaN


def test_check_finite_torch_compile_option():
    compiled = torch.compile(log_of, backend="wrapgen", options={"check_finite": True}, dynamic=False)
    with pytest.raises(FloatingPointError):
        compiled(torch.tensor([1.0, 0.0, 2.0, 3.0, 4.0]))  # log(0) is -inf


@pytest.mark.parametrize("mode", MODES)
def test_nan_passes_through_without_check_finite(mode):
    compiled = compile_as(mode, log_of, (torch.rand(5) + 0.5,))
    x = torch.tensor([1.0, -1.0, 2.0, 3.0, 4.0])
    torch.testing.assert_close(compiled(x), log_of(x), equal_nan=True)
