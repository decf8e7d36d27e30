"""select-kernels on a stacked matmul whose packed weights are views of parameters.

After `optimize` (stack-shared-matmuls) three matmuls sharing x are one batched matmul: each
weight is reshaped to [1, k, n], the three concatenated, the product split and each piece
reshaped back. The CUDA backend's elementwise region for the concat reads the reshapes by value
(views of its inputs), i.e. it reads the weights themselves; the segment cut that fell between
the first reshape and the concat left that region reading an argument its segment's problem
did not hold (a KeyError in the solver). Checked here: the plan of that function (written as
`optimize` leaves it, and made by `optimize` from the three matmuls), with the values on the
host and on the (stand-in) device, f32 and bf16, numpy alone and numpy + cuda, run against
float64 on fresh random inputs; and the same with a computed value (not an argument) under the
view.
"""

from __future__ import annotations

import secrets

import ml_dtypes
import numpy as np
import pytest
from test_planner_split_view import stand_in  # noqa: F401 (the fixture)

import tgc
from tgc.dialects.kernel import CallOp
from tgc.pass_manager import PassManager
from tgc.planner.backends import cuda_kernels as ck
from tgc.planner.executor import run_plan
from tgc.planner.kernel import rel_error
from tgc.planner.select import select_kernels


def qkv_text(dtype: str, m: int, k: int, n: int) -> str:
    """q, k, v of x (m x k) by three parameter weights (k x n), all three returned."""
    x, w, y = (f"tensor<{a}x{b}x{dtype}>" for a, b in ((m, k), (k, n), (m, n)))
    lines = [
        f"func.func @qkv(%x: {x}, %wq: {w} {{tgc.param}}, %wk: {w} {{tgc.param}}, "
        f"%wv: {w} {{tgc.param}}) -> ({y}, {y}, {y}) {{"
    ]
    lines += [f"  %{p} = atomic.matmul %x, %w{p} : ({x}, {w}) -> {y}" for p in "qkv"]
    lines += [f"  func.return %q, %k, %v : {y}, {y}, {y}", "}"]
    return "\n".join(lines)


DTYPES = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
# Normwise error of the planned products against float64 on the same (rounded) inputs: f32
# sums of 32 terms, and bf16 results (8 significant bits: 2^-8 a rounding, with margin).
TOLERANCE = {"f32": 1e-5, "bf16": 1e-2}


def _types(rows: int, d: int, dtype: str, space: str | None):
    enc = f', "{space}"' if space else ""
    return (
        f"tensor<{rows}x{d}x{dtype}{enc}>",
        f"tensor<{d}x{d}x{dtype}{enc}>",
        f"tensor<1x{d}x{d}x{dtype}{enc}>",
        f"tensor<3x{d}x{d}x{dtype}{enc}>",
        f"tensor<3x{rows}x{d}x{dtype}{enc}>",
        f"tensor<1x{rows}x{d}x{dtype}{enc}>",
    )


def stacked_qkv_text(
    rows: int = 64, d: int = 32, dtype: str = "f32", space: str | None = None, scaled=False
) -> str:
    """The qkv function as `optimize` leaves it; `scaled`: wq doubled first (the view's operand a
    computed value, not an argument)."""
    x, w, w1, w3, p, p1 = _types(rows, d, dtype, space)
    q_in = "%wq2" if scaled else "%wq"
    scale = f"  %wq2 = atomic.add %wq, %wq : ({w}, {w}) -> {w}\n" if scaled else ""
    return f"""
func.func @qkv(%x: {x}, %wq: {w} {{tgc.param}}, %wk: {w} {{tgc.param}}, %wv: {w} {{tgc.param}}) -> ({x}, {x}, {x}) {{
{scale}  %0 = atomic.reshape {q_in} : ({w}) -> {w1}
  %1 = atomic.reshape %wk : ({w}) -> {w1}
  %2 = atomic.reshape %wv : ({w}) -> {w1}
  %3 = atomic.concat %0, %1, %2 {{axis = 0}} : ({w1}, {w1}, {w1}) -> {w3}
  %4 = atomic.matmul %x, %3 : ({x}, {w3}) -> {p}
  %5, %6, %7 = atomic.split %4 {{axis = 0, sizes = [1, 1, 1]}} : ({p}) -> ({p1}, {p1}, {p1})
  %q = atomic.reshape %5 : ({p1}) -> {x}
  %k = atomic.reshape %6 : ({p1}) -> {x}
  %v = atomic.reshape %7 : ({p1}) -> {x}
  func.return %q, %k, %v : {x}, {x}, {x}
}}
"""


