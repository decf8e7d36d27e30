"""The tensor-core skeleton of the matmul template (codegen/matmul_tc.cu.j2, issue 8): which
matmuls it takes, its parameters, and that its code compiles for sm_80 and sm_90 (nvcc, no GPU
needed). Its results against float64 are GPU tests in test/test_cuda.py
(`test_tensor_core_matmul_matches_float64`).
"""

from __future__ import annotations

import pytest
from test_attention_tc import NVCC, compile_kernels

from tgc.codegen.kernels import generate_kernel
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.parser import parse_module
from tgc.pass_manager import PassManager


def t(shape, dtype) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{dtype}>"


def matmul_region(a, b, dtype="bf16", tb=False, ta=False, gelu=True) -> FusedOp:
    """The matmul kernel `fuse` makes of a @ b (+ bias, tanh GELU) after lower-for-planning,
    as the planner offers it."""
    from tgc.dialects._shapes import matmul_shape

    out = matmul_shape(a, b, ta, tb)
    n = out[-1]
    o, v = t(out, dtype), t((n,), dtype)
    attrs = f"{{transpose_a = {str(ta).lower()}, transpose_b = {str(tb).lower()}}}"
    lines = [
        f"func.func @f(%a: {t(a, dtype)}, %b: {t(b, dtype)}, %bias: {v}) -> {o} {{",
        f"  %c = atomic.matmul %a, %b {attrs} : ({t(a, dtype)}, {t(b, dtype)}) -> {o}",
        f"  %y = atomic.add %c, %bias : ({o}, {v}) -> {o}",
    ]
    if gelu:
        lines.append(f'  %g = hl.gelu %y {{approximate = "tanh"}} : ({o}) -> {o}')
    lines += [f"  func.return {'%g' if gelu else '%y'} : {o}", "}"]
    module = parse_module("\n".join(lines))
    PassManager.from_text("lower-for-planning,fuse").run(module)
    (fused,) = [op for op in module.funcs[0].body.ops if isinstance(op, FusedOp)]
    assert fused.attr("template") == "matmul"
    return fused


def test_tensor_cores_are_the_default_where_they_fit_and_a_parameter_turns_them_off():
    region = matmul_region((100, 64), (64, 72))
    simt = generate_kernel(region, {"tensor_cores": False})
    assert "mma.sync" not in simt.source
    tc = generate_kernel(region)
    assert tc.params["tensor_cores"] is True
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in tc.source
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in tc.source  # B rows are k
    assert tc.block == (256, 1, 1) and tc.grid == (1, 1, 1)
    chosen = [tc.params[p] for p in ("block_m", "block_n", "block_k", "stages")]
    assert chosen == [128, 128, 32, 4]  # n < 256: 128x128 tiles
    assert tc.shared_bytes == 2 * 4 * (128 * (32 + 8) + 32 * (128 + 8))  # padded, 4 stages
    assert "cp.async.wait_group %0" in tc.source and "WM = 64, WN = 32" in tc.source
    small = generate_kernel(region, {"tensor_cores": True, "block_m": 64, "block_n": 64})
    assert small.grid == (2, 2, 1) and "WM = 32, WN = 16" in small.source
    assert "__launch_bounds__(256, 2)" in small.source  # two blocks an SM at 64x64


def test_wide_matmuls_get_128x256_tiles_of_64x64_per_warp():
    region = matmul_region((300, 64), (64, 2056))
    tc = generate_kernel(region)
    assert (tc.params["block_m"], tc.params["block_n"]) == (128, 256)
    assert tc.grid == (9, 3, 1) and "WM = 64, WN = 64" in tc.source
    assert "__launch_bounds__(256, 1)" in tc.source
    tall = generate_kernel(region, {"block_m": 256, "block_n": 128})
    assert tall.grid == (17, 2, 1) and "WM = 64, WN = 64" in tall.source  # warps 4x2
    assert tall.shared_bytes == 2 * 4 * (256 * 40 + 32 * 136)


def test_narrower_matmuls_get_128x128_tiles():
    """Below n = 2048 the default is 128x128: at n = 768 128x256 tiles leave too few blocks
    (an H100 ran 8192x768 @ 768x768 in 0.0610 ms at 128x128, 0.0678 at 128x256)."""
    for n in (520, 768, 2040):
        tc = generate_kernel(matmul_region((300, 64), (64, n)))
        assert (tc.params["block_m"], tc.params["block_n"]) == (128, 128)


def test_blocks_run_in_groups_of_eight_tile_rows():
    """The block order is a template constant: the grid's shape, the group of 8 tile rows."""
    tc = generate_kernel(matmul_region((1100, 64), (64, 520)))
    assert tc.grid == (5, 9, 1)
    assert "GRID_M = 9, GRID_N = 5, GROUP = 8" in tc.source


def test_a_transposed_b_is_read_by_rows_of_k_and_batches_by_the_grid():
    tc = generate_kernel(
        matmul_region((3, 70, 48), (56, 48), "f16", tb=True), {"tensor_cores": True}
    )
    assert ".trans." not in tc.source and "f32.f16.f16.f32" in tc.source
    assert tc.grid == (1, 1, 3)


