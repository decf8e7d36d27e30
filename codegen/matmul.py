"""The matmul template: one `atomic.matmul` of two kernel inputs, tiled over shared memory, with
the rest of the region as its epilogue (computed per output element from the accumulator).

Its skeletons:
- `matmul.cu.j2`, every element type: each thread accumulates `thread_m` x `thread_n` elements
  of C in the compute type (f32 for f16/bf16), from tiles of A and B in shared memory. Template
  parameters: `block_m`, `block_n`, `block_k` (the tile of C a block computes and the depth of
  one shared-memory step), `thread_m`, `thread_n`.
- `matmul_wgmma.cu.j2`, with the template parameter `wgmma` (sm_90; a planner option, not yet
  a default): Hopper's wgmma, warp-specialised and persistent (codegen/matmul_wgmma.py).
- `matmul_gemv.cu.j2`, with the template parameter `gemv` (the default where it fits: at most
  8 rows, 16 in bf16 and f16, against one weight stored [n][k], a decoding step's products):
  warps streaming B along k in 16-byte loads (codegen/matmul_gemv.py; `gemv_mma` its
  tensor-core variant, the default from 5 rows). It alone also takes a prologue: A computed in
  the kernel from its inputs (`a_prologue`; docs/fusion.md, "Prologues of the few-rows
  matmul"); every other skeleton needs A and B as kernel inputs. And it alone takes an
  epilogue that reads the product through a split of n into two halves (`_halves`: SiLU(gate)
  * up of a packed gate+up product), each warp summing its columns of both.
- `matmul_tc.cu.j2`, with the template parameter `tensor_cores` (default true where it fits):
  bf16/f16 on tensor cores, as the attention kernel's (codegen/attention.py): 8 warps (2x4, 4x2
  for a tile taller than wide), each a part of C of 16x8 `mma.sync` accumulator tiles in f32
  (64x64 at 128x256 or 256x128); A and B tiles in a `stages`-deep `cp.async` pipeline in dynamic
  shared memory (one barrier per k step), read by `ldmatrix` (transposed for a B whose rows are
  k) into fragments double-buffered in registers; blocks ordered in groups of 8 tile rows for L2
  reuse. It needs A not transposed, k a multiple of 8 and, unless B is transposed, n a multiple
  of 8 (16-byte rows). Parameters: `block_m`, `block_n` 64, 128 or 256 (at most 128x256; default
  128x256 where n >= 2048, else 128x128), `block_k` 16, 32 or 64 (default 32), `stages` 2 to 5
  (default 4; at most what a block of the GPU may take, `gpu_limits`). Where it does not fit,
  asking for it is an error (so a parameter search skips the point). The double-buffered 128x128
  skeleton ran 4096^3 bf16 at 255 TFLOP/s on an H100, a third of cuBLAS's
  (bench/results/matmul_tc-*.md), 14x the SIMT skeleton.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tgc.codegen.cuda_ops import COMPUTE_CTYPE, STORAGE_CTYPE, load_expression, store_value
from tgc.codegen.emitter import (
    Coords,
    Emitter,
    broadcast_coords,
    canon,
    delinearize,
    linear_offset,
)
from tgc.codegen.matmul_gemv import gemv_misfit, gemv_mma_by_default, generate_gemv
from tgc.codegen.matmul_wgmma import generate_wgmma, wgmma_by_default, wgmma_misfit
from tgc.codegen.render import KernelSource, idx_type, kernel_label, params_decl, render, yields_of
from tgc.cuda_target import TC_TYPES, gpu_limits
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.ir import Operation, Value
from tgc.types import ELEMENT_BYTES


@dataclass(frozen=True)
class _Shape:
    """The problem: C[m, n] = A[m, k] B[k, n] per batch entry, and where each operand starts."""

    out: tuple[int, ...]
    m: int
    n: int
    k: int
    batch: int
    bcoords: Coords  # batch coordinates of the flat batch index z
    a_offset: str  # start of A and B for batch entry z (C expressions)
    b_offset: str


def matmul_of(op: FusedOp) -> Operation:
    """The atomic.matmul of a matmul kernel."""
    found = [inner for inner in op.body.ops if inner.name == "atomic.matmul"]
    if len(found) != 1:
        raise TgcError(
            f"matmul kernel '{kernel_label(op)}' needs exactly one atomic.matmul", op.loc
        )
    return found[0]


def generate_matmul(op: FusedOp, params: dict, symbol: str) -> KernelSource:
    """The matmul kernel of `op`, with the region's other ops as its epilogue."""
    decls, ptrs, outs = params_decl(op)
    mm = matmul_of(op)
    a, b = mm.operands
    if b not in ptrs:
        raise TgcError("matmul operands must be kernel inputs", mm.loc)
    ta, tb = mm.attr("transpose_a"), mm.attr("transpose_b")
    shape = _shape(mm)
    m, n, k = shape.m, shape.n, shape.k
    elem = mm.results[0].type.element_type
    rows = m * shape.batch
    halves = _halves(op, mm)
    # A computed in the kernel from its inputs (a prologue), or the product read in halves: the
    # few-rows skeleton's own
    if a not in ptrs or halves is not None:
        if any(params.get(other) for other in ("tensor_cores", "wgmma", "gemv_mma")) or (
            params.get("gemv") is False
        ):
            what = "whose A the kernel computes (a prologue)"
            if a in ptrs:
                what = "whose epilogue reads its product's two halves"
            raise TgcError(
                f"a matmul {what} runs only on the few-rows skeleton without tensor cores",
                mm.loc,
            )
        params.update(gemv=True, gemv_mma=False)
        return _generate_gemv(op, mm, shape, params, symbol, (decls, ptrs, outs), halves)
    # The few-rows skeleton by default where it runs and no other skeleton was asked for; its
    # parameter is recorded only where it runs, so tuning offers it there.
    asked_other = "tensor_cores" in params or "wgmma" in params
    mma = bool(params.get("gemv_mma", gemv_mma_by_default(elem, rows)))
    gemv_fits = gemv_misfit(elem, bool(ta), bool(tb), rows, _b_batch(mm), k, mma) is None
    # Tensor cores wherever the skeleton fits: 14x the SIMT skeleton's speed at 4096^3 in bf16
    # on an H100 (bench/results/matmul_tc-*.md).
    fits = _tensor_core_misfit(mm, shape, elem, bool(tb)) is None
    params.setdefault("tensor_cores", fits)
    wgmma_fits = wgmma_misfit(elem, bool(ta), bool(tb), n, k) is None
    params.setdefault("wgmma", wgmma_by_default(params, wgmma_fits))
    if params.get("gemv", gemv_fits and not asked_other):
        params["gemv"] = True
        return _generate_gemv(op, mm, shape, params, symbol, (decls, ptrs, outs))
    if gemv_fits:
        params["gemv"] = False
    if params["wgmma"]:
        return _generate_wgmma(op, mm, shape, params, symbol, (decls, ptrs, outs))
    if params["tensor_cores"]:
        return _generate_tensor_core(op, mm, shape, params, symbol, (decls, ptrs, outs))
    sam, sak = (1, m) if ta else (k, 1)
    sbk, sbn = (1, k) if tb else (n, 1)
    acc_t = COMPUTE_CTYPE[mm.results[0].type.element_type]
    tiles = _tiles(params, 8 if acc_t == "double" else 4)
    source = render(
        "matmul.cu.j2",
        name=symbol,
        params=decls,
        idx_t=idx_type(op),
        acc_t=acc_t,
        m=m,
        n=n,
        k=k,
        batch=shape.batch,
        **tiles,
        a_batch_offset=shape.a_offset,
        b_batch_offset=shape.b_offset,
        a_k_contiguous=not ta,
        b_n_contiguous=not tb,
        a_load=_load(ptrs, a, "m", sam, "kx", sak, "a_base"),
        b_load=_load(ptrs, b, "kx", sbk, "n", sbn, "b_base"),
        epilogue=_epilogue(op, mm, shape, ptrs, outs),
    )
    return _kernel_source(
        op, symbol, source, shape, tiles["bm"], tiles["bn"], tiles["threads"], params
    )


