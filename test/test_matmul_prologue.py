"""The few-rows matmul with a prologue (codegen/matmul.py `a_prologue`): A computed in the kernel
from its inputs, as a decoding step's RMSNorm or layer norm before a projection and SiLU(gate) *
up before the down projection. The kernel's code and refusals, that the planner offers it for
few rows only, that nvcc compiles it without spills or warnings (no GPU needed), and on a GPU
its results against float64, outputs poisoned with NaN first.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from test_attention_tc import NVCC, compile_kernels
from test_matmul_wgmma import check_against_float64, fused_region
from test_planner_cuda import stand_in  # noqa: F401  (the fixture)

import tgc
from tgc.codegen.kernels import generate_kernel
from tgc.diagnostics import TgcError
from tgc.parser import parse_module
from tgc.pass_manager import PassManager

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))

from matmul_prologue import layer_norm_text, main, rms_norm_text, swiglu_text, t  # noqa: E402

SM90 = {"arch": "sm_90"}


def test_a_norm_before_a_few_rows_product_is_computed_where_a_is_read():
    """The few-rows skeleton without tensor cores: per row, the sum of squares by the warp's
    lanes and across it, then the scale; then A from x and the weight, once a block into
    shared memory in bf16, read there by the products as B is streamed."""
    k = generate_kernel(fused_region(rms_norm_text((1, 1), 64, 128)), dict(SM90))
    assert k.params["gemv"] is True and k.params["gemv_mma"] is False
    assert k.params["warps"] == 8 and k.block == (256, 1, 1)  # A computed by fewer blocks
    # a plain one-row product's 8 loads and two warps a column are not a prologue's defaults
    # (codegen/matmul_gemv.py: with them the planner put a decode step's norms apart again)
    assert (k.params["unroll"], k.params["split_k"]) == (4, 1)
    long = generate_kernel(fused_region(rms_norm_text((1, 1), 4096, 128)), dict(SM90))
    assert (long.params["unroll"], long.params["split_k"]) == (4, 1)
    assert "float rowv0[ROWS];" in k.source
    assert "__shared__ __align__(16) T a_tile[ROWS * K];" in k.source
    assert "a_tile[r * K + kk] = __float2bfloat16_rn(" in k.source
    assert "a_rows[r] = a_tile + r * K;" in k.source
    assert "acc[r][c] = dot(acc[r][c], av, bv[u][c]);" in k.source
    # B's first chunks are asked for before the prologue, used by the first step
    assert k.source.index("load_b(c_first, b_first);") < k.source.index("float rowv0[ROWS];")
    assert "if (c0 == c_first) {  // loaded before A was computed" in k.source
    # the block's warps split k: each sums its share, the shares meet in shared memory
    assert "for (idx_t kk = (idx_t) warp * 32 + lane; kk < 64; kk += 32 * WARPS)" in k.source
    assert "s = s + __shfl_xor_sync(0xffffffffu, s, o);" in k.source
    assert "if (lane == 0) shares[warp] = s;" in k.source and "s = s + shares[w];" in k.source
    assert "rsqrtf(rowv2[r])" in k.source and "rowv3[r]" in k.source
    # 8 rows of 4096 (64 KB) do not fit a block's static shared memory: each warp computes A's
    # values as it streams B
    wide = generate_kernel(fused_region(rms_norm_text((1, 8), 4096, 128)), dict(SM90))
    assert "a_tile" not in wide.source and "a_rows" not in wide.source
    assert "acc[r][c] = dot_a(acc[r][c], av, bv[u][c]);" in wide.source
    # four rows (two batch entries of two): rows of A at (z, m)
    four = generate_kernel(fused_region(rms_norm_text((2, 2), 64, 128)), dict(SM90))
    assert "ROWS = 4" in four.source and "const idx_t z = r / 2, m = r % 2;" in four.source


def test_two_reductions_and_an_epilogue():
    """A layer norm's variance reads its mean (a row value of the first reduction); the bias
    add is the epilogue."""
    k = generate_kernel(fused_region(layer_norm_text((1,), 128, 96)), dict(SM90))
    assert k.source.count("kk < 128; kk += 32 * WARPS)") == 2
    assert k.params["gemv"] is True


def test_an_elementwise_prologue_reads_the_packed_product_through_its_split():
    k = generate_kernel(fused_region(swiglu_text((1, 1), 96, 64)), dict(SM90))
    assert "rowv" not in k.source and "shares" not in k.source and "expf" in k.source
    assert "kk + 96" in k.source  # up: the second half of each row of the packed product


@pytest.mark.parametrize("skeleton", ["tensor_cores", "wgmma", "gemv_mma"])
def test_a_prologue_on_another_skeleton_is_refused(skeleton):
    r = fused_region(rms_norm_text((1, 1), 64, 128))
    with pytest.raises(TgcError, match="runs only on the few-rows skeleton") as info:
        generate_kernel(r, {**SM90, skeleton: True})
    assert info.value.loc is not None


def test_a_reduction_across_rows_is_refused():
    """A sum over the rows (one value a column, mixing the kernel's rows) is no prologue."""
    x, c, o = t((1, 4, 64), "bf16"), t((1, 1, 64), "bf16"), t((1, 4, 32), "bf16")
    text = f"""func.func @f(%x: {x}, %wt: {t((32, 64), "bf16")}) -> {o} {{
  %s = atomic.reduce_sum %x {{axes = [1], keepdims = true}} : ({x}) -> {c}
  %y = atomic.mul %x, %s : ({x}, {c}) -> {x}
  %o = atomic.matmul %y, %wt {{transpose_b = true}} : ({x}, {t((32, 64), "bf16")}) -> {o}
  func.return %o : {o}
}}"""
    with pytest.raises(TgcError, match="prologue reduces only along k") as info:
        generate_kernel(fused_region(text), dict(SM90))
    assert info.value.loc is not None


def _options(text: str):
    from tgc.planner.backends import cuda_kernels as ck

    module = tgc.parse(text)
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    (mm,) = [op for op in func.body.ops if op.name == "atomic.matmul"]
    with ck.planning_kernels("sm_90"):
        return [m.kernel.reference for m in ck.cuda_options(mm) if m.kernel.name == "cuda.matmul"]


def test_the_planner_offers_the_prologue_beside_the_plain_product_for_few_rows():
    few = _options(rms_norm_text((1, 1), 64, 128))
    assert any("atomic.reduce_sum" in ref for ref in few)
    assert any("atomic.reduce_sum" not in ref for ref in few)  # the product alone, still
    many = _options(rms_norm_text((1, 64), 64, 128))  # 64 rows: no few-rows kernel
    assert many and not any("atomic.reduce_sum" in ref for ref in many)


CASES = [
    (rms_norm_text((1, 1), 2048, 520), {}),
    (rms_norm_text((2, 3), 264, 200), {"columns": 2}),
    (layer_norm_text((1,), 768, 96), {}),
    (swiglu_text((1, 1), 344, 136), {"unroll": 8}),
    (rms_norm_text((1, 8), 4096, 72), {}),  # A too large for shared memory: computed per warp
]


def assert_compiled_without_spills_or_warnings(tmp_path, cases) -> None:
    """Each (function text, template parameters) of `cases` as one matmul region kernel,
    compiled by nvcc for sm_90: no spills, no warnings."""
    kernels = []
    for text, params in cases:
        k = generate_kernel(fused_region(text), {**SM90, **params})
        kernels.append((k, ("-arch=sm_90", "-cubin", "-Xptxas", "-v")))
    logs = compile_kernels(tmp_path, kernels)
    bad = [
        log[-2000:]
        for log in logs
        if "0 bytes spill stores, 0 bytes spill loads" not in log or "warning" in log
    ]
    assert not bad, "\n\n".join(bad)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_prologue_kernels_compile_without_spills_or_warnings(tmp_path):
    assert_compiled_without_spills_or_warnings(tmp_path, CASES)


@pytest.mark.cuda
@pytest.mark.parametrize("text, params", CASES)
def test_prologue_matmul_matches_float64(text, params):
    fused = fused_region(text)
    kernel = generate_kernel(fused, dict(params))
    check_against_float64(parse_module(text).funcs[0], fused, kernel)


def test_the_benchmarks_dry_run_generates_every_case(capsys):
    assert main(["--dry-run", "--rows", "1,4"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 14 and all("'gemv': True, 'gemv_mma': False" in x for x in lines)


def assert_planned_as_one_kernel(text: str, names: set[str]) -> None:
    """On the stand-in device (regions run by their reference on the host, each template
    kernel costing the same), the plan of `text` (f32) has one kernel holding ops of every name
    in `names`, and computes the float64 result on three seeds' inputs."""
    import numpy as np
    from test_planner_cuda import CUDA_CHEAP

    from tgc.dialects.kernel import CallOp
    from tgc.planner.executor import run_plan
    from tgc.planner.select import select_kernels
    from tgc.runtime.interpreter import random_inputs, run_function

    module = tgc.parse(text)
    tgc.run_pipeline(module, "lower-hl")
    func = module.funcs[0]
    select_kernels(func, CUDA_CHEAP, tolerance=1e-5, backends=("cuda",))
    calls = [op for op in func.body.ops if isinstance(op, CallOp)]
    whole = [op for op in calls if names <= {x.name for x in op.body.ops}]
    assert len(whole) == 1, [op.attr("callee") for op in calls]
    reference = tgc.parse(text).funcs[0]
    for seed in range(3):
        inputs = random_inputs(reference, seed)
        (want,) = run_function(reference, inputs, "f64")
        (got,) = run_plan(func, inputs)
        assert float(np.max(np.abs(got - want))) <= 1e-4 * float(np.max(np.abs(want)))


@pytest.mark.usefixtures("stand_in")
def test_a_planned_norm_and_product_run_as_one_kernel_matching_float64():
    """The plan of a layer norm before a one-row product with a bias is one generated kernel
    holding both reductions, the product and the bias."""
    assert_planned_as_one_kernel(
        layer_norm_text((1,), 128, 96), {"atomic.reduce_sum", "atomic.matmul"}
    )
