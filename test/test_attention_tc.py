"""The tensor-core attention kernel (codegen/attention_tc.cu.j2).

CPU: code generation picks it exactly for bf16/f16 with head dims multiples of 16 up to 128 and
q, k, v rows that 16-byte copies can move (else the exact f32 kernel), and nvcc compiles what
it emits for sm_80 and sm_90 (and, as a trap, for older targets), alone and in a standalone file.
GPU (marker `cuda`): against the float64 interpreter on fresh random inputs, outputs poisoned
with NaN first; the relative Frobenius error ||out - ref|| / ||ref|| must stay under 1e-2 for
bf16 and 2e-3 for f16 (P is rounded to the element type before P V, the output on store).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from nvcc_batch import compile_each

from tgc.codegen.kernels import generate_kernel
from tgc.codegen.render import prelude
from tgc.diagnostics import TgcError
from tgc.planner.backends import cuda_kernels as ck
from tgc.planner.standalone import (
    GENERATED,
    emit_standalone_cuda,
    plan_standalone,
    set_template_params,
)
from tgc.dialects.kernel import FusedOp
from tgc.parser import parse_module
from tgc.pass_manager import PassManager
from tgc.runtime.interpreter import random_inputs, run_function
from tgc.verifier import verify

ROOT = Path(__file__).resolve().parent.parent
NVCC = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")
REL_ERROR = {"bf16": 1e-2, "f16": 2e-3}


def t(shape, dtype) -> str:
    return f"tensor<{''.join(f'{d}x' for d in shape)}{dtype}>"


def heads_text(
    b, h, sq, sk, d, dv, dtype="bf16", causal=False, mask=False, layout="heads", scale=None
) -> str:
    """hl.attention over `h` heads. layout `heads`: q, k, v are (b, s, h, d) buffers transposed
    to (b, h, s, d), as GPT-2 splits heads; `flat`: (b, h, s, d) arguments; `qkv`: one
    (b, s, 3 h d) buffer split, reshaped and transposed (sq == sk, d == dv); `q_transposed`: q
    is a (b, h, d, sq) buffer with its last two dims swapped (column stride sq); `q_offset4`: q
    is columns 4 .. 4 + d of a (b, h, sq, d + 8) buffer (offset 4 elements)."""
    out = t((b, h, sq, dv), dtype)
    qh, kh, vh = t((b, h, sq, d), dtype), t((b, h, sk, d), dtype), t((b, h, sk, dv), dtype)
    args, lines = [], []
    perm = "{perm = [0, 2, 1, 3]}"
    if layout == "qkv":
        w = h * d
        x = t((b, sq, 3 * w), dtype)
        args.append(f"%qkv: {x}")
        lines.append(
            f"  %q, %k, %v = atomic.split %qkv {{axis = 2, sizes = [{w}, {w}, {w}]}} : ({x}) -> "
            f"({t((b, sq, w), dtype)}, {t((b, sq, w), dtype)}, {t((b, sq, w), dtype)})"
        )
        for n in "qkv":
            lines.append(
                f"  %{n}4 = atomic.reshape %{n} : ({t((b, sq, w), dtype)}) -> {t((b, sq, h, d), dtype)}"
            )
            lines.append(
                f"  %{n}h = atomic.transpose %{n}4 {perm} : ({t((b, sq, h, d), dtype)}) -> {qh}"
            )
    elif layout == "heads":
        for n, s, dd in (("q", sq, d), ("k", sk, d), ("v", sk, dv)):
            buf = t((b, s, h, dd), dtype)
            args.append(f"%{n}b: {buf}")
            lines.append(
                f"  %{n}h = atomic.transpose %{n}b {perm} : ({buf}) -> {t((b, h, s, dd), dtype)}"
            )
    else:
        args += [f"%kh: {kh}", f"%vh: {vh}"]
        if layout == "flat":
            args.insert(0, f"%qh: {qh}")
        elif layout == "q_transposed":
            buf = t((b, h, d, sq), dtype)
            args.insert(0, f"%qb: {buf}")
            lines.append(f"  %qh = atomic.transpose %qb {{perm = [0, 1, 3, 2]}} : ({buf}) -> {qh}")
        elif layout == "q_offset4":
            buf = t((b, h, sq, d + 8), dtype)
            args.insert(0, f"%qb: {buf}")
            lines.append(
                f"  %qh = atomic.slice %qb {{start = [0, 0, 0, 4], stop = [{b}, {h}, {sq}, {d + 4}], "
                f"step = [1, 1, 1, 1]}} : ({buf}) -> {qh}"
            )
        else:
            raise ValueError(layout)
    operands, types = "%qh, %kh, %vh", [qh, kh, vh]
    if mask:
        args.append(f"%m: {t((sq, sk), dtype)}")
        operands += ", %m"
        types.append(t((sq, sk), dtype))
    attrs = (["causal = true"] if causal else []) + ([f"scale = {scale}"] if scale else [])
    attr_text = f" {{{', '.join(attrs)}}}" if attrs else ""
    lines.append(f"  %y = hl.attention {operands}{attr_text} : ({', '.join(types)}) -> {out}")
    return "\n".join(
        [f"func.func @att({', '.join(args)}) -> {out} {{", *lines, f"  func.return %y : {out}", "}"]
    )


def planned(text: str, arch: str | None = None):
    """`text` planned as the GPU route plans it with nothing measured, on tgc's generated
    kernels alone (planner/standalone.py), for a GPU of `arch`."""
    module = parse_module(text)
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    with ck.planning_kernels(arch):
        plan_standalone(func, libraries=False)
    return func


def regions(func) -> list[FusedOp]:
    """The `kernel.fused` each generated kernel of planned `func` stands for (what codegen and
    the executor generate it from)."""
    calls = [op for op in func.body.ops if op.attributes.get("callee") in GENERATED]
    with ck.planning_kernels(None):  # the templates the calls name
        return [ck.fused_from_call(op) for op in calls]


def attention_region(text: str) -> FusedOp:
    """The one attention region of `text`'s plan."""
    fused = regions(planned(text))
    assert [o.attr("template") for o in fused] == ["attention"]
    return fused[0]


def attention_kernel(text: str):
    """The KernelSource of the one attention region of `text`'s plan."""
    return generate_kernel(attention_region(text))


# -- which kernel ----------------------------------------------------------------------------------

CHOICES = [
    # dtype, d, dv, layout, tensor cores?
    ("bf16", 64, 64, "heads", True),
    ("f16", 128, 128, "heads", True),
    ("bf16", 64, 64, "qkv", True),
    ("f16", 64, 64, "flat", True),
    ("bf16", 80, 80, "flat", True),  # any multiple of 8 up to 128
    ("bf16", 32, 128, "flat", True),  # d != d_v
    ("f32", 64, 64, "heads", False),  # f32 stays exact
    ("bf16", 72, 72, "flat", True),  # padded to 80
    ("f16", 64, 40, "flat", True),  # d_v padded to 48
    ("bf16", 68, 68, "flat", False),  # not a multiple of 8: rows are no 16-byte copies
    ("bf16", 256, 256, "flat", True),  # up to 256 (one slice a warp, tiles of 32 keys)
    ("f16", 160, 88, "flat", True),
    ("bf16", 64, 64, "q_transposed", False),  # column stride != 1
    ("f16", 64, 64, "q_offset4", False),  # offset not a multiple of 8 elements
]