TC_TILES, TC_BLOCK_K, TC_STAGES = (64, 128, 256), (16, 32, 64), (2, 3, 4, 5)
# At most 64x64 of C per warp (128 f32 accumulators per thread of 8 warps); the shared memory
# a block may have is the kernel's GPU's (`cuda_target.gpu_limits`).
TC_MAX_TILE = 128 * 256
TC_GROUP_M = 8  # tile rows per group of the block order (L2 reuse)
TC_WIDE_N = 2048  # the least n whose default tile is 128x256 (`_tc_defaults`)


def _tc_defaults(shape: _Shape, params: dict) -> tuple[int, int, int, int]:
    """block_m, block_n, block_k, stages: 128x256 tiles (64x64 per warp: the most mma per
    ldmatrix) where n has at least `TC_WIDE_N` columns, else 128x128; k steps of 32 in 4
    stages. On an H100 (bench/results/matmul_tc-*.md, f0091e7) 128x128 was faster at n = 768
    (8192x768 @ 768x768: 0.0610 against 0.0678 ms; 8192x3072 @ 3072x768: 0.1494 against
    0.1628), where 128x256 tiles leave too few blocks for 132 SMs, and 128x256 at n = 2304 and
    3072 (0.1649 against 0.1695 ms, 0.2035 against 0.2234)."""
    bm = params.setdefault("block_m", 128)
    bn = params.setdefault("block_n", 256 if shape.n >= TC_WIDE_N and bm <= 128 else 128)
    return bm, bn, params.setdefault("block_k", 32), params.setdefault("stages", 4)


