"""Views in a CUDA plan (codegen/plan.py): a slice that is one contiguous range of its operand
is a pointer into the operand's buffer, never a kernel; a function result that is such a view is
an output at that place, whose base then stays live to the end of a call. The QKV projection the
`algebraic` pass stacks (one batched matmul, x shared) returns its three products that way.
Plans are built on the CPU; the test marked `cuda` runs one on the GPU against float64.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import tgc
from tgc.codegen.plan import Gemm, Launch, build_plan
from tgc.parser import parse_module
from tgc.pass_manager import PassManager

tgc.load_all()
NUMPY = {"f32": np.float32, "bf16": ml_dtypes.bfloat16}
BOUND = {"f32": 1e-5, "bf16": 1e-2}  # relative Frobenius error (cuBLAS fp32; one bf16 rounding)


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


def stacked_plan(dtype: str, m: int, k: int, n: int):
    module = parse_module(qkv_text(dtype, m, k, n))
    PassManager.from_text("optimize,cuda").run(module)
    return build_plan(module.funcs[0])


def test_stacked_qkv_is_one_gemm_and_its_results_are_views():
    plan = stacked_plan("bf16", 200, 96, 80)
    gemm = next(s for s in plan.steps if isinstance(s, Gemm))
    assert [type(s) for s in plan.steps] == [Launch, Gemm]  # the packing, then one GEMM
    assert plan.prologue == [0]
    assert (gemm.batch, gemm.m, gemm.n, gemm.k, gemm.stride_a) == (3, 200, 80, 96, 0)
    outputs = sorted((b for b in plan.buffers if b.kind == "output"), key=lambda b: b.index)
    piece = 200 * 80 * 2
    assert [b.base for b in outputs] == [gemm.c] * 3
    assert [b.view_offset for b in outputs] == [0, piece, 2 * piece]


def test_a_returned_view_keeps_its_base_alive_to_the_end():
    """No later buffer takes the bytes of a base whose view the function returns."""
    text = """func.func @f(%x: tensor<4x8xf32>) -> (tensor<2x8xf32>, tensor<4x8xf32>) {
  %e = atomic.exp %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %a, %b = atomic.split %e {axis = 0, sizes = [2, 2]} : (tensor<4x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>)
  %t = atomic.neg %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %u = atomic.mul %t, %t : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  func.return %b, %u : tensor<2x8xf32>, tensor<4x8xf32>
}"""
    module = parse_module(text)
    PassManager.from_text("place-on-device").run(module)
    plan = build_plan(module.funcs[0])
    (view,) = [b for b in plan.buffers if b.kind == "output" and b.base is not None]
    base = view.base
    assert view.view_offset == 2 * 8 * 4 and base.kind == "scratch"
    others = [b for b in plan.buffers if b.kind == "scratch" and b is not base]
    assert others, "the neg's result is a scratch buffer read after the exp"
    for b in others:  # disjoint bytes in the arena
        assert b.offset + b.nbytes <= base.offset or base.offset + base.nbytes <= b.offset


def test_the_standalone_plan_copies_a_returned_view():
    module = parse_module(qkv_text("f32", 16, 8, 8))
    PassManager.from_text("optimize,cuda-standalone").run(module)
    plan = build_plan(module.funcs[0], library_matmul=False, returned_views=False)
    copies = [s for s in plan.steps if type(s).__name__ == "DeviceCopy"]
    assert [c.src.view_offset for c in copies] == [0, 16 * 8 * 4, 2 * 16 * 8 * 4]
    assert all(b.base is None for b in plan.buffers if b.kind == "output")


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("m,k,n", [(200, 96, 80), (1, 64, 48), (333, 130, 67)])
def test_stacked_qkv_matches_float64(dtype, m, k, n):
    """Outputs poisoned with NaN first; a second call with a new x reuses the packed weights."""
    from tgc.runtime.cuda_executor import CudaPlanRunner

    runner = CudaPlanRunner(stacked_plan(dtype, m, k, n))
    runner.poison()
    rng = np.random.default_rng([m, k, n])
    weights = [(k**-0.5 * rng.standard_normal((k, n))).astype(NUMPY[dtype]) for _ in range(3)]
    for _ in range(2):
        x = rng.standard_normal((m, k)).astype(NUMPY[dtype])
        got = runner.run([x, *weights])
        for g, w in zip(got, weights):
            want = x.astype(np.float64) @ w.astype(np.float64)
            g64 = g.astype(np.float64)
            assert np.isfinite(g64).all()
            assert np.linalg.norm(g64 - want) / np.linalg.norm(want) < BOUND[dtype]
    assert runner.prologue_runs == 1


def test_a_prologue_result_read_through_a_view_keeps_its_bytes_for_every_call():
    """The packed weights (a prologue step's result) read by a per-call GEMM through a
    contiguous slice: no per-call buffer may take their bytes (here the neg's result, written
    after the GEMM's last read), or the second call would read whatever was written there."""
    text = """func.func @f(%x: tensor<16x8xf32>, %wa: tensor<8x8xf32> {tgc.param}, %wb: tensor<8x8xf32> {tgc.param}) -> tensor<16x8xf32> {
  %w = atomic.concat %wa, %wb {axis = 0} : (tensor<8x8xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
  %w1 = atomic.slice %w {start = [8, 0], stop = [16, 8], step = [1, 1]} : (tensor<16x8xf32>) -> tensor<8x8xf32>
  %e = atomic.exp %x : (tensor<16x8xf32>) -> tensor<16x8xf32>
  %y = atomic.matmul %e, %w1 : (tensor<16x8xf32>, tensor<8x8xf32>) -> tensor<16x8xf32>
  %n = atomic.neg %y : (tensor<16x8xf32>) -> tensor<16x8xf32>
  %z = atomic.exp %n : (tensor<16x8xf32>) -> tensor<16x8xf32>
  func.return %z : tensor<16x8xf32>
}"""
    module = parse_module(text)
    PassManager.from_text("place-on-device").run(module)
    plan = build_plan(module.funcs[0])
    gemm = next(s for s in plan.steps if isinstance(s, Gemm))
    packed = gemm.b.root
    assert gemm.b.base is packed and gemm.b.view_offset == 8 * 8 * 4
    assert plan.prologue == [0] and packed.kind == "scratch"
    for b in plan.buffers:
        if b.kind == "scratch" and b is not packed:
            assert b.offset + b.nbytes <= packed.offset or packed.offset + packed.nbytes <= b.offset
