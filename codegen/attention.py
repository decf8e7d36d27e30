"""The fused attention kernel (template `attention`): one `hl.attention` in a `kernel.fused`
region, computed flash-attention style (tiles of queries against tiles of keys, online softmax,
the score matrix never in memory). Two skeletons:

- `attention_tc.cu.j2`, on tensor cores, for bf16 and f16 whose q, k and v rows are contiguous
  and 16-byte aligned (column stride 1; offset, row and batch strides multiples of 8 elements;
  the base pointers are checked at run time, and unaligned ones take plain loads) with head
  dims d and d_v multiples of 8 up to 256 (padded to 16 in shared memory with zeros): 4 warps
  of 32 query rows each (template parameter `rows_per_warp` 1 gives 16; above head dim 128 one
  slice a warp and tiles of 32 keys), K/V tiles of 64 keys double-buffered through cp.async,
  ldmatrix feeding mma.sync m16n8k16 with f32 accumulators, online softmax in f32, P rounded to the
  element type in registers for P V (as every tensor-core flash attention does); q's fragments
  stay in registers up to head dim 64 (`q_in_registers`). Needs sm_80 or later (below, the
  kernel traps).
- `attention.cu.j2` for everything else: exact f32 arithmetic (no TF32; f16 and bf16 are
  loaded into f32 and rounded on store).

What the planner plans (`lower-for-planning`) keeps `hl.attention`, and the CUDA backend offers
its own region (planner/backends/cuda_kernels.py) where `attention_supported` holds. Its q, k, v
and mask operands may be views
(transpose, reshape, slice, broadcast) of kernel inputs: `strided_layout` turns the chain of
views into an offset and one stride per dim, so the transposes that split heads are index
arithmetic on the tile loads instead of copy kernels. The two live below codegen and the passes
(tgc/cuda_target.py, tgc/views.py), which decide with them too. See docs/fusion.md.

The output is written through strides too: the region yields the attention result, or (when
`fuse` folded GPT-2's head merge into it) a transpose of it that keeps the head dim last,
perhaps reshaped; `_output_layout` turns that into a start per batch and a row stride, so the
consumer reads the kernel's buffer as it is and no transpose kernel follows.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tgc.codegen.attention_decode import decode_by_default, decode_kernel
from tgc.codegen.cuda_ops import STORAGE_CTYPE
from tgc.codegen.render import KernelSource, TensorMap, is_gpu_arch, kernel_label, render

# The head dims the mma.sync kernel takes: multiples of 8 (one 16-byte copy), padded to the
# mma's k step of 16 in shared memory with zero columns (72, as some models have, runs as 80),
# up to 256; the decode kernel's: multiples of 16 up to 128 (MAX_HEAD_DIM)
from tgc.cuda_target import (
    MAX_HEAD_DIM,
    TC_HEAD_DIM_STEP,
    TC_MAX_HEAD_DIM,
    TC_TYPES,
    attention_supported,
    gpu_limits,
)
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.ir import Operation, Value
from tgc.types import contiguous_strides
from tgc.views import head_grouped_layout

BLOCK_M = 64  # queries per block: 8 rows of threads x 8 rows each
BLOCK_N = 64  # keys per tile: 16 columns of threads x 4 keys each
THREADS = 128


def generate_attention(fused: FusedOp, params: dict, symbol: str) -> KernelSource:
    """The KernelSource of an `attention` region (one hl.attention, its operands block arguments
    or views of them, its result the region's only yield), its C symbol `symbol`: the tensor-core
    kernel where `_tensor_core_fits` holds, else the exact f32 one."""
    att = _attention_of(fused)
    q, k, v, *mask = att.operands
    out = att.results[0].type
    batch_shape = list(out.shape[:-2])
    ops = _operand_layouts(fused, att, batch_shape)
    ops["o"] = _output_layout(fused, att, batch_shape)
    common = dict(
        name=symbol,
        **_signature(fused, out.num_elements, q.type.element_type),
        **_bases(ops, batch_shape),
        seq_q=q.type.shape[-2],
        seq_k=k.type.shape[-2],
        offset_k=k.type.shape[-2] - q.type.shape[-2],
        d=q.type.shape[-1],
        dv=v.type.shape[-1],
        nb=math.prod(batch_shape),
        batch_shape=batch_shape,
        causal=bool(att.attr("causal")),
        has_mask=bool(mask),
        shape=f"q {q.type.shape} k {k.type.shape} v {v.type.shape}"
        + (f" mask {mask[0].type.shape}" if mask else ""),
    )
    if params.get("decode", _decode_by_default(att, ops, common)):
        make = _decode_kernel
    elif params.get("wgmma", _wgmma_by_default(att, ops, common, params)):
        make = _wgmma_kernel
    elif _tensor_core_fits(att, ops, TC_HEAD_DIM_STEP, TC_MAX_HEAD_DIM):
        make = _tensor_core_kernel
    elif max(common["d"], common["dv"]) > MAX_HEAD_DIM:
        raise TgcError(
            f"attention with head dims over {MAX_HEAD_DIM} runs only on the tensor-core kernel: "
            "bf16/f16, head dims in steps of 8, q, k and v rows of 16-byte copies"
        )
    else:
        make = _f32_kernel
    source, grid, block, shared_bytes, template_params, *maps = make(att, ops, common, params)
    params = dict(params)
    for key, value in template_params.items():
        params.setdefault(key, value)
    ks = KernelSource(
        symbol,
        source,
        "attention",
        len(fused.operands),
        1,
        grid,
        block,
        params,
        fused.loc,
        fused.attr("name"),
    )
    ks.shared_bytes = shared_bytes
    if make is _wgmma_kernel:
        ks.arch_features = "sm_90a"
    if maps:
        ks.tensor_maps = maps[0]
    return ks


# The GPU a kernel is for (template parameter `arch`, as nvcc names it; none: any sm_80 or
# later). On sm_90 the wgmma kernel is the default where it runs: at B8 H16 S2048 D64 causal
# bf16 it took 0.200 ms (344 TFLOP/s, 91% of SDPA's speed) against the mma.sync kernel's 0.308
# on an H100, 2026-11-23 (bench/results/attention_tc-wgmma-*.md); at D128 1.75 against 1.84 ms.
WGMMA_ARCHS = ("sm_90",)


def _decode_by_default(att: Operation, ops: dict[str, dict], common: dict) -> bool:
    """The split-KV decode skeleton (codegen/attention_decode.py) by default for a few query
    rows per key-value head against a long cache, where the tensor-core kernel's loads fit."""
    return _tensor_core_fits(att, ops) and decode_by_default(att, ops, common)


def _decode_kernel(att: Operation, ops: dict[str, dict], common: dict, params: dict):
    """attention_decode.cu.j2 (template parameter `decode`; `splits` its number of ranges of
    the cache): bf16/f16 the tensor-core kernel takes, at most 16 query rows per key-value
    head."""
    if not _tensor_core_fits(att, ops):
        raise TgcError(
            "attention template parameters: decode needs bf16/f16 operands the tensor-core "
            "kernel takes (head dims multiples of 16 up to 128, 16-byte rows)"
        )
    tc_args = _tensor_core_arguments(att, ops, common)
    return decode_kernel(att, ops, common, params, tc_args)


def _wgmma_by_default(att: Operation, ops: dict[str, dict], common: dict, params: dict) -> bool:
    arch = params.get("arch")
    if arch is not None and not is_gpu_arch(arch):
        raise TgcError(
            f"attention template parameters: arch names a GPU as nvcc does (sm_90), not {arch!r}"
        )
    fits = _wgmma_fits(att, ops, common)
    return arch in WGMMA_ARCHS and fits and 2 * common["d"] > _wgmma_width(common["d"])


# The head dims the wgmma kernel's shared-memory layout is made for (blocks of 64 columns,
# 128-byte swizzled). Other head dims (multiples of 8) run in the next of these widths, the
# columns past the head dim zeros. It is sm_90's default where that less than doubles the work
# (head dims 40 to 256; 32 and below run on the mma.sync kernel). On an H200 (2026-11-28,
# bench/results/attention_grid-padded-42ef3f7-*.md) head dims 72, 80 and 96 in the width of 128
# ran at 60-92% of SDPA's speed where the mma.sync kernel ran at 54-77% (but at 72 and 80,
# S512 causal: 65 and 62% against 70 and 64%); at 256 (bench/results/attention_grid-d256-
# sweep-*.md) 55-91% against 38-43%.
WGMMA_HEAD_DIMS = (64, 128, 256)


def _wgmma_fits(att: Operation, ops: dict[str, dict], common: dict) -> bool:
    """bf16/f16 operands the tensor-core kernel takes, head dims d = d_v (up to 256)."""
    fits = _tensor_core_fits(att, ops, TC_HEAD_DIM_STEP, TC_MAX_HEAD_DIM)
    return fits and common["d"] == common["dv"]


def _wgmma_width(d: int) -> int:
    """The shared-memory width of the wgmma kernel for head dim `d`: `d` padded with zeros."""
    return next(w for w in WGMMA_HEAD_DIMS if w >= d)


def _f32_kernel(att: Operation, ops: dict[str, dict], common: dict, params: dict):
    """attention.cu.j2: exact f32 arithmetic, 64 queries x 64 keys a tile, 128 threads."""
    if params.get("block_n", BLOCK_N) != BLOCK_N:
        raise TgcError(
            f"attention template parameters: the f32 kernel takes tiles of {BLOCK_N} keys, "
            f"not block_n={params['block_n']!r}"
        )
    elem, d, dv = att.operands[0].type.element_type, common["d"], common["dv"]
    _mark_vector_loads(ops, elem, d, dv)
    nq = (common["seq_q"] + BLOCK_M - 1) // BLOCK_M
    dp, cw = (d + 3) // 4 * 4, (dv + 15) // 16
    qstr, vstr, pstr = dp + 4, 16 * cw, BLOCK_N + 4
    shared_floats = BLOCK_M * qstr + BLOCK_N * qstr + BLOCK_N * vstr + BLOCK_M * pstr
    source = render(
        "attention.cu.j2",
        **common,
        dp=dp,
        cw=cw,
        qstr=qstr,
        vstr=vstr,
        pstr=pstr,
        bm=BLOCK_M,
        bn=BLOCK_N,
        threads=THREADS,
        nq=nq,
        scale=_f32_literal(att.scale()),
        out_vec=(elem == "f32" and cw == 4 and dv == 64 and _strides_divisible(ops["o"], 4)),
    )
    grid = (common["nb"] * nq, 1, 1)
    return (
        source,
        grid,
        (THREADS, 1, 1),
        shared_floats * 4,
        {"block_m": BLOCK_M, "block_n": BLOCK_N},
    )


# -- the tensor-core kernel ------------------------------------------------------------------------

# element type (cuda_target.TC_TYPES) -> mma operand type, pair type, pair packing
TC_PTX = {
    "bf16": ("bf16", "__nv_bfloat162", "__floats2bfloat162_rn"),
    "f16": ("f16", "__half2", "__floats2half2_rn"),
}
TC_WARPS = 4
TC_BLOCK_N = 64  # keys per shared-memory tile
TC_ALIGN = 8  # elements in 16 bytes: the unit of cp.async


def _tensor_core_fits(
    att: Operation, ops: dict[str, dict], head_dim_step: int = 16, most: int = MAX_HEAD_DIM
) -> bool:
    """bf16/f16, head dims multiples of `head_dim_step` up to `most`, and q, k, v rows that
    16-byte copies can move: column stride 1, offset and every other stride a multiple of 8
    elements (the base pointers' alignment is checked at run time). The mma.sync kernel takes
    head dims in steps of 8 up to 256 (it pads them to 16 in shared memory); the decode and
    wgmma kernels steps of 16 up to 128."""
    q, _, v, *_ = att.operands
    d, dv = q.type.shape[-1], v.type.shape[-1]
    if q.type.element_type not in TC_TYPES:
        return False
    if any(x % head_dim_step or x > most for x in (d, dv)):
        return False
    for name in ("q", "k", "v"):
        o = ops[name]
        others = [o["offset"], o["row"], *o["batch"]]
        if o["col"] != 1 or any(x % TC_ALIGN for x in others):
            return False
    return True


def _tc_layout(d: int, dv: int, params: dict) -> tuple[int, bool, int, int]:
    """(16-row query slices per warp, whether q's fragments stay in registers, keys per tile,
    warps per block). By default: q in registers up to head dim 64 (above, the o accumulators
    need them: q is read again for each key tile), tiles of 64 keys, two slices per warp (each
    K/V fragment read from shared memory serves 32 queries), and 4 warps up to head dim 64, 8
    above (measured on an H100, bench/results/attention_tc-tiles-*.md: 1% and 9% faster at
    head dim 128). One slice in 8 warps was 8% faster for causal attention at B8 H16 S2048 D64
    but 13% slower in the GPT-2 block's (B8 H12 S1024 D64), so it is left to tuning.
    Head dims 72 to 96 take 4 warps too: on an H200 (2026-11-28,
    bench/results/attention_tile-sweep-*.md) 7-10% faster than 8 at D72 and D96, B4 H32 S2048.
    Template parameters `rows_per_warp` (1 or 2), `q_in_registers`, `block_n` (32, 64 or 128)
    and `warps` (4 or 8) override the defaults."""
    # Above head dim 128 one 16-row slice a warp (o's accumulators alone are 128 registers a
    # thread at 256) and tiles of 32 keys (135 KB of shared memory at 256, within an A100's
    # 163 KB); on sm_90, whose blocks may take 227 KB, tiles of 64 keys (200 KB at 256: 13%
    # faster at D256 B4 H32 S2048 on an H200, bench/results/attention_tile-sweep-*.md)
    widest = max(d, dv)
    wide = widest > 128
    rows = params.get("rows_per_warp", 1 if wide else 2)
    q_in_registers = params.get("q_in_registers", widest <= 64)
    hopper = params.get("arch") in WGMMA_ARCHS
    bn = params.get("block_n", TC_BLOCK_N // 2 if wide and not hopper else TC_BLOCK_N)
    warps = params.get("warps", 8 if widest > 96 else TC_WARPS)
    if rows not in (1, 2) or not isinstance(q_in_registers, bool):
        raise TgcError(
            f"attention template parameters: rows_per_warp must be 1 or 2 and q_in_registers "
            f"true or false, got {rows!r} and {q_in_registers!r}"
        )
    if bn not in (32, 64, 128) or warps not in (4, 8):
        raise TgcError(
            f"attention template parameters: block_n must be 32, 64 or 128 and warps 4 or 8, "
            f"got {bn!r} and {warps!r}"
        )
    return rows, q_in_registers, bn, warps


def _tensor_core_kernel(att: Operation, ops: dict[str, dict], common: dict, params: dict):
    """attention_tc.cu.j2: 32 * warps threads per block of 16 * rows * warps queries."""
    d, dv = common["d"], common["dv"]
    rows, q_in_registers, bn, warps = _tc_layout(d, dv, params)
    group = _head_group(common, params)
    bm = 16 * rows * warps
    nq = (common["seq_q"] + bm - 1) // bm
    dp, dvp = -(-d // 16) * 16, -(-dv // 16) * 16  # padded to the mma's k step
    # Q [bm][dp + 8], K [2][bn][dp + 8], V [2][bn][dvp + 8], 2-byte elements.
    shared_bytes = 2 * (bm * (dp + 8) + 2 * bn * (dp + 8) + 2 * bn * (dvp + 8))
    source = render(
        "attention_tc.cu.j2",
        **common,
        **_tensor_core_arguments(att, ops, common),
        bm=bm,
        bn=bn,
        rows=rows,
        warps=warps,
        threads=32 * warps,
        nq=nq,
        shared_bytes=shared_bytes,
        q_in_registers=q_in_registers,
        group=group,
        dp=dp,
        dvp=dvp,
    )
    grid = (common["nb"] * nq, 1, 1)
    block = (32 * warps, 1, 1)
    chosen = {
        "block_m": bm,
        "block_n": bn,
        "tensor_cores": True,
        "rows_per_warp": rows,
        "warps": warps,
        "head_group": group,
    }
    if _wgmma_fits(att, ops, common):
        chosen["wgmma"] = False  # the other skeleton that runs it: tuning may try it (sm_90a)
    return source, grid, block, shared_bytes, {**chosen, "q_in_registers": q_in_registers}


LOG2E = 1.4426950408889634


def _head_group(common: dict, params: dict) -> int:
    """How many heads (batch entries) the tensor-core kernels' blocks take in turn (template
    parameter `head_group`): all query tiles of a group's heads run, heaviest first, before
    the next group's, so the blocks in flight share K and V in L2. The default is every head
    in one group: the heaviest query tiles of all heads first. Groups that fit L2 (24 heads at
    B8 H16 S2048 D64) read DRAM a third as much but ran 11% slower on an H100 (2026-11-23,
    bench/results/attention_tc-wgmma-*.md, "Session 2026-11-23 evening"): the long causal
    tiles left for the end of each group cost more than the DRAM traffic saved. Tuning tries
    smaller groups."""
    default = common["nb"]
    group = params.get("head_group", default)
    if not isinstance(group, int) or isinstance(group, bool) or group < 1:
        raise TgcError(
            f"attention template parameters: head_group must be a positive integer, not {group!r}"
        )
    return min(group, common["nb"])


def _tensor_core_arguments(att: Operation, ops: dict[str, dict], common: dict) -> dict:
    """What both tensor-core skeletons (mma.sync and wgmma) render alike: the element type's
    mma operand type and pair packing, the scale, the softmax's exp2 factor, the output's
    paired stores."""
    elem = att.operands[0].type.element_type
    ptx_type, t2, pack2 = TC_PTX[elem]
    scale = att.scale()
    # Without a mask, a positive scale commutes with the max: scores stay unscaled and the scale
    # joins log2 e in the FMA before exp2.
    raw_scores = (
        not common["has_mask"] and scale > 0 and bool(np.isfinite(np.float32(scale * LOG2E)))
    )
    return {
        "elem": elem,
        "ptx_type": ptx_type,
        "T2": t2,
        "pack2": pack2,
        "raw_scores": raw_scores,
        "scale": _f32_literal(scale),
        "exp_factor": _f32_literal(scale * LOG2E if raw_scores else LOG2E),
        "out_pairs": _strides_divisible(ops["o"], 2),
    }


# -- the wgmma kernel (Hopper) -----------------------------------------------------------------------

# The stride byte offsets wgmma reads V (shared memory, transposed: core matrices' rows along
# the keys) with: (leading, stride) = (the step between core matrices along the keys, along the
# head dim). bench/wgmma_probe.py asked the GPU (an H100, 2026-11-23): for both operand
# orders, LBO is the step along k and SBO the step along m or n.
WGMMA_V_OFFSETS = ("k", "n")


def _tma_by_default(common: dict) -> bool:
    """The TMA kernel is the wgmma kernel's default at head dims 72 to 256, and at 64 and below
    where the query tiles fill TMA_MIN_WAVES waves of its blocks. On an H200 (2026-11-29,
    bench/results/attention_grid-tma-*) it ran 72-256 faster at every measured size. At head
    dim 64 the other kernel runs two blocks an SM, one wave of 264. Against it the TMA kernel
    with two Q buffers and O stored by TMA (bench/results/attention_grid-store64-f88fdaa-*) ran
    the grid's 2,048 query tiles 10-25% faster at 512 positions (92-101% of SDPA's speed), 1-12%
    at 2k, and at 8k 5% faster full, 0.4-1.2% slower causal. BERT-base's 192 query tiles (1.45
    waves of the TMA kernel's 132 blocks) took 38 us on the TMA kernel of a807444 (one Q
    buffer, O from registers) where they took 34: below the waves' bound the other kernel
    stays, not measured since."""
    if _wgmma_width(common["d"]) > 64:
        return True
    tiles = common["nb"] * -(-common["seq_q"] // 128)
    return tiles >= TMA_MIN_WAVES * gpu_limits("sm_90").sms


def _wgmma_kernel(att: Operation, ops: dict[str, dict], common: dict, params: dict):
    """attention_wgmma.cu.j2 (template parameter `wgmma`; the default where `arch` is sm_90):
    two warpgroups of 64 queries, wgmma for Q K^T (Q from registers with `q_in_registers`,
    default true without ping-pong, else from shared memory) and P V (P from registers), key
    tiles of `block_n` (64, the default, or 128) keys, shared memory 128-byte swizzled
    (`swizzle`, default true: whole-row copies without bank conflicts). With `overlap`
    (default true) S of tile j and P V of tile j - 1 are in flight together and the softmax of
    tile j overlaps P V. With `pingpong` (default false; needs overlap) the two warpgroups run
    half a tile apart, named barriers taking turns, so one's softmax overlaps the other's
    wgmmas; K and V get 3 buffers each. With `persistent` (default false) the grid is as many
    blocks as run at once, each taking query tiles in turn (heaviest first) and copying the next
    tile's Q and first K while it normalises and stores the last one's O: a block's fixed cost
    was 6-9 us on an H200, as much as 3-4 key tiles (docs/gpu.md).
    bf16/f16 whose tensor-core kernel would run, with d = d_v, 64 or 128; sm_90a only. Two
    blocks share an SM at head dim 64 with 64-key tiles (128 registers a thread; the launch
    bounds say so). What made it fast (bench/results/attention_tc-wgmma-*.md): swizzled
    shared memory (the unswizzled layout's copies were bank-conflicted or took twice the L2
    requests), scores without mask checks away from the edges, whole-tile copies and
    descriptors with constant offsets: 0.343 to 0.200 ms at B8 H16 S2048 D64 causal.
    With `tma` (the default where `_tma_by_default` says) the warp-specialised TMA kernel runs
    instead (`_wgmma_tma_kernel`)."""
    elem, d, dv = att.operands[0].type.element_type, common["d"], common["dv"]
    if not _wgmma_fits(att, ops, common):
        raise TgcError(
            "attention template parameters: wgmma needs bf16/f16 operands the tensor-core kernel "
            f"takes and head dims d = d_v up to 256 (got {elem}, {d} and {dv})"
        )
    tma = params.get("tma", _tma_by_default(common))
    if not isinstance(tma, bool):
        raise TgcError(f"attention template parameters: tma must be true or false, not {tma!r}")
    if tma:
        return _wgmma_tma_kernel(att, ops, common, params)
    d = _wgmma_width(d)  # the layout's width; the operands' own head dim is common["d"]
    # Head dim 128 by default in 128-key tiles with ping-pong: on an H200 (2026-11-28,
    # bench/results/attention_tile-sweep-*.md) 15% faster than 64-key tiles without it at
    # B4 H32 S2048 (72% of SDPA's speed against 62%, causal) and 10% at B16 H32 S512.
    wide = d == 128
    widest = d == 256  # Q, two K and two V buffers of 64 keys: 192 KB of the 227 an SM has
    bn = params.get("block_n", 128 if wide else 64)
    if bn not in (64, 128):
        raise TgcError(f"attention template parameters: wgmma takes block_n 64 or 128, not {bn!r}")
    if widest and (bn != 64 or params.get("pingpong") or params.get("q_in_registers")):
        raise TgcError(
            "attention template parameters: wgmma at head dim 256 takes block_n 64, no "
            "pingpong and no q_in_registers (the shared memory and registers they need)"
        )
    overlap = params.get("overlap", True)
    if not isinstance(overlap, bool):
        raise TgcError(
            f"attention template parameters: overlap must be true or false, not {overlap!r}"
        )
    pingpong = params.get("pingpong", wide and overlap is True)  # ping-pong needs overlap
    if not isinstance(pingpong, bool):
        raise TgcError(
            f"attention template parameters: pingpong must be true or false, not {pingpong!r}"
        )
    if pingpong and not overlap:
        raise TgcError("attention template parameters: pingpong needs overlap=true")
    # Q in registers by default, but with ping-pong (three K and V buffers) and a mask at head
    # dim 64 the 128 registers of two blocks an SM would spill.
    q_in_registers = params.get("q_in_registers", not pingpong and not widest)
    swizzle = params.get("swizzle", True)
    persistent = params.get("persistent", False)
    for name, value in (
        ("q_in_registers", q_in_registers),
        ("swizzle", swizzle),
        ("persistent", persistent),
    ):
        if not isinstance(value, bool):
            raise TgcError(
                f"attention template parameters: {name} must be true or false, not {value!r}"
            )
    stages = 3 if pingpong else 2  # K and V buffers each (the template says why ping-pong needs 3)
    group = _head_group(common, params)
    nq = (common["seq_q"] + 127) // 128
    # Q, then K and V `stages` times each, then 16 bytes for the softmax's ordering store; and
    # with swizzling up to 1023 bytes to align Q to 1024.
    shared_bytes = 2 * (128 * d + 2 * stages * bn * d) + 16 + (1024 if swizzle else 0)
    step = {"k": d * 16, "n": 128}  # bytes between V's core matrices along keys, head dim
    min_blocks = 2 if (d, bn) == (64, 64) else 1  # blocks an SM (the launch bounds' registers)
    source = render(
        "attention_wgmma.cu.j2",
        **{**common, "d": d},
        head_dim=common["d"],
        **_tensor_core_arguments(att, ops, common),
        bn=bn,
        nq=nq,
        overlap=overlap,
        pingpong=pingpong,
        q_in_registers=q_in_registers,
        swizzle=swizzle,
        group=group,
        stages=stages,
        min_blocks=min_blocks,
        persistent=persistent,
        shared_bytes=shared_bytes,
        v_lbo=step[WGMMA_V_OFFSETS[0]],
        v_sbo=step[WGMMA_V_OFFSETS[1]],
    )
    items = common["nb"] * nq
    if persistent:  # as many blocks as run at once on the GPU (module doc of the template)
        limits = gpu_limits(params.get("arch"))
        resident = limits.sms * min(min_blocks, limits.blocks_by_shared(shared_bytes))
        grid = (min(items, resident), 1, 1)
    else:
        grid = (items, 1, 1)
    chosen = {
        "block_m": 128,
        "block_n": bn,
        "tensor_cores": True,
        "wgmma": True,
        "persistent": persistent,
        "tma": False,
        "overlap": overlap,
        "pingpong": pingpong,
        "q_in_registers": q_in_registers,
        "swizzle": swizzle,
        "head_group": group,
    }
    return source, grid, (256, 1, 1), shared_bytes, chosen


# The TMA kernel's registers a thread (setmaxnreg): the producer warpgroup's 128 threads give
# theirs to the two consumer warpgroups' 256 (65,536 in all; 168 each at launch).
TMA_PRODUCER_REGISTERS, TMA_CONSUMER_REGISTERS = 24, 240
TMA_MAX_RANK = 5  # a tensor map's dims: the head dim, the rows, at most three batch dims
TMA_MAX_STAGES = 4
TMA_Q_STAGES = (1, 2)  # Q's buffers (`q_stages`)
# Batch entries a group of the TMA kernel's units of query tiles (`head_group`), without and
# with a causal mask: on an H200 (2026-11-29, bench/results/attention_grid-tma-*) groups of 8
# ran head dim 64 without a mask 7-8% faster than one entry's tiles after another, and head
# dim 128 as fast; with the mask's pairs, groups of 8 were 1-2% slower than one entry's.
TMA_HEAD_GROUP, TMA_CAUSAL_HEAD_GROUP = 8, 1
TMA_MIN_WAVES = 4  # (_tma_by_default)
# Keys from which the TMA kernel merges query tiles at head dim 256 without a causal mask
# (_merge_tiles_by_default)
MERGE_FROM_KEYS_D256 = 8192


def _merge_tiles_by_default(common: dict, d: int) -> bool:
    """Query tiles merged (`merge_tiles`) at head dim 256 without a causal mask from
    MERGE_FROM_KEYS_D256 keys. On an H200 (2026-11-29, bench/results/attention_grid-merge-*-
    7f3c30c-*) merging ran 256 11% faster at 8k keys full (1.4% slower at 2k), and head dim 64
    1-9% faster at every size of the grid; at 80 and 128 its gain did not repeat in the next run
    (bench/results/attention_grid-q2-3b62c78-*). Up to head dim 128 two Q buffers and O stored
    by TMA, which merged tiles cannot have, ran faster still (`_wgmma_tma_kernel`'s notes)."""
    return d == 256 and not common["causal"] and common["seq_k"] >= MERGE_FROM_KEYS_D256


@dataclass(frozen=True)
class _OperandMap:
    """An attention operand's tensor map and the C expressions of its batch coordinates (of
    the flat batch index `bz`), innermost first as the copy takes them."""

    spec: TensorMap
    coords: tuple[str, ...]

    @property
    def rank(self) -> int:
        return len(self.spec.dims)


def _tma_operand_map(
    o: dict, batch_shape: list[int], rows: int, head_dim: int, elem: str, box_rows: int
):
    """The tensor map of operand layout `o` (q, k, v or the output o: `rows` rows of
    `head_dim` columns per batch entry), in boxes of 64 columns x `box_rows` rows; None where a
    tensor map cannot describe it (more than three batch dims that are not broadcast, or a
    stride not a multiple of 16 bytes: its copies' need)."""
    item = 2  # bf16 and f16
    dims, strides, coords = [head_dim, rows], [o["row"] * item], []
    # Innermost batch dim first; a broadcast dim (stride 0) is no dim of the map, and a dim read
    # by index / divisor (grouped-query heads) has that many fewer entries.
    divs = o.get("div") or [1] * len(o["batch"])
    batch = zip(_batch_coords(batch_shape), o["batch"], divs, batch_shape)
    for coord, stride, div, size in reversed(list(batch)):
        if stride == 0:
            continue
        dims.append(-(-size // div))
        strides.append(stride * item)
        coords.append(coord if div == 1 else f"({coord} / {div})")
    if len(dims) > TMA_MAX_RANK or any(s % 16 for s in strides):
        return None
    box = (64, box_rows) + (1,) * (len(dims) - 2)
    spec = TensorMap(o["operand"], elem, tuple(dims), tuple(strides), box, o["offset"] * item)
    return _OperandMap(spec, tuple(coords))


def _wgmma_tma_kernel(att: Operation, ops: dict[str, dict], common: dict, params: dict):
    """attention_wgmma_tma.cu.j2 (template parameters `wgmma` and `tma`): warp-specialised,
    persistent, a TMA producer warpgroup and two consumer warpgroups in ping-pong (the
    template's header). `block_n` 64 or 128 (default 128, 64 at head dim 256), `stages` (the
    rings' depth, default as many as fit, at most 4), `q_stages` (Q's buffers, 1 or 2, default
    2 where Q is read from shared memory and two fit, up to head dim 128: the producer copies
    the next query tile's Q while the last one's is read; measured where it is chosen),
    `tma_store` (default where it fits: tiles not merged, output strides of 16 bytes): each
    warpgroup writes its normalised O into its rows of the tile's Q buffer and one thread
    stores them by TMA, instead of every thread storing from registers; the buffer is released
    after that (with Q in registers too), `q_in_registers` (default at head dim 64
    and below), `head_group` (default TMA_HEAD_GROUP, TMA_CAUSAL_HEAD_GROUP with a causal mask):
    the query tiles go in units (pairs of a batch entry's under a causal mask), in groups of
    that many entries; `merge_tiles` (default where `_merge_tiles_by_default` says): a query
    tile's last P V in one round with the next tile's first S, its store after it. Its q, k and
    v must be 16-byte aligned (a located error at launch otherwise, runtime/tensor_map.py)."""
    elem, head_dim = att.operands[0].type.element_type, common["d"]
    d = _wgmma_width(head_dim)
    for name in ("overlap", "pingpong", "persistent", "swizzle"):
        if params.get(name, True) is not True:
            raise TgcError(
                f"attention template parameters: the TMA kernel always runs {name}; "
                f"{name}=false needs tma=false"
            )
    bn = params.get("block_n", 64 if d == 256 else 128)
    if bn not in (64, 128) or (d == 256 and bn != 64):
        raise TgcError(
            f"attention template parameters: the TMA kernel takes block_n 64 or 128 (64 at head "
            f"dim 256), not {bn!r}"
        )
    q_in_registers = params.get("q_in_registers", d <= 64)
    # asking for O's TMA stores turns the merged tiles' default off (they cannot have them)
    merge_default = _merge_tiles_by_default(common, d) and params.get("tma_store") is not True
    merge_tiles = params.get("merge_tiles", merge_default)
    for name, value in (("q_in_registers", q_in_registers), ("merge_tiles", merge_tiles)):
        if not isinstance(value, bool):
            raise TgcError(
                f"attention template parameters: {name} must be true or false, not {value!r}"
            )
    limits = gpu_limits("sm_90")
    tile = 2 * bn * d  # one K or V tile's bytes
    # the mbarriers (Q's full and empty, the rings') and softmax_done's word
    barriers = 8 * (2 * max(TMA_Q_STAGES) + 4 * TMA_MAX_STAGES) + 16
    # Two Q buffers up to head dim 128 (at 256 they do not fit): on an H200 (2026-11-29,
    # bench/results/attention_grid-q2-3b62c78-*) they ran head dim 128 at 512 positions 4.7-8.4%
    # faster (82% of SDPA's speed full, 77% causal), 80 3.2% full, and the longer sequences 0-3%
    # faster, though the second buffer leaves 2 ring stages where there were 3; GQA causal at
    # 512 was 1.3% slower. With O stored by TMA they hold it (`tma_store`).
    q_stages = params.get("q_stages", 2 if d <= 128 else 1)
    if q_stages not in TMA_Q_STAGES or isinstance(q_stages, bool):
        raise TgcError(
            f"attention template parameters: the TMA kernel takes q_stages 1 or 2, not {q_stages!r}"
        )

    def shared(stages: int) -> int:  # Q, the rings, 1024 bytes to align them, the barriers
        return q_stages * 2 * 128 * d + 2 * stages * tile + 1024 + barriers

    fit = max(
        (s for s in range(1, TMA_MAX_STAGES + 1) if shared(s) <= limits.shared_per_block),
        default=0,
    )
    stages = params.get("stages", fit)
    if not isinstance(stages, int) or not 2 <= stages <= fit:
        raise TgcError(
            f"attention template parameters: the TMA kernel at head dim {d} with block_n {bn} "
            f"and q_stages {q_stages} takes 2 to {fit} stages (shared memory), not {stages!r}"
        )
    batch_shape = common["batch_shape"]
    maps = {
        "q": _tma_operand_map(ops["q"], batch_shape, common["seq_q"], head_dim, elem, 128),
        "k": _tma_operand_map(ops["k"], batch_shape, common["seq_k"], head_dim, elem, bn),
        "v": _tma_operand_map(ops["v"], batch_shape, common["seq_k"], head_dim, elem, bn),
    }
    if any(m is None for m in maps.values()):
        raise TgcError(
            f"attention template parameters: the TMA kernel reads q, k and v with at most "
            f"{TMA_MAX_RANK - 2} batch dims that are not broadcast each"
        )
    # O through shared memory by TMA stores (each warpgroup's 64 rows, boxes of 64 x 64)
    o_map = _tma_operand_map(ops["o"], batch_shape, common["seq_q"], head_dim, elem, 64)
    store_fits = not merge_tiles and o_map is not None
    # O by TMA stores wherever they fit, with one Q buffer too: on an H200 (2026-11-29,
    # bench/results/attention_grid-store256-0a8caae-*) head dim 256 (one buffer) ran 18% faster
    # at 512 positions causal (74% of SDPA's speed to 91%), 15% full, 6-9% at 2k, 3-4% at 8k.
    tma_store = params.get("tma_store", store_fits)
    if not isinstance(tma_store, bool) or (tma_store and not store_fits):
        raise TgcError(
            "attention template parameters: tma_store (true or false, not "
            f"{tma_store!r} here) needs merge_tiles false and an output whose strides are "
            "multiples of 16 bytes"
        )
    if tma_store:
        maps["o"] = o_map
    nq = (common["seq_q"] + 127) // 128
    per_unit = 2 if common["causal"] else 1  # query tiles a unit (the template says why)
    units = common["nb"] * -(-nq // per_unit)
    default_group = TMA_CAUSAL_HEAD_GROUP if common["causal"] else TMA_HEAD_GROUP
    group = _head_group(common, {"head_group": default_group, **params})
    shared_bytes = shared(stages)
    source = render(
        "attention_wgmma_tma.cu.j2",
        **{**common, "d": d},
        head_dim=head_dim,
        **_tensor_core_arguments(att, ops, common),
        bn=bn,
        nq=nq,
        stages=stages,
        q_stages=q_stages,
        tma_store=tma_store,
        group=group,
        maps=maps,
        q_in_registers=q_in_registers,
        merge_tiles=merge_tiles,
        overlap=True,
        swizzle=True,
        producer_registers=TMA_PRODUCER_REGISTERS,
        consumer_registers=TMA_CONSUMER_REGISTERS,
        shared_bytes=shared_bytes,
        v_lbo=0,  # (the unswizzled layout's; the swizzled one's are constants)
        v_sbo=0,
    )
    chosen = {
        "block_m": 128,
        "block_n": bn,
        "tensor_cores": True,
        "wgmma": True,
        "tma": True,
        "stages": stages,
        "q_stages": q_stages,
        "tma_store": tma_store,
        "q_in_registers": q_in_registers,
        "merge_tiles": merge_tiles,
        "head_group": group,
    }
    grid = (min(units, limits.sms), 1, 1)
    specs = tuple(m.spec for m in maps.values())  # q, k, v (and o): the kernel's first params
    return source, grid, (384, 1, 1), shared_bytes, chosen, specs


def _f32_literal(x: float) -> str:
    """`x` rounded once to f32, as a C float literal."""
    return f"{float(np.float32(x))!r}f"


def _attention_of(fused: FusedOp) -> Operation:
    """The region's one hl.attention, which must be one the kernel supports (its result, or the
    transpose the region yields instead, is the region's one result)."""
    inner = [o for o in fused.body.ops if o.name == "hl.attention"]
    if len(inner) != 1 or len(fused.results) != 1:
        raise TgcError(f"attention kernel '{kernel_label(fused)}' needs exactly one hl.attention")
    att = inner[0]
    if not attention_supported(att):
        raise TgcError("this hl.attention cannot run as a fused kernel (lower it first)", att.loc)
    return att


def _signature(fused: FusedOp, out_elements: int, elem: str) -> dict:
    """The kernel's parameters, storage type, index type and rounding store function."""
    args = list(fused.body.args)
    sizes = [a.type.num_elements for a in args] + [out_elements]
    return {
        "params": [
            f"const {STORAGE_CTYPE[a.type.element_type]}* __restrict__ in{i}"
            for i, a in enumerate(args)
        ]
        + [f"{STORAGE_CTYPE[elem]}* __restrict__ out0"],
        "T": STORAGE_CTYPE[elem],
        "idx_t": "long long" if max(sizes) > 2**31 - 1 else "int",
        "store": (
            "" if elem == "f32" else {"bf16": "__float2bfloat16_rn", "f16": "__float2half_rn"}[elem]
        ),
    }


def _output_layout(fused: FusedOp, att: Operation, batch_shape: list[int]) -> dict:
    """Where the kernel writes element (batch..., row, column) of the attention result: the
    region yields that result (contiguous), or a transpose of it that keeps the head dim last,
    written contiguously (GPT-2 merges the heads so), or a reshape of that transpose (the same
    buffer relabelled). The stride of each batch dim, of rows and of columns in the yielded
    buffer; a located error for any other result."""
    (y,) = fused.body.last.operands
    shape = y.type.shape
    reshape = y.defining_op
    if reshape is not None and reshape.name == "atomic.reshape":
        y = reshape.operands[0]
        shape = y.type.shape
    strides = list(contiguous_strides(shape))
    transpose = y.defining_op
    if transpose is not None and transpose.name == "atomic.transpose":
        inverse = [0] * len(strides)
        for i, p in enumerate(transpose.attr("perm")):
            inverse[p] = strides[i]
        strides = inverse
        y = transpose.operands[0]
    if y is not att.results[0] or strides[-1] != 1:
        raise TgcError(
            f"attention kernel '{kernel_label(fused)}' writes the attention result, or a "
            "transpose of it that keeps the last dim (then maybe reshaped), not this value",
            fused.body.last.loc,
        )
    shape = att.results[0].type.shape
    return {
        "operand": len(fused.body.args),  # its place among the kernel's pointers
        "offset": 0,
        "batch": _batch_strides(shape, strides, batch_shape, 2),
        "row": strides[-2],
        "col": 1,
        # The result itself: batch bz starts bz * rows * columns elements in.
        "flat_batch": shape[-2] * shape[-1] if strides == list(contiguous_strides(shape)) else None,
    }


def _strides_divisible(o: dict, n: int) -> bool:
    """Every stride of layout `o` but the column's (1) is a multiple of `n` elements."""
    return o["row"] % n == 0 and all(s % n == 0 for s in o["batch"])


def _layout(args: list[Value], x: Value, what: str) -> tuple[int, int, list[int], list[int]]:
    """The kernel input `x` is a strided view of: its position, offset, strides and the divisor
    of each dim's coordinate (a grouped-query head repeat reads head i // group:
    head_grouped_layout)."""
    found = head_grouped_layout(x)
    if found is None or found[0] not in args:
        raise TgcError(f"attention operand '{what}' is not a strided view of a kernel input")
    root, offset, strides, divisors = found
    return args.index(root), offset, strides, divisors


def _operand_layouts(fused: FusedOp, att: Operation, batch_shape: list[int]) -> dict[str, dict]:
    """Per operand (q, k, v, and mask when there is one): its pointer, offset, the stride of
    each result batch dim, of its rows and of its columns (broadcast dims: stride 0)."""
    args = list(fused.body.args)
    q, k, v, *mask = att.operands
    ops = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        idx, offset, strides, divisors = _layout(args, x, name)
        ops[name] = {
            "ptr": f"in{idx}",
            "operand": idx,  # its place among the kernel's pointers
            "offset": offset,
            "batch": _batch_strides(x.type.shape, strides, batch_shape, 2),
            "div": _batch_strides(x.type.shape, divisors, batch_shape, 2, 1),
            "row": strides[-2],
            "col": strides[-1],
        }
    if mask:
        ops["mask"] = _mask_layout(args, mask[0], batch_shape)
    return ops


def _mask_layout(args: list[Value], m: Value, batch_shape: list[int]) -> dict:
    """The mask's layout; it may have fewer than two dims (missing or unit dims broadcast)."""
    idx, offset, strides, divisors = _layout(args, m, "mask")
    mshape = list(m.type.shape)
    full = [1] * (2 - min(2, len(mshape))) + mshape[-2:]
    fstr = [0] * (2 - min(2, len(strides))) + strides[-2:]
    return {
        "ptr": f"in{idx}",
        "offset": offset,
        "batch": _batch_strides(mshape, strides, batch_shape, min(2, len(mshape))),
        "div": _batch_strides(mshape, divisors, batch_shape, min(2, len(mshape)), 1),
        "row": 0 if full[0] == 1 else fstr[0],
        "col": 0 if full[1] == 1 else fstr[1],
    }


def _batch_strides(shape, strides, batch_shape, tail: int, broadcast: int = 0) -> list[int]:
    """The stride of each result batch dim in an operand of `shape` (broadcast dims:
    `broadcast`, 0; with divisors for strides, 1)."""
    lead = shape[: len(shape) - tail]
    lead_strides = strides[: len(shape) - tail]
    pad = len(batch_shape) - len(lead)
    out = []
    for d in range(len(batch_shape)):
        j = d - pad
        out.append(lead_strides[j] if j >= 0 and lead[j] != 1 else broadcast)
    return out


def _mark_vector_loads(ops: dict[str, dict], elem: str, d: int, dv: int) -> None:
    """f32 operands whose rows are contiguous and 16-byte aligned move as float4 (the base
    pointers are checked again at run time): sets each of q, k, v's `vec`."""
    for name in ("q", "k", "v"):
        o = ops[name]
        width = d if name != "v" else dv
        o["vec"] = (
            elem == "f32"
            and o["col"] == 1
            and width % 4 == 0
            and o["offset"] % 4 == 0
            and o["row"] % 4 == 0
            and all(s % 4 == 0 for s in o["batch"])
        )


def _batch_coords(batch_shape: list[int]) -> list[str]:
    """The C expression of each batch coordinate of the flat batch index `bz` (row-major)."""
    coords = []
    rest = "bz"
    for i in range(len(batch_shape) - 1, -1, -1):
        n = batch_shape[i]
        coords.insert(0, f"({rest} % {n})" if i > 0 else rest)
        rest = f"({rest} / {n})"
    return coords


def _bases(ops: dict[str, dict], batch_shape: list[int]) -> dict:
    """The operand and output layouts and the C expression of each one's start for the flat
    batch index `bz` (row-major over batch_shape)."""
    bcoords = _batch_coords(batch_shape)

    def base(o) -> str:
        divs = o.get("div") or [1] * len(o["batch"])
        terms = [str(o["offset"])] + [
            f"(long long) {c if q == 1 else f'({c} / {q})'} * {s}"
            for c, s, q in zip(bcoords, o["batch"], divs)
            if s
        ]
        return " + ".join(terms)

    o = ops["o"]
    return {
        "q": ops["q"],
        "k": ops["k"],
        "v": ops["v"],
        "mask": ops.get("mask"),
        "q_base": base(ops["q"]),
        "k_base": base(ops["k"]),
        "v_base": base(ops["v"]),
        "mask_base": base(ops["mask"]) if "mask" in ops else "0",
        "o": o,
        "o_base": f"(long long) bz * {o['flat_batch']}" if o["flat_batch"] else base(o),
    }
