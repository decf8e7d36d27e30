"""The split-KV decode attention kernel (`attention_decode.cu.j2`), a skeleton of the `attention`
template: a handful of query rows per key-value head against a long key/value cache, split
along the cache as flash-decoding does.

Why its own skeleton: the flash-attention kernels give each block a tile of 64-128 queries, so
a decode step (one to a few queries per head) launches one block per head and batch entry (8 at
batch 1 of a Llama-8B-like model): 8 SMs read the whole cache. Here a block takes one key-value
head and one of `splits` ranges of the cache; the grid is about one wave of the GPU.

- Rows: the query rows of a key-value head are every query of every query head that reads it.
  With grouped-query attention whose k and v are the cache's heads repeated (`reshape` of a
  `broadcast`, as Hugging Face's repeat_kv and PyTorch's enable_gqa write it), the operand
  layouts carry a divisor on the head dim (`head_grouped_layout`, tgc/views.py): the kernel
  reads key-value head h // group from the un-expanded cache, and the group's query heads
  become rows of one block (row r: query head r / seq_q of the group, position r % seq_q), so
  each K/V byte is read once for all of them. At most 16 rows (one mma row slice).
- Each of the block's 4 warps streams its own key tiles (every 4th tile of the block's range)
  through a private cp.async ring of `STAGES` buffers: no block barrier in the loop, and
  several tiles per warp in flight, which is what keeps HBM busy. ldmatrix + mma.sync m16n8k16
  (bf16/f16, f32 accumulators) for S = Q K^T and O += P V; online softmax in f32.
- Combine: the 4 warps' (max, sum, O) merge through shared memory; with splits > 1 each block
  writes its partial result (f32) to a scratch buffer, and the last block of a head to finish
  (an atomic counter per head, reset by that block) merges the splits and writes the output.
  One kernel, no second launch and no scratch the caller allocates: the scratch and counters
  are module globals sized from the static shapes (`__device__` arrays), so the kernel is not
  reentrant across streams (a plan runs its kernels on one stream).
- `stages` (2 to 4, default 4): the ring's buffers per warp; fewer leave room for two blocks
  an SM at head dim 128.
- `splits` (template parameter, swept by tuning) defaults to the count that fills about one
  wave of the GPU's SMs at the blocks per SM its shared memory allows (`cuda_target.gpu_limits`
  of the kernel's `arch`), with at least one key tile per warp per split.
- Causal (bottom-right aligned, as hl.attention's) and an additive mask are handled in the key
  tiles that need them.
"""

from __future__ import annotations

import math

from tgc.codegen.render import render
from tgc.cuda_target import gpu_limits
from tgc.diagnostics import TgcError
from tgc.ir import Operation

WARPS = 4
STAGES = 4  # K/V buffers per warp: 3 tiles in flight while one is computed
MAX_ROWS = 16  # query rows of a key-value head: one mma row slice
# Fewer keys than this: the flash-attention kernels' one block per head is as good.
MIN_KEYS = 256
# The module globals the kernel defines, named after its own symbol (format strings): whoever
# allocates the symbol reserves these with it (codegen/kernels.py SYMBOL_FORMS), so no other
# kernel or function of the translation unit can be given one of them.
GLOBALS = {"part": "{}_part", "part_ml": "{}_part_ml", "done": "{}_done"}


def group_of(ops: dict[str, dict]) -> int:
    """The query heads per key-value head: the divisor k and v share on their last batch dim
    (1 without grouping)."""
    k, v = ops["k"], ops["v"]
    if not k["batch"]:
        return 1
    g = k["div"][-1]
    return g if v["div"][-1] == g and all(d == 1 for d in k["div"][:-1] + v["div"][:-1]) else 0


def decode_fits(att: Operation, ops: dict[str, dict], common: dict) -> str | None:
    """Why the decode skeleton cannot run this attention, or None."""
    group = group_of(ops)
    if not group:
        return "k and v are grouped differently"
    rows = group * common["seq_q"]
    if rows > MAX_ROWS:
        return f"{rows} query rows per key-value head (at most {MAX_ROWS})"
    if any(
        ops[n]["div"] != [1] * len(ops[n]["div"])
        for n in ("q",) + (("mask",) if "mask" in ops else ())
    ):
        return "q or the mask is read with a head divisor"
    return None


def decode_by_default(att: Operation, ops: dict[str, dict], common: dict) -> bool:
    return common["seq_k"] >= MIN_KEYS and decode_fits(att, ops, common) is None


def _layout(d: int, dv: int, stages: int) -> tuple[int, int]:
    """(keys per warp tile, shared bytes per block): 16 keys above head dim 64 (a warp's ring
    of 4 tiles is then 35 KB), else 32."""
    bn = 16 if max(d, dv) > 64 else 32
    ring = WARPS * stages * bn * ((d + 8) + (dv + 8)) * 2
    q = MAX_ROWS * (d + 8) * 2
    # The warps' merge reuses the ring: (max, sum) and O of each warp's 16 rows, f32.
    merge = WARPS * MAX_ROWS * (dv + 2) * 4
    return bn, q + max(ring, merge)


