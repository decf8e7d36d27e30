"""The few-rows skeleton of the matmul template (`matmul_gemv.cu.j2`, template parameter `gemv`):
C = A B^T where A has at most `GEMV_MAX_ROWS` rows (the batch folded into them) and B is one
weight stored as [n][k], as a decoding step multiplies one token's activations by each of a
model's weights. Such a product is a read of B and nothing else: on an H200 (2026-11-28,
bench/results/generate-*.md run 6) the tensor-core skeleton's 128x256 tiles left 8 blocks for
a 2048-column output and took 165 µs for a 33 MB weight, cuBLAS 13 µs (2.6 TB/s).

Each warp takes `columns` columns of C for every row; its lanes stride along k in 16-byte
loads of B (`unroll` of them in flight a lane and column, streamed past L1) and of A (read by
every warp, so from L1 and L2), summing in f32, then reduce across the warp; `warps` warps a
block. On an H200 it ran a 1 B Llama's single-token products 5-39% faster than cuBLAS (its
down projection 6% slower); at 4-8 rows cuBLAS is faster (bench/results/matmul_gemv-*.md), and
the planner, measuring both, keeps it there. Where the pointers are not 16-byte aligned the
kernel sums one element at a time (correct, slow). Needs bf16, f16 or f32, A not transposed, B
transposed and the same for every batch entry, and k a multiple of 16 bytes; where it does not
fit, asking for it is a TgcError.

With `split_k` S > 1 a column group is S warps' of one block, each taking every S-th step of
the group's k, their sums meeting in shared memory. At one row the kernel is a stream of the
weight whose speed is the bytes in flight: by default there 8 loads a lane (`unroll`), and two
warps a column where each still has a whole step of them (k of 4,096 and more in bf16). On an
H200 (2026-11-29, bench/results/matmul_gemv-split-*) that ran a 1 B Llama's down projection
(2,048 x 8,192) in 10.1 us against 11.9 with 4 loads and one warp a column, an 8 B Llama's
q/k/v, gate/up and head 4-13% faster, and the products with k of 2,048 within 3% either way.
Above one row, and with a prologue, the defaults stay 4 loads and one warp a column (measured
before): with 8 in the prologue kernels too, the 1 B Llama's decode step on an H200 ran 236
kernels where it had run 219 and took 1.222 ms against 1.125-1.171 (bench/results/
decode_step-onerow-*). Seventeen more kernels is one a layer and the head's: most likely the
planner, measuring, put a norm before its product back in a kernel of its own, the fused kernel
having become the slower (not yet checked in the plan).

Its tensor-core variant (`matmul_gemv_mma.cu.j2`, template parameter `gemv_mma`, bf16/f16, up to
16 rows) is the default from `GEMV_MMA_FROM_ROWS` rows, with 8 warps: timed on an H200 at 8 and
16 rows it beat the CUDA-core kernel on every product of bench/matmul_gemv.py (by 1.1-1.7x), at
4 rows on 2 of 11; cuBLAS stays faster than both at 4-16 rows on most products (1.0-2x) and the
planner, measuring, keeps it there. The CUDA-core kernel's instructions grow with the rows (for
each 16 bytes of B, 8 conversions and FMAs a row); an mma takes 16 rows for the same ones.
A block takes 8 columns and its `warps` warps split k; a lane loads 16 bytes of one column of B
and of one or two rows of A a step and feeds them to two mma.sync m16n8k16 as they are (A's rows
padded to 16 with zeros): both operands are read in one k order the fragments share, which a sum
does not care about. The warps' sums meet in shared memory, where the epilogue reads them.

With `operands["halves"]` (codegen/matmul.py `_halves`; the CUDA-core kernel only) the epilogue
reads the product's two halves along n, as SiLU(gate) * up reads a packed gate+up product: a
warp's `columns` output columns n take B's rows n and N/2 + n, twice the sums, and the grid
covers N/2 columns (docs/fusion.md, "SiLU(gate) * up as the few-rows product's epilogue").

Both are launched as programmatic dependents on sm_90 (runtime/driver_kernel.py): a block
first asks for the start of its rows of B in L2 (PREFETCH_BYTES in all), then waits for the
kernel before it, so that a decoding step's products, each a few microseconds of streaming,
do not each begin with memory's latency after the small kernel before them.

With `operands["prologue"]` (codegen/matmul.py `a_prologue`; the caller asks for the CUDA-core
kernel then) the kernel computes A instead of loading it: the block first fills, for each row,
the values of one element a row (reductions along k, split over its warps), then, where A's rows
fit a block's static shared memory (`STAGED_A_BYTES`), computes A there once, in its element
type as the unfused graph would store it, and the products read it as they read A from memory.
Else each warp computes A's 16 bytes' worth of values at each step from the kernel's inputs: on
an H200 (bench/results/matmul_prologue-NVIDIA-H200-2026-11-28.md) that ran at about half the
plain product's speed, every warp recomputing A with one load an element.
"""