def _tc_shared_bytes(bm: int, bn: int, bk: int, stages: int, tb: bool) -> int:
    """The dynamic shared memory of the template: `stages` padded A and B tiles of 2 bytes."""
    b_tile = bn * (bk + 8) if tb else bk * (bn + 8)
    return 2 * stages * (bm * (bk + 8) + b_tile)


def _tc_point_misfit(
    bm: int, bn: int, bk: int, stages: int, shared: int, arch: str | None
) -> str | None:
    """Why the tile parameters make no kernel for a GPU of `arch` (None: any), or None."""
    if bm not in TC_TILES or bn not in TC_TILES or bk not in TC_BLOCK_K or stages not in TC_STAGES:
        return (
            f"block_m and block_n 64, 128 or 256, block_k 16, 32 or 64 and stages 2 to 5, "
            f"not {bm}, {bn}, {bk}, {stages}"
        )
    if bm * bn > TC_MAX_TILE:
        return f"a {bm}x{bn} tile is over 64x64 per warp"
    most = gpu_limits(arch).shared_per_block
    if shared > most:
        return (
            f"{stages} stages of {bm}x{bk} and {bk}x{bn} tiles need {shared} bytes of shared memory"
            f" (a block may take {most})"
        )
    return None


def _generate_tensor_core(
    op: FusedOp, mm: Operation, shape: _Shape, params: dict, symbol: str, decl: tuple
) -> KernelSource:
    """matmul_tc.cu.j2 (module doc); a TgcError where it does not fit the matmul."""
    decls, ptrs, outs = decl
    a, b = mm.operands
    elem = mm.results[0].type.element_type
    tb = bool(mm.attr("transpose_b"))
    why = _tensor_core_misfit(mm, shape, elem, tb)
    bm, bn, bk, stages = _tc_defaults(shape, params)
    shared = _tc_shared_bytes(bm, bn, bk, stages, tb)
    if why is None:
        why = _tc_point_misfit(bm, bn, bk, stages, shared, params.get("arch"))
    if why is not None:
        raise TgcError(f"the tensor-core matmul cannot run '{kernel_label(op)}': {why}", op.loc)
    # 8 warps, 2x4 (4x2 for a tile taller than wide): 64x64 of C each at 128x256 or 256x128.
    warps_m = 4 if bm > bn else 2
    grid_m, grid_n = math.ceil(shape.m / bm), math.ceil(shape.n / bn)
    source = render(
        "matmul_tc.cu.j2",
        name=symbol,
        params=decls,
        idx_t=idx_type(op),
        T=STORAGE_CTYPE[elem],
        elem=elem,
        ptx_type=elem,  # mma.sync names bf16 and f16 as tgc does
        m=shape.m,
        n=shape.n,
        k=shape.k,
        batch=shape.batch,
        bm=bm,
        bn=bn,
        bk=bk,
        wm=bm // warps_m,
        wn=bn // (8 // warps_m),
        stages=stages,
        shared_bytes=shared,
        min_blocks=2 if bm * bn < 128 * 128 else 1,  # 128 registers: 128x128 would spill
        grid_m=grid_m,
        grid_n=grid_n,
        group_m=TC_GROUP_M,
        a=ptrs[a],
        b=ptrs[b],
        a_batch_offset=shape.a_offset,
        b_batch_offset=shape.b_offset,
        b_n_contiguous=not tb,
        epilogue=_epilogue(op, mm, shape, ptrs, outs),
    )
    kernel = _kernel_source(op, symbol, source, shape, bm, bn, 256, params)
    kernel.shared_bytes = shared
    return kernel


