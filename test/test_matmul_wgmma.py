"""The Hopper skeleton of the matmul template (codegen/matmul_wgmma.cu.j2): when it is the
default, its parameters and refusals, that its kernels compile for sm_90a without spills (one
nvcc run, no GPU needed), and on an sm_90 GPU its results against float64 at sizes that end
inside a tile, with bias, GELU and residual epilogues, outputs poisoned with NaN first.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_attention_tc import NVCC, compile_kernels

from tgc.codegen.kernels import generate_kernel
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.parser import parse_module
from tgc.pass_manager import PassManager

SM90 = {"arch": "sm_90"}
WG = {"arch": "sm_90", "wgmma": True}
TMA = {**WG, "tma": True}


def t(shape, dtype) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{dtype}>"


def matmul_text(a, b, dtype="bf16", tb=False, epilogue="bias_gelu_tanh") -> str:
    """C = a @ b with an epilogue: "none", "bias_gelu_tanh", "bias_gelu_erf_residual" or
    "residual_cast" (the sum rounded to f32)."""
    from tgc.dialects._shapes import matmul_shape

    out = matmul_shape(a, b, False, tb)
    o, v = t(out, dtype), t((out[-1],), dtype)
    args = [f"%a: {t(a, dtype)}", f"%b: {t(b, dtype)}"]
    lines = [
        f"  %c = atomic.matmul %a, %b {{transpose_a = false, transpose_b = {str(tb).lower()}}} "
        f": ({t(a, dtype)}, {t(b, dtype)}) -> {o}"
    ]
    result, rtype = "%c", o
    if epilogue.startswith("bias"):
        args.append(f"%bias: {v}")
        lines.append(f"  %y = atomic.add %c, %bias : ({o}, {v}) -> {o}")
        approximate = "tanh" if "tanh" in epilogue else "none"
        lines.append(f'  %g = hl.gelu %y {{approximate = "{approximate}"}} : ({o}) -> {o}')
        result = "%g"
    if epilogue.endswith("residual") or epilogue == "residual_cast":
        args.append(f"%res: {o}")
        lines.append(f"  %r = atomic.add {result}, %res : ({o}, {o}) -> {o}")
        result = "%r"
    if epilogue == "residual_cast":
        rtype = t(out, "f32")
        lines.append(f"  %f = atomic.cast %r : ({o}) -> {rtype}")
        result = "%f"
    return "\n".join(
        [
            f"func.func @f({', '.join(args)}) -> {rtype} {{",
            *lines,
            f"  func.return {result} : {rtype}",
            "}",
        ]
    )


def fused_region(text: str) -> FusedOp:
    """The whole function after lower-for-planning as one matmul region kernel, as the
    planner offers it (its operands are the function's arguments, in order)."""
    from tgc.planner.backends.cuda_kernels import fused_from_block

    module = parse_module(text)
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    results = list(func.function_type.results)
    return fused_from_block(func.body, results, "matmul", "mm", func.loc)


def region(a, b, dtype="bf16", tb=False, epilogue="bias_gelu_tanh") -> FusedOp:
    return fused_region(matmul_text(a, b, dtype, tb, epilogue))


def test_wgmma_is_the_default_on_sm_90_only():
    """Faster than the mma.sync skeleton where measured (codegen/matmul_wgmma.py), it is sm_90's
    default where it fits; elsewhere, and with `wgmma` false, the mma.sync skeleton."""
    r = region((300, 64), (64, 520))
    k = generate_kernel(r, dict(SM90))
    assert k.params["wgmma"] is True and k.arch_features == "sm_90a"
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in k.source
    assert "setmaxnreg.inc.sync.aligned.u32 232" in k.source
    # 3 x 5 tiles of 128x128 (one wave of 132: 128x256 would waste half of each last tile)
    assert (k.params["block_m"], k.params["block_n"]) == (128, 128)
    assert k.grid == (15, 1, 1) and k.block == (384, 1, 1)
    assert k.params["stages"] == 6 and k.shared_bytes == 6 * 256 * 128 + 1024 + 6 * 16
    for params in ({}, {"arch": "sm_80"}, {**SM90, "wgmma": False}):
        other = generate_kernel(r, params)
        assert other.params["wgmma"] is False and "wgmma" not in other.source
        assert other.arch_features == "" and "mma.sync" in other.source


def test_the_planner_may_try_wgmma_and_its_copies():
    from tgc.planner.backends.cuda_kernels import TUNABLE

    assert TUNABLE["matmul"]["wgmma"] == (False, True)
    assert TUNABLE["matmul"]["tma"] == (True, False)


def test_tma_copies_are_the_default_and_cp_async_asked_for():
    """TMA: one thread's box copies, A's and B's tensor maps the kernel's first parameters
    (3-D: inner dim, rows, batch entries; boxes of 64 x the tile's rows, B as [k][n] in
    blocks of 64 columns); with `tma` false 128 threads' cp.async and no tensor maps."""
    r = region((300, 64), (64, 520))
    k = generate_kernel(r, dict(WG))
    assert k.params["tma"] is True
    a, b = k.tensor_maps
    assert (a.operand, a.elem, a.dims, a.strides, a.box) == (
        0,
        "bf16",
        (64, 300, 1),
        (128, 300 * 128),
        (64, 128, 1),
    )
    assert (b.operand, b.dims, b.strides, b.box) == (
        1,
        (520, 64, 1),
        (1040, 64 * 1040),
        (64, 64, 1),
    )
    assert "const __grid_constant__ TgcTensorMap tgc_map_a" in k.source
    assert "cp.async.bulk.tensor.3d.shared::cluster.global.tile" in k.source
    assert "mbarrier.init.shared::cta.b64 [%0], 1;" in k.source
    assert "cp.async.cg" not in k.source
    # B transposed ([n][k]) in one box of the tile's n rows; three batch entries of A, one B
    t = generate_kernel(region((3, 70, 48), (56, 48), "f16", tb=True), TMA)
    a, b = t.tensor_maps
    assert a.dims == (48, 70, 3) and a.strides == (96, 70 * 96)
    assert b.dims == (48, 56, 1) and b.box == (64, t.params["block_n"], 1)
    assert "za = (int) z, zb = 0" in t.source
    plain = generate_kernel(r, {**WG, "tma": False})
    assert (
        plain.params["tma"] is False
        and plain.tensor_maps == ()
        and "TgcTensorMap tgc_map" not in plain.source
    )
    assert "cp.async.mbarrier.arrive.noinc.shared::cta.b64" in plain.source
    assert "mbarrier.init.shared::cta.b64 [%0], 128;" in plain.source


def test_the_epilogue_stores_two_columns_by_one_instruction_where_it_can():
    """A consumer thread holds columns n and n + 1 of a row: with rows of even length and
    aligned outputs (checked at run time) each output's two elements are one store, each
    column's epilogue reading its own inputs; else element by element."""
    k = generate_kernel(region((300, 64), (64, 520), epilogue="residual_cast"), dict(WG))
    assert (
        "const bool pairs = (reinterpret_cast<uintptr_t>(out0) % alignof(TgcPair<float>) == 0);"
        in k.source
    )
    assert "if (N % 2 == 0 && pairs) {" in k.source
    assert "*reinterpret_cast<TgcPair<float>*>(&out0[m * 520 + n]) = TgcPair<float>{" in k.source
    assert "in2[m * 520 + n]" in k.source and "in2[m * 520 + n1]" in k.source
    assert "out0[m * 520 + n] = " in k.source  # the element-by-element path
    assert "stores16" not in k.source  # an f32 output: pairs at most
    odd = generate_kernel(region((77, 64), (75, 64), tb=True), dict(WG))
    assert "constexpr int M = 77, N = 75," in odd.source


def test_one_2_byte_output_is_stored_16_bytes_a_thread_after_a_shuffle_in_the_quad():
    """Each thread of a quad holds 2 of 8 neighbouring columns in every column block: each
    computes its word, 4 shuffles give thread q block j0 + q's 8 columns, one 16-byte store;
    rows whose length is not a multiple of 8, or an unaligned output, take the pairs' path, as
    does an epilogue that loads (a bias)."""
    k = generate_kernel(region((3, 300, 64), (64, 520), epilogue="none"), dict(WG))
    src = k.source
    assert "const bool stores16 = (reinterpret_cast<uintptr_t>(out0) & 15) == 0;" in src
    assert "if (N % 8 == 0 && stores16) {" in src
    assert "const TgcPair<__nv_bfloat16> pair{__float2bfloat16_rn(mm_val0)," in src
    assert "__shfl_sync(0xffffffffu, send, (lane & ~3) | from);" in src
    assert "*reinterpret_cast<uint4*>(&out0[z * 156000 + m * 520 + nv]) = make_uint4(" in src
    assert "if (N % 2 == 0 && pairs) {" in src  # the other path is still there
    biased = generate_kernel(region((300, 64), (64, 520)), dict(WG))
    assert "stores16" not in biased.source and "if (N % 2 == 0 && pairs) {" in biased.source


def test_a_batch_broadcast_in_part_is_copied_without_tma():
    """B's 3 matrices over A's 2 x 3 batch entries: a 3-D tensor map cannot index them."""
    r = region((2, 3, 40, 64), (3, 64, 72), epilogue="none")
    assert generate_kernel(r, dict(WG)).params["tma"] is False
    with pytest.raises(TgcError, match="B's 3 matrices broadcast over 6 batch entries") as info:
        generate_kernel(r, TMA)
    assert "cannot copy" in str(info.value) and info.value.loc is not None


def test_a_launch_passes_the_maps_first_and_refuses_an_unaligned_operand():
    from tgc.runtime.tensor_map import kernel_arguments

    k = generate_kernel(region((300, 64), (64, 520)), TMA)
    with pytest.raises(TgcError, match=r"its operand 0 is not 16-byte aligned") as info:
        kernel_arguments(k, [4096 + 8, 8192, 12288, 16384])
    assert f"({k.name})" in str(info.value) and info.value.loc is not None


def test_the_grid_is_persistent_and_tiles_follow_the_waves():
    """At most `sms` blocks walk every tile; the default tile is the one whose waves of 132
    blocks cost least."""
    square = generate_kernel(region((4096, 512), (512, 4096), epilogue="none"), WG)
    assert (square.params["block_m"], square.params["block_n"]) == (128, 256)
    assert square.grid == (132, 1, 1) and "TILES = TILES_PER_BATCH * 1" in square.source
    assert "GRID_M = 32, GRID_N = 16, GROUP = 8" in square.source
    # n = 768: 128x192 makes 256 tiles (two waves), 128x256 192 (two waves of larger tiles)
    narrow = generate_kernel(region((8192, 512), (512, 768), epilogue="none"), WG)
    assert (narrow.params["block_m"], narrow.params["block_n"]) == (128, 192)
    few = generate_kernel(region((300, 64), (64, 520)), {**WG, "sms": 4})
    assert few.grid == (4, 1, 1)


def test_b_transposed_is_k_major_and_batches_are_tiles():
    k = generate_kernel(region((3, 70, 48), (56, 48), "f16", tb=True), WG)
    assert "f32.f16.f16" in k.source and "p, 1, 1, 0, 0;" in k.source  # B not transposed
    assert "TILES_PER_BATCH * 3" in k.source and k.grid == (3, 1, 1)
    mn = generate_kernel(region((70, 48), (48, 64)), WG)
    assert "p, 1, 1, 0, 1;" in mn.source  # B as [k][n]: MN-major, read transposed


@pytest.mark.parametrize(
    "a, b, dtype, tb, why",
    [
        ((100, 64), (64, 72), "f32", False, "it takes bf16 and f16, not f32"),
        ((100, 60), (60, 72), "bf16", False, "k and n must be multiples of 8"),
        ((100, 64), (64, 70), "f16", False, "k and n must be multiples of 8"),
    ],
)
def test_what_wgmma_cannot_run_is_not_the_default_and_asking_is_an_error(a, b, dtype, tb, why):
    r = region(a, b, dtype, tb=tb)
    assert generate_kernel(r, dict(SM90)).params["wgmma"] is False
    with pytest.raises(TgcError, match=why) as info:
        generate_kernel(r, {**SM90, "wgmma": True})
    assert "the wgmma matmul cannot run" in str(info.value) and info.value.loc is not None


@pytest.mark.parametrize(
    "params, why",
    [
        ({"arch": "sm_80"}, "needs an sm_90 GPU, not sm_80"),
        ({"block_m": 64}, "block_m 128 or 256 and block_n 64, 128, 192 or 256"),
        ({"block_m": 256, "block_n": 256}, "at most 128x256 elements, not 256x256"),
        ({"block_n": 256, "stages": 5}, "at 128x256 takes 3 to 4 stages"),
        ({"stages": 2}, "takes 3 to 6 stages"),
        ({"sms": 0}, "sms is a positive count"),
    ],
)
def test_points_outside_the_skeletons_choices_are_refused(params, why):
    r = region((100, 64), (64, 72))
    with pytest.raises(TgcError, match=why):
        generate_kernel(r, {"arch": "sm_90", "wgmma": True, **params})


COMPILED = [
    # a, b, dtype, tb, epilogue, params: TMA copies (the default), then cp.async
    ((4096, 4096), (4096, 4096), "bf16", False, "bias_gelu_tanh", {}),  # 128x256
    ((8192, 3072), (3072, 768), "bf16", False, "bias_gelu_erf_residual", {}),  # 128x192
    ((8192, 768), (768, 3072), "bf16", False, "none", {}),  # 128x256, 16-byte stores
    ((300, 520), (264, 520), "f16", True, "residual_cast", {"block_m": 256}),
    ((2, 33, 64), (2, 64, 136), "bf16", False, "none", {"block_n": 64}),
    ((4096, 4096), (4096, 4096), "bf16", False, "bias_gelu_tanh", {"tma": False}),
    (
        (300, 520),
        (264, 520),
        "f16",
        True,
        "residual_cast",
        {"tma": False, "block_m": 256, "block_n": 128},
    ),
    ((2, 33, 64), (2, 64, 136), "bf16", False, "none", {"tma": False, "block_n": 64, "stages": 3}),
]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_wgmma_matmuls_compile_for_sm_90a_without_spills(tmp_path):
    """One nvcc run for all; a spill (the whole kernel shares the 168 registers that 384
    threads of one block leave) or a wgmma the compiler serialises costs much."""
    kernels = []
    for a, b, dtype, tb, epilogue, params in COMPILED:
        k = generate_kernel(region(a, b, dtype, tb, epilogue), {**WG, **params})
        flags = (*k.nvcc_target("sm_90"), "-cubin", "-Xptxas", "-v")
        kernels.append((k, flags))
    logs = compile_kernels(tmp_path, kernels)
    bad = [
        f"{case[:5]}:\n{log[-2000:]}"
        for case, log in zip(COMPILED, logs)
        if "0 bytes spill stores, 0 bytes spill loads" not in log
        or "serialized" in log
        or "C7508" in log
    ]
    assert not bad, "\n\n".join(bad)


# -- on an sm_90 GPU -------------------------------------------------------------------------------

GPU_CASES = [
    # a, b, dtype, tb, epilogue, params: sizes not multiples of the tile (m, n, k); the
    # cp.async producer, then TMA copies (the default); rows of odd length, whose epilogue
    # stores element by element
    ((333, 200), (200, 520), "bf16", False, "bias_gelu_tanh", {"tma": False}),
    (
        (1000, 136),
        (136, 712),
        "bf16",
        False,
        "bias_gelu_erf_residual",
        {"tma": False, "block_n": 192},
    ),
    (
        (517, 264),
        (392, 264),
        "f16",
        True,
        "residual_cast",
        {"tma": False, "block_m": 256, "block_n": 128},
    ),
    ((3, 130, 72), (72, 200), "bf16", False, "none", {"tma": False, "block_n": 64, "stages": 3}),
    ((2100, 1032), (1032, 1544), "f16", False, "bias_gelu_tanh", {"tma": False, "sms": 7}),
    ((333, 200), (200, 520), "bf16", False, "bias_gelu_tanh", {}),
    ((1000, 136), (136, 712), "bf16", False, "bias_gelu_erf_residual", {"block_n": 192}),
    ((517, 264), (392, 264), "f16", True, "residual_cast", {"block_m": 256, "block_n": 128}),
    ((3, 130, 72), (72, 200), "bf16", False, "none", {"block_n": 64, "stages": 3}),
    ((2, 130, 72), (2, 72, 200), "bf16", False, "none", {}),  # 2 Bs, one each
    ((2100, 1032), (1032, 1544), "f16", False, "bias_gelu_tanh", {"sms": 7}),
    ((77, 64), (75, 64), "bf16", True, "bias_gelu_tanh", {}),
    ((130, 72), (201, 72), "f16", True, "residual_cast", {"tma": False}),
]
TOLERANCE = {"bf16": 2e-2, "f16": 4e-3, "f32": 4e-3}  # of max |reference|; outputs rounded


def _run_poisoned(kernel, inputs: list[np.ndarray], out: np.ndarray) -> np.ndarray:
    """`kernel` on `inputs` into `out` (NaN everywhere first), through PyCUDA."""
    import pycuda.driver as cuda

    from tgc.runtime.cuda_compile import load_kernels
    from tgc.runtime.tensor_map import kernel_arguments

    (fn,) = load_kernels([kernel])
    # As bytes: PyCUDA's buffers take no bf16 (ml_dtypes) arrays.
    device = [cuda.to_device(np.ascontiguousarray(x).view(np.uint8)) for x in inputs]
    poisoned = np.full(out.shape, np.nan, dtype=out.dtype).view(np.uint8)
    d_out = cuda.to_device(poisoned)
    arguments = kernel_arguments(kernel, [int(d) for d in (*device, d_out)])
    fn.prepared_call(kernel.grid, kernel.block, *arguments, shared_size=kernel.shared_bytes)
    cuda.Context.synchronize()
    return cuda.from_device_like(d_out, poisoned).view(out.dtype)


@pytest.mark.cuda
@pytest.mark.parametrize("a, b, dtype, tb, epilogue, params", GPU_CASES)
def test_wgmma_matmul_matches_float64(a, b, dtype, tb, epilogue, params):
    from tgc.runtime.cuda_compile import device_arch

    if device_arch() != "sm_90":
        pytest.skip(f"the wgmma skeleton needs an sm_90 GPU, not {device_arch()}")
    text = matmul_text(a, b, dtype, tb, epilogue)
    ref = parse_module(text).funcs[0]
    fused = fused_region(text)
    kernel = generate_kernel(fused, {**SM90, "wgmma": True, **params})
    check_against_float64(ref, fused, kernel)


def check_against_float64(ref, fused: FusedOp, kernel) -> None:
    """`kernel` (of region `fused`) on fresh random inputs of function `ref`, into an output
    poisoned with NaN: every element written, within TOLERANCE of ref in float64."""
    from tgc.runtime.interpreter import random_inputs, run_function

    inputs = random_inputs(ref, int(np.random.default_rng().integers(1 << 30)))  # fresh
    (want,) = run_function(ref, inputs, "f64")
    out_type = fused.results[0].type
    got = _run_poisoned(kernel, inputs, np.empty(out_type.shape, out_type.dtype))
    got64 = got.astype(np.float64)
    assert not np.isnan(got64).any(), f"{int(np.isnan(got64).sum())} elements not written"
    error = np.max(np.abs(got64 - want)) / np.max(np.abs(want))
    assert error < TOLERANCE[str(out_type.element_type)], error


def test_kernels_with_tensor_maps_are_loaded_and_launched_by_the_driver(monkeypatch):
    """PyCUDA's packed argument buffer misplaces a 64-byte-aligned parameter (runtime/
    driver_kernel.py): a kernel with tensor maps is a DriverKernel, the others PyCUDA's
    functions."""
    pytest.importorskip("pycuda.driver", reason="the kernel loader needs PyCUDA")
    from tgc.runtime import cuda_compile

    made = []

    class Recorded:
        def __init__(self, cubin, kernel, programmatic=False):
            made.append((cubin, kernel.name, programmatic))

    monkeypatch.setattr(cuda_compile, "_functions", {})
    monkeypatch.setattr(cuda_compile, "context", lambda: None)
    monkeypatch.setattr(cuda_compile, "device_arch", lambda: "sm_90")
    monkeypatch.setattr(cuda_compile, "compile_cubin", lambda s, a, k: k.name.encode())
    monkeypatch.setattr(cuda_compile, "DriverKernel", Recorded)
    k = generate_kernel(region((300, 64), (64, 520)), TMA)
    (fn,) = cuda_compile.load_kernels([k])
    assert isinstance(fn, Recorded) and made == [(k.name.encode(), k.name, False)]


def test_a_driver_kernel_that_cannot_load_is_one_error():
    """No driver (CI), or a cubin the driver refuses: a TgcError, never a ctypes traceback."""
    from tgc.runtime.driver_kernel import DriverKernel

    k = generate_kernel(region((300, 64), (64, 520)), TMA)
    with pytest.raises(TgcError, match="no CUDA driver|failed to load: CUDA error"):
        DriverKernel(b"not a cubin", k)