from __future__ import annotations

import math

from tgc.codegen.cuda_ops import store_value
from tgc.codegen.render import KernelSource, render
from tgc.cuda_target import TC_TYPES
from tgc.diagnostics import TgcError
from tgc.ir import Location
from tgc.types import ELEMENT_BYTES

GEMV_MAX_ROWS = 8
GEMV_MMA_MAX_ROWS = 16  # the tensor-core variant: A's rows are an mma's 16
GEMV_MMA_FROM_ROWS = 5  # the tensor-core variant is the default from this many rows (doc)
# A computed by a prologue is kept in static shared memory up to this size (48 KB a block, less
# the reductions' shares and split_k's sums, 8 warps x 8 rows x 8 sums: 4 columns in both
# halves): 1 row of k up to 23,424 in bf16, or 8 rows of 2,928.
STAGED_A_BYTES = 48 * 1024 - 256 - 2048
GEMV_TYPES = {  # element type -> (C type of a pair, its conversion to float2), f32 read as float4
    "bf16": ("__nv_bfloat162", "__bfloat1622float2"),
    "f16": ("__half2", "__half22float2"),
    "f32": (None, None),
}
GEMV_WARPS, GEMV_COLUMNS, GEMV_UNROLL = (2, 4, 8), (1, 2, 4), (1, 2, 4, 8)
GEMV_SPLIT_K = (1, 2, 4, 8)
# Bytes of B a kernel asks for in L2 before the kernel before it has ended (module doc): the
# start of each row, at most this much in all, a third of an H100's or H200's 50 MB L2.
PREFETCH_BYTES, L2_LINE = 16 << 20, 128


def gemv_misfit(
    elem: str,
    transpose_a: bool,
    transpose_b: bool,
    rows: int,
    b_batch: int,
    k: int,
    mma: bool = False,
) -> str | None:
    """Why the skeleton (`mma`: its tensor-core variant) cannot run the product, or None.
    `rows`: A's rows with the batch folded in; `b_batch`: how many distinct B the batch
    entries read."""
    if mma and elem not in TC_TYPES:
        return f"its tensor-core variant takes bf16 and f16, not {elem}"
    if elem not in GEMV_TYPES:
        return f"it takes bf16, f16 and f32, not {elem}"
    if transpose_a:
        return "A is transposed"
    if not transpose_b:
        return "B is not transposed (its rows must be k, as a weight [n][k] is stored)"
    if b_batch != 1:
        return "B differs between batch entries"
    most = GEMV_MMA_MAX_ROWS if mma else GEMV_MAX_ROWS
    if rows > most:
        return f"it takes at most {most} rows, not {rows}"
    if k * ELEMENT_BYTES[elem] % 16:
        return "k must make rows of a multiple of 16 bytes"
    return None


def _one_row_defaults(chunks: int) -> tuple[int, int]:
    """(unroll, split_k) at one row over rows of B of `chunks` 16-byte chunks (module doc): 8
    loads a lane, two warps a column where each keeps a whole step of them."""
    return 8, 2 if chunks >= 2 * 32 * 8 else 1


def gemv_mma_by_default(elem: str, rows: int) -> bool:
    """Whether the tensor-core variant is the default for `rows` rows of `elem` (module doc)."""
    return elem in TC_TYPES and rows >= GEMV_MMA_FROM_ROWS


