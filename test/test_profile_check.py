"""Checking an instance before it is timed (planner/profile.py `measure`), on the host path that
runs without PyTorch (CI has none): `rel_error`'s one-sweep path gives the general rule's value
on every kind of input, and the op-by-op evaluation in the program's types (which only widens
the allowance) is run only where it can change the verdict, with the same verdicts as before.
The PyTorch path is test/test_profile_torch_check.py."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tgc.planner import load_backends, profile
from tgc.planner.kernel import Kernel, rel_error
from tgc.planner.profile import HostCheck, Instance, measure
from tgc.types import TensorType

load_backends(["numpy"])


def general_rel_error(got, want) -> float:
    """planner/kernel.py's rule as stated (and as it was computed until the one-sweep path)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return math.inf
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    if same.all():
        return 0.0
    if not (np.isfinite(got) | same).all() or not (np.isfinite(want) | same).all():
        return math.inf
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(got - want))
    scale = np.max(np.abs(np.where(np.isfinite(want), want, 0.0)), initial=0.0)
    return float(diff.max() / scale) if scale > 0 else math.inf


def error_cases(seed: int):
    """(got, want) pairs of every kind: close, equal, zeros, NaN and infinities that coincide
    or not, differences that overflow, empty, 16-bit and boolean results."""
    rng = np.random.default_rng(seed)
    want = rng.standard_normal((7, 33))
    close = want + 1e-6 * rng.standard_normal(want.shape)
    yield close.astype(np.float32), want
    yield want.copy(), want
    yield np.zeros(5), np.zeros(5)
    yield np.zeros(5), np.full(5, 1e-300)
    yield np.full(5, 1e-300), np.zeros(5)
    yield np.zeros((0, 3)), np.zeros((0, 3))
    yield np.zeros(4), np.zeros(5)
    yield close.astype("bfloat16"), want
    yield rng.random(9) < 0.5, (rng.random(9) < 0.5).astype(np.float64)
    yield np.array([1e308, -1e308]), np.array([-1e308, 1e308])  # the difference overflows
    for special in (np.nan, np.inf, -np.inf):
        for where in ("got", "want", "both"):
            g, w = close.copy(), want.copy()
            at = tuple(rng.integers(0, n) for n in want.shape)
            if where in ("got", "both"):
                g[at] = special
            if where in ("want", "both"):
                w[at] = special
            yield g, w
    nan_and_inf = want.copy()
    nan_and_inf[0, 0], nan_and_inf[1, 1] = np.nan, np.inf
    yield nan_and_inf, nan_and_inf.copy()
    yield nan_and_inf + 1e-3, nan_and_inf  # specials coincide, finite values differ


@pytest.mark.parametrize("seed", range(5))
def test_rel_error_gives_the_general_rules_value(seed):
    checked = 0
    for got, want in error_cases(seed):
        with np.errstate(all="ignore"):
            assert rel_error(got, want) == general_rel_error(got, want), (got, want)
        checked += 1
    assert checked > 15


# A function whose op-by-op evaluation in f32 loses about 1e-3 of its result to cancellation:
# (1e4 a + b) - 1e4 a is b, but f32 rounds 1e4 a + b to 1e4 |a| * 6e-8. A kernel computing it
# the same way is as far from float64 as the native evaluation is: it passes only by the
# allowance's 4x the native error, far above its 8 ulp.
CANCEL = """
func.func @cancel(%a: tensor<64x32xf32>, %b: tensor<64x32xf32>) -> tensor<64x32xf32> {
  %c = atomic.constant {value = dense<1.0e4> : tensor<f32>} : () -> tensor<f32>
  %big = atomic.mul %a, %c : (tensor<64x32xf32>, tensor<f32>) -> tensor<64x32xf32>
  %s = atomic.add %big, %b : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
  %y = atomic.sub %s, %big : (tensor<64x32xf32>, tensor<64x32xf32>) -> tensor<64x32xf32>
  func.return %y : tensor<64x32xf32>
}
"""


def cancelling(factor: float):
    def run(inputs, attrs, result_types):
        a, b = (np.asarray(x, np.float32) for x in inputs)
        big = a * np.float32(1e4)
        return [((big + b) - big) * np.float32(factor)]

    return run


@pytest.fixture
def evaluations(monkeypatch):
    """The precisions the host check evaluated the reference at, in order."""
    seen = []
    reference = HostCheck.reference

    def counted(self, precision):
        seen.append(precision)
        return reference(self, precision)

    monkeypatch.setattr(HostCheck, "reference", counted)
    # the host's check whatever else is registered (test_profile_torch_check.py: torch's)
    monkeypatch.setattr(profile, "checker", _host_checker)
    return seen


def _host_checker(inst, ref, seed):
    return HostCheck(ref, inst.kernel.space, seed)


@pytest.mark.parametrize(
    "factor, ok, native",
    [
        (1.0, True, True),  # passes by 4x the native error alone: the native evaluation ran
        (1.02, False, True),  # 2% off: fails even with it
    ],
)
def test_the_native_evaluation_decides_where_the_error_exceeds_the_floor(
    evaluations, factor, ok, native
):
    x = TensorType.get((64, 32), "f32")
    kernel = Kernel("numpy.test_cancel", "numpy", reference=CANCEL, run=cancelling(factor))
    m = measure(Instance(kernel, (x, x), (x,)), min_time=0.001)
    assert m.ok is ok, m.message
    assert m.max_error > 8 * np.finfo(np.float32).eps  # above the floor: the native one decides
    assert evaluations == ["f64", "native"]


def test_a_kernel_within_the_floor_is_not_evaluated_natively(evaluations):
    x = TensorType.get((64, 32), "f32")
    kernel = Kernel("numpy.test_exact", "numpy", op="atomic.exp", run=_exp)
    m = measure(Instance(kernel, (x,), (x,)), min_time=0.001)
    assert m.ok and m.max_error <= 8 * np.finfo(np.float32).eps
    assert evaluations == ["f64"]


def _exp(inputs, attrs, result_types):
    return [np.exp(inputs[0]).astype(result_types[0].dtype)]


def test_without_torch_the_host_checks(monkeypatch):
    """With no torch backend registered, `checker` is the host's (numpy's), as before."""
    from tgc.planner.backends import BACKENDS

    for name in profile.TORCH_BACKENDS:
        monkeypatch.delitem(BACKENDS, name, raising=False)
    x = TensorType.get((8, 8), "f32")
    inst = Instance(Kernel("numpy.test_exp", "numpy", op="atomic.exp", run=_exp), (x,), (x,))
    assert type(profile.checker(inst, profile.reference_function(inst), 0)) is HostCheck