@pytest.mark.parametrize(
    "a, b, dtype, ta, tb",
    [((100, 64), (64, 72), "f32", False, False), ((100, 60), (60, 72), "bf16", False, False)],
)
def test_where_tensor_cores_do_not_fit_the_default_is_the_simt_skeleton(a, b, dtype, ta, tb):
    kernel = generate_kernel(matmul_region(a, b, dtype, ta=ta, tb=tb))
    assert kernel.params["tensor_cores"] is False and "mma.sync" not in kernel.source


@pytest.mark.parametrize(
    "a, b, dtype, ta, tb, why",
    [
        ((100, 64), (64, 72), "f32", False, False, "it takes bf16 and f16, not f32"),
        ((64, 100), (64, 72), "bf16", True, False, "A is transposed"),
        ((100, 60), (60, 72), "bf16", False, False, "k and n must be multiples of 8"),
        ((100, 64), (64, 70), "f16", False, False, "k and n must be multiples of 8"),
        ((100, 60), (70, 60), "f16", False, True, "k must be multiples of 8"),
    ],
)
def test_what_tensor_cores_cannot_run_is_an_error_naming_why(a, b, dtype, ta, tb, why):
    region = matmul_region(a, b, dtype, tb=tb, ta=ta)
    with pytest.raises(TgcError, match=why) as info:
        generate_kernel(region, {"tensor_cores": True})
    assert "the tensor-core matmul cannot run" in str(info.value) and info.value.loc is not None
    generate_kernel(region)  # the default skeleton runs it


@pytest.mark.parametrize(
    "params, why",
    [
        ({"block_k": 128}, "block_m and block_n 64, 128 or 256, block_k 16, 32 or 64 and stages"),
        ({"block_m": 32}, r"stages 2 to 5, not 32, 128, 32, 4"),
        ({"stages": 6}, r"stages 2 to 5, not 128, 128, 32, 6"),
        ({"block_m": 256, "block_n": 256}, "a 256x256 tile is over 64x64 per warp"),
        (
            {"block_m": 256, "block_n": 128, "block_k": 64, "stages": 5},
            "5 stages of 256x64 and 64x128 tiles need 271360 bytes of shared memory",
        ),
    ],
)
def test_tiles_outside_the_skeletons_choices_are_refused(params, why):
    region = matmul_region((100, 64), (64, 72))
    with pytest.raises(TgcError, match=why) as info:
        generate_kernel(region, {"tensor_cores": True, **params})
    assert "the tensor-core matmul cannot run" in str(info.value) and info.value.loc is not None


def test_over_48k_of_shared_memory_is_raised_in_the_standalone_launcher():
    """The default 128x256 tiles in 4 stages take 108 KB of dynamic shared memory: the
    standalone host code raises the function's limit before the launch. (A relu after the
    matmul, which no library GEMM runs in its epilogue, makes the plan a generated kernel.)"""
    from tgc.planner.standalone import emit_standalone_cuda

    a, b, o = "tensor<256x64xbf16>", "tensor<64x2048xbf16>", "tensor<256x2048xbf16>"
    text = (
        f"func.func @f(%a: {a}, %b: {b}) -> {o} {{\n"
        f"  %c = atomic.matmul %a, %b {{transpose_a = false, transpose_b = false}} : ({a}, {b})"
        f" -> {o}\n  %r = hl.relu %c : ({o}) -> {o}\n  func.return %r : {o}\n}}"
    )
    module = parse_module(text)
    PassManager.from_text("lower-for-planning").run(module)
    source = emit_standalone_cuda(module, "mm")
    assert "mma.sync" in source
    shared = 2 * 4 * (128 * 40 + 32 * 264)
    assert f"cudaFuncAttributeMaxDynamicSharedMemorySize, {shared})" in source
    assert f", {shared}, stream>>>" in source


COMPILED = [
    # a, b, dtype, tb, params
    ((100, 64), (64, 72), "bf16", False, {}),
    ((3, 70, 48), (56, 48), "f16", True, {"block_m": 64, "block_k": 16}),
    ((2, 33, 64), (2, 64, 136), "bf16", False, {"block_n": 64, "stages": 2}),
    ((300, 512), (512, 520), "bf16", False, {}),  # 128x256
    ((300, 512), (520, 512), "f16", True, {"block_k": 64, "stages": 3}),
    ((300, 512), (512, 520), "bf16", False, {"block_m": 256, "block_n": 128}),
    ((300, 512), (512, 520), "f16", False, {"block_k": 16, "stages": 5}),
]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_tensor_core_matmuls_compile(tmp_path):
    """Each case for sm_90, the first three for sm_80 too (one nvcc run per arch), without
    spilling registers to local memory (a spill in the main loop costs much)."""
    cases, kernels = [], []
    for i, (a, b, dtype, tb, params) in enumerate(COMPILED):
        k = generate_kernel(matmul_region(a, b, dtype, tb=tb), {"tensor_cores": True, **params})
        for arch in ("sm_80", "sm_90") if i < 3 else ("sm_90",):
            cases.append((a, b, dtype, tb, params, arch))
            kernels.append((k, ("-cubin", f"-arch={arch}", "-Xptxas", "-v")))
    spilled = [
        f"{case}:\n{log[-2000:]}"
        for case, log in zip(cases, compile_kernels(tmp_path, kernels))
        if not ("0 bytes spill stores, 0 bytes spill loads" in log and "bytes spill" in log)
    ]
    assert not spilled, "\n\n".join(spilled)