def default_splits(nb: int, tiles: int, blocks_per_sm: int, sms: int) -> int:
    """Splits per key-value head: the fewest whose blocks fill at least 95% of their last wave
    of `sms * blocks_per_sm` (else the best filling), each split keeping at least one tile per
    warp. One wave of equal blocks is the aim: a memory-bound kernel's blocks all stream at
    once, and a second, partial wave would run on a fraction of the SMs."""
    most = max(1, tiles // WARPS)
    cap = sms * blocks_per_sm
    best, best_fill = 1, 0.0
    for s in range(1, most + 1):
        blocks = nb * s
        fill = blocks / (math.ceil(blocks / cap) * cap)
        if fill >= 0.95:
            return s
        if fill > best_fill + 1e-9:
            best, best_fill = s, fill
    return best


def decode_kernel(att: Operation, ops: dict[str, dict], common: dict, params: dict, tc_args: dict):
    """attention_decode.cu.j2 for `att` (decode_fits holds): (source, grid, block, shared
    bytes, chosen template parameters)."""
    why = decode_fits(att, ops, common)
    if why:
        raise TgcError(f"attention template parameters: decode does not fit: {why}")
    d, dv, sq, sk = common["d"], common["dv"], common["seq_q"], common["seq_k"]
    group = group_of(ops)
    rows = group * sq
    nb = common["nb"] // group  # key-value heads x batch
    stages = params.get("stages", STAGES)
    if stages not in (2, 3, 4) or isinstance(stages, bool):
        raise TgcError(
            f"attention template parameters: decode takes stages 2, 3 or 4, not {stages!r}"
        )
    bn, shared_bytes = _layout(d, dv, stages)
    tiles = -(-sk // bn)
    limits = gpu_limits(params.get("arch"))
    sms = limits.sms
    per_sm = max(1, min(limits.blocks_by_shared(shared_bytes), 2048 // (32 * WARPS)))
    splits = params.get("splits", default_splits(nb, tiles, per_sm, sms))
    if not isinstance(splits, int) or isinstance(splits, bool) or splits < 1:
        raise TgcError(
            f"attention template parameters: splits must be a positive integer, not {splits!r}"
        )
    # The last block's merge keeps a weight per row and split in the warps' O buffer.
    if rows * splits > WARPS * MAX_ROWS * dv:
        raise TgcError(
            f"attention template parameters: at most {WARPS * MAX_ROWS * dv // rows} splits here, not {splits}"
        )
    per_split = -(-tiles // min(splits, tiles))  # tiles per split
    splits = -(-tiles // per_split)  # none empty
    batch = _kv_batch(ops, common["batch_shape"], group)
    # The key-value batch's starts replace the query batch's of `common`.
    source = render(
        "attention_decode.cu.j2",
        **{**common, **tc_args, **batch},
        group=group,
        rows=rows,
        nkv=nb,
        bn=bn,
        warps=WARPS,
        stages=stages,
        splits=splits,
        per_split=per_split,
        shared_bytes=shared_bytes,
        **{key: form.format(common["name"]) for key, form in GLOBALS.items()},
        # Tiles from here on need the bounds or causal checks.
        edge_from=sk - (sq - 1 if common["causal"] else 0),
    )
    chosen = {"decode": True, "splits": splits, "tensor_cores": True, "stages": stages}
    return source, (nb * splits, 1, 1), (32 * WARPS, 1, 1), shared_bytes, chosen


def _kv_batch(ops: dict[str, dict], batch_shape: list[int], group: int) -> dict:
    """C expressions of each operand's start for the flat key-value batch index `bz` (over
    batch_shape with its last dim divided by `group`), and the stride between a group's query
    heads in q, the output and the mask (`*_h`)."""
    shape = list(batch_shape)
    if shape:
        shape[-1] //= group
    coords, rest = [], "bz"
    for i in range(len(shape) - 1, -1, -1):
        coords.insert(0, f"({rest} % {shape[i]})" if i > 0 else rest)
        rest = f"({rest} / {shape[i]})"

    def base(o: dict, scale_last: int) -> str:
        strides = list(o["batch"])
        if strides:
            strides[-1] *= scale_last
        terms = [str(o["offset"])] + [
            f"(long long) {c} * {s}" for c, s in zip(coords, strides) if s
        ]
        return " + ".join(terms)

    out = {
        "q_base": base(ops["q"], group),
        "k_base": base(ops["k"], 1),
        "v_base": base(ops["v"], 1),
        "o_base": base(ops["o"], group),
        "q_h": ops["q"]["batch"][-1] if shape else 0,
        "o_h": ops["o"]["batch"][-1] if shape else 0,
    }
    if "mask" in ops:
        out["mask_base"] = base(ops["mask"], group)
        out["mask_h"] = ops["mask"]["batch"][-1] if shape else 0
    return out