def generate_gemv(
    symbol: str, dims: dict, operands: dict, params: dict, label: str, loc: Location | None
) -> KernelSource:
    """The kernel; `dims`: m, n, k, batch, elem, transpose_a/_b, b_batch, idx_t, T;
    `operands`: params, a, b, a_batch_offset, epilogue, num_inputs, num_outputs, ir_name, and
    optionally prologue and halves (the epilogue reads the product's two halves along n)."""
    rows = dims["m"] * dims["batch"]
    halves = bool(operands.get("halves"))  # (codegen/matmul.py asks the CUDA-core kernel then)
    mma = params.setdefault("gemv_mma", gemv_mma_by_default(dims["elem"], rows))
    why = gemv_misfit(
        dims["elem"],
        dims["transpose_a"],
        dims["transpose_b"],
        rows,
        dims["b_batch"],
        dims["k"],
        mma,
    )
    if why is not None:
        raise TgcError(f"the few-rows matmul cannot run '{label}': {why}", loc)
    # 8 warps with a prologue: every block computes A, so fewer, wider blocks compute it fewer
    # times (at 1 row 8 warps streamed B as fast as 4 on an H200: bench/results/matmul_gemv-*-b.md)
    prologue = operands.get("prologue")
    warps = params.setdefault("warps", 8 if mma or prologue is not None else 4)
    row_bytes = dims["k"] * ELEMENT_BYTES[dims["elem"]]  # of B
    # (a product with a prologue keeps the defaults it was measured with: module doc)
    plain_row = rows == 1 and not mma and prologue is None
    unroll_1, split_1 = _one_row_defaults(row_bytes // 16)
    unroll = params.setdefault("unroll", unroll_1 if plain_row else 4)
    checked = [("warps", warps, GEMV_WARPS), ("unroll", unroll, GEMV_UNROLL)]
    if mma:
        params.pop("columns", None)  # a block takes the mma's 8 columns, its warps split k
        columns, per_block = None, 8
    else:
        # Measured on an H200 (bench/results/matmul_gemv-*.md): at 1 row one column a column
        # group (split_k, unroll: the module doc); above, 2 columns and 4 loads (the best point
        # at 8 rows for most products; 4 columns with 1 load, A read from L1 fewer times, was
        # 2.5x slower).
        columns = params.setdefault("columns", 1 if rows == 1 else 2)
        split = params.setdefault("split_k", split_1 if plain_row else 1)
        checked += [("columns", columns, GEMV_COLUMNS), ("split_k", split, GEMV_SPLIT_K)]
    for name, value, allowed in checked:
        if value not in allowed:
            raise TgcError(
                f"the few-rows matmul takes {name} {', '.join(map(str, allowed))}, not {value!r}",
                loc,
            )
    if not mma:
        if warps % split:
            raise TgcError(
                f"the few-rows matmul's split_k ({split}) must divide its warps ({warps})", loc
            )
        per_block = warps // split * columns
    pair_t, pair_to_float2 = GEMV_TYPES[dims["elem"]]
    prefetch = min(row_bytes, max(L2_LINE, PREFETCH_BYTES // dims["n"]))
    staged = prologue is not None and rows * row_bytes <= STAGED_A_BYTES
    source = render(
        "matmul_gemv_mma.cu.j2" if mma else "matmul_gemv.cu.j2",
        name=symbol,
        params=operands["params"],
        idx_t=dims["idx_t"],
        T=dims["T"],
        elem=dims["elem"],
        pair_t=pair_t,
        pair_to_float2=pair_to_float2,
        rows=rows,
        m=dims["m"],
        n=dims["n"],
        k=dims["k"],
        warps=warps,
        columns=columns,
        unroll=unroll,
        split_k=None if mma else split,
        a=operands["a"],
        b=operands["b"],
        a_batch_offset=operands["a_batch_offset"],
        prologue=prologue,
        staged=staged,
        stored_a_value=store_value(prologue["a_value"], dims["elem"]) if prologue else "",
        epilogue=operands["epilogue"],
        halves=halves,
        block_rows=per_block,
        prefetch_lines=-(-prefetch // L2_LINE),
    )
    grid = (math.ceil((dims["n"] // 2 if halves else dims["n"]) / per_block), 1, 1)
    return KernelSource(
        symbol,
        source,
        "matmul",
        operands["num_inputs"],
        operands["num_outputs"],
        grid,
        (32 * warps, 1, 1),
        params,
        loc,
        operands["ir_name"],
        dependent_launch=True,
    )
