"""K-major weights for small CPU products (lowering/graph_passes/product_weights.py) and the wide
column-sum blocks that read them (kernels/cpp/column_reduction.py: wide_block, chains): owned weights
only, recorded as permuted constants, equal to eager on every target and through a package."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch

import wrapgen
from wrapgen.api import _capture
from wrapgen.backends import registered_backends
from wrapgen.kernels.cpp import column_reduction, lane_tiles
from wrapgen.lowering.lower import lower_captured
from wrapgen.wrapper_ir import KernelDefinition
from wrapgen.wrapper_ir.program import Constant
from wrapgen.wrapper_ir.values import TensorType
from wrapgen.wrapper_ir.verify import VerificationError, verify


class _Lifted(torch.nn.Module):
    """Weights held as plain tensors: torch.export lifts them as constants (frozen)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.w1, self.b1 = torch.randn(256, 64) / 8, torch.randn(256)
        self.w2 = torch.randn(64, 256) / 16

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.gelu(x @ self.w1.t() + self.b1) @ self.w2.t()


def _mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 64)).eval()


def _kernels(program) -> list[str]:
    return [line.source for line in program.lines if isinstance(line, KernelDefinition)]


def test_a_parameter_held_by_reference_keeps_its_layout():
    program = wrapgen.lower(_mlp(), (torch.randn(1, 64),))
    assert not any(c.permutation for c in program.constants), str(program)


def test_owned_weights_of_a_batch_one_product_are_k_major_and_summed_in_wide_blocks():
    captured = _capture(_mlp(), (torch.randn(1, 64),), False)
    program = verify(lower_captured(dataclasses.replace(captured, owned=frozenset(captured.constants))))
    permuted = {c.origin: c for c in program.constants if c.permutation}
    assert set(permuted) == {"0.weight", "2.weight"}, str(program)
    assert permuted["0.weight"].type.sizes == (64, 128) and permuted["0.weight"].permutation == (1, 0)
    assert "= permute(0.weight, [1, 0]).contiguous()" in str(program)
    assert not any(c.origin == "0.weight" and not c.permutation for c in program.constants)  # the original is gone
    torch.testing.assert_close(permuted["0.weight"].value, _mlp()[0].weight.t())
    assert sum("xb += 64" in s or "xb += 128" in s for s in _kernels(program)) == 2, _kernels(program)


def test_more_rows_than_a_small_product_keep_the_layout():
    captured = _capture(_mlp(), (torch.randn(16, 64),), False)
    program = lower_captured(dataclasses.replace(captured, owned=frozenset(captured.constants)))
    assert not any(c.permutation for c in program.constants), str(program)


@pytest.mark.parametrize("target", [t for t in registered_backends() if t in ("python", "cpp", "fx", "interpret")])
def test_lifted_weights_are_k_major_and_match_eager_on_every_target(target):
    model = _Lifted()
    x = torch.randn(1, 64)
    program = wrapgen.lower(model, (x,))
    assert sum(1 for c in program.constants if c.permutation) == 2, str(program)
    compiled = wrapgen.compile(model, (x,), target=target)
    fresh = torch.randn(1, 64)
    torch.testing.assert_close(compiled(fresh), model(fresh))


def test_a_package_ships_k_major_weights_and_lays_new_weights_out_again(tmp_path):
    model = _mlp()
    x = torch.randn(1, 64)
    with torch.no_grad():
        path = wrapgen.aot_compile(model, (x,), tmp_path / "mlp.wgpkg", arrayref=True)
        handle, arrayref = wrapgen.load_package(path), wrapgen.load_package(path, interface="arrayref")
        meta = json.loads((tmp_path / "mlp.wgpkg" / "metadata.json").read_text())
        assert {c["origin"] for c in meta["constants"] if c.get("permutation") == [1, 0]} == {"0.weight", "2.weight"}
        torch.testing.assert_close(handle(x), model(x))
        torch.testing.assert_close(arrayref(x), model(x))
        torch.manual_seed(1)
        new = {k: torch.randn_like(v) / 8 for k, v in model.state_dict().items()}
        handle.update_weights(new)
        arrayref.update_weights(new)
        model.load_state_dict(new)
        torch.testing.assert_close(handle(x), model(x))
        torch.testing.assert_close(arrayref(x), model(x))


@pytest.mark.parametrize("outputs", [10, 16, 48, 64, 96])
def test_narrow_products_sum_in_interleaved_chains_and_match_eager(outputs, tmp_path):
    """A product narrower than a wide block cuts its reduced loop into chains (`chains`); 10
    outputs are less than one vector, 48 and 96 no power of two."""
    torch.manual_seed(outputs)
    model = torch.nn.Sequential(torch.nn.Linear(48, 64), torch.nn.GELU(), torch.nn.Linear(64, outputs)).eval()
    captured = _capture(model, (torch.randn(1, 48),), False)
    program = verify(lower_captured(dataclasses.replace(captured, owned=frozenset(captured.constants))))
    lanes = lane_tiles.lanes(torch.float32)
    width = column_reduction.WIDE_VECTORS * lanes
    block = outputs if outputs <= width else next(w for w in range(width, 0, -lanes) if outputs % w == 0)
    expected = max(1, column_reduction.WIDE_VECTORS // -(-block // lanes))
    expected = next(c for c in range(expected, 0, -1) if 64 % c == 0)
    sources = [s for s in _kernels(program) if "rc < " in s or f"xb += {block})" in s]
    if expected > 1:
        assert any(f"rc < {expected};" in s for s in sources), _kernels(program)
    with torch.no_grad():  # a package owns its weights: the K-major layout and the chained sums
        compiled = wrapgen.load_package(wrapgen.aot_compile(model, (torch.randn(1, 48),), tmp_path / "p.wgpkg"))
    for _ in range(3):
        x = torch.randn(1, 48)
        torch.testing.assert_close(compiled(x), model(x))


def test_dynamic_rows_keep_the_layout():
    captured = _capture(_mlp(), (torch.randn(2, 64),), True)
    program = lower_captured(dataclasses.replace(captured, owned=frozenset(captured.constants)))
    assert not any(c.permutation for c in program.constants), str(program)


def test_the_verifier_rejects_a_permuted_constant_that_is_not_contiguous():
    program = wrapgen.lower(_Lifted(), (torch.randn(1, 64),))
    bad = Constant("w", TensorType(torch.float32, torch.device("cpu"), (64, 256), (1, 64)), "w1", None, (1, 0))
    with pytest.raises(VerificationError, match="contiguous"):
        verify(dataclasses.replace(program, constants=(*program.constants, bad)))
    wrong = dataclasses.replace(bad, type=TensorType(torch.float32, torch.device("cpu"), (64, 256), (256, 1)), permutation=(0, 0))
    with pytest.raises(VerificationError, match="permutation"):
        verify(dataclasses.replace(program, constants=(*program.constants, wrong)))
