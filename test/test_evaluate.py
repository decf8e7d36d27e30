"""tgc.evaluate, the op evaluator every consumer shares (the interpreter, the rule checker, the
region ops), and tgc.patterns.erase_dead_ops, the dead-op helper of dce and fuse. Numbers are checked against numpy float64 on fresh random inputs."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.evaluate import WIDENED_DTYPES, evaluate_block, widened
from tgc.pass_manager import PassStatistics
from tgc.patterns import erase_dead_ops
from tgc.types import NUMPY_DTYPES

F16 = NUMPY_DTYPES["f16"]

# exp(x) * x, once as plain ops, once in a kernel.fused region, once in a kernel.call region.
REGIONS = """
func.func @f(%x: tensor<3x5xT>) -> (tensor<3x5xT>, tensor<3x5xT>, tensor<3x5xT>) {
  %e = atomic.exp %x : (tensor<3x5xT>) -> tensor<3x5xT>
  %p = atomic.mul %e, %x : (tensor<3x5xT>, tensor<3x5xT>) -> tensor<3x5xT>
  %k = kernel.fused %x {name = "k"} : (tensor<3x5xT>) -> tensor<3x5xT> {
  ^bb0(%a: tensor<3x5xT>):
    %ea = atomic.exp %a : (tensor<3x5xT>) -> tensor<3x5xT>
    %pa = atomic.mul %ea, %a : (tensor<3x5xT>, tensor<3x5xT>) -> tensor<3x5xT>
    kernel.yield %pa : tensor<3x5xT>
  }
  %c = kernel.call %x {callee = "lib.exp_times"} : (tensor<3x5xT>) -> tensor<3x5xT> {
  ^bb0(%b: tensor<3x5xT>):
    %eb = atomic.exp %b : (tensor<3x5xT>) -> tensor<3x5xT>
    %pb = atomic.mul %eb, %b : (tensor<3x5xT>, tensor<3x5xT>) -> tensor<3x5xT>
    kernel.yield %pb : tensor<3x5xT>
  }
  func.return %p, %k, %c : tensor<3x5xT>, tensor<3x5xT>, tensor<3x5xT>
}
"""


def regions(element_type: str):
    return tgc.parse(REGIONS.replace("xT>", f"x{element_type}>")).funcs[0]


def test_widened_computes_16_bit_floats_in_f32():
    assert WIDENED_DTYPES == {NUMPY_DTYPES["f16"], NUMPY_DTYPES["bf16"]}
    for name in ("f16", "bf16"):
        a = np.ones(3, dtype=NUMPY_DTYPES[name])
        assert widened(a).dtype == np.float32
    for name in ("f32", "f64", "i32", "i1"):
        a = np.ones(3, dtype=NUMPY_DTYPES[name])
        assert widened(a) is a


SUM = """
func.func @f(%x: tensor<4096xT>) -> tensor<T> {
  %s = atomic.reduce_sum %x {axes = [0]} : (tensor<4096xT>) -> tensor<T>
  func.return %s : tensor<T>
}
"""


# One ulp of each 16-bit type between 4096 and 8192, where these sums land.
ULP_NEAR_6000 = {"f16": 4.0, "bf16": 32.0}


@pytest.mark.parametrize("element_type", ["f16", "bf16"])
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_a_16_bit_sum_accumulates_in_f32(element_type, seed):
    """4096 values in [1, 2) summed in f32 and rounded once: the float64 sum within one ulp of
    the 16-bit type (a bf16 accumulator would stop growing at 512)."""
    text = SUM.replace("xT>", f"x{element_type}>").replace("<T>", f"<{element_type}>")
    func = tgc.parse(text).funcs[0]
    dtype = NUMPY_DTYPES[element_type]
    x = (np.random.default_rng(seed).random(4096) + 1.0).astype(dtype)
    (out,) = evaluate_block(func.body, [x], "native")
    assert out.dtype == dtype
    assert out == np.sum(x.astype(np.float32)).astype(dtype)
    exact = np.sum(x.astype(np.float64))
    assert 4096 <= exact < 8192
    assert abs(float(out) - exact) <= ULP_NEAR_6000[element_type]


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_f64_precision_evaluates_regions_in_float64(seed):
    """Plain ops and both region ops agree with numpy float64 to 1e-12 (f32 would miss)."""
    func = regions("f32")
    x = np.random.default_rng(seed).standard_normal((3, 5))
    want = np.exp(x) * x
    with np.errstate(all="ignore"):
        outs = evaluate_block(func.body, [x], "f64")
    for out in outs:
        assert out.dtype == np.float64
        np.testing.assert_allclose(out, want, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_native_precision_rounds_each_result_inside_regions_too(seed):
    """On f16 every op computes in f32 and stores f16, in a region as outside one: the three
    results are identical, and equal exp then mul each rounded to f16 (float64 within f16's
    rounding of the f64 value)."""
    func = regions("f16")
    x = np.random.default_rng(seed).standard_normal((3, 5)).astype(F16)
    with np.errstate(all="ignore"):
        plain, fused, called = evaluate_block(func.body, [x], "native")
    step = (np.exp(x.astype(np.float32)).astype(F16).astype(np.float32) * x).astype(F16)
    for out in (plain, fused, called):
        assert out.dtype == F16
        np.testing.assert_array_equal(out, step)
    exact = np.exp(x.astype(np.float64)) * x.astype(np.float64)
    np.testing.assert_allclose(plain.astype(np.float64), exact, rtol=2e-3, atol=1e-3)


def test_region_ops_have_a_reference_of_their_own():
    """`reference` of kernel.fused and kernel.call evaluates the region (it used to need the
    interpreter: the call's raised NotImplementedError)."""
    func = regions("f64")
    fused, call = (op for op in func.body.ops if op.name.startswith("kernel."))
    x = np.random.default_rng(3).standard_normal((3, 5))
    np.testing.assert_allclose(fused.reference(x), np.exp(x) * x, rtol=1e-12)
    (out,) = call.reference(x, precision="f64")
    np.testing.assert_allclose(out, np.exp(x) * x, rtol=1e-12)


# -- erase_dead_ops ----------------------------------------------------------------------------

DEAD = """
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %a = atomic.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %b = atomic.reshape %a : (tensor<4xf32>) -> tensor<2x2xf32>
  %c = atomic.transpose %b {perm = [1, 0]} : (tensor<2x2xf32>) -> tensor<2x2xf32>
  %k = kernel.fused %x {name = "k"} : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%p: tensor<4xf32>):
    %dead = atomic.neg %p : (tensor<4xf32>) -> tensor<4xf32>
    kernel.yield %p : tensor<4xf32>
  }
  func.return %k : tensor<4xf32>
}
"""


def names(block) -> list[str]:
    return [op.name for op in block.ops]


def test_erase_dead_ops_takes_a_dead_chain_in_one_walk():
    func = tgc.parse(DEAD).funcs[0]
    stats = PassStatistics()
    assert erase_dead_ops(func.body, stats, "gone") == 4
    assert names(func.body) == ["kernel.fused", "func.return"]
    assert names(func.body.first.regions[0].block) == ["kernel.yield"]  # the neg in the region
    assert stats.counters == {"gone": 4}


def test_erase_dead_ops_filter_and_nesting():
    """`only` keeps the dead ops it does not name (the exp under a dead view chain); without
    `nested` the region is left alone; nothing erased adds no counter."""
    func = tgc.parse(DEAD).funcs[0]
    stats = PassStatistics()
    views = erase_dead_ops(func.body, stats, nested=False, only=lambda op: op.name != "atomic.exp")
    assert views == 2
    assert names(func.body) == ["atomic.exp", "kernel.fused", "func.return"]
    fused = next(op for op in func.body.ops if op.name == "kernel.fused")
    assert names(fused.regions[0].block) == ["atomic.neg", "kernel.yield"]
    assert erase_dead_ops(func.body, stats, "again", nested=False, only=lambda op: False) == 0
    assert "again" not in stats.counters
