"""The implicit-GEMM convolution (codegen/conv.py, conv_tc.cu.j2) and its fusion group: which
convolutions it takes (`conv_misfit`), the regions the planner offers, the generated source, an
nvcc compile of every variant in one run (test/nvcc_batch.py); on a GPU (marker `cuda`), each
variant against the float64 interpreter at odd sizes with its outputs poisoned with NaN first.
The grouping itself is shown by test/lit/fuse/conv.tg, the standalone file by
test/lit/emit-cuda/conv.tg.
"""

from __future__ import annotations

import numpy as np
import pytest
from nvcc_batch import NVCC, compile_each

from tgc.codegen.kernels import generate_kernel
from tgc.codegen.render import prelude
from tgc.cuda_target import conv_misfit
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.parser import parse_module
from tgc.pass_manager import PassManager
from tgc.planner.backends import cuda_kernels as ck
from tgc.runtime.interpreter import random_inputs, run_function


def t(shape, dtype) -> str:
    return f"tensor<{'x'.join(map(str, shape))}x{dtype}>"


def conv_text(x, w, y, attrs="", bias=True, epilogue=(), dtype="bf16") -> str:
    """A function of one convolution (x, w -> y shapes, `attrs` its attribute text) with the
    optional bias and the `epilogue`: "relu", "silu", "gelu", "residual" (an added argument of
    y's shape), "cast" (to f32, the last)."""
    tx, tw, ty, tb = t(x, dtype), t(w, dtype), t(y, dtype), t((w[0],), dtype)
    args = [f"%x: {tx}", f"%w: {tw}"] + ([f"%b: {tb}"] if bias else [])
    if "residual" in epilogue:
        args.append(f"%r: {ty}")
    operands = "%x, %w, %b" if bias else "%x, %w"
    types = f"{tx}, {tw}, {tb}" if bias else f"{tx}, {tw}"
    body = [f"  %v0 = hl.conv2d {operands} {{{attrs}}} : ({types}) -> {ty}"]
    body[0] = body[0].replace("hl.conv2d", f"hl.conv{len(x) - 2}d")
    out = ty
    for i, step in enumerate(epilogue, 1):
        prev = f"%v{i - 1}"
        if step == "residual":
            body.append(f"  %v{i} = atomic.add {prev}, %r : ({ty}, {ty}) -> {ty}")
        elif step == "cast":
            out = t(y, "f32")
            body.append(f"  %v{i} = atomic.cast {prev} : ({ty}) -> {out}")
        elif step == "gelu":
            body.append(f'  %v{i} = hl.gelu {prev} {{approximate = "tanh"}} : ({ty}) -> {ty}')
        else:
            body.append(f"  %v{i} = hl.{step} {prev} : ({ty}) -> {ty}")
    last = f"%v{len(epilogue)}"
    return "\n".join(
        [
            f"func.func @f({', '.join(args)}) -> {out} {{",
            *body,
            f"  func.return {last} : {out}",
            "}",
        ]
    )


def fused_conv(text: str) -> FusedOp:
    """The one conv kernel `fuse` makes of `text` after lower-for-planning; for a convolution
    without an epilogue (which `fuse` leaves alone), the planner's region of it."""
    module = parse_module(text)
    PassManager.from_text("lower-for-planning").run(module)
    ops = list(module.funcs[0].body.ops)
    if len(ops) == 2:  # the convolution and the return
        return region_kernel_op(ops[0])
    PassManager.from_text("fuse").run(module)
    fused = [op for op in module.funcs[0].body.ops if isinstance(op, FusedOp)]
    assert [op.attr("template") for op in fused] == ["conv"], fused
    return fused[0]


def region_kernel_op(conv) -> FusedOp:
    """The `kernel.fused` of the planner's region of `conv` alone."""
    region = ck.region_of("conv", [conv])
    func = ck.region_function(region)
    return ck.fused_from_block(func.body, [conv.results[0].type], "conv", "conv", conv.loc)


