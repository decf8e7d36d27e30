"""The converter of ONNX Attention (opset 23 and 24) to hl.attention.

Q, K and V are [batch, heads, seq, head_size], or 3D [batch, seq, heads * head_size] with
`q_num_heads` and `kv_num_heads` (split into heads, and the result merged back). A past key and
value are concatenated in front of K and V (the present_key and present_value outputs). Grouped
queries (more query heads than key/value heads) are not repeated: Q becomes
[batch, kv_heads, group, seq, d] and K, V [batch, kv_heads, 1, seq, d], and hl.attention's batch
dims broadcast.

Every mask is additive: a boolean attn_mask becomes 0 / -inf, one shorter than the keys is padded
with -inf (as ONNX says), nonpad_kv_seqlen masks each batch's padding keys, and is_causal masks
key j for query i when j > i + past (ONNX aligns the diagonal to the top left, past tokens
aside; hl.attention's `causal` aligns it to the end, so it is used only where the two agree,
when K brings as many new tokens as Q has). A softcap, a qk_matmul_output or a softmax_precision
other than the inputs' own type take the explicit form: matmul, scale, softcap, mask,
hl.softmax, matmul.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.ir import Value

from .context import NodeContext
from .dtypes import element_type, onnx_type_name
from .ops_nn import _broadcasts_into, _cast, _reshape
from .registry import converter


def _split_heads(ctx: NodeContext, x: Value, heads: int, what: str) -> Value:
    """[batch, seq, heads * size] -> [batch, heads, seq, size]."""
    batch, seq, hidden = x.type.shape
    if heads <= 0 or hidden % heads:
        raise ctx.error(f"{what} hidden size {hidden} is not a multiple of {heads} heads")
    split = _reshape(ctx, x, (batch, seq, heads, hidden // heads))
    return ctx.b.atomic.transpose(split, perm=[0, 2, 1, 3])


def _merge_heads(ctx: NodeContext, y: Value) -> Value:
    """[batch, heads, seq, size] -> [batch, seq, heads * size]."""
    batch, heads, seq, size = y.type.shape
    moved = ctx.b.atomic.transpose(y, perm=[0, 2, 1, 3])
    return _reshape(ctx, moved, (batch, seq, heads * size))


def _qkv(ctx: NodeContext) -> tuple[Value, Value, Value, bool]:
    """Q, K, V as 4D tensors, and whether they came in 3D."""
    q, k, v = ctx.input(0), ctx.input(1), ctx.input(2)
    q_heads = ctx.attr("q_num_heads", None)
    kv_heads = ctx.attr("kv_num_heads", None)
    ranks = {q.type.rank, k.type.rank, v.type.rank}
    if ranks == {3}:
        if q_heads is None or kv_heads is None:
            raise ctx.error("3D Q, K and V need the q_num_heads and kv_num_heads attributes")
        q = _split_heads(ctx, q, q_heads, "Q")
        k = _split_heads(ctx, k, kv_heads, "K")
        v = _split_heads(ctx, v, kv_heads, "V")
        return q, k, v, True
    if ranks != {4}:
        raise ctx.error(f"Q, K and V must all be 3D or all 4D, got {q.type}, {k.type}, {v.type}")
    for what, given, actual in (("q", q_heads, q.type.shape[1]), ("kv", kv_heads, k.type.shape[1])):
        if given is not None and given != actual:
            raise ctx.error(f"{what}_num_heads {given} differs from the input's {actual} heads")
    return q, k, v, False


def _with_past(ctx: NodeContext, k: Value, v: Value) -> tuple[Value, Value, int]:
    """K and V with the past key and value in front (the present ones), and the past length."""
    past_key, past_value = ctx.optional_input(4), ctx.optional_input(5)
    if (past_key is None) != (past_value is None):
        raise ctx.error("past_key and past_value must be given together")
    if past_key is None:
        return k, v, 0
    for what, past, new in (("past_key", past_key, k), ("past_value", past_value, v)):
        p, n = past.type.shape, new.type.shape
        if past.type.rank != 4 or p[:2] != n[:2] or p[3] != n[3]:
            raise ctx.error(f"{what} {past.type} does not fit the new tokens {new.type}")
    k = ctx.b.atomic.concat(past_key, k, axis=2)
    v = ctx.b.atomic.concat(past_value, v, axis=2)
    return k, v, past_key.type.shape[2]


def _additive_mask(ctx: NodeContext, q: Value, total: int) -> Value | None:
    """attn_mask as scores to add (0 / -inf for a boolean one), padded with -inf to `total` keys."""
    b = ctx.b
    mask = ctx.optional_input(3)
    if mask is None:
        return None
    if mask.type.element_type == "i1":
        mask = b.atomic.where(mask, ctx.scalar(0.0, q), ctx.scalar(-math.inf, q))
    elif mask.type.element_type != q.type.element_type:
        raise ctx.error(f"attn_mask {mask.type} must be bool or of Q's element type")
    if mask.type.rank == 0 or mask.type.rank > 4:
        raise ctx.error(f"attn_mask {mask.type} must have rank 1 to 4")
    keys = mask.type.shape[-1]
    if keys > total:
        raise ctx.error(f"attn_mask covers {keys} keys, more than the {total} there are")
    if keys < total:
        pad_type = mask.type.with_shape(mask.type.shape[:-1] + (total - keys,))
        pad = ctx.constant(np.full(pad_type.shape, -np.inf, pad_type.dtype), pad_type.element_type)
        mask = b.atomic.concat(mask, pad, axis=mask.type.rank - 1)
    return mask


def _causal_mask(ctx: NodeContext, q: Value, seq_q: int, total: int, past: int) -> Value:
    """[seq_q, total]: 0 where key j <= query i + past, else -inf (ONNX's top-left diagonal)."""
    b = ctx.b
    positions = q.type.with_shape((seq_q, total)).with_element_type("i32")
    row = b.atomic.iota(axis=0, result_type=positions)
    col = b.atomic.iota(axis=1, result_type=positions)
    if past:
        row = b.atomic.add(row, ctx.scalar(past, row))
    allowed = b.atomic.cmp(col, row, pred="le")
    return b.atomic.where(allowed, ctx.scalar(0.0, q), ctx.scalar(-math.inf, q))


def _padding_mask(ctx: NodeContext, q: Value, batch: int, total: int) -> Value | None:
    """nonpad_kv_seqlen [batch] as [batch, 1, 1, total]: 0 for the first n keys, else -inf."""
    if not ctx.has_input(6):
        return None
    b = ctx.b
    lengths = ctx.input(6)
    if lengths.type.shape != (batch,) or lengths.type.element_type != "i64":
        raise ctx.error(f"nonpad_kv_seqlen must be tensor<{batch}xi64>, got {lengths.type}")
    if ctx.has_input(4):
        raise ctx.error("nonpad_kv_seqlen cannot be used with past_key and past_value")
    lengths = _reshape(ctx, lengths, (batch, 1, 1, 1))
    keys = b.atomic.iota(axis=3, result_type=lengths.type.with_shape((1, 1, 1, total)))
    kept = b.atomic.cmp(keys, lengths, pred="lt")
    return b.atomic.where(kept, ctx.scalar(0.0, q), ctx.scalar(-math.inf, q))


def _add(ctx: NodeContext, a: Value | None, b: Value | None) -> Value | None:
    if a is None or b is None:
        return a if b is None else b
    return ctx.b.atomic.add(a, b)


def _group(ctx: NodeContext, x: Value, kv_heads: int, group: int) -> Value:
    """[b, heads, s, d] (heads = kv_heads * group, or 1) -> [b, kv_heads, group, s, d] (or
    [b, 1, 1, s, d]); a tensor of rank < 4 is first padded with leading 1s."""
    shape = (1,) * (4 - x.type.rank) + x.type.shape
    heads = shape[1]
    split = (kv_heads, group) if heads != 1 else (1, 1)
    return _reshape(ctx, x, shape[:1] + split + shape[2:])


def _softmax_type(ctx: NodeContext, q: Value) -> str:
    precision = ctx.attr("softmax_precision", None)
    if precision is None:
        return q.type.element_type
    elem = element_type(precision)
    if elem not in ("f16", "bf16", "f32", "f64"):
        raise ctx.error(f"softmax_precision {onnx_type_name(precision)} is not a float type")
    return elem


@converter("Attention")
def attention(ctx: NodeContext):
    b = ctx.b
    q, k, v, was_3d = _qkv(ctx)
    for what, t in (("K", k), ("V", v)):
        if t.type.element_type != q.type.element_type:
            raise ctx.error(f"{what} {t.type} and Q {q.type} differ in element type")
    if not q.type.is_float:
        raise ctx.error(f"Q must be a float tensor, got {q.type}")
    k, v, past = _with_past(ctx, k, v)
    batch, q_heads, seq_q, head = q.type.shape
    _, kv_heads, total, k_head = k.type.shape
    if k_head != head:
        raise ctx.error(f"Q and K head sizes differ: {head} and {k_head}")
    if q_heads % kv_heads:
        raise ctx.error(f"{q_heads} query heads are not a multiple of {kv_heads} key/value heads")
    scale = ctx.attr("scale", None)
    scale = 1 / math.sqrt(head) if scale is None else scale
    causal = bool(ctx.attr("is_causal", 0))
    softcap = ctx.attr("softcap", 0.0)
    mode = ctx.attr("qk_matmul_output_mode", 0)
    if mode not in (0, 1, 2, 3):
        raise ctx.error(f"qk_matmul_output_mode {mode} is not one of 0, 1, 2, 3")
    softmax_elem = _softmax_type(ctx, q)
    mask = _add(ctx, _additive_mask(ctx, q, total), _padding_mask(ctx, q, batch, total))
    if mask is not None and not _broadcasts_into(mask.type.shape, (batch, q_heads, seq_q, total)):
        raise ctx.error(
            f"attn_mask {mask.type} does not broadcast to the scores [{batch}, {q_heads}, "
            f"{seq_q}, {total}]"
        )
    hl_causal = causal and total - past == seq_q  # then both diagonals agree
    if causal and not hl_causal:
        mask = _add(ctx, mask, _causal_mask(ctx, q, seq_q, total, past))
    present = [k if ctx.has_output(1) else None, v if ctx.has_output(2) else None]
    group = q_heads // kv_heads
    if group > 1:
        q, k, v = (_group(ctx, t, kv_heads, n) for t, n in ((q, group), (k, 1), (v, 1)))
        mask = None if mask is None else _group(ctx, mask, kv_heads, group)
    explicit = softcap > 0 or ctx.has_output(3) or softmax_elem != q.type.element_type
    if explicit:
        y, qk = _explicit(ctx, q, k, v, mask, scale, softcap, hl_causal, past, mode, softmax_elem)
    else:
        operands = [q, k, v] + ([] if mask is None else [mask])
        causal_attr = {"causal": True} if hl_causal else {}
        y, qk = b.hl.attention(*operands, scale=float(scale), **causal_attr), None
    scores_shape = (batch, q_heads, seq_q, total)
    y = _reshape(ctx, y, (batch, q_heads, seq_q, y.type.shape[-1]))
    if was_3d:
        y = _merge_heads(ctx, y)
    qk = None if qk is None else _reshape(ctx, qk, scores_shape)
    return [y, *present, qk]


def _explicit(ctx, q, k, v, mask, scale, softcap, causal, past, mode, softmax_elem):
    """Attention op by op, returning (Y, the qk_matmul_output of `mode`)."""
    b = ctx.b
    scores = b.atomic.matmul(q, k, transpose_b=True)
    scores = b.atomic.mul(scores, ctx.scalar(scale, scores))
    stages = [scores]
    if softcap > 0:
        capped = b.hl.tanh(b.atomic.div(scores, ctx.scalar(softcap, scores)))
        scores = b.atomic.mul(capped, ctx.scalar(softcap, scores))
    stages.append(scores)
    if mask is not None:
        scores = b.atomic.add(scores, mask)
    if causal:  # query i sees key j <= i + past (here the new tokens are as many as the queries)
        seq_q, total = scores.type.shape[-2:]
        scores = b.atomic.add(scores, _causal_mask(ctx, q, seq_q, total, past))
    stages.append(scores)
    probs = _cast(ctx, b.hl.softmax(_cast(ctx, scores, softmax_elem), axis=-1), q.type.element_type)
    stages.append(probs)
    return b.atomic.matmul(probs, v), stages[mode]


def _rotary_input(ctx: NodeContext, x: Value) -> Value:
    """The input as [batch, heads, seq, head_size] (4D as it is; 3D split with num_heads)."""
    heads = ctx.attr("num_heads", None)
    if x.type.rank == 4:
        if heads is not None and heads != x.type.shape[1]:
            raise ctx.error(f"num_heads {heads} differs from the input's {x.type.shape[1]} heads")
        return x
    if x.type.rank != 3:
        raise ctx.error(f"the input must be 3D or 4D, got {x.type}")
    if heads is None:
        raise ctx.error("a 3D input needs the num_heads attribute")
    return _split_heads(ctx, x, heads, "the input")


def _last_dim_slice(ctx: NodeContext, x: Value, start: int, stop: int, step: int = 1) -> Value:
    rank = x.type.rank
    begin = [0] * (rank - 1) + [start]
    end = list(x.type.shape[:-1]) + [stop]
    return ctx.b.atomic.slice(x, start=begin, stop=end, step=[1] * (rank - 1) + [step])


def _rotary_caches(ctx: NodeContext, x: Value, half: int) -> tuple[Value, Value]:
    """cos and sin as [batch, 1, seq, half]: rows of the caches picked by position_ids, or the
    caches themselves when they are already [batch, seq, half]."""
    batch, _, seq, _ = x.type.shape
    caches = [ctx.input(1), ctx.input(2)]
    positions = ctx.optional_input(3)
    out = []
    for what, cache in zip(("cos_cache", "sin_cache"), caches):
        if cache.type.element_type != x.type.element_type:
            raise ctx.error(f"{what} {cache.type} and the input {x.type} differ in element type")
        if positions is not None:
            if cache.type.rank != 2 or positions.type.shape != (batch, seq):
                raise ctx.error(
                    f"with position_ids {positions.type}, {what} must be [max_position, "
                    f"{half}], got {cache.type}"
                )
            cache = ctx.b.atomic.gather(cache, positions, axis=0)
        if cache.type.shape != (batch, seq, half):
            raise ctx.error(f"{what} must be [{batch}, {seq}, {half}], got {cache.type}")
        out.append(_reshape(ctx, cache, (batch, 1, seq, half)))
    return out[0], out[1]


@converter("RotaryEmbedding")
def rotary_embedding(ctx: NodeContext):
    """Rotate pairs of the first rotary_embedding_dim features: (x1, x2) -> (x1 cos - x2 sin,
    x1 sin + x2 cos), the pairs being the two halves or, interleaved, features 2i and 2i+1."""
    b = ctx.b
    given = ctx.input(0)
    if not given.type.is_float:
        raise ctx.error(f"the input must be a float tensor, got {given.type}")
    x = _rotary_input(ctx, given)
    size = x.type.shape[-1]
    rotary = ctx.attr("rotary_embedding_dim", 0) or size
    if rotary % 2 or rotary > size:
        raise ctx.error(f"rotary_embedding_dim {rotary} must be even and at most {size}")
    half = rotary // 2
    interleaved = bool(ctx.attr("interleaved", 0))
    cos, sin = _rotary_caches(ctx, x, half)
    if interleaved:
        x1, x2 = _last_dim_slice(ctx, x, 0, rotary, 2), _last_dim_slice(ctx, x, 1, rotary, 2)
    else:
        x1, x2 = _last_dim_slice(ctx, x, 0, half), _last_dim_slice(ctx, x, half, rotary)
    real = b.atomic.sub(b.atomic.mul(cos, x1), b.atomic.mul(sin, x2))
    imag = b.atomic.add(b.atomic.mul(sin, x1), b.atomic.mul(cos, x2))
    if interleaved:  # [.., half, 2] flattened: real and imag alternate
        pair = x1.type.shape + (1,)
        both = b.atomic.concat(_reshape(ctx, real, pair), _reshape(ctx, imag, pair), axis=4)
        rotated = _reshape(ctx, both, x.type.shape[:-1] + (rotary,))
    else:
        rotated = b.atomic.concat(real, imag, axis=3)
    if rotary < size:
        rotated = b.atomic.concat(rotated, _last_dim_slice(ctx, x, rotary, size), axis=3)
    return _merge_heads(ctx, rotated) if given.type.rank == 3 else rotated