def _plan(text: str, dtype: str, backends: tuple[str, ...]):
    module = tgc.parse(text, "stacked.tg")
    func = module.funcs[0]
    select_kernels(func, None, tolerance=TOLERANCE[dtype], backends=backends)
    tgc.verify(module)
    return func


def _check(func, dtype: str, scaled: bool = False) -> None:
    """The planned function against float64 numpy on fresh random inputs (twice)."""
    for _ in range(2):
        seed = secrets.randbits(32)
        rng = np.random.default_rng(seed)
        x, wq, wk, wv = (
            rng.standard_normal(a.type.shape).astype(DTYPES[dtype]) for a in func.body.args
        )
        x64 = x.astype(np.float64)
        wq64 = wq.astype(np.float64) * (2 if scaled else 1)
        want = [x64 @ wq64, x64 @ wk.astype(np.float64), x64 @ wv.astype(np.float64)]
        got = run_plan(func, [x, wq, wk, wv])
        assert len(got) == 3
        for g, w in zip(got, want):
            assert g.shape == w.shape
            assert rel_error(g, w) <= TOLERANCE[dtype], (seed, rel_error(g, w))


CASES = [
    ("f32", None),
    ("bf16", None),
    ("f32", "cuda"),  # on the device: the concat a generated region reading the weights
    ("bf16", "cuda"),
]


@pytest.mark.parametrize("scaled", [False, True], ids=["argument", "computed"])
@pytest.mark.parametrize("dtype, space", CASES)
def test_the_stacked_qkv_plans_and_matches_float64(stand_in, dtype, space, scaled):  # noqa: F811
    func = _plan(
        stacked_qkv_text(dtype=dtype, space=space, scaled=scaled), dtype, ("numpy", "cuda")
    )
    _check(func, dtype, scaled)


def test_on_the_device_the_concat_region_reads_the_weights_by_value(stand_in):  # noqa: F811
    """The case that failed: the concat's region reads the reshapes by value, so its kernel's
    operands are the weights themselves; the plan holds it and computes the products."""
    func = _plan(stacked_qkv_text(space="cuda"), "f32", ("numpy", "cuda"))
    weights = set(func.body.args[1:])
    regions = [
        op
        for op in func.body.ops
        if isinstance(op, CallOp) and op.attr("callee") == "cuda.elementwise"
    ]
    assert any(set(op.operands) == weights for op in regions), [str(op) for op in regions]
    callees = [op.attr("callee") for op in func.body.ops if isinstance(op, CallOp)]
    assert ck.SPLIT_VIEW in callees, callees
    _check(func, "f32")


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_optimize_then_select_kernels_on_three_matmuls_sharing_x(stand_in, dtype):  # noqa: F811
    module = tgc.parse(qkv_text(dtype, 64, 32, 32), "qkv.tg")
    PassManager.from_text("optimize").run(module)
    func = module.funcs[0]
    assert any(op.name == "atomic.concat" for op in func.body.ops), str(func)  # stacked
    select_kernels(func, None, tolerance=TOLERANCE[dtype], backends=("numpy", "cuda"))
    tgc.verify(module)
    _check(func, dtype)


@pytest.mark.parametrize("scaled", [False, True], ids=["argument", "computed"])
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_numpy_alone_plans_the_stacked_qkv(dtype, scaled):
    func = _plan(stacked_qkv_text(dtype=dtype, scaled=scaled), dtype, ("numpy",))
    _check(func, dtype, scaled)
