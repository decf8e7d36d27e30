"""GPU tests (marker `cuda`) of parameters: the plan's prologue runs once per set of parameter
arrays (runtime/cuda_executor.py, codegen/plan.py).

The merged Q/K/V projection with `{tgc.param}` weights packs its weights in the prologue; later
calls with a new x reuse the packed weights, a new array for a weight packs again. Results are
compared with numpy in float64 on the same (rounded) inputs, on fresh random inputs at odd sizes,
with outputs and scratch poisoned with NaN bytes before the first run. Error bounds: relative
Frobenius error 1e-5 for f32 (cuBLAS in fp32, no TF32), 1e-2 for bf16 (one rounding of the
output, 2^-8, plus accumulation order).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

from tgc.codegen.plan import Gemm, Launch, build_plan, step_reads
from tgc.parser import parse_module
from tgc.pass_manager import PassManager

pytestmark = pytest.mark.cuda
BOUND = {"f32": 1e-5, "bf16": 1e-2}
NUMPY = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}


def qkv_text(dtype: str, m: int, k: int, n: int) -> str:
    """QKV merged by concat, written out (algebraic would stack returned products instead:
    test/test_plan_views.py), so that the plan packs the weights in its prologue and copies the
    returned column pieces out."""
    x, w, y = (f"tensor<{a}x{b}x{dtype}>" for a, b in ((m, k), (k, n), (m, n)))
    w3, y3 = f"tensor<{k}x{3 * n}x{dtype}>", f"tensor<{m}x{3 * n}x{dtype}>"
    return f"""func.func @qkv(%x: {x}, %wq: {w} {{tgc.param}}, %wk: {w} {{tgc.param}}, %wv: {w} {{tgc.param}}) -> ({y}, {y}, {y}) {{
  %w = atomic.concat %wq, %wk, %wv {{axis = 1}} : ({w}, {w}, {w}) -> {w3}
  %m = atomic.matmul %x, %w : ({x}, {w3}) -> {y3}
  %q, %k, %v = atomic.split %m {{axis = 1, sizes = [{n}, {n}, {n}]}} : ({y3}) -> ({y}, {y}, {y})
  func.return %q, %k, %v : {y}, {y}, {y}
}}"""


def placed(text: str):
    module = parse_module(text)
    PassManager.from_text("cuda").run(module)
    return module.funcs[0]


def draw(rng, shape, dtype: str, scale: float = 1.0) -> np.ndarray:
    return (scale * rng.standard_normal(shape)).astype(NUMPY[dtype])


def check_qkv(got, x, weights, dtype: str) -> None:
    x64 = x.astype(np.float64)
    for g, w in zip(got, weights):
        want = x64 @ w.astype(np.float64)
        assert g.dtype == NUMPY[dtype]
        g64 = g.astype(np.float64)
        assert np.isfinite(g64).all()
        err = np.linalg.norm(g64 - want) / np.linalg.norm(want)
        assert err < BOUND[dtype], f"relative error {err:.2e}"


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("m,k,n", [(200, 96, 80), (1, 64, 48), (333, 130, 67)])
def test_merged_qkv_packs_once_and_repacks_on_new_params(dtype, m, k, n):
    from tgc.runtime.cuda_executor import CudaPlanRunner

    func = placed(qkv_text(dtype, m, k, n))
    plan = build_plan(func)
    (first,) = plan.prologue
    assert isinstance(plan.steps[first], Launch)  # the concat of the three weights
    assert sum(isinstance(s, Gemm) for s in plan.steps) == 1  # merged
    rng = np.random.default_rng([m, k, n])
    weights = [draw(rng, (k, n), dtype, k**-0.5) for _ in range(3)]
    runner = CudaPlanRunner(plan)
    runner.poison()

    x = draw(rng, (m, k), dtype)
    check_qkv(runner.run([x, *weights]), x, weights, dtype)
    assert runner.prologue_runs == 1

    x = draw(rng, (m, k), dtype)  # a new x, the same parameter arrays: no packing
    check_qkv(runner.run([x, *weights]), x, weights, dtype)
    assert runner.prologue_runs == 1

    x[...] = draw(rng, (m, k), dtype)  # x changed in place: inputs are uploaded every call
    check_qkv(runner.run([x, *weights]), x, weights, dtype)
    assert runner.prologue_runs == 1

    weights[1] = draw(rng, (k, n), dtype, k**-0.5)  # a new array for one weight: pack again
    check_qkv(runner.run([x, *weights]), x, weights, dtype)
    assert runner.prologue_runs == 2

    weights[2] = weights[2].copy()  # equal values, another object: packed again (by identity)
    check_qkv(runner.run([x, *weights]), x, weights, dtype)
    assert runner.prologue_runs == 3


def test_poison_repeats_the_prologue():
    """poison() overwrites the packed weights with NaN bytes, so the next run packs again."""
    from tgc.runtime.cuda_executor import CudaPlanRunner

    runner = CudaPlanRunner(build_plan(placed(qkv_text("f32", 65, 33, 17))))
    rng = np.random.default_rng(7)
    weights = [draw(rng, (33, 17), "f32") for _ in range(3)]
    x = draw(rng, (65, 33), "f32")
    runner.run([x, *weights])
    runner.poison()
    check_qkv(runner.run([x, *weights]), x, weights, "f32")
    assert runner.prologue_runs == 2


def test_parameter_results_survive_later_calls():
    """A parameter returned as it is, and one computed from parameters only, come from the
    prologue; they stay right on later calls, beside a per-call result reading a parameter."""
    from tgc.runtime.cuda_executor import CudaPlanRunner

    t = "tensor<37x29xf32>"
    func = placed(f"""func.func @f(%x: {t}, %w: {t} {{tgc.param}}, %b: {t} {{tgc.param}}) -> ({t}, {t}, {t}) {{
  %wb = atomic.mul %w, %b : ({t}, {t}) -> {t}
  %e = atomic.exp %wb : ({t}) -> {t}
  %y = atomic.add %x, %b : ({t}, {t}) -> {t}
  func.return %y, %e, %w : {t}, {t}, {t}
}}""")
    plan = build_plan(func)
    assert plan.prologue and plan.per_call
    for i in plan.per_call:  # every per-call step reads x or a per-call result
        assert any(
            b.kind != "input" or b.index not in plan.params for b in step_reads(plan.steps[i])
        )
    runner = CudaPlanRunner(plan)
    runner.poison()
    rng = np.random.default_rng(11)
    w, b = draw(rng, (37, 29), "f32"), draw(rng, (37, 29), "f32")
    for _ in range(3):
        x = draw(rng, (37, 29), "f32")
        y, e, w_out = runner.run([x, w, b])
        np.testing.assert_allclose(y, x.astype(np.float64) + b, rtol=1e-6, atol=1e-6)
        np.testing.assert_allclose(e, np.exp(w.astype(np.float64) * b), rtol=1e-5, atol=1e-6)
        np.testing.assert_array_equal(w_out, w)
    assert runner.prologue_runs == 1


def test_profile_times_the_per_call_steps():
    from tgc.runtime.cuda_executor import CudaPlanRunner

    plan = build_plan(placed(qkv_text("bf16", 128, 64, 64)))
    runner = CudaPlanRunner(plan)
    rng = np.random.default_rng(3)
    runner.upload([draw(rng, (128, 64), "bf16")] + [draw(rng, (64, 64), "bf16") for _ in range(3)])
    times = runner.profile(reps=3)
    assert len(times) == len(plan.per_call) == len(plan.steps) - 1
    assert runner.prologue_runs == 1
    assert all(ms > 0 for _, ms in times)
