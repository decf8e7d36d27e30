"""The Hopper skeleton of the matmul template (`matmul_wgmma.cu.j2`, template parameter
`wgmma`, sm_90 only, the default there where it fits: `WGMMA_DEFAULT_ARCHS`): wgmma with f32
accumulators, warp-specialised (one producer warpgroup filling a `stages`-deep ring of
128-byte-swizzled A and B tiles in shared memory under full/empty mbarriers, two consumer
warpgroups each computing half of a `block_m` x `block_n` tile), and a persistent grid of at
most `sms` blocks walking the tiles in groups of 8 tile rows, so that one tile's epilogue runs
while the next tile's copies are in flight. The epilogue is the region's, per element, as in
the other skeletons (matmul.py builds it and calls `generate_wgmma`).

The producer's copies (`tma`) are TMA box copies by default: one thread issues, per stage, A's
box and B's (one per 64 columns where B is [k][n]), each completing its bytes on the stage's
full barrier; the hardware swizzles, and fills what lies past the operand's edges with zeros.
Each operand's tensor map (3-D: inner dim, rows, batch entries) is a 128-byte kernel argument
made at launch from its address (runtime/tensor_map.py; `KernelSource.tensor_maps`; the
standalone `.cu` makes them too), so the operands must be 16-byte aligned (an error at launch
otherwise). Where TMA cannot read an operand (a batch broadcast in part), and with `tma`
false, the producer's 128 threads copy 16 bytes each with cp.async, arriving on the stage's
full barrier as they land; the consumers then fence to the async proxy (wgmma reads through
it). On an H200 (bench/results/matmul_wgmma-tma-f6cb1a2-*.md) TMA ran 4096^3 bf16 at
79% of cuBLAS's speed, cp.async at 39%: 16 bytes an instruction was the limit. The epilogue
stores a thread's two neighbouring columns by one instruction where it can (matmul.py
`_pair_epilogue`), and one output of 2-byte elements 16 bytes a thread where its epilogue loads
nothing (`_word_epilogue`): 95% (bench/results/matmul_wgmma-stores16-*.md; docs/gpu.md).

Parameters: `tma` (see above), `block_m` 128 or 256, `block_n` 64 to 256 in steps
of 64 (B as [k][n] is kept in blocks of 64 columns; at most 128 accumulators a consumer
thread: block_m * block_n <= 128 * 256), `stages` (default as many as fit, at most 6), `sms`
(the grid's size limit, default 132: an H100 SXM's and an H200's multiprocessors; a GPU with
fewer still runs every tile). Needs bf16 or f16, A not transposed, k a multiple of 8 and, unless B is transposed, n
a multiple of 8 (16-byte rows); where it does not fit, asking for it is a TgcError.
"""

from __future__ import annotations

import math

from tgc.codegen.render import KernelSource, TensorMap, is_gpu_arch, render
from tgc.cuda_target import gpu_limits
from tgc.diagnostics import TgcError

WGMMA_ARCHS = ("sm_90",)  # the GPUs whose own features (sm_90a) the skeleton needs
# The GPUs where it is the default: on an H200 (bench/results/matmul_wgmma-stores16-c78e9e0-
# 2026-11-28.md) it ran every measured shape 2.1x to 2.8x as fast as the mma.sync skeleton
# (4096^3 bf16: 748 TFLOP/s against 343, cuBLAS 787). The planner measures it beside cuBLAS
# and keeps the faster.
WGMMA_DEFAULT_ARCHS: tuple[str, ...] = WGMMA_ARCHS
WGMMA_TYPES = ("bf16", "f16")
WGMMA_BLOCK_M, WGMMA_BLOCK_N = (128, 256), (64, 128, 192, 256)
WGMMA_MAX_TILE = 128 * 256  # 128 f32 accumulators per consumer thread
WGMMA_MAX_STAGES = 6
# One block an SM: sm_90's 227 KB of dynamic shared memory, less 1 KB to align the stages and
# the mbarriers.
WGMMA_MAX_SHARED = gpu_limits("sm_90").shared_per_block
WGMMA_SMS = gpu_limits("sm_90").sms
WGMMA_GROUP_M = 8
# setmaxnreg: the producer's 128 threads give registers to the consumers' 256 (65,536 in all).
PRODUCER_REGISTERS, CONSUMER_REGISTERS = 40, 232
# Tile shapes tried by default, with the speed of their wgmma per SM relative to 128x256's
# (smaller n per instruction, more shared-memory reads per flop).
DEFAULT_TILES = ((128, 256, 1.0), (128, 192, 0.95), (128, 128, 0.85))