def _generate_wgmma(
    op: FusedOp, mm: Operation, shape: _Shape, params: dict, symbol: str, decl: tuple
) -> KernelSource:
    """matmul_wgmma.cu.j2 (codegen/matmul_wgmma.py), with its stores of two and of eight
    neighbouring columns; a TgcError where it does not fit."""
    dims, operands = _skeleton_arguments(op, mm, shape, decl, indent=12)
    _, ptrs, outs = decl
    operands.update(
        pair_epilogue=_pair_epilogue(op, mm, shape, ptrs, outs, indent=12),
        pairs_aligned=_pairs_aligned(op, outs),
        word_epilogue=_word_epilogue(op, mm, shape, ptrs, indent=16),
        word_output=outs[0],
        output_at=linear_offset(shape.out, shape.bcoords + ("m", "nv")),
    )
    return generate_wgmma(symbol, dims, operands, params, kernel_label(op), op.loc)


def _generate_gemv(
    op: FusedOp,
    mm: Operation,
    shape: _Shape,
    params: dict,
    symbol: str,
    decl: tuple,
    halves: Operation | None = None,
) -> KernelSource:
    """matmul_gemv.cu.j2 (codegen/matmul_gemv.py); a TgcError where it does not fit."""
    dims, operands = _skeleton_arguments(op, mm, shape, decl, indent=8, halves=halves)
    if mm.operands[0] not in decl[1]:
        operands["prologue"] = a_prologue(op, mm, shape, decl[1])
    operands["halves"] = halves is not None
    return generate_gemv(symbol, dims, operands, params, kernel_label(op), op.loc)