@pytest.mark.parametrize("dtype,d,dv,layout,tc", CHOICES)
def test_tensor_core_kernel_is_chosen_exactly_where_it_fits(dtype, d, dv, layout, tc):
    k = attention_kernel(heads_text(2, 3, 100, 100, d, dv, dtype, True, False, layout))
    assert ("mma.sync.aligned.m16n8k16" in k.source) == tc
    assert k.params.get("tensor_cores", False) == tc
    assert k.template == "attention"
    assert k.block == ((32 * k.params["warps"], 1, 1) if tc else (128, 1, 1))
    if tc:
        assert "cp.async.cg.shared.global" in k.source and "ldmatrix" in k.source
        bm = k.params["block_m"]
        assert bm in (128, 256) if max(d, dv) <= 128 else k.params["rows_per_warp"] == 1
        assert k.grid == (2 * 3 * -(-100 // bm), 1, 1)
        dp, dvp = -(-d // 16) * 16, -(-dv // 16) * 16  # padded to the mma's k step
        bn = k.params["block_n"]
        assert bn == (32 if max(d, dv) > 128 else 64)
        assert k.shared_bytes == 2 * (bm * (dp + 8) + 2 * bn * (dp + 8) + 2 * bn * (dvp + 8))
        assert ("pad columns" in k.source) == ((dp, dvp) != (d, dv))


def test_a_head_dim_over_128_the_tensor_cores_cannot_take_is_a_refusal():
    """Head dim 160 in bf16 with q transposed (rows that are no 16-byte copies): the f32 kernel
    stops at 128, so the generator refuses the attention region with its reason, the planner
    has no such option, and the plan runs the decomposition (on the GPU, SDPA is one too)."""
    text = heads_text(2, 3, 100, 100, 160, 160, "bf16", True, False, "q_transposed")
    module = parse_module(text)
    PassManager.from_text("lower-for-planning").run(module)
    (att,) = [op for op in module.funcs[0].body.ops if op.name == "hl.attention"]
    with ck.planning_kernels(None):
        region = ck.region_of("attention", [att])
        assert ck.region_kernel(region) is None  # no option the planner could pick
        func = ck.region_function(region)
        results = list(func.function_type.results)
        fused = ck.fused_from_block(func.body, results, "attention", "att", func.loc)
    with pytest.raises(TgcError, match="head dims over 128 runs only on the tensor-core kernel"):
        generate_kernel(fused)
    assert "attention" not in [o.attr("template") for o in regions(planned(text))]


def test_mma_type_follows_the_element_type():
    for dtype, ptx in (("bf16", "f32.bf16.bf16.f32"), ("f16", "f32.f16.f16.f32")):
        source = attention_kernel(heads_text(1, 2, 65, 65, 64, 64, dtype)).source
        assert f"mma.sync.aligned.m16n8k16.row.col.{ptx}" in source


def test_template_parameters_choose_rows_per_warp_and_q_registers():
    """Defaults: 32 query rows per warp (block of 128), q in registers up to head dim 64;
    `rows_per_warp` and `q_in_registers` override them."""
    text64 = heads_text(1, 2, 65, 65, 64, 64)
    text128 = heads_text(1, 2, 65, 65, 128, 128)
    fused = attention_region(text64)
    default = generate_kernel(fused)
    assert (default.params["block_m"], default.params["q_in_registers"]) == (128, True)
    one = generate_kernel(fused, {"rows_per_warp": 1, "q_in_registers": False})
    assert (one.params["block_m"], one.params["q_in_registers"]) == (64, False)
    assert one.grid == (2 * 2, 1, 1) and default.grid == (2 * 1, 1, 1)
    assert "uint32_t qf[R]" in default.source and "uint32_t qf[R]" not in one.source
    assert not attention_kernel(text128).params["q_in_registers"]


@pytest.mark.parametrize(
    "d, causal, arch, rows, warps, block_n",
    [
        (64, False, None, 2, 4, 64),
        (64, True, None, 2, 4, 64),
        (72, True, "sm_90", 2, 4, 64),
        (96, False, None, 2, 4, 64),
        (128, False, None, 2, 8, 64),
        (128, True, "sm_80", 2, 8, 64),
        (256, True, None, 1, 8, 32),
        (256, False, "sm_80", 1, 8, 32),
        (256, False, "sm_90", 1, 8, 64),
    ],
)
def test_the_default_block_shape_is_the_fastest_measured_for_its_head_dim(
    d, causal, arch, rows, warps, block_n
):
    """bench/results/attention_tc-tiles-*.md and attention_tile-sweep-*.md: 4 warps of 32
    queries up to head dim 96, 8 warps of 32 queries up to 128, 8 warps of 16 queries above in
    tiles of 64 keys where sm_90's shared memory holds them, else 32 (the mma.sync kernel)."""
    k = generate_kernel(
        attention_region(heads_text(1, 2, 65, 65, d, d, "bf16", causal)),
        {"wgmma": False, **({"arch": arch} if arch else {})},
    )
    shape = (k.params["rows_per_warp"], k.params["warps"], k.params["block_n"])
    assert shape == (rows, warps, block_n)
    assert k.block == (32 * warps, 1, 1) and k.params["block_m"] == 16 * rows * warps


@pytest.mark.parametrize("wgmma", [False, True])
def test_blocks_take_heads_in_groups_of_every_head_unless_told(wgmma):
    """`head_group`: by default every head in one group (the heaviest query tiles of all heads
    first); a value sets it, capped at the heads there are, and a bad one is an error."""
    extra = {"wgmma": True} if wgmma else {}
    fused = attention_region(heads_text(2, 3, 65, 65, 64, 64))
    assert generate_kernel(fused, extra).params["head_group"] == 6  # 2 x 3 heads
    assert generate_kernel(fused, {**extra, "head_group": 4}).params["head_group"] == 4
    assert "G = 6;" in generate_kernel(fused, {**extra, "head_group": 64}).source
    assert "G = 4;" in generate_kernel(fused, {**extra, "head_group": 4}).source
    for bad in (0, True, "4"):
        with pytest.raises(TgcError, match="head_group must be a positive integer"):
            generate_kernel(fused, {**extra, "head_group": bad})


def test_template_parameters_choose_keys_per_tile_and_warps():
    """`block_n` sets the keys of a shared-memory tile and `warps` the warps of a block (its
    queries 16 * rows_per_warp * warps): the grid, the threads and the shared memory follow."""
    fused = attention_region(heads_text(1, 2, 300, 300, 64, 64))
    k = generate_kernel(fused, {"rows_per_warp": 1, "block_n": 128, "warps": 8})
    assert (k.params["block_m"], k.params["block_n"], k.params["warps"]) == (128, 128, 8)
    assert k.block == (256, 1, 1) and k.grid == (2 * -(-300 // 128), 1, 1)
    assert k.shared_bytes == 2 * (128 * 72 + 2 * 128 * 72 + 2 * 128 * 72)
    assert "BN = 128" in k.source and "__launch_bounds__(256)" in k.source
    for bad, why in (
        ({"block_n": 96}, "block_n must be 32, 64 or 128"),
        ({"warps": 2}, "warps 4 or 8"),
    ):
        with pytest.raises(TgcError, match=why):
            generate_kernel(fused, bad)


# -- the wgmma skeleton (sm_90a; template parameter `wgmma`, sm_90's default at 64, 128, 256) ----


def test_wgmma_is_off_by_default_and_a_parameter_turns_it_on():
    fused = attention_region(heads_text(1, 2, 300, 300, 64, 64, "bf16", True))
    assert "wgmma" not in generate_kernel(fused).source
    k = generate_kernel(fused, {"wgmma": True})
    assert "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16" in k.source  # Q K^T and P V
    assert "fence.proxy.async.shared::cta" in k.source
    assert k.arch_features == "sm_90a" and k.block == (256, 1, 1)
    assert k.grid == (2 * -(-300 // 128), 1, 1) and k.params["block_n"] == 64
    assert k.shared_bytes == 2 * (128 * 64 + 4 * 64 * 64) + 16 + 1024  # Q, K, V, sink, alignment
    assert "__launch_bounds__(256, 2)" in k.source  # two blocks an SM: at most 128 registers
    wide = generate_kernel(fused, {"wgmma": True, "block_n": 128})
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in wide.source  # Q K^T
    assert "__launch_bounds__(256, 1)" in wide.source
    k128 = generate_kernel(
        attention_region(heads_text(1, 2, 65, 65, 128, 128, "f16")), {"wgmma": True, "tma": False}
    )
    # head dim 128: 128-key tiles, the warpgroups in ping-pong, Q from shared memory (measured
    # fastest on an H200, bench/results/attention_tile-sweep-*.md); parameters override them
    assert (k128.params["block_n"], k128.params["pingpong"], k128.params["q_in_registers"]) == (
        128,
        True,
        False,
    )
    assert "m64n128k16.f32.f16.f16" in k128.source and "bar.arrive" in k128.source
    assert k128.shared_bytes == 2 * (128 * 128 + 6 * 128 * 128) + 16 + 1024
    plain128 = generate_kernel(
        attention_region(heads_text(1, 2, 65, 65, 128, 128, "f16")),
        {"wgmma": True, "tma": False, "block_n": 64, "pingpong": False},
    )
    assert (plain128.params["block_n"], plain128.params["q_in_registers"]) == (64, True)
    serial128 = generate_kernel(
        attention_region(heads_text(1, 2, 65, 65, 128, 128, "f16")),
        {"wgmma": True, "tma": False, "overlap": False},
    )
    assert not serial128.params["pingpong"]  # ping-pong needs overlap: off without it


def test_wgmma_pads_a_head_dim_between_its_widths_with_zero_columns():
    """Head dim 80 runs in the layout of 128: copies past column 80 are zeros read from nowhere
    (src-size 0), and only 80 columns are stored. Where padding would double the work (32 in
    64) the mma.sync kernel stays sm_90's default, and records `wgmma` false so that tuning
    tries the other."""
    fused = attention_region(heads_text(1, 2, 300, 300, 80, 80, "bf16"))
    k = generate_kernel(fused, {"arch": "sm_90", "tma": False})
    assert "constexpr int D = 128, DH = 80," in k.source
    assert "const bool col_ok = copy_col < DH;" in k.source
    assert "const bool ok = r0 + r < end && c < DH;" in k.source
    assert "for (int n = 0; n < DH / 8; ++n)" in k.source
    assert k.shared_bytes == 2 * (128 * 128 + 6 * 128 * 128) + 16 + 1024  # as head dim 128
    narrow = generate_kernel(
        attention_region(heads_text(1, 2, 300, 300, 32, 32)), {"arch": "sm_90"}
    )
    assert narrow.params["wgmma"] is False and "wgmma.mma_async" not in narrow.source
    exact = generate_kernel(attention_region(heads_text(1, 2, 300, 300, 64, 64)), {"wgmma": True})
    assert "constexpr int D = 64, DH = 64," in exact.source and "col_ok" not in exact.source
    with pytest.raises(TgcError, match=r"head dims d = d_v up to 256 \(got bf16, 80 and 64\)"):
        generate_kernel(
            attention_region(heads_text(1, 2, 65, 65, 80, 64)), {"arch": "sm_90", "wgmma": True}
        )


def test_persistent_blocks_take_query_tiles_in_turn_and_copy_the_next_ones_early():
    """persistent=true: as many blocks as an H100/H200 runs at once (one an SM at head dim 128,
    two at 64 with 64-key tiles), each looping over the query tiles; the next tile's Q and
    first K are copied after both warpgroups are done with this one's, before its O is stored.
    Off by default; a tile count under the grid's keeps one block a tile."""
    text = heads_text(4, 8, 600, 600, 128, 128, "bf16", True)  # 32 heads x 5 query tiles
    old = {"arch": "sm_90", "tma": False}  # (the TMA kernel is always persistent)
    k = generate_kernel(attention_region(text), {**old, "persistent": True})
    assert k.params["persistent"] is True and k.grid == (132, 1, 1)
    src = k.source
    assert "constexpr int ITEMS = 32 * NQ;" in src
    assert "for (int item = blockIdx.x; item < ITEMS; item += gridDim.x) {" in src
    assert "origin(item + gridDim.x, next_bz, next_q0);" in src
    assert src.index("load_rows(Qs, q_at(next_bz)") < src.index("// Normalise by the row sums")
    two = generate_kernel(
        attention_region(heads_text(8, 8, 600, 600, 64, 64, "bf16")),
        {**old, "persistent": True},
    )
    assert two.grid == (264, 1, 1) and "__launch_bounds__(256, 2)" in two.source
    few = generate_kernel(
        attention_region(heads_text(1, 2, 300, 300, 128, 128)),
        {**old, "persistent": True},
    )
    assert few.grid == (2 * 3, 1, 1)
    default = generate_kernel(attention_region(text), old)
    assert default.params["persistent"] is False and default.grid == (32 * 5, 1, 1)
    assert "ITEMS" not in default.source and "next_bz" not in default.source
    with pytest.raises(TgcError, match="persistent must be true or false, not 1"):
        generate_kernel(attention_region(text), {**old, "persistent": 1})


@pytest.mark.parametrize(
    "text, arch, wgmma",
    [
        (heads_text(1, 2, 300, 300, 64, 64, "bf16", True), "sm_90", True),
        (heads_text(1, 2, 300, 300, 128, 128, "f16"), "sm_90", True),
        (heads_text(1, 2, 300, 300, 64, 64, "bf16", True), "sm_80", False),
        (heads_text(1, 2, 300, 300, 64, 64, "bf16", True), None, False),
        (heads_text(1, 2, 300, 300, 80, 80, "bf16"), "sm_90", True),  # 80 in the width of 128
        (heads_text(1, 2, 300, 300, 32, 32, "bf16"), "sm_90", False),  # 32: twice the work in 64
        (heads_text(1, 2, 300, 300, 64, 64, "f32"), "sm_90", False),
    ],
)
def test_the_wgmma_kernel_is_the_default_for_sm_90_where_it_runs(text, arch, wgmma):
    """`arch`: on sm_90 the wgmma kernel (swizzled) unless it cannot run the
    region; elsewhere, or with no arch, the portable kernels; `wgmma` still overrides."""
    fused = attention_region(text)
    k = generate_kernel(fused, {"arch": arch} if arch else {})
    assert k.params.get("wgmma", False) is wgmma
    assert ("wgmma.mma_async" in k.source) is wgmma
    if wgmma:
        assert k.arch_features == "sm_90a"
        assert not generate_kernel(fused, {"arch": arch, "wgmma": False}).params["wgmma"]


def test_a_plan_for_sm_90_runs_the_wgmma_kernel():
    """The plan for an sm_90 runs the wgmma kernel (the template's default there), for another
    GPU the mma.sync one; template parameters given over the plan's (set_template_params)
    still win."""

    def wgmma(arch=None, params=None) -> bool:
        func = planned(heads_text(1, 2, 300, 300, 64, 64, "bf16", True), arch)
        if params is not None:
            set_template_params(func, {"arch": arch, **params})
        (fused,) = regions(func)
        (call,) = [op for op in func.body.ops if op.attributes.get("callee") in GENERATED]
        k = generate_kernel(fused, {"arch": arch, **ck.call_params(call)} if arch else None)
        return bool(k.params.get("wgmma")) and "wgmma.mma_async" in k.source

    assert wgmma("sm_90") and not wgmma() and not wgmma("sm_80")
    assert wgmma("sm_90", {"block_n": 128})
    assert not wgmma("sm_90", {"wgmma": False})


@pytest.mark.parametrize("arch", [90, "sm_9x", "sm_"])
def test_a_bad_arch_is_an_error(arch):
    """The same test as tgc-translate's --arch (render.is_gpu_arch)."""
    with pytest.raises(TgcError, match="arch names a GPU as nvcc does"):
        generate_kernel(attention_region(heads_text(1, 2, 65, 65, 64, 64)), {"arch": arch})


def test_wgmma_overlaps_the_softmax_with_p_v_unless_told_not_to():
    """By default S of tile j and P V of tile j - 1 are in flight together and the softmax waits
    for S alone (wait_group 1); overlap=false waits for both."""
    fused = attention_region(heads_text(1, 2, 300, 300, 64, 64, "bf16", True))
    k = generate_kernel(fused, {"wgmma": True})
    assert k.params["overlap"] is True
    assert "wgmma.wait_group.sync.aligned 1;" in k.source
    # The softmax ends in a shared-memory store of its row sums before P V's wait: the order
    # ptxas keeps (without it the wait was scheduled before the softmax).
    for body in (k.source, generate_kernel(fused, {"wgmma": True, "pingpong": True}).source):
        assert body.count("softmax(j * BN);\n      softmax_done();\n      wgmma_wait0();") == 1
    serial = generate_kernel(fused, {"wgmma": True, "overlap": False})
    assert serial.params["overlap"] is False
    assert "wgmma.wait_group.sync.aligned 1;" not in serial.source
    assert "wgmma.wait_group.sync.aligned 0;" in serial.source


def test_wgmma_pingpong_is_off_by_default_and_takes_turns_through_named_barriers():
    """pingpong=true: no __syncthreads in the key loop but a named barrier the two warpgroups
    meet at (LANDED, bar.sync) and one they take turns at (TURN, warpgroup 0 arrives, 1 waits);
    K and V get three buffers each (the shared memory says so)."""
    fused = attention_region(heads_text(1, 2, 300, 300, 64, 64, "bf16", True))
    plain = generate_kernel(fused, {"wgmma": True})
    assert plain.params["pingpong"] is False and "bar.sync %0" not in plain.source
    assert plain.shared_bytes == 2 * (128 * 64 + 4 * 64 * 64) + 16 + 1024
    k = generate_kernel(fused, {"wgmma": True, "pingpong": True})
    assert k.params["pingpong"] is True
    assert "bar.sync %0, 256;" in k.source and "bar.arrive %0, 256;" in k.source
    assert "__syncthreads();" not in k.source and "__syncthreads();" in plain.source
    assert k.shared_bytes == 2 * (128 * 64 + 6 * 64 * 64) + 16 + 1024
    assert "__launch_bounds__(256, 2)" in k.source  # 64 KiB a block: still two an SM


def test_wgmma_is_sm_90s_kernel_at_head_dim_256():
    """Head dim 256 on the wgmma kernel: 64-key tiles, Q from shared memory, no ping-pong (192
    KB of shared memory); sm_90's default there (55-91% of SDPA's speed on an H200 where the
    mma.sync kernel ran at 38-43%), the mma.sync kernel elsewhere."""
    fused = attention_region(heads_text(1, 2, 300, 300, 256, 256, "bf16", True))
    k = generate_kernel(fused, {"wgmma": True, "tma": False})
    assert "wgmma.mma_async.sync.aligned.m64n256k16.f32.bf16.bf16" in k.source  # P V
    assert (k.params["block_n"], k.params["pingpong"], k.params["q_in_registers"]) == (
        64,
        False,
        False,
    )
    assert k.shared_bytes == 2 * (128 * 256 + 4 * 64 * 256) + 16 + 1024
    assert generate_kernel(fused, {"arch": "sm_90"}).params["wgmma"]
    assert not generate_kernel(fused, {"arch": "sm_80"}).params["wgmma"]
    for params in ({"block_n": 128}, {"pingpong": True}, {"q_in_registers": True}):
        with pytest.raises(TgcError, match="wgmma at head dim 256 takes block_n 64, no pingpong"):
            generate_kernel(fused, {"wgmma": True, "tma": False, **params})


@pytest.mark.parametrize(
    "text, params, why",
    [
        (heads_text(1, 2, 65, 65, 64, 64, "f32"), {}, "got f32, 64 and 64"),
        (heads_text(1, 2, 65, 65, 20, 20), {}, "got bf16, 20 and 20"),
        (heads_text(1, 2, 65, 65, 32, 128, layout="flat"), {}, "got bf16, 32 and 128"),
        (heads_text(1, 2, 65, 65, 64, 64), {"block_n": 32}, "wgmma takes block_n 64 or 128"),
        (heads_text(1, 2, 65, 65, 64, 64), {"overlap": 1}, "overlap must be true or false, not 1"),
        (heads_text(1, 2, 65, 65, 64, 64), {"pingpong": "yes"}, "pingpong must be true or false"),
        (
            heads_text(1, 2, 65, 65, 64, 64),
            {"q_in_registers": 1},
            "q_in_registers must be true or false, not 1",
        ),
        (heads_text(1, 2, 65, 65, 64, 64), {"swizzle": "on"}, "swizzle must be true or false"),
        (
            heads_text(1, 2, 65, 65, 64, 64),
            {"pingpong": True, "overlap": False},
            "pingpong needs overlap=true",
        ),
    ],
)
def test_what_wgmma_cannot_run_is_an_error_naming_why(text, params, why):
    with pytest.raises(TgcError, match=why):
        generate_kernel(attention_region(text), {"wgmma": True, "tma": False, **params})


# -- the TMA kernel (warp-specialised, persistent; `tma`, sm_90's default but at 64 causal) --------


def test_the_tma_kernel_is_sm_90s_default_but_at_head_dims_to_64_with_few_tiles():
    """On sm_90 the TMA kernel runs head dims 72-256, and 64 from 4 waves of 132 query tiles
    (BERT-base's 192 at batch 4 ran faster on the other kernel), causal or not: a producer
    warpgroup and two consumers (384 threads), one block an SM (as many as there are units of
    query tiles, at most 132), q, k and v read through tensor maps (head dim, rows, then the
    batch dims, innermost first; the columns past the head dim read as zeros)."""
    regions = {}  # (each planned once: planning is most of this test's time)
    for b, h, d, causal, tma in (
        (2, 3, 128, True, True),
        (2, 3, 80, False, True),
        (4, 12, 64, False, False),  # 384 query tiles
        (6, 11, 64, False, True),  # 528: 4 waves
        (6, 11, 64, True, True),
        (4, 12, 64, True, False),
    ):
        regions[b, h, d, causal] = region = attention_region(
            heads_text(b, h, 1000, 1000, d, d, "bf16", causal)
        )
        k = generate_kernel(region, {"arch": "sm_90"})
        assert k.params["wgmma"] and k.params["tma"] is tma, (b, h, d, causal)
        assert (k.block == (384, 1, 1)) is tma and bool(k.tensor_maps) is tma
    k = generate_kernel(regions[2, 3, 80, False], {"arch": "sm_90"})
    assert k.grid == (2 * 3 * 8, 1, 1)  # 8 query tiles a head, one a unit without a mask
    q, kmap, v, o = k.tensor_maps
    # q: the (b, s, h, d) buffer transposed: rows 3 * 80 elements apart, heads 80, batches 1000 rows
    assert q.dims == (80, 1000, 3, 2) and q.strides == (480, 160, 480_000)
    assert q.box == (64, 128, 1, 1) and kmap.box == v.box == (64, 128, 1, 1)
    # O stored by TMA (tma_store) in each warpgroup's boxes of 64 rows: the (b, h, s, d) result
    assert k.params["tma_store"] and o.operand == 3 and o.box == (64, 64, 1, 1)
    assert o.dims == (80, 1000, 3, 2) and o.strides == (160, 160_000, 480_000)
    assert "constexpr int D = 128, DH = 80, BM = 128, BN = 128, STAGES = 2;" in k.source
    assert "constexpr int Q_STAGES = 2;" in k.source
    assert "setmaxnreg.dec.sync.aligned.u32 24;" in k.source
    assert "setmaxnreg.inc.sync.aligned.u32 240;" in k.source
    assert k.source.count("cp.async.bulk.tensor.4d") == 4  # q, k, v loaded; o stored
    big = generate_kernel(regions[6, 11, 64, False], {"arch": "sm_90"})
    assert big.grid == (132, 1, 1) and big.params["head_group"] == 8
    old = generate_kernel(regions[2, 3, 80, False], {"arch": "sm_90", "tma": False})
    assert not old.tensor_maps and old.block == (256, 1, 1)


def test_the_tma_kernels_query_tiles_go_in_pairs_of_equal_keys():
    """Under a causal mask a unit is query tiles NQ - 1 - p and p of one batch entry (the heavier
    first): every unit sees NQ + 1 key tiles, so blocks taking units in turn stay balanced.
    Without it a unit is one tile, in groups of 8 entries."""
    k = generate_kernel(
        attention_region(heads_text(1, 2, 1000, 1000, 128, 128, "bf16", True)), {"arch": "sm_90"}
    )
    assert "constexpr int NQ = 8, PER = 2, SLOTS = (NQ + PER - 1) / PER;" in k.source
    assert "constexpr int UNITS = 2 * SLOTS, G = 1;" in k.source
    assert k.grid == (2 * 4, 1, 1) and k.params["head_group"] == 1
    full = generate_kernel(
        attention_region(heads_text(1, 2, 1000, 1000, 128, 128, "bf16")), {"arch": "sm_90"}
    )
    assert "PER = 1," in full.source and "UNITS = 2 * SLOTS, G = 2;" in full.source
    assert full.grid == (2 * 8, 1, 1)


def test_merged_query_tiles_issue_a_tiles_last_p_v_with_the_next_ones_first_s():
    """merge_tiles=true (the default at head dim 256 without a causal mask from 8k keys):
    after a block's first tile, each round 0 issues the next tile's S and the pending tile's
    last P V together and stores the pending tile's O after them; one round of P V alone ends
    the block."""
    text = heads_text(1, 2, 1000, 1000, 128, 128, "bf16", True)
    plain = generate_kernel(attention_region(text), {"arch": "sm_90"})
    merged = generate_kernel(attention_region(text), {"arch": "sm_90", "merge_tiles": True})
    assert plain.params["merge_tiles"] is False and "rest_of_tile" not in plain.source
    assert merged.params["merge_tiles"] is True
    body = merged.source[merged.source.index("while (next_tile()) {") :]
    merged_round = body[: body.index("rest_of_tile(st);")]
    assert merged_round.index("issue_s(Ks + st * TILE_BYTES);") < merged_round.index(
        "issue_pv(Vs + pst * TILE_BYTES);"
    )
    assert merged_round.index("wgmma_wait1();") < merged_round.index("float sum = prev_l[h];")


@pytest.mark.parametrize(
    "seq, dim, causal, merged",
    [
        (512, 64, True, False),  # up to 128: never (two Q buffers and TMA stores instead)
        (8192, 64, False, False),
        (2048, 128, False, False),
        (8192, 80, False, False),
        (8192, 256, True, False),  # 256: full from 8k keys
        (2048, 256, False, False),
        (8192, 256, False, True),
    ],
)
def test_query_tiles_are_merged_by_default_where_measured_faster(seq, dim, causal, merged):
    """_merge_tiles_by_default: the sizes where the H200 grid ran merge_tiles faster."""
    text = heads_text(1, 2, seq, seq, dim, dim, "bf16", causal)
    k = generate_kernel(attention_region(text), {"arch": "sm_90", "tma": True})
    assert k.params["merge_tiles"] is merged
    assert ("rest_of_tile" in k.source) is merged


def test_two_q_buffers_take_turns_and_cost_a_ring_stage_at_head_dim_128():
    """q_stages=2 (the default up to head dim 128): query tile n's Q in buffer n % 2 under its
    own full and empty barriers, so the producer copies the next tile's Q while the consumers
    read this one's; at head dim 128 the second 32 KB buffer leaves room for 2 ring stages, not
    3. With Q in registers two buffers too (O is stored through them); at 256 one."""
    fused = attention_region(heads_text(1, 2, 1000, 1000, 128, 128, "bf16"))
    one = generate_kernel(fused, {"arch": "sm_90", "tma": True, "q_stages": 1})
    two = generate_kernel(fused, {"arch": "sm_90", "tma": True})  # the default here
    assert (one.params["q_stages"], one.params["stages"]) == (1, 3)
    assert (two.params["q_stages"], two.params["stages"]) == (2, 2)
    assert "constexpr int Q_STAGES = 2;" in two.source
    assert "wait(&q_empty[qslot], ((qn / Q_STAGES) & 1) ^ 1);" in two.source
    assert "Qs = Q0 + qslot * Q_BYTES;" in two.source
    assert two.shared_bytes - one.shared_bytes == 128 * 128 * 2 - 2 * 2 * 128 * 128
    regs = generate_kernel(fused, {"arch": "sm_90", "tma": True, "q_in_registers": True})
    wide = attention_region(heads_text(1, 2, 1000, 1000, 256, 256, "bf16"))
    assert regs.params["q_stages"] == 2 and regs.params["tma_store"]
    assert generate_kernel(wide, {"arch": "sm_90", "tma": True}).params["q_stages"] == 1


def test_o_is_stored_by_tma_where_two_q_buffers_take_it_and_its_strides_allow():
    """tma_store (the default where tiles are not merged and output strides are of 16 bytes,
    which head dims in steps of 8 always make; with one Q buffer too): each warpgroup writes O into its rows of
    the tile's Q buffer and one thread stores them by bulk tensor copies; the buffer is
    released by those two threads, not by 256. Elsewhere O goes from registers, and asking
    for tma_store there is an error."""
    fused = attention_region(heads_text(1, 2, 1000, 1000, 128, 128, "bf16", True))
    k = generate_kernel(fused, {"arch": "sm_90", "tma": True})
    assert k.params["tma_store"] and len(k.tensor_maps) == 4
    assert "d.global.shared::cta.bulk_group [%0, { %1, %2, %3 }], [%4];" in k.source
    assert "init(&q_empty[s], 2);" in k.source and "cp.async.bulk.wait_group.read 0;" in k.source
    assert "TgcTensorMap tgc_map_o" in k.source
    plain = generate_kernel(fused, {"arch": "sm_90", "tma": True, "tma_store": False})
    assert len(plain.tensor_maps) == 3 and "init(&q_empty[s], 256);" in plain.source
    assert "bulk_group" not in plain.source
    merged = generate_kernel(fused, {"arch": "sm_90", "tma": True, "merge_tiles": True})
    assert merged.params["tma_store"] is False
    one = generate_kernel(fused, {"arch": "sm_90", "tma": True, "q_stages": 1})
    assert one.params["tma_store"] and "init(&q_empty[s], 2);" in one.source
    short = attention_region(heads_text(1, 2, 512, 512, 256, 256, "bf16"))
    short_k = generate_kernel(short, {"arch": "sm_90"})
    assert short_k.params["q_stages"] == 1 and short_k.params["tma_store"]
    # where merged tiles are the default (256, full, 8k keys), asking for the stores unmerges
    wide = attention_region(heads_text(1, 1, 8192, 8192, 256, 256, "bf16"))
    assert generate_kernel(wide, {"arch": "sm_90"}).params["tma_store"] is False
    stored = generate_kernel(wide, {"arch": "sm_90", "tma": True, "tma_store": True})
    assert stored.params["tma_store"] and not stored.params["merge_tiles"]
    assert generate_kernel(wide, {"arch": "sm_90", "tma": True}).params["merge_tiles"]
    with pytest.raises(TgcError, match="tma_store .* needs merge_tiles false"):
        generate_kernel(
            fused, {"arch": "sm_90", "tma": True, "merge_tiles": True, "tma_store": True}
        )


def test_the_tma_kernel_refuses_an_unaligned_operand_at_launch():
    """A tensor map needs a 16-byte aligned address: a launch over an operand 2 bytes past one
    is a located error naming the kernel and the operand, made before anything reaches the GPU."""
    from tgc.runtime.tensor_map import kernel_arguments

    text = heads_text(2, 2, 100, 150, 128, 128, "bf16", True, True, "flat")
    k = generate_kernel(attention_region(text), {"arch": "sm_90"})
    assert k.params["tma"]
    with pytest.raises(TgcError, match=r"its operand 0 is not 16-byte aligned") as info:
        kernel_arguments(k, [4096 + 2, 8192, 12288, 16384, 20480])
    assert f"({k.name})" in str(info.value) and info.value.loc is not None


@pytest.mark.parametrize(
    "params, why",
    [
        ({"tma": 1}, "tma must be true or false, not 1"),
        ({"overlap": False}, "the TMA kernel always runs overlap; overlap=false needs tma=false"),
        ({"pingpong": False}, "always runs pingpong"),
        ({"persistent": False}, "always runs persistent"),
        ({"block_n": 32}, "the TMA kernel takes block_n 64 or 128"),
        ({"stages": 1}, "q_stages 2 takes 2 to 2 stages \\(shared memory\\), not 1"),
        ({"q_stages": 1, "stages": 4}, "q_stages 1 takes 2 to 3 stages"),
        ({"stages": 3}, "q_stages 2 takes 2 to 2 stages"),
        ({"q_stages": 3}, "takes q_stages 1 or 2, not 3"),
        ({"q_stages": True}, "takes q_stages 1 or 2, not True"),
        ({"tma_store": 1}, "tma_store \\(true or false, not 1 here\\)"),
        ({"q_in_registers": "no"}, "q_in_registers must be true or false"),
        ({"head_group": 0}, "head_group must be a positive integer"),
        ({"merge_tiles": 1}, "merge_tiles must be true or false, not 1"),
    ],
)
def test_what_the_tma_kernel_cannot_run_is_an_error_naming_why(params, why):
    fused = attention_region(heads_text(1, 2, 300, 300, 128, 128, "bf16"))
    with pytest.raises(TgcError, match=why):
        generate_kernel(fused, {"arch": "sm_90", "tma": True, **params})


def test_a_kernel_that_needs_sm_90a_is_built_for_it_and_refused_elsewhere():
    fused = attention_region(heads_text(1, 2, 65, 65, 64, 64))
    plain, wg = generate_kernel(fused), generate_kernel(fused, {"wgmma": True})
    assert plain.nvcc_target("sm_90") == ["-arch=sm_90"]
    assert plain.nvcc_target("sm_80") == ["-arch=sm_80"]
    assert wg.nvcc_target("sm_90") == ["-gencode=arch=compute_90a,code=sm_90a"]
    with pytest.raises(TgcError, match="needs a sm_90a GPU \\(this one is sm_80\\)") as info:
        wg.nvcc_target("sm_80")
    assert info.value.loc is not None


# Each parameter at least once, at both head dims, causal and masked (a covering set: every
# case costs seconds of ptxas in the suite)
WGMMA_COMPILED = [
    (heads_text(2, 3, 100, 130, 64, 64, "bf16", True, False, "heads"), {}),
    # the other kernel's defaults at head dim 128 (ping-pong, 128-key tiles) with a mask
    (heads_text(2, 3, 1000, 1000, 128, 128, "f16", False, True, "heads"), {"tma": False}),
    (heads_text(2, 2, 700, 700, 64, 64, "bf16", True, False, "qkv"), {"overlap": False}),
    (heads_text(2, 3, 1000, 1000, 64, 64, "bf16", True, True, "heads"), {"pingpong": True}),
    (
        heads_text(2, 3, 1000, 1000, 64, 64, "bf16", True, False, "heads"),
        {"q_in_registers": True},
    ),
    (heads_text(2, 3, 1000, 1000, 64, 64, "bf16", True, False, "heads"), {"swizzle": True}),
    # persistent blocks
    (
        heads_text(4, 8, 600, 600, 128, 128, "bf16", False, True, "heads"),
        {"tma": False, "persistent": True},
    ),
    # the TMA kernel: padded and causal (its default); merged query tiles at head dim 64, Q in
    # registers, a mask
    (heads_text(2, 3, 1000, 1000, 80, 80, "bf16", True, True, "heads"), {}),
    (
        heads_text(2, 2, 700, 700, 64, 64, "f16", False, True, "qkv"),
        {"tma": True, "merge_tiles": True},
    ),
]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_wgmma_kernels_compile_for_sm_90a_with_no_wgmma_serialised(tmp_path):
    """The -gencode target the executor uses; ptxas reports no fence it had to add between
    wgmmas (C7519: registers the wgmmas read changed between them) nor any other reason it
    serialised them, and no spill: the accumulators of S and O and P's fragments fit in the
    registers the launch bounds leave (128 a thread where two blocks share an SM); no warning
    (an unused lambda). Every case in one nvcc run (compile_kernels)."""
    kernels = [
        generate_kernel(attention_region(text), {"wgmma": True, **params})
        for text, params in WGMMA_COMPILED
    ]
    built = compile_kernels(
        tmp_path, [(k, ("-cubin", "-Xptxas", "-v", *k.nvcc_target("sm_90"))) for k in kernels]
    )
    failures = []
    for (_, params), k, messages in zip(WGMMA_COMPILED, kernels, built):
        used = re.search(r"Used (\d+) registers", messages)
        limit = 128 if "__launch_bounds__(256, 2)" in k.source else 255
        if "C7519" in messages or "serialized" in messages:
            failures.append(f"{params}: wgmmas serialised\n{messages[-2000:]}")
        elif not used or int(used.group(1)) > limit:
            failures.append(f"{params}: more than {limit} registers\n{messages[-2000:]}")
        elif not re.search(r"\b0 bytes spill stores, 0 bytes spill loads", messages):
            failures.append(f"{params}: spills\n{messages[-2000:]}")
        elif "warning" in messages:
            failures.append(f"{params}: nvcc warns\n{messages[-2000:]}")
    assert not failures, "\n\n".join(failures)


def test_the_f32_kernel_refuses_a_tile_size_it_does_not_take():
    fused = attention_region(heads_text(1, 2, 65, 65, 64, 64, "f32"))
    assert generate_kernel(fused, {"block_n": 64}).params["block_n"] == 64
    with pytest.raises(TgcError, match="the f32 kernel takes tiles of 64 keys, not block_n=128"):
        generate_kernel(fused, {"block_n": 128})


def test_bad_template_parameter_is_a_located_error():
    from tgc.diagnostics import TgcError

    fused = attention_region(heads_text(1, 2, 65, 65, 64, 64))
    with pytest.raises(TgcError, match="rows_per_warp must be 1 or 2") as info:
        generate_kernel(fused, {"rows_per_warp": 3})
    assert info.value.loc is not None


def test_over_48k_of_shared_memory_is_raised_in_the_standalone_launcher():
    """Head dim 128 needs more than 48 KB of dynamic shared memory: the standalone host code
    sets the function's limit before its launch (the PyCUDA executor does the same)."""
    text = heads_text(1, 2, 65, 65, 128, 128, "bf16", True)
    k = attention_kernel(text)
    assert k.shared_bytes > 48 * 1024
    module = parse_module(text)
    PassManager.from_text("lower-for-planning").run(module)
    source = emit_standalone_cuda(module, "att")
    assert f"cudaFuncAttributeMaxDynamicSharedMemorySize, {k.shared_bytes})" in source


# -- nvcc ------------------------------------------------------------------------------------------


def nvcc(tmp_path: Path, source: str, *flags: str) -> str:
    """Compile `source` with `flags` (the test fails if nvcc does); nvcc's messages."""
    path = tmp_path / "k.cu"
    path.write_text(source)
    proc = subprocess.run(
        [NVCC, *flags, "-O3", "-std=c++17", str(path), "-o", str(tmp_path / "k.out")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout + proc.stderr


def compile_kernels(tmp_path: Path, kernels: list) -> list[str]:
    """Compile each (kernel, flags) after the prelude as `nvcc` does (the test fails naming
    every kernel that does not compile); each kernel's messages. Kernels with the same flags
    compile in one nvcc run (test/nvcc_batch.py): nvcc's fixed cost, about 0.4 s of CPU a
    run, is paid once, and ptxas's messages are split by kernel."""
    groups: dict[tuple, list[int]] = {}
    for i, (_, flags) in enumerate(kernels):
        groups.setdefault(tuple(flags), []).append(i)
    messages: list[str] = [""] * len(kernels)
    failed = []
    for g, (flags, members) in enumerate(groups.items()):
        work = tmp_path / f"unit{g}"
        work.mkdir()
        sources = [(kernels[i][0].name, kernels[i][0].source) for i in members]
        results = compile_each(work, prelude(), sources, (*flags, "-O3", "-std=c++17"))
        for i, (ok, log) in zip(members, results):
            messages[i] = log
            if not ok:
                failed.append(f"{kernels[i][0].name} ({' '.join(flags)}):\n{log[-3000:]}")
    assert not failed, "\n\n".join(failed)
    return messages


COMPILED = [
    # dtype, d, dv, causal, mask, layout
    ("bf16", 64, 64, True, False, "heads"),
    ("f16", 128, 128, False, True, "heads"),
    ("bf16", 80, 48, True, True, "flat"),
    ("bf16", 72, 40, True, False, "heads"),  # both head dims padded in shared memory
    ("bf16", 256, 256, False, True, "heads"),  # one slice a warp, tiles of 32 keys
]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_generated_kernels_compile(tmp_path):
    """Each case's tensor-core kernel for sm_80, the first for sm_90 too (one nvcc run per
    arch: the source is the same for both)."""
    kernels = []
    for i, (dtype, d, dv, causal, mask, layout) in enumerate(COMPILED):
        k = attention_kernel(
            heads_text(2, 3, 100, 130 if dv == d else 100, d, dv, dtype, causal, mask, layout)
        )
        assert k.params["tensor_cores"]
        kernels += [(k, ("-cubin", f"-arch={arch}")) for arch in ("sm_80", "sm_90")[: 2 - bool(i)]]
    compile_kernels(tmp_path, kernels)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_standalone_file_compiles_and_traps_below_sm80(tmp_path):
    """The whole standalone file (two attention kernels in one translation unit) compiles for
    sm_90 with its main, and for sm_75, where the tensor-core kernel is a trap."""
    text = heads_text(2, 2, 70, 70, 64, 64, "bf16", True, True, "qkv")
    second = heads_text(1, 2, 33, 33, 128, 128, "bf16").replace("@att", "@att2")
    module = parse_module(text + "\n" + second)
    PassManager.from_text("lower-for-planning").run(module)
    source = emit_standalone_cuda(module, "att")
    assert source.count("mma.sync.aligned.m16n8k16") == 2
    nvcc(tmp_path, source, "-arch=sm_90", "-DTGC_STANDALONE_MAIN")
    nvcc(tmp_path, source, "-arch=sm_75", "-c")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_standalone_file_for_sm_90_compiles_with_its_wgmma_kernels(tmp_path):
    """`arch="sm_90"` (tgc-translate --arch): both attention kernels are wgmma ones, the second
    the TMA kernel, its k and v maps starting 256 and 512 elements into the one qkv buffer; the
    file, with its main, compiles for sm_90a as its header says."""
    text = heads_text(2, 2, 70, 70, 64, 64, "bf16", True, True, "qkv")
    second = heads_text(1, 2, 33, 33, 128, 128, "f16", False, False, "qkv")
    module = parse_module(text + "\n" + second.replace("@att", "@att2"))
    PassManager.from_text("lower-for-planning").run(module)
    source = emit_standalone_cuda(module, "att", arch="sm_90")
    assert source.count("fused attention on Hopper's tensor cores") == 2
    assert "const unsigned long long tgc_strides1[2] = {1536, 256};" in source
    assert "tgc_tensor_map(&tgc_maps[1], 6, (const char*) (const __half*) inputs[0] + 512, 3," in (
        source
    )
    assert "(const char*) (const __half*) inputs[0] + 1024, 3, tgc_dims2" in source
    assert "-gencode=arch=compute_90a,code=sm_90a" in source.split("#include")[0]
    nvcc(tmp_path, source, "-gencode=arch=compute_90a,code=sm_90a", "-DTGC_STANDALONE_MAIN")


def bench_dry_run(*args: str) -> str:
    """bench/attention_tc.py --dry-run with `args` (nvcc on its PATH); its output, after it
    succeeded."""
    proc = subprocess.run(
        [sys.executable, str(ROOT / "bench" / "attention_tc.py"), "--dry-run", *args],
        capture_output=True,
        text=True,
        check=False,
        env=dict(os.environ, PATH=f"{Path(NVCC).parent}:{os.environ.get('PATH', '')}"),
    )
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    return proc.stdout


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_bench_dry_run_generates_and_compiles():
    """bench/attention_tc.py --dry-run, the causal bf16 cases (both shapes): generated and
    compiled, no GPU needed. (Its other kernels are the same templates at other types and
    masks, which test_generated_kernels_compile and the wgmma test compile.)"""
    out = bench_dry_run("--arch", "sm_90", "--only", "bf16,causal")
    assert out.count("compiled") == 2, out


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_bench_decode_dry_run_generates_and_compiles_a_gqa_decode_kernel():
    """bench/attention_tc.py --decode --dry-run, one case (batch 1, a 2k cache, head dim 64):
    the grouped query heads as query rows of their key-value head, generated and compiled."""
    out = bench_dry_run("--decode", "--only", "B1,S2048,D64")
    assert out.count("compiled") == 1
    assert "decode B1 H32/8 S2048 D64 bf16: compiled for sm_90" in out


def _bench():
    sys.path.insert(0, str(ROOT / "bench"))
    import attention_tc

    return attention_tc


def test_the_bench_grid_covers_the_issues_head_dims_and_grouped_query_attention():
    """--grid: bf16 at head dims 64, 72, 80, 96, 128 and 256, three sequence lengths of 8k
    tokens, causal and full; grouped-query 8:1 at 64 and 128; --only selects by words."""
    bench = _bench()
    grid = bench.grid_cases(set())
    assert {c.d for c in grid} == {64, 72, 80, 96, 128, 256}
    assert {(c.b * c.s, c.dtype) for c in grid} == {(8192, "bf16")}
    assert {c.d for c in grid if c.kv_heads} == {64, 128}
    assert len(grid) == 6 * 3 * 2 + 2 * 3 * 2
    (one,) = bench.grid_cases({"GQA", "S2048", "D128", "full"})
    assert one.name == "B4 H32/4 GQA S2048 D128 full bf16"


@pytest.mark.parametrize("causal", [True, False])
def test_the_grouped_query_text_of_the_bench_is_sdpas_enable_gqa(causal):
    """The grid's grouped-query text (k and v repeated as repeat_kv writes it) computes what
    SDPA with enable_gqa computes: query head h reads key-value head h // group; small sizes
    against a float64 loop."""
    text = _bench().gqa_text(2, 6, 2, 5, 8, causal, "f64")
    module = parse_module(text)
    verify(module)
    q, k, v = random_inputs(module.funcs[0], 7)
    (got,) = run_function(module.funcs[0], [q, k, v], "f64")
    want = np.empty_like(got)
    for b in range(2):
        for h in range(6):
            scores = q[b, h] @ k[b, h // 3].T / np.sqrt(8)
            if causal:
                scores = np.where(np.triu(np.ones((5, 5), bool), 1), -np.inf, scores)
            p = np.exp(scores - scores.max(-1, keepdims=True))
            want[b, h] = (p / p.sum(-1, keepdims=True)) @ v[b, h // 3]
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)


def test_the_bench_takes_one_set_of_cases(capsys):
    with pytest.raises(SystemExit) as info:
        _bench().main(["--grid", "--decode", "--dry-run"])
    assert info.value.code == 2
    assert "--decode and --grid are two sets of cases: give one" in capsys.readouterr().err


def test_the_bench_sweeps_sets_of_template_parameters(monkeypatch, capsys):
    """--params with `;`: every case with each set (a sweep); one set only with --decode."""
    bench = _bench()
    seen = []
    monkeypatch.setattr(bench, "dry_run", lambda cases, arch, params: seen.append(params) or 0)
    argv = ["--grid", "--only", "D64,S512", "--dry-run", "--params", "block_n=128;pingpong=true"]
    assert bench.main(argv) == 0
    assert seen == [{"block_n": 128}, {"pingpong": True}]
    with pytest.raises(SystemExit) as info:
        bench.main(["--decode", "--dry-run", "--params", "splits=4;splits=8"])
    assert info.value.code == 2
    assert "--params takes one set of template parameters with --decode" in (
        capsys.readouterr().err
    )


# -- on the GPU ------------------------------------------------------------------------------------


def rel_frobenius(got: np.ndarray, want: np.ndarray) -> float:
    got, want = got.astype(np.float64), want.astype(np.float64)
    return float(np.linalg.norm(got - want) / max(np.linalg.norm(want), 1e-300))


def run_gpu(text: str, seed: int, q_gain: float = 1.0, edit=None, params=None):
    """(result, float64 reference, kernels): `text` planned on tgc's generated kernels for this
    GPU (`planned`) and run by the planner's executor, `params` the template parameters of its
    kernels over the defaults for this GPU; the KernelSource of each kernel of the plan.
    `q_gain` scales the first input (peakier softmax: the running max moves more);
    `edit(inputs)` may change the inputs further."""
    from tgc.planner import load_backends
    from tgc.planner.executor import run_plan

    load_backends(("cuda",), required=True)
    ref = parse_module(text)
    verify(ref)
    inputs = random_inputs(ref.funcs[0], seed)
    inputs[0] = (inputs[0].astype(np.float32) * q_gain).astype(inputs[0].dtype)
    if edit is not None:
        edit(inputs)
    func = planned(text, ck.TARGET["arch"])
    if params:
        set_template_params(func, {"arch": ck.TARGET["arch"], **params})
    (got,) = run_plan(func, inputs)
    (want,) = run_function(ref.funcs[0], inputs, "f64")
    calls = [op for op in func.body.ops if op.attributes.get("callee") in GENERATED]
    kernels = [generate_kernel(f, ck.call_params(c)) for f, c in zip(regions(func), calls)]
    return got, want, kernels


SHAPES = [
    # b, h, seq_q, seq_k, d, d_v, layout
    (1, 1, 1, 1, 64, 64, "heads"),
    (2, 3, 63, 63, 64, 64, "heads"),
    (1, 2, 65, 65, 128, 128, "heads"),
    (2, 2, 200, 200, 80, 80, "heads"),
    (1, 3, 65, 200, 64, 64, "heads"),  # seq_q < seq_k: the causal diagonal at the end
    (2, 1, 200, 333, 128, 128, "flat"),
    (1, 2, 1, 200, 128, 128, "heads"),  # one query against a cache
    (2, 2, 200, 200, 64, 64, "qkv"),  # GPT-2's split of one projection
    (1, 2, 130, 97, 32, 128, "flat"),  # d != d_v, more queries than keys (not causal)
    (2, 2, 150, 150, 72, 72, "heads"),  # head dims padded to 80 (not yet run on a GPU)
    (1, 3, 77, 120, 64, 40, "flat"),  # d_v padded to 48 (not yet run on a GPU)
    (1, 2, 100, 130, 256, 256, "heads"),  # head dim 256
]


# Every shape with and without a mask, in bf16 and f16; causal too where seq_q <= seq_k (the
# verifier rejects causal attention with more queries than keys).
CASES = [
    (*shape, mask, causal, dtype)
    for shape in SHAPES
    for mask in (False, True)
    for causal in (False, True)
    for dtype in ("bf16", "f16")
    if not (causal and shape[2] > shape[3])
]


@pytest.mark.cuda
@pytest.mark.parametrize("b,h,sq,sk,d,dv,layout,mask,causal,dtype", CASES)
def test_tensor_core_attention_matches_float64(b, h, sq, sk, d, dv, layout, mask, causal, dtype):
    text = heads_text(b, h, sq, sk, d, dv, dtype, causal, mask, layout)
    seed = b * 1000 + sq + sk + d + 7 * mask + 13 * causal
    got, want, kernels = run_gpu(text, seed, q_gain=3.0 if seed % 2 else 1.0)
    assert [k.params.get("tensor_cores") for k in kernels] == [True]
    assert not np.isnan(got).any(), "NaN in the result (an element left unwritten?)"
    err = rel_frobenius(got, want)
    assert err < REL_ERROR[dtype], f"relative error {err:.2e}"


# Tile shapes other than the defaults (rows_per_warp, block_n, warps), on shapes whose
# sequences end inside a tile: a head dim that is not a power of two, masked and causal.
PARAM_POINTS = [(1, 128, 4), (1, 128, 8), (1, 64, 8), (2, 32, 4), (2, 128, 4), (2, 64, 8)]
PARAM_SHAPES = [
    (2, 2, 200, 200, 80, 80, "heads", False, True),
    (1, 3, 65, 200, 64, 64, "heads", True, True),
    (1, 2, 130, 97, 32, 128, "flat", False, False),
]


@pytest.mark.cuda
@pytest.mark.parametrize("rows,block_n,warps", PARAM_POINTS)
@pytest.mark.parametrize("b,h,sq,sk,d,dv,layout,mask,causal", PARAM_SHAPES)
def test_every_tile_shape_matches_float64(
    b, h, sq, sk, d, dv, layout, mask, causal, rows, block_n, warps
):
    # Heads in groups of 4 (of 6 or 2): a last group smaller than the others, or one group.
    # These are the mma.sync kernel's tile shapes: on sm_90 the wgmma kernel, the default there,
    # is turned off (it takes block_n 64 and 128 only, and has its own test below).
    params = {
        "rows_per_warp": rows,
        "block_n": block_n,
        "warps": warps,
        "head_group": 4,
        "wgmma": False,
    }
    text = heads_text(b, h, sq, sk, d, dv, "bf16", causal, mask, layout)
    got, want, kernels = run_gpu(text, sq + block_n + warps, q_gain=2.0, params=params)
    (kernel,) = kernels
    assert (kernel.params["block_n"], kernel.params["warps"]) == (block_n, warps)
    assert not kernel.params["wgmma"]
    assert not np.isnan(got).any(), "NaN in the result (an element left unwritten?)"
    assert rel_frobenius(got, want) < REL_ERROR["bf16"]


# The wgmma kernel on Hopper only (sm_90a): not yet run when it was written (issue 8).
WGMMA_SHAPES = [
    (2, 3, 63, 63, 64, 64, "heads", False, True),
    (1, 2, 200, 333, 128, 128, "flat", False, False),
    (1, 3, 65, 200, 64, 64, "heads", True, True),
    (2, 2, 200, 200, 64, 64, "qkv", False, True),
    (1, 2, 1030, 1030, 64, 64, "heads", False, True),
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("b,h,sq,sk,d,dv,layout,mask,causal", WGMMA_SHAPES)
def test_wgmma_attention_matches_float64(b, h, sq, sk, d, dv, layout, mask, causal, dtype):
    from tgc.runtime.cuda_compile import context, device_arch

    context()  # device_arch asks the current context
    if device_arch() != "sm_90":
        pytest.skip(f"wgmma needs an sm_90 GPU, this one is {device_arch()}")
    text = heads_text(b, h, sq, sk, d, dv, dtype, causal, mask, layout)
    got, want, kernels = run_gpu(text, sq + d, q_gain=2.0, params={"wgmma": True})
    (kernel,) = kernels
    assert kernel.params["wgmma"]
    assert not np.isnan(got).any(), "NaN in the result (an element left unwritten?)"
    assert rel_frobenius(got, want) < REL_ERROR[dtype]


# The other tile widths and schedules the wgmma kernel takes, through many key tiles (the K and
# V double buffers wrapping around, a last tile cut short, causal tiles that skip the mask).
WGMMA_VARIANTS = [
    ((1, 2, 1030, 1030, 64, 64, "heads", False, True), {"block_n": 128}),
    ((1, 2, 777, 777, 64, 64, "heads", True, False), {"block_n": 128}),
    ((1, 2, 1030, 1030, 128, 128, "heads", False, True), {"block_n": 128}),
    ((1, 2, 1030, 1030, 128, 128, "heads", False, True), {}),
    ((1, 2, 1030, 1030, 64, 64, "qkv", False, True), {"overlap": False}),
    ((1, 2, 200, 333, 128, 128, "flat", True, False), {"tma": False, "overlap": False}),
    # Ping-pong: one tile (tiles == 1), a few, many (the three buffers wrapping around), a mask.
    ((2, 3, 63, 63, 64, 64, "heads", False, True), {"pingpong": True}),
    ((1, 3, 65, 200, 64, 64, "heads", True, True), {"pingpong": True}),
    ((1, 2, 1030, 1030, 64, 64, "heads", False, True), {"pingpong": True}),
    ((1, 2, 777, 777, 64, 64, "qkv", True, False), {"pingpong": True}),
    ((1, 2, 1030, 1030, 64, 64, "heads", True, True), {"pingpong": True, "block_n": 128}),
    ((1, 2, 1030, 1030, 128, 128, "heads", False, True), {"pingpong": True}),
    ((1, 2, 200, 333, 128, 128, "flat", True, False), {"pingpong": True, "block_n": 128}),
    # Q in registers (S's A operand): both head dims, both schedules, ping-pong, a mask.
    ((2, 3, 63, 63, 64, 64, "heads", False, True), {"q_in_registers": True}),
    ((1, 2, 1030, 1030, 64, 64, "heads", True, True), {"q_in_registers": True}),
    ((1, 2, 777, 777, 64, 64, "qkv", False, True), {"q_in_registers": True, "block_n": 128}),
    ((1, 2, 1030, 1030, 128, 128, "heads", False, True), {"q_in_registers": True}),
    (
        (1, 2, 200, 333, 128, 128, "flat", True, False),
        {"tma": False, "q_in_registers": True, "overlap": False},
    ),
    ((1, 2, 1030, 1030, 64, 64, "heads", False, True), {"q_in_registers": True, "pingpong": True}),
    # 128-byte swizzled shared memory: both head dims (D 128: two column blocks, LBO), Q in
    # registers or not, 128-key tiles, ping-pong, a mask, GPT-2's strided qkv rows.
    ((2, 3, 63, 63, 64, 64, "heads", False, True), {"swizzle": True}),
    ((1, 2, 1030, 1030, 64, 64, "heads", True, True), {"swizzle": True, "q_in_registers": True}),
    ((1, 2, 777, 777, 64, 64, "qkv", False, True), {"swizzle": True, "block_n": 128}),
    ((1, 2, 1030, 1030, 128, 128, "heads", False, True), {"swizzle": True}),
    ((1, 2, 200, 333, 128, 128, "flat", True, False), {"swizzle": True, "q_in_registers": True}),
    ((1, 2, 1030, 1030, 64, 64, "heads", False, True), {"swizzle": True, "pingpong": True}),
    ((1, 2, 1030, 1030, 128, 128, "heads", True, True), {"swizzle": True, "pingpong": True}),
    # Heads in groups: 4 then 2 of 6; one head a group.
    ((2, 3, 300, 300, 64, 64, "heads", True, True), {"head_group": 4}),
    ((2, 3, 200, 333, 128, 128, "flat", False, False), {"head_group": 1}),
    # Head dim 256: a mask, causal, many tiles, no overlap.
    ((1, 2, 300, 300, 256, 256, "heads", True, True), {}),
    ((1, 2, 1030, 1030, 256, 256, "heads", False, True), {}),
    ((1, 2, 200, 333, 256, 256, "flat", False, False), {"tma": False, "overlap": False}),
    # Head dims between the layout's widths, padded with zero columns: 40 in 64, 72 to 96 in 128
    # (128-key tiles in ping-pong, or 64 without), 160 in 256; masks, GPT-2's strided rows.
    ((1, 2, 300, 300, 40, 40, "heads", True, True), {}),
    ((1, 2, 1030, 1030, 80, 80, "heads", False, True), {}),
    ((1, 2, 200, 333, 72, 72, "flat", True, False), {}),
    (
        (2, 3, 300, 300, 96, 96, "qkv", False, True),
        {"tma": False, "block_n": 64, "pingpong": False},
    ),
    ((1, 2, 300, 300, 160, 160, "heads", False, True), {}),
    # Persistent blocks, more query tiles than blocks (132 at head dims 80 and 128, 264 at 64):
    # ping-pong, causal; without it, a mask; padded.
    ((4, 8, 600, 600, 128, 128, "heads", False, True), {"persistent": True}),
    ((8, 8, 600, 600, 64, 64, "qkv", True, False), {"persistent": True}),
    ((4, 8, 600, 600, 80, 80, "heads", True, True), {"persistent": True}),
    # The TMA kernel (producer warpgroup, ping-pong consumers, persistent): one key tile, keys
    # past the queries, stages wrapping over many tiles and over query tiles (more than 132),
    # both head dims, Q in registers or not, masks, GPT-2's strided qkv rows (offsets into one
    # buffer), padded head dims (the copies' zero fill), head dim 256.
    ((2, 3, 63, 63, 64, 64, "heads", False, True), {"tma": True}),
    ((1, 3, 65, 200, 128, 128, "heads", True, True), {"tma": True}),
    ((1, 2, 1030, 1030, 128, 128, "heads", False, True), {"tma": True}),
    ((1, 2, 1030, 1030, 128, 128, "heads", True, False), {"tma": True, "q_in_registers": True}),
    ((1, 2, 1030, 1030, 64, 64, "heads", True, True), {"tma": True}),
    ((8, 8, 600, 600, 64, 64, "qkv", False, True), {"tma": True, "q_in_registers": False}),
    ((4, 8, 600, 600, 128, 128, "heads", False, False), {"tma": True, "stages": 2}),
    ((4, 8, 600, 600, 80, 80, "heads", True, True), {"tma": True}),
    ((1, 2, 200, 333, 72, 72, "flat", True, False), {"tma": True, "block_n": 64}),
    ((1, 2, 300, 300, 256, 256, "heads", True, True), {"tma": True}),
    # Query tiles merged (a tile's last P V with the next one's first S): many tiles a block,
    # one key tile a query tile, keys past the queries, Q in registers, masks, qkv rows, padded.
    ((4, 8, 600, 600, 128, 128, "heads", False, True), {"tma": True, "merge_tiles": True}),
    ((4, 8, 600, 600, 64, 64, "qkv", True, False), {"tma": True, "merge_tiles": True}),
    ((8, 8, 63, 63, 128, 128, "heads", False, True), {"tma": True, "merge_tiles": True}),
    ((1, 3, 65, 200, 80, 80, "heads", True, True), {"tma": True, "merge_tiles": True}),
    (
        (4, 8, 600, 600, 128, 128, "flat", False, False),
        {"tma": True, "merge_tiles": True, "q_in_registers": True},
    ),
    ((1, 2, 1030, 1030, 256, 256, "heads", False, True), {"tma": True, "merge_tiles": True}),
    # Two Q buffers (the next tile's Q copied while one is read): plain and merged tiles,
    # one key tile a query tile, a mask, padded head dims.
    ((4, 8, 600, 600, 128, 128, "heads", False, True), {"tma": True, "q_stages": 2}),
    ((8, 8, 63, 63, 128, 128, "heads", True, False), {"tma": True, "q_stages": 2}),
    (
        (4, 8, 600, 600, 80, 80, "heads", True, True),
        {"tma": True, "q_stages": 2, "merge_tiles": True},
    ),
    # O from registers where TMA stores it by default; TMA stores of a qkv buffer's rows
    # (heads merged back), of a tail of 63 rows, of head dim 72's first 72 columns
    ((4, 8, 600, 600, 128, 128, "heads", True, False), {"tma": True, "tma_store": False}),
    ((2, 4, 600, 600, 96, 96, "qkv", False, True), {"tma": True}),
    ((8, 8, 63, 63, 72, 72, "heads", False, True), {"tma": True}),
    # TMA stores with Q in registers (the buffer held until O is stored), with one Q buffer
    (
        (4, 8, 600, 600, 64, 64, "heads", True, False),
        {"tma": True, "merge_tiles": False, "q_stages": 2},
    ),
    (
        (4, 8, 600, 600, 64, 64, "qkv", False, True),
        {"tma": True, "merge_tiles": False, "tma_store": True},
    ),
    ((1, 2, 1030, 1030, 256, 256, "heads", True, True), {"tma": True, "tma_store": True}),
]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("shape, params", WGMMA_VARIANTS)
def test_wgmma_variants_match_float64(shape, params, dtype):
    from tgc.runtime.cuda_compile import context, device_arch

    context()  # device_arch asks the current context
    if device_arch() != "sm_90":
        pytest.skip(f"wgmma needs an sm_90 GPU, this one is {device_arch()}")
    b, h, sq, sk, d, dv, layout, mask, causal = shape
    text = heads_text(b, h, sq, sk, d, dv, dtype, causal, mask, layout)
    got, want, kernels = run_gpu(text, sq + d + 5, q_gain=2.0, params={"wgmma": True, **params})
    (kernel,) = kernels
    assert kernel.params["wgmma"] and all(kernel.params[k] == v for k, v in params.items())
    assert not np.isnan(got).any(), "NaN in the result (an element left unwritten?)"
    assert rel_frobenius(got, want) < REL_ERROR[dtype]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_long_causal_sequence(dtype):
    """Many key tiles through the double buffer, the heaviest query tiles first."""
    text = heads_text(1, 2, 1030, 1030, 64, 64, dtype, True, False, "heads")
    got, want, _ = run_gpu(text, 11, q_gain=2.0)
    assert rel_frobenius(got, want) < REL_ERROR[dtype]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_minus_inf_mask_rows_are_nan_as_in_numpy(dtype):
    """An additive -inf mask over a whole first key tile (the running max stays -inf there), and
    one query that sees no key at all: NaN, as softmax over -inf in the reference."""

    def edit(inputs):
        inputs[3][:, :70] = -np.inf
        inputs[3][5, :] = -np.inf

    text = heads_text(2, 2, 80, 150, 64, 64, dtype, True, True, "heads")
    got, want, _ = run_gpu(text, 3, edit=edit)
    assert np.isnan(got[:, :, 5]).all() and np.isnan(want[:, :, 5]).all()
    keep = np.ones(80, bool)
    keep[5] = False
    assert not np.isnan(got[:, :, keep]).any()
    assert rel_frobenius(got[:, :, keep], want[:, :, keep]) < REL_ERROR[dtype]


@pytest.mark.cuda
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_unaligned_base_pointers_take_the_plain_load_path(dtype):
    """Buffers 2 bytes past a 16-byte boundary (not what the executor allocates, but what a
    caller of the standalone file may pass): the kernel loads its tiles without cp.async and
    stores the result one element at a time, with the same results. (The TMA kernel refuses
    them: test_the_tma_kernel_refuses_an_unaligned_operand_at_launch.)"""
    import pycuda.driver as cuda

    from tgc.runtime.cuda_compile import load_kernels

    text = heads_text(2, 2, 100, 150, 128, 128, dtype, True, True, "flat")
    _, want, (k,) = run_gpu(text, 5, params={"tma": False})
    inputs = random_inputs(parse_module(text).funcs[0], 5)  # q, k, v, mask: the kernel's inputs
    (fn,) = load_kernels([k])
    (out_type,) = parse_module(text).funcs[0].function_type.results
    keep, pointers = [], []
    for value in [*inputs, None]:
        nbytes = out_type.nbytes if value is None else value.nbytes
        mem = cuda.mem_alloc(nbytes + 16)
        keep.append(mem)
        ptr = int(mem) + 2
        if value is not None:
            cuda.memcpy_htod(ptr, np.ascontiguousarray(value))
        else:
            cuda.memset_d8(ptr, 0xFF, nbytes)
            out_ptr = ptr
        pointers.append(ptr)
    fn.prepared_call(k.grid, k.block, *pointers, shared_size=k.shared_bytes)
    cuda.Context.synchronize()
    got = np.empty(out_type.shape, dtype=out_type.dtype)
    cuda.memcpy_dtoh(got, out_ptr)
    assert not np.isnan(got.astype(np.float64)).any()
    assert rel_frobenius(got, want) < REL_ERROR[dtype]


# -- the head merge folded: the kernel writes its output as its consumer reads it ----------------


def merged_text(b, h, s, d, dtype, causal=False, mask=False, form="merged") -> str:
    """GPT-2's attention: q, k, v split from one (b, s, 3 h d) buffer into heads (b, h, s, d);
    after attention the heads are merged again. form `merged`: transpose to (b, s, h, d) and
    reshape to (b s, h d), the function's result; `transposed`: the (b, s, h, d) transpose is
    the result; `consumer`: the merged value plus a residual argument (an elementwise kernel
    reads the attention kernel's output); `heads_first`: no batch dim (examples/gpt2_block.tg):
    (h, s, d) arguments, transposed to (s, h, d) and reshaped to (s, h d)."""
    w = h * d
    mask_arg = f", %m: {t((s, s), dtype)}" if mask else ""
    mask_operand = ", %m" if mask else ""
    mask_type = f", {t((s, s), dtype)}" if mask else ""
    attr = " {causal = true}" if causal else ""
    if form == "heads_first":
        hs = t((h, s, d), dtype)
        out = t((s, w), dtype)
        return "\n".join(
            [
                f"func.func @att(%q: {hs}, %k: {hs}, %v: {hs}{mask_arg}) -> {out} {{",
                f"  %y = hl.attention %q, %k, %v{mask_operand}{attr} : ({hs}, {hs}, {hs}{mask_type}) -> {hs}",
                f"  %yt = atomic.transpose %y {{perm = [1, 0, 2]}} : ({hs}) -> {t((s, h, d), dtype)}",
                f"  %ym = atomic.reshape %yt : ({t((s, h, d), dtype)}) -> {out}",
                f"  func.return %ym : {out}",
                "}",
            ]
        )
    x, part = t((b, s, 3 * w), dtype), t((b, s, w), dtype)
    split, heads = t((b, s, h, d), dtype), t((b, h, s, d), dtype)
    merged = t((b * s, w), dtype)
    out = {"merged": merged, "consumer": merged, "transposed": split}[form]
    residual = f", %r: {merged}" if form == "consumer" else ""
    lines = [
        f"func.func @att(%qkv: {x}{mask_arg}{residual}) -> {out} {{",
        f"  %q, %k, %v = atomic.split %qkv {{axis = 2, sizes = [{w}, {w}, {w}]}} : ({x}) -> ({part}, {part}, {part})",
    ]
    for n in "qkv":
        lines += [
            f"  %{n}4 = atomic.reshape %{n} : ({part}) -> {split}",
            f"  %{n}h = atomic.transpose %{n}4 {{perm = [0, 2, 1, 3]}} : ({split}) -> {heads}",
        ]
    lines += [
        f"  %y = hl.attention %qh, %kh, %vh{mask_operand}{attr} : ({heads}, {heads}, {heads}{mask_type}) -> {heads}",
        f"  %yt = atomic.transpose %y {{perm = [0, 2, 1, 3]}} : ({heads}) -> {split}",
    ]
    if form == "transposed":
        lines.append(f"  func.return %yt : {split}")
    else:
        lines.append(f"  %ym = atomic.reshape %yt : ({split}) -> {merged}")
        if form == "consumer":
            lines.append(f"  %z = atomic.add %ym, %r : ({merged}, {merged}) -> {merged}")
            lines.append(f"  func.return %z : {merged}")
        else:
            lines.append(f"  func.return %ym : {merged}")
    return "\n".join([*lines, "}"])


MERGED_REL_ERROR = {**REL_ERROR, "f32": 1e-5}

# b, h, s, d, dtype, causal, mask, form: every element type with and without the causal mask at
# head dims 64 and 128, odd sequence lengths (not multiples of a tile) and batch 1; then the
# other forms of the merge.
MERGED = [
    (2, 3, 63, 64, "bf16", False, True, "merged"),
    (1, 2, 130, 128, "bf16", True, False, "merged"),
    (2, 2, 97, 128, "bf16", False, False, "merged"),
    (2, 3, 65, 64, "f16", True, True, "merged"),
    (1, 2, 201, 64, "f16", False, False, "merged"),
    (1, 2, 130, 128, "f16", True, False, "merged"),
    (2, 3, 63, 64, "f32", True, False, "merged"),
    (1, 2, 130, 64, "f32", False, True, "merged"),
    (1, 2, 97, 128, "f32", True, True, "merged"),
    (2, 2, 65, 128, "f32", False, False, "merged"),
    (2, 2, 77, 64, "bf16", True, False, "transposed"),
    (2, 2, 70, 80, "bf16", True, False, "consumer"),  # head dim 80: tensor cores, other strides
    (1, 3, 65, 128, "f16", True, False, "heads_first"),
    (1, 3, 65, 64, "f32", True, True, "heads_first"),
]


def merged_ids(case) -> str:
    b, h, s, d, dtype, causal, mask, form = case
    return (
        f"{form}-{dtype}-b{b}h{h}s{s}d{d}"
        + ("-causal" if causal else "")
        + ("-mask" if mask else "")
    )


def fused_kernels(text: str) -> list[FusedOp]:
    """The regions `fuse` makes of what the planner plans (attention with the head merge after
    it, as the planner offers it)."""
    module = parse_module(text)
    PassManager.from_text("lower-for-planning,fuse{matmul-epilogue=false}").run(module)
    return [o for o in module.funcs[0].body.ops if isinstance(o, FusedOp)]


@pytest.mark.parametrize("case", MERGED, ids=merged_ids)
def test_head_merge_is_no_kernel_of_its_own(case):
    """The kernels `fuse` offers the planner: the attention kernel (on tensor cores for
    bf16/f16), which takes the transpose and the reshape after it, and, for `consumer`, the add:
    no transpose."""
    b, h, s, d, dtype, causal, mask, form = case
    kernels = fused_kernels(merged_text(b, h, s, d, dtype, causal, mask, form))
    want = ["attention", "elementwise"] if form == "consumer" else ["attention"]
    assert [k.attr("template") for k in kernels] == want
    inner = [op.name for op in kernels[0].body.ops]
    assert inner[inner.index("hl.attention") :] == (
        ["hl.attention", "atomic.transpose", "kernel.yield"]
        if form == "transposed"
        else ["hl.attention", "atomic.transpose", "atomic.reshape", "kernel.yield"]
    )
    source = generate_kernel(kernels[0])
    assert bool(source.params.get("tensor_cores")) == (dtype != "f32")


@pytest.mark.parametrize(
    "case",
    [(1, 2, 1, 64, "bf16", True, False, "merged"), (2, 1, 33, 128, "f16", False, True, "merged")],
    ids=merged_ids,
)
def test_a_head_merge_of_one_token_or_one_head_is_a_view(case):
    """One query token, or one head: the merge's transpose moves only a unit dim, so
    canonicalize makes it a reshape; the attention's result is merged by views alone, with no
    transpose left for any kernel to write (before, the attention kernel took the transpose, as
    in the test above)."""
    module = parse_module(merged_text(*case))
    PassManager.from_text("lower-for-planning,fuse{matmul-epilogue=false}").run(module)
    names = [op.name for op in module.funcs[0].body.ops]
    assert "atomic.transpose" not in names and "kernel.fused" not in names, names
    assert names.count("hl.attention") == 1


def _out_addresses(source: str, nb: int, rows: int, cols: int) -> np.ndarray:
    """Where the generated kernel stores o[bz, i, c], read from its source: the C expression of
    the batch's start (`T* op = out0 + (...)`) evaluated for each bz, then `qi * row stride`,
    columns contiguous."""
    import re

    base = re.search(r"T\* op = out0 \+ \((.*)\);", source).group(1)
    row = int(re.search(r"T\* row = op \+ \(idx_t\) qi \* (\d+);", source).group(1))
    python = base.replace("(long long) ", "").replace("/", "//")
    starts = np.array([eval(python, {"bz": bz}) for bz in range(nb)])  # noqa: S307 (our own C)
    return (
        starts[:, None, None]
        + np.arange(rows)[None, :, None] * row
        + np.arange(cols)[None, None, :]
    )


@pytest.mark.parametrize("case", MERGED, ids=merged_ids)
def test_output_addresses_are_the_merged_layout(case):
    """Every element the kernel stores lands where numpy's transpose and reshape put it: the
    addresses taken from the generated source, checked against the region's own ops run on an
    attention result of distinct values (its flat index)."""
    b, h, s, d, dtype, causal, mask, form = case
    (fused, *_) = fused_kernels(merged_text(b, h, s, d, dtype, causal, mask, form))
    att = next(op for op in fused.body.ops if op.name == "hl.attention")
    shape = att.results[0].type.shape
    index = np.arange(int(np.prod(shape))).reshape(shape)
    value = index
    ops = list(fused.body.ops)
    for op in ops[ops.index(att) + 1 : -1]:
        value = (
            np.transpose(value, op.attr("perm"))
            if op.name == "atomic.transpose"
            else value.reshape(op.results[0].type.shape)
        )
    written = np.ascontiguousarray(value).ravel()
    nb = int(np.prod(shape[:-2]))
    addresses = _out_addresses(generate_kernel(fused).source, nb, shape[-2], shape[-1])
    assert sorted(addresses.ravel().tolist()) == list(range(written.size))  # each once
    np.testing.assert_array_equal(written[addresses], index.reshape(nb, shape[-2], shape[-1]))


def test_output_the_kernel_cannot_write_is_a_located_error():
    """An attention region yielding a transpose that moves the head dim (fuse never forms one)
    is refused by the generator with the region's location, not generated wrong."""
    from tgc.diagnostics import TgcError

    a, o = t((2, 5, 16), "f32"), t((2, 16, 5), "f32")
    text = "\n".join(
        [
            f"func.func @f(%q: {a}, %k: {a}, %v: {a}) -> {o} {{",
            f'  %y = kernel.fused %q, %k, %v {{name = "k", template = "attention"}} : ({a}, {a}, {a}) -> {o} {{',
            f"  ^bb0(%a: {a}, %b: {a}, %c: {a}):",
            f"    %r = hl.attention %a, %b, %c : ({a}, {a}, {a}) -> {a}",
            f"    %s = atomic.transpose %r {{perm = [0, 2, 1]}} : ({a}) -> {o}",
            f"    kernel.yield %s : {o}",
            "  }",
            f"  func.return %y : {o}",
            "}",
        ]
    )
    module = parse_module(text)
    verify(module)
    fused = next(op for op in module.walk() if isinstance(op, FusedOp))
    with pytest.raises(TgcError, match="writes the attention result, or a transpose") as info:
        generate_kernel(fused)
    assert info.value.loc is not None and info.value.loc.line == 6


# Each element type at both head dims, and each head dim causal and full: every pair of
# (dtype, d), (dtype, causal) and (d, causal) once, in half the compile time of all twelve (the
# suite runs under five minutes on two cores).
FOLDED_COMPILED = [
    ("f32", 64, False),
    ("f32", 128, True),
    ("bf16", 64, True),
    ("bf16", 128, False),
    ("f16", 64, False),
    ("f16", 128, True),
]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_folded_kernels_compile(tmp_path):
    """Each case's folded kernel for sm_90 (one nvcc run)."""
    kernels = []
    for dtype, d, causal in FOLDED_COMPILED:
        (fused,) = fused_kernels(merged_text(2, 3, 97, d, dtype, causal, not causal))
        k = generate_kernel(fused)
        assert "Written as its consumer reads it" in k.source, (dtype, d, causal)
        kernels.append((k, ("-cubin", "-arch=sm_90")))
    compile_kernels(tmp_path, kernels)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_standalone_file_with_folded_kernels_compiles(tmp_path):
    """The standalone file's plan folds the head merge into the attention kernel where the
    merged heads are the result: a bf16 and an f32 merged attention in one file with its main,
    no transpose kernel in it."""
    first = merged_text(2, 2, 70, 64, "bf16", True, False, "merged")
    second = merged_text(1, 2, 33, 64, "f32", True, True, "heads_first").replace("@att", "@att2")
    module = parse_module(first + "\n" + second)
    PassManager.from_text("lower-for-planning").run(module)
    source = emit_standalone_cuda(module, "att")
    assert source.count("Written as its consumer reads it") == 2
    assert "_transpose" not in source
    nvcc(tmp_path, source, "-arch=sm_90", "-DTGC_STANDALONE_MAIN")


@pytest.mark.cuda
@pytest.mark.parametrize("case", MERGED, ids=merged_ids)
def test_folded_head_merge_matches_float64(case):
    """The attention kernel writing the merged layout against the float64 interpreter of the
    unfused function, outputs poisoned with NaN first (an element left unwritten fails)."""
    b, h, s, d, dtype, causal, mask, form = case
    text = merged_text(b, h, s, d, dtype, causal, mask, form)
    seed = 101 * b + s + d + 7 * mask + 13 * causal
    got, want, kernels = run_gpu(text, seed, q_gain=1.5 if seed % 2 else 1.0)
    templates = [k.template for k in kernels]
    assert templates == (["attention", "elementwise"] if form == "consumer" else ["attention"])
    assert got.shape == want.shape
    assert not np.isnan(got.astype(np.float64)).any(), "NaN in the result (left unwritten?)"
    err = rel_frobenius(got, want)
    assert err < MERGED_REL_ERROR[dtype], f"relative error {err:.2e}"
