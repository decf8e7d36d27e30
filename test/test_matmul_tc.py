"""The tensor-core skeleton of the matmul template (codegen/matmul_tc.cu.j2, issue 8): which
matmuls it takes, its parameters, and that its code compiles for sm_80 and sm_90 (nvcc, no GPU
needed). Its results against float64 are GPU tests in test/test_cuda.py
(`test_tensor_core_matmul_matches_float64`).
"""

from __future__ import annotations

import pytest
from test_attention_tc import NVCC, nvcc

from tgc.codegen.kernels import generate_kernel
from tgc.codegen.render import prelude
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.parser import parse_module
from tgc.pass_manager import PassManager


def t(shape, dtype) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{dtype}>"


def matmul_region(a, b, dtype="bf16", tb=False, ta=False, gelu=True) -> FusedOp:
    """The `cuda-standalone` route's matmul kernel of a @ b (+ bias, tanh GELU)."""
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
    PassManager.from_text("cuda-standalone").run(module)
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
    assert (tc.params["block_m"], tc.params["block_n"], tc.params["block_k"]) == (128, 128, 32)
    small = generate_kernel(region, {"tensor_cores": True, "block_m": 64, "block_n": 64})
    assert small.grid == (2, 2, 1) and "WM = 32, WN = 16" in small.source


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


def test_tiles_outside_the_skeletons_choices_are_refused():
    region = matmul_region((100, 64), (64, 72))
    with pytest.raises(TgcError, match="block_m and block_n 64 or 128 and block_k 16 or 32"):
        generate_kernel(region, {"tensor_cores": True, "block_k": 64})


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize(
    "a, b, dtype, tb, params",
    [
        ((100, 64), (64, 72), "bf16", False, {}),
        ((3, 70, 48), (56, 48), "f16", True, {"block_m": 64, "block_k": 16}),
        ((2, 33, 64), (2, 64, 136), "bf16", False, {"block_n": 64}),
    ],
)
def test_tensor_core_matmul_compiles(tmp_path, arch, a, b, dtype, tb, params):
    k = generate_kernel(matmul_region(a, b, dtype, tb=tb), {"tensor_cores": True, **params})
    nvcc(tmp_path, prelude() + "\n" + k.source, "-cubin", f"-arch={arch}")