def _halves(op: FusedOp, mm: Operation) -> Operation | None:
    """The `atomic.split` of the product along n into two equal halves that the region's
    epilogue reads it through (SiLU(gate) * up of a packed gate+up product, as lower-for-planning
    packs a Llama MLP's two projections), or None where the epilogue reads the product itself.
    A TgcError where it reads it both ways, or splits it otherwise."""
    users = [u for u in mm.results[0].users() if u.block is op.body]
    splits = [u for u in users if u.name == "atomic.split"]
    if not splits:
        return None
    split, rank, n = splits[0], mm.results[0].type.rank, mm.results[0].type.shape[-1]
    if (
        len(users) != 1
        or split.attr("axis") % rank != rank - 1
        or list(split.attr("sizes")) != [n // 2, n - n // 2]
        or n % 2
    ):
        raise TgcError(
            f"matmul kernel '{kernel_label(op)}': its epilogue reads the product whole or "
            "through one split of n into two equal halves, nothing else",
            split.loc,
        )
    return split


PROLOGUE_REDUCTIONS = {
    "atomic.reduce_sum": ("0.0f", "{0} + {1}"),
    "atomic.reduce_max": ("-INFINITY", "tgc_max({0}, {1})"),
}


def a_prologue(op: FusedOp, mm: Operation, shape: _Shape, ptrs: dict[Value, str]) -> dict:
    """The code of a few-rows matmul whose A the kernel computes from its inputs: elementwise
    ops, views, and reductions along A's last axis (k) with kept dims, as RMSNorm and layer
    norm are before a projection, or SiLU(gate) * up before the down projection.

    `rows`: per row r (C variables z and m), the statements that fill `rowv<j>[r]` with each
    value of one element per row that depends on a reduction (each reduction split over the
    block's warps along k, summed across each warp, the warps' shares meeting in shared memory
    `shares`), in the block's order; `arrays`: those arrays' names; `reduces`: whether there is
    a reduction; `element`: the statements computing A at (z, m, kk) with those values read
    from the arrays, and `a_value`, the name holding it. A TgcError where A needs something
    else (a reduction along another axis, a value the rows mix)."""
    a = mm.operands[0]
    k = shape.k
    batch_shape = shape.out[:-2]
    a_coords = broadcast_coords(a.type.shape[:-2], batch_shape, shape.bcoords) + ("m", "kk")
    needed: set[Operation] = set()
    stack = [a.defining_op]
    while stack:
        producer = stack.pop()
        if producer is None or producer in needed or producer.block is not op.body:
            continue
        needed.add(producer)
        stack += [v.defining_op for v in producer.operands]
    if mm in needed:
        raise TgcError("A of the few-rows matmul depends on its own product", mm.loc)
    ordered = [x for x in op.body.ops if x in needed]
    per_row: list[Value] = []  # values of one element per row that depend on a reduction
    for x in ordered:
        reduces = x.name in PROLOGUE_REDUCTIONS
        if reduces:
            src = x.operands[0]
            if (
                list(x.attr("axes")) not in ([src.type.rank - 1], [-1])
                or not x.attr("keepdims")
                or src.type.shape[-1] != k
            ):
                raise TgcError(
                    "a few-rows matmul's prologue reduces only along k, keeping the dim", x.loc
                )
        for v in x.results:
            if reduces or (v.type.shape[-1:] == (1,) and any(u in per_row for u in x.operands)):
                per_row.append(v)
    arrays = {v: f"rowv{j}" for j, v in enumerate(per_row)}

    def row_coords(v: Value) -> Coords:
        return canon(v.type.shape, broadcast_coords(v.type.shape, a.type.shape, a_coords))

    def emitter() -> Emitter:
        em = Emitter(ptrs)
        for v, array in arrays.items():
            here = row_coords(v)[:-1] + ("0",)
            em.hooks[v] = lambda c, here=here, array=array: f"{array}[r]" if c == here else None
        return em

    rows: list[str] = []  # each row value in a block of its own, inside the loop over rows
    for v in per_row:
        x = v.defining_op
        em = emitter()
        em.hooks.pop(v)
        if x.name in PROLOGUE_REDUCTIONS:
            init, combine = PROLOGUE_REDUCTIONS[x.name]
            src = x.operands[0]
            em.emit("{")
            em.emit(f"  float s = {init};")
            em.emit(f"  for (idx_t kk = (idx_t) warp * 32 + lane; kk < {k}; kk += 32 * WARPS) {{")
            head = em.take(4)
            term = em.value(src, broadcast_coords(src.type.shape, a.type.shape, a_coords))
            em.emit(f"s = {combine.format('s', term)};")
            body = em.take(8)
            em.emit("  }")
            em.emit("  for (int o = 16; o > 0; o /= 2)")
            em.emit(f"    s = {combine.format('s', '__shfl_xor_sync(0xffffffffu, s, o)')};")
            em.emit("  if (lane == 0) shares[warp] = s;")
            em.emit("  __syncthreads();")
            em.emit("  s = shares[0];")
            em.emit("  for (int w = 1; w < WARPS; ++w)")
            em.emit(f"    s = {combine.format('s', 'shares[w]')};")
            em.emit("  __syncthreads();  // before the next reduction writes its shares")
            em.emit(f"  {arrays[v]}[r] = s;")
            em.emit("}")
            rows.append("\n".join([head, body, em.take(4)]))
        else:
            name = em.value(v, row_coords(v))
            em.emit(f"{arrays[v]}[r] = {name};")
            rows.append("    {\n" + em.take(6) + "\n    }")
    em = emitter()
    value = em.value(a, a_coords)
    return dict(
        rows="\n".join(rows),
        arrays=list(arrays.values()),
        reduces=any(v.defining_op.name in PROLOGUE_REDUCTIONS for v in per_row),
        element=em.take(14),
        a_value=value,
    )


def _skeleton_arguments(
    op: FusedOp,
    mm: Operation,
    shape: _Shape,
    decl: tuple,
    indent: int,
    halves: Operation | None = None,
) -> tuple[dict, dict]:
    """What the skeletons generated in their own modules (wgmma, gemv) take: the problem's
    sizes and types, and the kernel's operands with the epilogue at `indent` (reading the
    product's `halves`, where given)."""
    decls, ptrs, outs = decl
    a, b = mm.operands
    elem = mm.results[0].type.element_type
    dims = dict(
        m=shape.m,
        n=shape.n,
        k=shape.k,
        batch=shape.batch,
        elem=elem,
        transpose_a=bool(mm.attr("transpose_a")),
        transpose_b=bool(mm.attr("transpose_b")),
        a_batch=math.prod(a.type.shape[:-2]),
        b_batch=_b_batch(mm),
        idx_t=idx_type(op),
        T=STORAGE_CTYPE[elem],
    )
    operands = dict(
        params=decls,
        a=ptrs.get(a, ""),  # "" where the kernel computes A (a prologue)
        b=ptrs[b],
        a_input=list(op.body.args).index(a) if a in ptrs else -1,
        b_input=list(op.body.args).index(b),
        a_batch_offset=shape.a_offset,
        b_batch_offset=shape.b_offset,
        epilogue=_epilogue(op, mm, shape, ptrs, outs, indent=indent, halves=halves),
        num_inputs=len(op.operands),
        num_outputs=len(op.results),
        ir_name=op.attr("name"),
    )
    return dims, operands


def _b_batch(mm: Operation) -> int:
    """How many B matrices the product's batch entries read (1: one, broadcast)."""
    return math.prod(mm.operands[1].type.shape[:-2])


def _kernel_source(
    op: FusedOp, symbol: str, source: str, shape: _Shape, bm: int, bn: int, threads: int, params
) -> KernelSource:
    """A matmul kernel: one block per bm x bn tile of C, per batch entry."""
    grid = (math.ceil(shape.n / bn), math.ceil(shape.m / bm), shape.batch)
    return KernelSource(
        symbol,
        source,
        "matmul",
        len(op.operands),
        len(op.results),
        grid,
        (threads, 1, 1),
        params,
        op.loc,
        op.attr("name"),
    )


def _tensor_core_misfit(mm: Operation, shape: _Shape, elem: str, tb: bool) -> str | None:
    """Why the tensor-core skeleton cannot run `mm`, or None."""
    if elem not in TC_TYPES:
        return f"it takes bf16 and f16, not {elem}"
    if mm.attr("transpose_a"):
        return "A is transposed"
    if shape.k % 8 or (not tb and shape.n % 8):
        return f"k{'' if tb else ' and n'} must be multiples of 8 (16-byte rows)"
    return None


def _shape(mm: Operation) -> _Shape:
    """Sizes of the product and the batch offsets of its operands (batch dims broadcast)."""
    a, b = mm.operands
    out = mm.results[0].type.shape
    k = a.type.shape[-2] if mm.attr("transpose_a") else a.type.shape[-1]
    batch_shape = out[:-2]
    bcoords = delinearize("z", batch_shape)
    a_batch = broadcast_coords(a.type.shape[:-2], batch_shape, bcoords)
    b_batch = broadcast_coords(b.type.shape[:-2], batch_shape, bcoords)
    return _Shape(
        out=out,
        m=out[-2],
        n=out[-1],
        k=k,
        batch=math.prod(batch_shape),
        bcoords=bcoords,
        a_offset=linear_offset(a.type.shape, a_batch + ("0", "0")),
        b_offset=linear_offset(b.type.shape, b_batch + ("0", "0")),
    )


# What one block may have: threads, and static shared memory (the two tiles).
MAX_THREADS, MAX_STATIC_SHARED = 1024, 48 * 1024


def _tiles(params: dict, acc_bytes: int) -> dict[str, int]:
    """The tile sizes (template parameters) and the threads of a block; a TgcError where they
    do not make a kernel (a thread tile that does not divide the block tile, more threads or
    shared memory than a block has), so a parameter search can skip the point."""
    bm = int(params.setdefault("block_m", 64))
    bn = int(params.setdefault("block_n", 64))
    bk = int(params.setdefault("block_k", 16))
    tm = int(params.setdefault("thread_m", 4))
    tn = int(params.setdefault("thread_n", 4))
    if min(bm, bn, bk, tm, tn) < 1 or bm % tm or bn % tn:
        raise TgcError(
            f"matmul tiles {bm}x{bn} (k step {bk}) cannot be split into {tm}x{tn} per thread"
        )
    threads = (bm // tm) * (bn // tn)
    shared = bk * (bm + 1 + bn + 1) * acc_bytes
    if threads > MAX_THREADS or shared > MAX_STATIC_SHARED:
        raise TgcError(
            f"matmul tiles {bm}x{bn}x{bk} with {tm}x{tn} per thread need {threads} threads and "
            f"{shared} bytes of shared memory; a block has {MAX_THREADS} and {MAX_STATIC_SHARED}"
        )
    return {"bm": bm, "bn": bn, "bk": bk, "tm": tm, "tn": tn, "threads": threads}


def _load(
    ptrs: dict[Value, str], x: Value, first: str, s1: int, second: str, s2: int, base: str
) -> str:
    """The C expression loading x[base + first * s1 + second * s2] in the compute type."""
    offset = f"{base} + {first} * {s1} + {second} * {s2}"
    return load_expression(ptrs[x], offset, x.type.element_type)


def _epilogue(
    op: FusedOp,
    mm: Operation,
    shape: _Shape,
    ptrs: dict[Value, str],
    outs: list[str],
    indent: int = 8,
    halves: Operation | None = None,
) -> str:
    """The statements storing every output at (batch, m, n), the product there being mm_val;
    with `halves` (the split of the product that `_halves` found) the outputs are of a half's
    shape and the halves at (batch, m, n) are mm_val0 and mm_val1."""
    em = Emitter(ptrs)
    coords = shape.bcoords + ("m", "n")
    out = shape.out
    if halves is None:
        em.hooks[mm.results[0]] = lambda c: "mm_val"
    else:
        out = halves.results[0].type.shape
        here = canon(out, coords)
        for j, half in enumerate(halves.results):  # read where they are stored, nowhere else
            em.hooks[half] = lambda c, j=j: f"mm_val{j}" if canon(out, c) == here else None
    for j, (y, r) in enumerate(zip(yields_of(op), op.results)):
        if r.type.shape != out:
            raise TgcError(f"matmul kernel '{kernel_label(op)}' yields a value of another shape")
        val = store_value(em.value(y, coords), r.type.element_type)
        em.emit(f"{outs[j]}[{linear_offset(out, coords)}] = {val};")
    return em.take(indent)


def _pair_epilogue(
    op: FusedOp, mm: Operation, shape: _Shape, ptrs: dict[Value, str], outs: list[str], indent: int
) -> str:
    """The statements storing every output at columns n and n1 = n + 1 of (batch, m), the
    products there being mm_val0 and mm_val1, each output's two elements by one store (for n
    even, rows of even length and pointers `_pairs_aligned` says take it)."""
    em = _pair_emitter(mm, ptrs)
    for j, (y, r) in enumerate(zip(yields_of(op), op.results)):
        if r.type.shape != shape.out:
            raise TgcError(f"matmul kernel '{kernel_label(op)}' yields a value of another shape")
        pair, values = _pair_values(em, shape, y, r.type.element_type)
        offset = linear_offset(shape.out, shape.bcoords + ("m", "n"))
        em.emit(f"*reinterpret_cast<{pair}*>(&{outs[j]}[{offset}]) = {pair}{{{values}}};")
    return em.take(indent)


def _pairs_aligned(op: FusedOp, outs: list[str]) -> str:
    """The C condition that every output's pointer takes `_pair_epilogue`'s stores."""
    checks = [
        f"reinterpret_cast<uintptr_t>({name}) % alignof(TgcPair<{STORAGE_CTYPE[r.type.element_type]}>) == 0"
        for name, r in zip(outs, op.results)
    ]
    return " && ".join(f"({c})" for c in checks) or "true"


def _word_epilogue(
    op: FusedOp, mm: Operation, shape: _Shape, ptrs: dict[Value, str], indent: int
) -> str | None:
    """For a kernel with one output of a 2-byte type and an epilogue that loads nothing: the
    statements computing it at columns n and n1 = n + 1 of (batch, m) (products mm_val0 and
    mm_val1) into the 32-bit `word`, which the skeleton gathers with its neighbours' into
    16-byte stores; else None. An epilogue that loads (a bias, a residual) stores pairs: its
    loads cannot pass the gathering shuffles, and on an H200 such epilogues ran 12-36% slower
    gathered than stored in pairs (bench/results/matmul_wgmma-stores16-*.md)."""
    if len(op.results) != 1 or ELEMENT_BYTES[op.results[0].type.element_type] != 2:
        return None
    if any(x in ptrs for e in op.body.ops if e is not mm for x in e.operands):
        return None
    em = _pair_emitter(mm, ptrs)
    (y,) = yields_of(op)
    pair, values = _pair_values(em, shape, y, op.results[0].type.element_type)
    em.emit(f"const {pair} pair{{{values}}};")
    em.emit("word = *reinterpret_cast<const uint32_t*>(&pair);")
    return em.take(indent)


def _pair_emitter(mm: Operation, ptrs: dict[Value, str]) -> Emitter:
    """An emitter reading the product at column n as mm_val0 and at n1 as mm_val1."""
    em = Emitter(ptrs)
    em.hooks[mm.results[0]] = lambda c: "mm_val1" if c[-1] == "n1" else "mm_val0"
    return em


def _pair_values(em: Emitter, shape: _Shape, y: Value, elem: str) -> tuple[str, str]:
    """The C type of a pair of `elem` and its two values, `y` at columns n and n1 (emitting
    what computes them), as the initialiser "x, w"."""
    x, w = (store_value(em.value(y, shape.bcoords + ("m", col)), elem) for col in ("n", "n1"))
    return f"TgcPair<{STORAGE_CTYPE[elem]}>", f"{x}, {w}"