def wgmma_misfit(elem: str, transpose_a: bool, tb: bool, n: int, k: int) -> str | None:
    """Why the wgmma skeleton cannot run a matmul, or None."""
    if elem not in WGMMA_TYPES:
        return f"it takes bf16 and f16, not {elem}"
    if transpose_a:
        return "A is transposed"
    if k % 8 or (not tb and n % 8):
        return f"k{'' if tb else ' and n'} must be multiples of 8 (16-byte rows)"
    return None


def tma_misfit(batch: int, a_batch: int, b_batch: int) -> str | None:
    """Why TMA copies cannot read the operands, or None: a 3-D tensor map takes an operand's
    batch entries as one matrix (read by every entry) or one matrix each."""
    for name, count in (("A", a_batch), ("B", b_batch)):
        if count not in (1, batch):
            return f"{name}'s {count} matrices broadcast over {batch} batch entries"
    return None


def tensor_maps(dims: dict, operands: dict, bm: int, bn: int) -> tuple[TensorMap, ...]:
    """A's and B's tensor maps: A [batch][m][k] in boxes of 64 k x `bm` rows; B [batch][n][k]
    (transposed) in boxes of 64 k x `bn` rows, or [batch][k][n] in boxes of 64 n x 64 k."""
    m, n, k, elem = dims["m"], dims["n"], dims["k"], dims["elem"]
    item = 2  # bf16 and f16 (WGMMA_TYPES)
    a = TensorMap(
        operands["a_input"], elem, (k, m, dims["a_batch"]), (k * item, m * k * item), (64, bm, 1)
    )
    if dims["transpose_b"]:
        inner, rows, box = k, n, (64, bn, 1)
    else:
        inner, rows, box = n, k, (64, 64, 1)
    b = TensorMap(
        operands["b_input"],
        elem,
        (inner, rows, dims["b_batch"]),
        (inner * item, rows * inner * item),
        box,
    )
    return a, b


def wgmma_by_default(params: dict, fits: bool) -> bool:
    """Whether the skeleton is the default: on `WGMMA_DEFAULT_ARCHS`, where it fits."""
    arch = params.get("arch")
    if arch is not None and not is_gpu_arch(arch):
        raise TgcError(
            f"matmul template parameters: arch names a GPU as nvcc does (sm_90), not {arch!r}"
        )
    return fits and arch in WGMMA_DEFAULT_ARCHS


def stage_bytes(bm: int, bn: int) -> int:
    """One stage: the A and B tiles of a k step of 64 (2-byte elements, 128-byte rows)."""
    return (bm + bn) * 128


def shared_bytes(bm: int, bn: int, stages: int) -> int:
    """The stages, 1024 bytes to align them, and a full and an empty mbarrier per stage."""
    return stages * stage_bytes(bm, bn) + 1024 + 16 * stages


def default_tile(m: int, n: int, batch: int, sms: int) -> tuple[int, int]:
    """The tile whose waves of `sms` blocks take least time: waves x tile area / speed (a
    persistent grid's last wave costs a full one)."""

    def cost(tile) -> float:
        bm, bn, speed = tile
        tiles = math.ceil(m / bm) * math.ceil(n / bn) * batch
        return math.ceil(tiles / sms) * bm * bn / speed

    bm, bn, _ = min(DEFAULT_TILES, key=cost)
    return bm, bn