# (name, x, w, y, attributes, bias, epilogue, dtype): odd sizes, channels not multiples of 16.
CASES = [
    (
        "s2_groups2_silu_residual",
        (2, 20, 9, 11),
        (24, 10, 3, 3),
        (2, 24, 5, 6),
        "strides = [2, 2], pads = [1, 1, 1, 1], groups = 2",
        True,
        ("silu", "residual"),
        "bf16",
    ),
    (
        "dilation2_asymmetric_relu",
        (3, 13, 17, 15),
        (40, 13, 3, 3),
        (3, 40, 17, 12),
        "dilations = [2, 2], pads = [2, 1, 2, 0]",
        False,
        ("relu",),
        "bf16",
    ),
    (
        "stem_7x7_s2_gelu",
        (1, 3, 31, 29),
        (19, 3, 7, 7),
        (1, 19, 16, 15),
        "strides = [2, 2], pads = [3, 3, 3, 3]",
        True,
        ("gelu",),
        "bf16",
    ),
    ("pointwise_cast", (2, 72, 7, 9), (33, 72, 1, 1), (2, 33, 7, 9), "", False, ("cast",), "bf16"),
    (
        "plain_f16",
        (2, 9, 12, 10),
        (17, 9, 3, 3),
        (2, 17, 12, 10),
        "pads = [1, 1, 1, 1]",
        True,
        (),
        "f16",
    ),
    (
        "residual_relu_wide",
        (8, 16, 33, 35),
        (80, 16, 3, 3),
        (8, 80, 33, 35),
        "pads = [1, 1, 1, 1]",
        True,
        ("residual", "relu"),
        "bf16",
    ),
    ("conv1d", (2, 12, 33), (16, 12, 5), (2, 16, 33), "pads = [2, 2]", True, ("silu",), "bf16"),
    (
        "conv3d",
        (1, 6, 5, 7, 9),
        (10, 6, 3, 3, 3),
        (1, 10, 5, 7, 9),
        "pads = [1, 1, 1, 1, 1, 1]",
        True,
        ("relu",),
        "bf16",
    ),
]
IDS = [c[0] for c in CASES]
# Tile points besides the defaults, on the wide case: every block_m, block_n and block_k.
TILES = [
    {"block_m": 128, "block_n": 128, "block_k": 16},
    {"block_m": 64, "block_n": 32, "block_k": 32},
    {"block_m": 128, "block_n": 64, "block_k": 32},
]


def case_text(case) -> str:
    _, x, w, y, attrs, bias, epilogue, dtype = case
    return conv_text(x, w, y, attrs, bias, epilogue, dtype)


# -- what it takes ---------------------------------------------------------------------------------


def _conv_op(text: str):
    module = parse_module(text)
    return next(op for op in module.funcs[0].body.ops if op.name.startswith("hl.conv"))


@pytest.mark.parametrize(
    "x,w,y,attrs,dtype,why",
    [
        ((1, 8, 6, 6), (8, 8, 3, 3), (1, 8, 4, 4), "", "f32", "takes bf16 and f16, not f32"),
        ((1, 16, 6, 6), (16, 1, 3, 3), (1, 16, 4, 4), "groups = 16", "bf16", "depthwise"),
        ((1, 16, 6, 6), (8, 4, 3, 3), (1, 8, 4, 4), "groups = 4", "bf16", "2 output channels"),
    ],
)
def test_what_the_kernel_refuses_names_why(x, w, y, attrs, dtype, why):
    op = _conv_op(conv_text(x, w, y, attrs, False, (), dtype))
    assert why in conv_misfit(op)
    assert ck.single_op_kind(op) is None  # no region: the planner keeps cuDNN or im2col


def test_bf16_f16_groups_and_dilations_are_taken():
    for case in CASES:
        assert conv_misfit(_conv_op(case_text(case))) is None, case[0]


def test_the_planner_offers_the_convolution_alone_and_with_its_epilogue():
    module = parse_module(case_text(CASES[0]))
    PassManager.from_text("lower-for-planning").run(module)
    block = module.funcs[0].body
    ck._register_kernels()
    try:
        options = {}
        for op in block.ops:
            for m in ck.cuda_options(op):
                options.setdefault(m.kernel.name, []).append([o.name for o in m.ops])
    finally:
        ck.unregister()
    convs = options["cuda.conv"]
    assert ["hl.conv2d"] in convs  # alone (cuDNN's epilogue kernels after it stay an option)
    whole = max(convs, key=len)
    assert whole[0] == "hl.conv2d" and whole[-1] == "atomic.add" and len(whole) > 3


# -- the generated source ------------------------------------------------------------------------------


def test_source_gathers_the_im2col_tile_and_applies_the_epilogue_in_registers():
    k = generate_kernel(fused_conv(case_text(CASES[0])))
    assert k.template == "conv" and k.block == (128, 1, 1)
    # 60 pixels per group in 64-pixel tiles, 12 channels per group in a 32-wide tile, 2 groups
    assert k.grid == (1, 1, 2)
    assert k.params == {"block_m": 64, "block_n": 32, "block_k": 32}
    src = k.source
    assert "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32" in src
    assert "ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16" in src  # A is k-major
    assert "KDIM = 90, TAPS = 9, OG = 12" in src
    # pads: the origin moves back by the begin pad; a tap outside x is a zero, never a load
    assert "* 2 - 1;" in src and "(unsigned) i0 < 9u && (unsigned) i1 < 11u" in src
    assert "const float conv_val = acc[mi][ni][e] + tgc_cvt(in2[o]);" in src  # the bias
    assert "expf(" in src  # SiLU's sigmoid
    assert "tgc_cvt(in3[n_img * 720 + o * 30 + q0 * 6 + q1])" in src  # the residual
    assert "out0[n_img * 720 + o * 30 + q0 * 6 + q1] = __float2bfloat16_rn(" in src


