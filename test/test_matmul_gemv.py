"""The few-rows skeleton of the matmul template (codegen/matmul_gemv.cu.j2): which products it
takes by default, what it refuses and why, that it compiles for sm_80 and sm_90 without spills
(nvcc, no GPU needed), and on a GPU its results against float64 (NaN-poisoned outputs).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_attention_tc import NVCC, compile_kernels
from test_matmul_wgmma import check_against_float64, fused_region, matmul_text, region

from tgc.codegen.kernels import generate_kernel
from tgc.diagnostics import TgcError
from tgc.parser import parse_module


def test_a_few_rows_against_a_weight_take_the_gemv_skeleton_by_default():
    """One row (a decoding step's token) against a weight stored [n][k]: one column a column
    group, eight 16-byte loads in flight a lane, four warps a block; rows of 2,048 are one
    step of a warp's loads, so one warp a column (split_k 1)."""
    k = generate_kernel(region((1, 2048), (515, 2048), tb=True))
    assert k.params["gemv"] is True
    assert (k.params["warps"], k.params["columns"], k.params["unroll"]) == (4, 1, 8)
    assert k.params["split_k"] == 1
    assert k.grid == (-(-515 // 4), 1, 1) and k.block == (128, 1, 1)
    assert "__ldcs" in k.source and "ROWS = 1, COLS = 1, UNROLL = 8, SPLIT = 1" in k.source
    assert "mma.sync" not in k.source


def test_the_batch_folds_into_rows_and_more_rows_take_two_columns_a_warp():
    """2 batch entries of 4 rows against one weight: 8 rows, 2 columns a warp and 4 loads in
    flight a lane and column (the best point measured at 8 rows, bench/results/matmul_gemv-*.md)."""
    k = generate_kernel(region((2, 4, 136), (77, 136), "f32", tb=True, epilogue="none"))
    assert (k.params["gemv"], k.params["columns"], k.params["unroll"]) == (True, 2, 4)
    assert k.grid == (-(-77 // 8), 1, 1)
    assert "const idx_t z = r / 4, m = r % 4;" in k.source


def test_asking_for_another_skeleton_or_gemv_false_keeps_the_others():
    fused = region((2, 2048), (512, 2048), tb=True)
    tc = generate_kernel(fused, {"tensor_cores": True})
    assert "mma.sync" in tc.source and tc.params["gemv"] is False
    off = generate_kernel(fused, {"gemv": False})
    assert "mma.sync" in off.source and off.params["gemv"] is False


@pytest.mark.parametrize(
    "a, b, dtype, tb, why",
    [
        ((9, 64), (72, 64), "f32", True, "it takes at most 8 rows, not 9"),
        ((3, 3, 64), (72, 64), "f32", True, "it takes at most 8 rows, not 9"),
        ((17, 64), (72, 64), "bf16", True, "it takes at most 16 rows, not 17"),
        ((1, 64), (64, 72), "bf16", False, r"B is not transposed \(its rows must be k"),
        ((2, 1, 64), (2, 72, 64), "bf16", True, "B differs between batch entries"),
        ((1, 60), (72, 60), "bf16", True, "k must make rows of a multiple of 16 bytes"),
        ((1, 6), (72, 6), "f32", True, "k must make rows of a multiple of 16 bytes"),
    ],
)
def test_what_gemv_cannot_run_is_not_the_default_and_asking_is_an_error(a, b, dtype, tb, why):
    fused = region(a, b, dtype, tb, "none")
    default = generate_kernel(fused)
    assert "__ldcs" not in default.source and "gemv" not in default.params
    with pytest.raises(TgcError, match=f"the few-rows matmul cannot run 'mm': {why}") as info:
        generate_kernel(fused, {"gemv": True})
    assert info.value.loc is not None


@pytest.mark.parametrize(
    "params, why",
    [
        ({"columns": 3}, "takes columns 1, 2, 4, not 3"),
        ({"warps": 16}, "takes warps 2, 4, 8, not 16"),
        ({"unroll": 0}, "takes unroll 1, 2, 4, 8, not 0"),
    ],
)
def test_points_outside_the_skeletons_choices_are_refused(params, why):
    with pytest.raises(TgcError, match=f"the few-rows matmul {why}"):
        generate_kernel(region((1, 64), (72, 64), tb=True), {"gemv": True, **params})


@pytest.mark.parametrize(
    "rows, k, split, unroll",
    [
        (1, 8192, 2, 8),  # a 1 B Llama's down projection: two warps a column
        (1, 4096, 2, 8),  # an 8 B Llama's q/k/v: two whole steps of 8 loads
        (1, 2048, 1, 8),  # one step of 8 loads a row: one warp
        (4, 8192, 1, 4),  # above one row: as measured before
    ],
)
def test_one_row_takes_8_loads_a_lane_and_two_warps_a_column_where_each_has_a_step(
    rows, k, split, unroll
):
    """`_one_row_defaults` (codegen/matmul_gemv.py, measured on an H200)."""
    kernel = generate_kernel(region((rows, k), (2048, k), tb=True))
    assert (kernel.params["split_k"], kernel.params["unroll"]) == (split, unroll)
    columns = kernel.params["columns"]
    assert kernel.grid == (-(-2048 // (4 // split * columns)), 1, 1)
    if split > 1:
        assert "parts[threadIdx.x / 32 + s]" in kernel.source
    else:
        assert "parts" not in kernel.source


def test_split_k_must_divide_the_warps():
    with pytest.raises(TgcError, match=r"split_k \(8\) must divide its warps \(4\)"):
        generate_kernel(region((1, 2048), (64, 2048), tb=True), {"split_k": 8})


def test_the_tensor_core_variant_takes_8_columns_a_block_and_up_to_16_rows():
    """`gemv_mma`: a block's warps split k for 8 columns, A's rows (at most 16) padded to an
    mma's 16; the default from 5 rows in bf16 and f16, with 8 warps (the faster variant there
    on an H200, bench/results/matmul_gemv-*.md)."""
    fused = region((4, 4, 264), (130, 264), "f16", tb=True, epilogue="residual_cast")
    k = generate_kernel(fused)
    assert k.params["gemv"] is True and k.params["gemv_mma"] is True and "columns" not in k.params
    assert k.grid == (-(-130 // 8), 1, 1) and k.block == (256, 1, 1)
    assert "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32" in k.source
    assert "ROWS = 16, WARPS = 8, UNROLL = 4" in k.source
    assert generate_kernel(fused, {"gemv_mma": True, "warps": 4}).block == (128, 1, 1)
    for rows, mma in ((1, False), (4, False), (5, True), (16, True)):
        kernel = generate_kernel(region((rows, 64), (72, 64), tb=True))
        assert kernel.params["gemv"] is True and kernel.params["gemv_mma"] is mma, rows
    f32 = generate_kernel(region((8, 64), (72, 64), "f32", tb=True))
    assert f32.params["gemv"] is True and f32.params["gemv_mma"] is False


@pytest.mark.parametrize(
    "a, b, dtype, why",
    [
        ((17, 64), (72, 64), "bf16", "it takes at most 16 rows, not 17"),
        ((2, 64), (72, 64), "f32", "its tensor-core variant takes bf16 and f16, not f32"),
    ],
)
def test_what_the_tensor_core_variant_cannot_run_is_an_error_naming_why(a, b, dtype, why):
    fused = region(a, b, dtype, True, "none")
    with pytest.raises(TgcError, match=f"the few-rows matmul cannot run 'mm': {why}"):
        generate_kernel(fused, {"gemv": True, "gemv_mma": True})


def test_the_planner_may_try_gemv_and_its_parameters():
    from tgc.planner.backends.cuda_kernels import TUNABLE

    assert TUNABLE["matmul"]["gemv"] == (True, False)
    assert TUNABLE["matmul"]["gemv_mma"] == (False, True)
    assert {"warps", "columns", "unroll"} <= set(TUNABLE["matmul"])


def test_the_benchmarks_products_take_the_gemv_skeleton_by_default():
    """bench/matmul_gemv.py's decoding products at 1 and 8 rows (what its default column times)."""
    import sys
    from pathlib import Path

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import matmul_gemv

    for rows in (1, 8):
        for name, k, n in matmul_gemv.WEIGHTS:
            kernel = matmul_gemv.make_kernel(rows, k, n, {})
            assert kernel.params["gemv"] is True, (name, rows)


COMPILED = [
    # a, b, dtype, epilogue, params
    ((1, 2048), (2048, 2048), "bf16", "bias_gelu_tanh", {}),
    ((1, 1, 8192), (2048, 8192), "bf16", "residual_cast", {}),
    ((2, 4, 136), (77, 136), "f32", "none", {}),
    ((8, 520), (300, 520), "f16", "bias_gelu_erf_residual", {"columns": 4, "unroll": 8}),
    ((1, 1, 8192), (2048, 8192), "bf16", "residual_cast", {"gemv_mma": True}),
    ((16, 520), (300, 520), "f16", "bias_gelu_tanh", {"gemv_mma": True, "unroll": 8}),
]


@pytest.mark.parametrize("mma", [False, True])
def test_a_gemv_asks_for_its_weight_in_l2_then_waits_for_the_kernel_before(mma):
    """Launched as a programmatic dependent (runtime/driver_kernel.py): the start of each of
    the block's rows of B asked for in L2 (the whole row where the weight fits
    PREFETCH_BYTES), then the wait, before A or anything else is read or written."""
    from tgc.codegen.matmul_gemv import PREFETCH_BYTES

    small = generate_kernel(region((1, 2048), (515, 2048), tb=True), {"gemv_mma": mma})
    assert small.dependent_launch
    src = small.source
    rows = 8 if mma else 4  # a block's columns: the mma's 8, or 4 warps of one
    assert f"constexpr int BLOCK_ROWS = {rows}, LINES = 32;" in src  # 4 KB rows, whole
    wait = src.index("tgc_wait_for_predecessors();")
    assert src.index("tgc_launch_dependents();") < src.index("tgc_prefetch_l2(") < wait
    before = src[src.index("\n{\n") : wait]  # the body up to the wait
    assert "in0" not in before and "out0" not in before  # nor A nor the result
    # a weight larger than PREFETCH_BYTES: the same share of every row
    big = generate_kernel(region((1, 8192), (16384, 8192), tb=True), {"gemv_mma": mma})
    lines = PREFETCH_BYTES // 16384 // 128
    assert f"LINES = {lines};" in big.source and lines < 8192 * 2 // 128


def test_a_dependent_launch_kernel_is_launched_by_the_driver_on_sm_90_only(monkeypatch):
    """cuLaunchKernelEx's programmatic attribute is sm_90's: there a gemv is a DriverKernel
    launched as a dependent, on sm_80 PyCUDA's function as before."""
    pytest.importorskip("pycuda.driver", reason="the kernel loader needs PyCUDA")
    from tgc.runtime import cuda_compile

    made = []

    class Recorded:
        def __init__(self, cubin, kernel, programmatic=False):
            made.append((kernel.name, programmatic))

    class Loaded:  # PyCUDA's module_from_buffer, for sm_80
        def get_function(self, name):
            made.append((name, "pycuda"))
            return type("F", (), {"prepare": lambda self, sig: None})()

    k = generate_kernel(region((1, 2048), (515, 2048), tb=True))
    monkeypatch.setattr(cuda_compile, "context", lambda: None)
    monkeypatch.setattr(cuda_compile, "compile_cubin", lambda s, a, k: k.name.encode())
    monkeypatch.setattr(cuda_compile, "DriverKernel", Recorded)
    monkeypatch.setattr(cuda_compile.cuda, "module_from_buffer", lambda cubin: Loaded())
    for arch, want in (("sm_90", True), ("sm_80", "pycuda")):
        monkeypatch.setattr(cuda_compile, "_functions", {})
        monkeypatch.setattr(cuda_compile, "device_arch", lambda arch=arch: arch)
        made.clear()
        cuda_compile.load_kernels([k])
        assert made == [(k.name, want)], arch


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_gemv_matmuls_compile_without_spills_or_warnings(tmp_path):
    """Warnings fail the build: over one row an epilogue reads no row index, and the kernels
    say so rather than leave nvcc a variable never read (warning 177) in every standalone
    file."""
    kernels, cases = [], []
    for i, (a, b, dtype, epilogue, params) in enumerate(COMPILED):
        k = generate_kernel(region(a, b, dtype, True, epilogue), {"gemv": True, **params})
        # sm_90 for each; sm_80 for a CUDA-core and a tensor-core case (each nvcc's build
        # is a second of the suite)
        for arch in ("sm_80", "sm_90") if i in (0, 4) else ("sm_90",):
            cases.append((a, b, dtype, epilogue, params, arch))
            flags = ("-cubin", f"-arch={arch}", "-Xptxas", "-v", "-Werror", "all-warnings")
            kernels.append((k, flags))
    spilled = [
        f"{case}:\n{log[-2000:]}"
        for case, log in zip(cases, compile_kernels(tmp_path, kernels))
        if "0 bytes spill stores, 0 bytes spill loads" not in log
    ]
    assert not spilled, "\n\n".join(spilled)


# -- on a GPU --------------------------------------------------------------------------------------

GPU_CASES = [
    # a, b, dtype, epilogue, params: n not a multiple of a block's columns, k of a warp's loads
    ((1, 2056), (1001, 2056), "bf16", "bias_gelu_tanh", {}),
    ((1, 1, 8200), (515, 8200), "bf16", "residual_cast", {}),
    ((2, 4, 136), (77, 136), "f32", "none", {}),
    ((3, 520), (300, 520), "f16", "bias_gelu_erf_residual", {"columns": 1, "warps": 2}),
    ((8, 264), (130, 264), "bf16", "none", {"unroll": 8, "columns": 2, "warps": 8}),
    # the tensor-core variant: 1, 12 and 16 rows, k not a multiple of a step (32) or of the
    # warps' steps, n not a multiple of 8
    ((1, 2056), (1001, 2056), "bf16", "bias_gelu_tanh", {"gemv_mma": True}),
    ((3, 4, 8200), (515, 8200), "bf16", "none", {"gemv_mma": True, "warps": 8, "unroll": 2}),
    ((4, 4, 264), (130, 264), "f16", "residual_cast", {"gemv_mma": True, "warps": 2}),
]


@pytest.mark.cuda
@pytest.mark.parametrize("a, b, dtype, epilogue, params", GPU_CASES)
def test_gemv_matmul_matches_float64(a, b, dtype, epilogue, params):
    text = matmul_text(a, b, dtype, True, epilogue)
    fused = fused_region(text)
    kernel = generate_kernel(fused, {"gemv": True, **params})
    check_against_float64(parse_module(text).funcs[0], fused, kernel)


SLOW_COPY = """
extern "C" __global__ void tgc_test_slow_copy(const unsigned char* in0, unsigned char* out0) {
  tgc_launch_dependents();  // the gemv after this kernel may start now
  const long long start = clock64();
  while (clock64() - start < 20000000) {}  // about 10 ms: the gemv waits, or reads NaN
  for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < %d; i += gridDim.x * blockDim.x)
    out0[i] = in0[i];
}
"""


@pytest.mark.cuda
@pytest.mark.parametrize("mma", [False, True])
def test_a_gemv_launched_as_a_dependent_waits_for_the_kernel_before(mma):
    """On a stream, after a kernel that lets it start at once and only then, 10 ms later,
    writes A over NaN: the gemv, started early, asks for B in L2 but reads A after its wait,
    so its result is the product of the A written (float64 reference), never of the NaN."""
    import pycuda.driver as cuda

    from tgc.codegen.render import KernelSource
    from tgc.runtime.cuda_compile import device_arch, load_kernels
    from tgc.runtime.interpreter import random_inputs, run_function

    if device_arch() != "sm_90":
        pytest.skip(f"programmatic dependent launch is tried on sm_90, not {device_arch()}")
    text = matmul_text((1, 2056), (1001, 2056), "bf16", True, "bias_gelu_tanh")
    ref = parse_module(text).funcs[0]
    kernel = generate_kernel(fused_region(text), {"gemv": True, "gemv_mma": mma})
    a, b, bias = random_inputs(ref, int(np.random.default_rng().integers(1 << 30)))
    (want,) = run_function(ref, [a, b, bias], "f64")
    a_bytes = np.ascontiguousarray(a).view(np.uint8)
    copy = KernelSource(
        "tgc_test_slow_copy", SLOW_COPY % a_bytes.size, "test", 1, 1, (4, 1, 1), (128, 1, 1)
    )
    slow, gemv = load_kernels([copy, kernel])
    assert getattr(gemv, "programmatic", False)
    d_src = cuda.to_device(a_bytes)
    d_a = cuda.to_device(np.full(a.shape, np.nan, a.dtype).view(np.uint8))
    d_b, d_bias = (cuda.to_device(np.ascontiguousarray(x).view(np.uint8)) for x in (b, bias))
    d_out = cuda.to_device(np.full(want.shape, np.nan, a.dtype).view(np.uint8))
    stream = cuda.Stream()
    slow.prepared_async_call(
        copy.grid, copy.block, stream, np.uintp(int(d_src)), np.uintp(int(d_a))
    )
    pointers = [np.uintp(int(d)) for d in (d_a, d_b, d_bias, d_out)]
    gemv.prepared_async_call(kernel.grid, kernel.block, stream, *pointers)
    stream.synchronize()
    got = cuda.from_device(d_out, want.shape, np.uint16).view(a.dtype).astype(np.float64)
    assert not np.isnan(got).any(), f"{int(np.isnan(got).sum())} NaN: A read before its write"
    assert np.max(np.abs(got - want)) / np.max(np.abs(want)) < 2e-2