def wgmma_point(m: int, n: int, batch: int, params: dict) -> tuple[int, int, int, int]:
    """block_m, block_n, stages and sms (defaults filled into `params`); a TgcError where they
    make no kernel."""
    sms = params.setdefault("sms", WGMMA_SMS)
    if not isinstance(sms, int) or sms < 1:
        raise TgcError(f"matmul template parameters: sms is a positive count, not {sms!r}")
    dm, dn = default_tile(m, n, batch, sms)
    bm, bn = params.setdefault("block_m", dm), params.setdefault("block_n", dn)
    if bm not in WGMMA_BLOCK_M or bn not in WGMMA_BLOCK_N or bm * bn > WGMMA_MAX_TILE:
        raise TgcError(
            f"the wgmma matmul takes block_m 128 or 256 and block_n 64, 128, 192 or 256, at most "
            f"128x256 elements, not {bm}x{bn}"
        )
    fit = (WGMMA_MAX_SHARED - 1024) // (stage_bytes(bm, bn) + 16)
    stages = params.setdefault("stages", min(WGMMA_MAX_STAGES, fit))
    if not 3 <= stages <= min(WGMMA_MAX_STAGES, fit):
        raise TgcError(
            f"the wgmma matmul at {bm}x{bn} takes 3 to {min(WGMMA_MAX_STAGES, fit)} stages "
            f"(shared memory), not {stages!r}"
        )
    return bm, bn, stages, sms


def generate_wgmma(
    symbol: str, dims: dict, operands: dict, params: dict, label: str, loc
) -> KernelSource:
    """matmul_wgmma.cu.j2 for C = A @ B of `dims` (m, n, k, batch, elem, transpose_b, idx_t,
    T) with the kernel parameters, operand pointers and batch offsets, and the epilogue of
    `operands` (params, a, b, a_batch_offset, b_batch_offset, epilogue, num_inputs,
    num_outputs, ir_name)."""
    m, n, k, batch = dims["m"], dims["n"], dims["k"], dims["batch"]
    tb = dims["transpose_b"]
    why = wgmma_misfit(dims["elem"], dims["transpose_a"], tb, n, k)
    if why is not None:
        raise TgcError(f"the wgmma matmul cannot run '{label}': {why}", loc)
    arch = params.get("arch")
    if arch is not None and arch not in WGMMA_ARCHS:
        raise TgcError(f"the wgmma matmul needs an sm_90 GPU, not {arch}", loc)
    bm, bn, stages, sms = wgmma_point(m, n, batch, params)
    tma_why = tma_misfit(batch, dims["a_batch"], dims["b_batch"])
    tma = params.setdefault("tma", tma_why is None)
    if tma and tma_why is not None:
        raise TgcError(f"the wgmma matmul cannot copy '{label}' with TMA: {tma_why}", loc)
    if not tb and bn % 64:
        raise TgcError(f"the wgmma matmul keeps B as [k][n] in 64 columns: block_n {bn}", loc)
    grid_m, grid_n = math.ceil(m / bm), math.ceil(n / bn)
    tiles = grid_m * grid_n * batch
    shared = shared_bytes(bm, bn, stages)
    source = render(
        "matmul_wgmma.cu.j2",
        name=symbol,
        params=operands["params"],
        idx_t=dims["idx_t"],
        T=dims["T"],
        elem=dims["elem"],
        ptx_type=dims["elem"],
        m=m,
        n=n,
        k=k,
        batch=batch,
        bm=bm,
        bn=bn,
        mw_count=bm // 128,
        stages=stages,
        tiles=tiles,
        shared_bytes=shared,
        grid_m=grid_m,
        grid_n=grid_n,
        group_m=WGMMA_GROUP_M,
        producer_registers=PRODUCER_REGISTERS,
        consumer_registers=CONSUMER_REGISTERS,
        a=operands["a"],
        b=operands["b"],
        a_batch_offset=operands["a_batch_offset"],
        b_batch_offset=operands["b_batch_offset"],
        b_n_contiguous=not tb,
        tma=tma,
        a_batched=dims["a_batch"] > 1,
        b_batched=dims["b_batch"] > 1,
        epilogue=operands["epilogue"],
        pair_epilogue=operands["pair_epilogue"],
        pairs_aligned=operands["pairs_aligned"],
        word_epilogue=operands["word_epilogue"],
        word_output=operands["word_output"],
        output_at=operands["output_at"],
    )
    kernel = KernelSource(
        symbol,
        source,
        "matmul",
        operands["num_inputs"],
        operands["num_outputs"],
        (min(tiles, sms), 1, 1),
        (384, 1, 1),
        params,
        loc,
        operands["ir_name"],
    )
    kernel.shared_bytes = shared
    kernel.arch_features = "sm_90a"
    if tma:
        kernel.tensor_maps = tensor_maps(dims, operands, bm, bn)
    return kernel