def test_wide_problems_get_128_pixel_tiles_and_parameters_override():
    fused = fused_conv(case_text(CASES[5]))  # 8 x 33 x 35 = 9240 pixels, 80 channels
    k = generate_kernel(fused)
    assert k.params == {"block_m": 128, "block_n": 64, "block_k": 32}
    assert k.grid == (73, 2, 1)
    small = generate_kernel(fused, {"block_m": 64, "block_n": 128, "block_k": 16})
    assert small.grid == (145, 1, 1) and "WM = 32, WN = 64" in small.source


@pytest.mark.parametrize(
    "params,why",
    [({"block_m": 256}, "block_m 64 or 128"), ({"block_k": 64}, "block_k 16 or 32")],
)
def test_tiles_outside_the_choices_are_refused(params, why):
    with pytest.raises(TgcError, match=why):
        generate_kernel(fused_conv(case_text(CASES[0])), params)


def test_a_region_the_kernel_cannot_run_is_an_error_naming_why():
    module = parse_module(conv_text((1, 8, 6, 6), (8, 8, 3, 3), (1, 8, 4, 4), dtype="f32"))
    PassManager.from_text("lower-for-planning").run(module)
    with pytest.raises(TgcError, match="takes bf16 and f16, not f32"):
        generate_kernel(region_kernel_op(next(iter(module.funcs[0].body.ops))))


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_every_variant_compiles(tmp_path):
    """Each case and tile point for sm_90, in one nvcc run; no spills at the defaults."""
    kernels = [
        (f"k{i}", generate_kernel(fused_conv(case_text(c)), None, f"k{i}").source)
        for i, c in enumerate(CASES)
    ]
    wide = fused_conv(case_text(CASES[5]))
    kernels += [(f"p{i}", generate_kernel(wide, p, f"p{i}").source) for i, p in enumerate(TILES)]
    for arch in ("sm_90",):
        flags = ["-cubin", f"-arch={arch}", "-O3", "-std=c++17", "-Xptxas", "-v"]
        built = compile_each(tmp_path, prelude(), kernels, flags)
        failed = [f"{n}: {log[-1500:]}" for (n, _), (ok, log) in zip(kernels, built) if not ok]
        assert not failed, "\n".join(failed)
        if arch == "sm_90":
            spills = [
                n
                for (n, _), (_, log) in zip(kernels[: len(CASES)], built)
                if " 0 bytes spill stores" not in log
            ]
            assert not spills, spills


# -- on the GPU --------------------------------------------------------------------------------------

TOLERANCE = {"bf16": 3e-2, "f16": 1e-2}


def run_poisoned(fused: FusedOp, inputs: list, params: dict | None = None) -> list[np.ndarray]:
    """The kernel of `fused` launched on `inputs` into outputs filled with NaN first (so an
    element it never writes shows)."""
    import pycuda.driver as cuda

    from tgc.planner import load_backends
    from tgc.planner.backends.cuda import DeviceArray
    from tgc.runtime.cuda_compile import load_kernels

    load_backends(("cuda",), required=True)
    source = generate_kernel(fused, params, "tgc_conv_test")
    (function,) = load_kernels([source])
    args = [DeviceArray.from_host(np.asarray(a), v.type) for a, v in zip(inputs, fused.operands)]
    outs = []
    for r in fused.results:
        nan = np.full(r.type.shape, np.nan, dtype=np.float32).astype(r.type.dtype)
        outs.append(DeviceArray.from_host(nan, r.type))
    pointers = [np.uintp(a.ptr) for a in [*args, *outs]]
    function.prepared_async_call(source.grid, source.block, None, *pointers, shared_size=0)
    cuda.Context.synchronize()
    return [o.get() for o in outs]


def check_on_gpu(text: str, params: dict | None = None, seed: int = 0) -> None:
    ref = parse_module(text)
    inputs = random_inputs(ref.funcs[0], seed)
    (want,) = run_function(ref.funcs[0], inputs, "f64")
    (got,) = run_poisoned(fused_conv(text), inputs, params)
    got = got.astype(np.float64)
    assert not np.isnan(got).any(), f"{np.isnan(got).sum()} elements NaN (never written)"
    elem = next(iter(ref.funcs[0].body.ops)).results[0].type.element_type
    tol = TOLERANCE[elem]
    scale = max(float(np.max(np.abs(want))), 1.0)
    np.testing.assert_allclose(got, want.astype(np.float64), atol=tol * scale, rtol=tol)


@pytest.mark.cuda
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_conv_matches_float64(case):
    check_on_gpu(case_text(case))


@pytest.mark.cuda
@pytest.mark.parametrize("params", TILES, ids=lambda p: "x".join(map(str, p.values())))
def test_conv_tiles_match_float64(params):
    check_on_gpu(case_text(CASES[5]), params, seed=1)


@pytest.mark.cuda
def test_the_route_plans_and_checks_a_conv_block(tmp_path):
    """tgc-run --backend cuda --check on a conv + bias + SiLU + residual block: the planner
    measures the generated kernel beside cuDNN's and the decomposition, and the plan matches."""
    from test_cuda import route_check

    path = tmp_path / "block.tg"
    path.write_text(case_text(CASES[5]))
    route_check(path, tmp_path)
