"""`raise-attention`: find attention spelled out as matmul, scale, mask, softmax, matmul (how
the ONNX and PyTorch importers write it) and replace it by one `hl.attention`, which the CUDA
route runs as its fused flash-attention kernel instead of materialising the score matrix.

The pattern, read from the last matmul back (`s` is the running score value):

    s = atomic.matmul q, k^T           k^T: transpose_b, an atomic.transpose whose perm swaps
                                       the last two dims of k's layout, or any value (then a
                                       transpose of it is made)
    s = s * c | c * s | s / c          c a splat float constant; several multiply together
    s = s + m | m + s                  one additive mask, after every scale
    s = where(cond, s, -inf)           a -inf where-mask (or where(cond, -inf, s))
    p = hl.softmax s {axis = -1}       or its lowered form: e = exp(s - reduce_max(s)),
                                       p = e / reduce_sum(e) over the last axis, keepdims
    o = atomic.matmul p, v             (transpose_b allowed: v is then transposed back)

Each intermediate must have no use outside the pattern, every op of it must sit in the block of
the last matmul, and the hl.attention built must verify and have the type of `o`.

Which masks are legal (the rewrite must give the same result, fully masked rows included):

- An additive mask is hl.attention's own: the same add of the same values. A mask added before
  a scale is not raised ((s + m) * c is not s * c + m).
- `where(cond, s, -inf)` whose `cond` is a constant (or computed from constants and iotas, as
  hl.attention's own decomposition does) equal to hl.attention's causal pattern, query i sees key
  j iff j <= i + seq_k - seq_q with seq_q <= seq_k, becomes `causal = true`: the same select of
  the same -inf. This is exact for every input when the additive mask (if any) is added before
  the where, as hl.attention does; added after, it is exact only if the mask never holds +inf or
  NaN where cond is false (a constant mask is checked, otherwise see `assume-finite`).
- Any other `where(cond, s, -inf)` becomes the additive mask `where(cond, 0, -inf)`, summed with
  the additive mask if there is one. s + (-inf) equals -inf for every finite s, so a row that the
  where fully masks is all -inf either way and gives NaN either way; but a masked score that is
  NaN or +inf (q or k holding inf or NaN, or q . k overflowing) is hidden by the where and not by
  the add. So this fires only with `assume-finite=true` (PyTorch's scaled_dot_product_attention
  treats a boolean mask the same way: as an additive -inf mask).
- `where(cond, s, c)` with a finite c (-1e9, the float minimum) is never raised: a row it fully
  masks is uniform (every score c), while any additive form gives softmax(s + c) there; and a
  masked entry is exp(c - max), not 0.
- A where-mask before a scale commutes with it only when the scale is positive (-inf * c).

The scale of hl.attention is the product of the constants (1/c for a divide), computed in
float64 and stored as its `scale` (explicit, also when it is 1): s / c and s * (1/c) round
differently, so results are equal up to rounding.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from tgc.attributes import DenseAttr
from tgc.builder import Builder
from tgc.builtin import FuncOp
from tgc.diagnostics import VerifyError
from tgc.dialects._shapes import broadcast_shapes, normalize_axes, normalize_axis
from tgc.ir import Operation, Value
from tgc.opdef import OPS, PURE, create
from tgc.pass_manager import Pass, PassStatistics, option, register_pass
from tgc.passes.canonicalize import constant_array, float_splat
from tgc.passes.rules import run_reference
from tgc.patterns import erase_dead_producers
from tgc.rewriter import Rewriter
from tgc.types import TensorType

MAX_CHAIN = 16  # ops between the score matmul and the softmax: more is not an attention
MAX_FOLD_OPS = 8  # ops evaluated to prove a where's condition is the causal pattern
MAX_FOLD_ELEMENTS = 1 << 22


# -- what the walk finds ---------------------------------------------------------------------------


@dataclass(frozen=True)
class _Scale:
    factor: float


@dataclass(frozen=True)
class _Add:
    mask: Value


@dataclass(frozen=True)
class _Where:
    cond: Value
    keep_when_true: bool  # where(cond, s, -inf): True; where(cond, -inf, s): False


@dataclass
class _Scores:
    """The ops from the softmax input back to q @ k^T; `events` nearest the softmax first."""

    matmul: Operation
    ops: list[Operation] = field(default_factory=list)
    events: list = field(default_factory=list)


@dataclass
class _Plan:
    """Everything the rewrite builds: operands as (source, perm or None), scale, masks."""

    q: tuple[Value, tuple[int, ...] | None]
    k: tuple[Value, tuple[int, ...] | None]
    v: tuple[Value, tuple[int, ...] | None]
    scale: float
    causal: bool
    additive: Value | None
    wheres: list[_Where]
    erase: list[Operation]


# -- constants -------------------------------------------------------------------------------------


def _is_neg_inf(v: Value) -> bool:
    value = float_splat(v)
    return value is not None and value == -math.inf


def _fold(v: Value, budget: list[int]) -> np.ndarray | None:
    """The value of `v` when it is computed from constants (and iotas) only, by at most
    MAX_FOLD_OPS pure ops (each evaluated with its numpy reference), else None."""
    op = v.defining_op
    if op is None or not op.has_trait(PURE) or op.regions or budget[0] <= 0:
        return None
    if v.type.num_elements > MAX_FOLD_ELEMENTS:
        return None
    if op.name == "atomic.constant":
        return np.asarray(op.attr("value").array)
    budget[0] -= 1
    arrays = [_fold(x, budget) for x in op.operands]
    if any(a is None for a in arrays):
        return None
    outs = run_reference(op, arrays, [r.type.dtype for r in op.results])
    return None if outs is None else np.asarray(outs[v.index])


def _is_causal(where: _Where, seq_q: int, seq_k: int) -> bool:
    """Is the where's kept set exactly hl.attention's causal pattern (j <= i + seq_k - seq_q),
    the same for every batch entry?"""
    if seq_q > seq_k or where.cond.type.element_type != "i1":
        return False
    cond = _fold(where.cond, [MAX_FOLD_OPS])
    if cond is None or math.prod(cond.shape[:-2]) != 1:
        return False
    kept = cond if where.keep_when_true else ~cond
    kept = kept.reshape(kept.shape[-2:] if kept.ndim >= 2 else (1,) + kept.shape)
    allowed = np.arange(seq_k)[None, :] <= np.arange(seq_q)[:, None] + (seq_k - seq_q)
    return bool(np.array_equal(np.broadcast_to(kept, allowed.shape), allowed))


def _is_causal_mask(attention: Operation) -> bool:
    """Does hl.attention's additive mask hold, in every batch entry, exactly the causal
    pattern: 0 where key j <= query i + seq_k - seq_q, -inf elsewhere (how PyTorch's exporters
    write `is_causal` as a float mask)?"""
    if len(attention.operands) != 4 or attention.attr("causal"):
        return False
    seq_q, seq_k = attention.scores_shape()[-2:]
    if seq_q > seq_k:
        return False
    mask = _fold(attention.operands[3], [MAX_FOLD_OPS])
    if mask is None:
        return False
    mask = np.broadcast_to(mask, mask.shape[:-2] + (seq_q, seq_k)).astype(np.float64)
    allowed = np.arange(seq_k)[None, :] <= np.arange(seq_q)[:, None] + (seq_k - seq_q)
    return bool(np.all(mask[..., allowed] == 0) and np.all(mask[..., ~allowed] == -math.inf))


def _finite_below_inf(v: Value) -> bool:
    """A constant that holds neither NaN nor +inf: -inf + it is -inf everywhere."""
    array = constant_array(v)
    return array is not None and not bool(np.any(np.isnan(array) | np.isposinf(array)))


# -- matching --------------------------------------------------------------------------------------


def _last_axis_only(op: Operation, rank: int) -> bool:
    try:
        return normalize_axes(op.attr("axes"), rank) == (rank - 1,) and bool(op.attr("keepdims"))
    except VerifyError:
        return False


def _single_use(v: Value, user: Operation, index: int) -> bool:
    return list(v.uses) == [(user, index)]


def _softmax_input(p: Value) -> tuple[Value, list[Operation]] | None:
    """(x, ops) when `p` is softmax(x) over the last axis: hl.softmax or its lowered form, whose
    inner values have no other use (x's uses are the softmax's own)."""
    op = p.defining_op
    rank = p.type.rank
    if op is None:
        return None
    if op.name == "hl.softmax":
        x = op.operands[0]
        if normalize_axis(op.attr("axis"), rank) != rank - 1 or len(x.uses) != 1:
            return None
        return x, [op]
    if op.name != "atomic.div":
        return None
    e, total = op.operands
    sum_op, exp_op = total.defining_op, e.defining_op
    if sum_op is None or sum_op.name != "atomic.reduce_sum" or sum_op.operands[0] is not e:
        return None
    if exp_op is None or exp_op.name != "atomic.exp" or not _last_axis_only(sum_op, rank):
        return None
    shifted = exp_op.operands[0]
    sub_op = shifted.defining_op
    if sub_op is None or sub_op.name != "atomic.sub":
        return None
    x, m = sub_op.operands
    max_op = m.defining_op
    if max_op is None or max_op.name != "atomic.reduce_max" or max_op.operands[0] is not x:
        return None
    if not _last_axis_only(max_op, rank) or e.type != p.type or x.type != p.type:
        return None
    if set(e.uses) != {(op, 0), (sum_op, 0)} or set(x.uses) != {(sub_op, 0), (max_op, 0)}:
        return None
    if not (
        _single_use(total, op, 1) and _single_use(shifted, exp_op, 0) and _single_use(m, sub_op, 1)
    ):
        return None
    return x, [op, sum_op, exp_op, sub_op, max_op]


def _steps(op: Operation):
    """(operand on the score path, event) for each way `op` can be a scale or mask step."""
    a = op.operands
    if op.name == "atomic.mul":
        for i in (0, 1):
            c = float_splat(a[1 - i])
            if c is not None:
                yield a[i], _Scale(c)
    elif op.name == "atomic.div":
        c = float_splat(a[1])
        if c is not None and c != 0:
            yield a[0], _Scale(1.0 / c)
    elif op.name == "atomic.add":
        for i in (0, 1):
            yield a[i], _Add(a[1 - i])
    elif op.name == "atomic.where":
        if _is_neg_inf(a[2]):
            yield a[1], _Where(a[0], True)
        if _is_neg_inf(a[1]):
            yield a[2], _Where(a[0], False)


def _walk(v: Value, block, found: _Scores) -> _Scores | None:
    """Follow the score path from `v` (the softmax input) back to its matmul; tries both
    operands of an add (which one is the mask is known only at the matmul)."""
    op = v.defining_op
    if op is None or op.block is not block or len(found.ops) > MAX_CHAIN:
        return None
    if op.name == "atomic.matmul":
        return _Scores(op, found.ops, found.events)
    has_add = any(isinstance(e, _Add) for e in found.events)
    for path, event in _steps(op):
        if path.type != v.type or len(path.uses) != 1 or (has_add and isinstance(event, _Add)):
            continue  # (one additive mask at most: also keeps the walk linear)
        result = _walk(path, block, _Scores(op, found.ops + [op], found.events + [event]))
        if result is not None:
            return result
    return None


def _swap_last(rank: int) -> tuple[int, ...]:
    return tuple(range(rank - 2)) + (rank - 1, rank - 2)


def _transposed(v: Value) -> tuple[Value, tuple[int, ...] | None]:
    """`v` with its last two dims swapped, as (source, perm) with perm None for `source` itself:
    a transpose producing `v` is folded into the new perm instead of stacked."""
    op = v.defining_op
    rank = v.type.rank
    if op is None or op.name != "atomic.transpose":
        return v, _swap_last(rank)
    perm = tuple(op.attr("perm"))
    perm = perm[:-2] + (perm[-1], perm[-2])
    return op.operands[0], None if perm == tuple(range(rank)) else perm


def _type_of(operand: tuple[Value, tuple[int, ...] | None]) -> TensorType:
    source, perm = operand
    if perm is None:
        return source.type
    return source.type.with_shape(tuple(source.type.shape[p] for p in perm))


# -- deciding --------------------------------------------------------------------------------------


def _scale(events: list) -> float | None:
    """The product of the scale factors, or None when a mask sits where it may not: an add
    before a scale, a where before a non-positive scale, two adds."""
    scale = 1.0
    adds = 0
    for i, event in enumerate(events):
        if isinstance(event, _Scale):
            scale *= event.factor
        elif isinstance(event, _Add):
            adds += 1
            if any(isinstance(e, _Scale) for e in events[:i]):
                return None  # (s + m) * c: the mask would need scaling too
        elif any(isinstance(e, _Scale) and not e.factor > 0 for e in events[:i]):
            return None  # where(cond, s, -inf) * c is a -inf mask only for c > 0
    return scale if adds <= 1 and math.isfinite(scale) else None


def _fits(scale: float, t: TensorType) -> bool:
    """hl.attention multiplies by the scale in the element type: it must neither overflow nor
    flush to zero there (1 / 1e-5 is inf in f16, where s / 1e-5 may be finite)."""
    with np.errstate(all="ignore"):
        rounded = float(np.asarray(scale).astype(t.dtype))
    return math.isfinite(rounded) and (rounded != 0) == (scale != 0)


def _masks(events: list, seq_q: int, seq_k: int, assume_finite: bool):
    """(causal, additive mask, where-masks made additive), or None when not exact."""
    additive = next((e.mask for e in events if isinstance(e, _Add)), None)
    add_at = next((i for i, e in enumerate(events) if isinstance(e, _Add)), None)
    causal = False
    wheres = []
    for i, event in enumerate(events):
        if not isinstance(event, _Where):
            continue
        # An add after the where (nearer the softmax) sees -inf + mask: -inf unless the mask
        # holds +inf or NaN there; hl.attention selects after adding.
        add_after = add_at is not None and add_at < i
        exact = not add_after or _finite_below_inf(additive)
        if not causal and _is_causal(event, seq_q, seq_k) and (exact or assume_finite):
            causal = True
        elif assume_finite:
            wheres.append(event)
        else:
            return None
    return causal, additive, wheres


def _plan(root: Operation, assume_finite: bool) -> _Plan | None:
    """The rewrite of the attention ending at `root` (matmul(p, v)), or None."""
    if root.name != "atomic.matmul" or root.attr("transpose_a"):
        return None
    p, v = root.operands
    if p is v or not _single_use(p, root, 0):
        return None
    softmax = _softmax_input(p)
    if softmax is None:
        return None
    x, softmax_ops = softmax
    if x.type != p.type:
        return None
    scores = _walk(x, root.block, _Scores(root))
    if scores is None or scores.matmul.results[0].type != p.type:
        return None
    s = scores.matmul
    if any(op.block is not root.block for op in softmax_ops):
        return None
    scale = _scale(scores.events)
    if scale is not None and not _fits(scale, p.type):
        return None
    seq_q, seq_k = p.type.shape[-2:]
    masks = None if scale is None else _masks(scores.events, seq_q, seq_k, assume_finite)
    if masks is None:
        return None
    a, b = s.operands
    q = _transposed(a) if s.attr("transpose_a") else (a, None)
    k = (b, None) if s.attr("transpose_b") else _transposed(b)
    v_operand = _transposed(v) if root.attr("transpose_b") else (v, None)
    causal, additive, wheres = masks
    plan = _Plan(q, k, v_operand, scale, causal, additive, wheres, [])
    plan.erase = softmax_ops + scores.ops + [s]
    return plan if _verifies(plan, root) else None


def _mask_type(plan: _Plan, like: TensorType) -> TensorType | None:
    shapes = [w.cond.type.shape for w in plan.wheres]
    if plan.additive is not None:
        shapes.append(plan.additive.type.shape)
    if not shapes:
        return None
    return like.with_shape(broadcast_shapes(*shapes))


def _verifies(plan: _Plan, root: Operation) -> bool:
    """Would the hl.attention verify and give `root`'s result type? (Checked on placeholder
    values before anything is built.)"""
    types = [_type_of(plan.q), _type_of(plan.k), _type_of(plan.v)]
    mask = _mask_type(plan, root.results[0].type)
    if mask is not None:
        types.append(mask)
    try:
        probe = create(OPS["hl.attention"], [Value(t) for t in types], _attributes(plan))
        probe.verify_()
    except VerifyError:
        return False
    return probe.results[0].type == root.results[0].type


def _attributes(plan: _Plan) -> dict:
    return {"scale": plan.scale, "causal": True if plan.causal else None}


# -- building --------------------------------------------------------------------------------------


def _materialize(b: Builder, operand: tuple[Value, tuple[int, ...] | None]) -> Value:
    source, perm = operand
    return source if perm is None else b.atomic.transpose(source, perm=perm)


def _scalar(b: Builder, like: TensorType, value: float) -> Value:
    t = TensorType.get((), like.element_type, like.encoding)
    return b.atomic.constant(value=DenseAttr.splat(value, t.with_encoding(None)), result_type=t)


def _build_mask(b: Builder, plan: _Plan, like: TensorType) -> Value | None:
    """The additive mask, then each where-mask as where(cond, 0, -inf) added to it."""
    mask = plan.additive
    for where in plan.wheres:
        zero, minus_inf = _scalar(b, like, 0.0), _scalar(b, like, -math.inf)
        pair = (zero, minus_inf) if where.keep_when_true else (minus_inf, zero)
        term = b.atomic.where(where.cond, *pair)
        mask = term if mask is None else b.atomic.add(mask, term)
    return mask


def _rewrite(root: Operation, plan: _Plan, rewriter: Rewriter) -> None:
    b = rewriter.builder_before(root)
    operands = [_materialize(b, plan.q), _materialize(b, plan.k), _materialize(b, plan.v)]
    mask = _build_mask(b, plan, root.results[0].type)
    if mask is not None:
        operands.append(mask)
    attention = b.hl.attention(*operands, **_attributes(plan))
    rewriter.replace_op(root, attention)
    dead = [operand for op in plan.erase for operand in op.operands]
    for op in plan.erase:
        rewriter.erase_op(op)
    erase_dead_producers(dead, rewriter)


def _make_causal(attention: Operation, rewriter: Rewriter) -> None:
    """hl.attention with a causal additive mask -> the same attention with `causal`, no mask."""
    b = rewriter.builder_before(attention)
    *qkv, mask = attention.operands
    attrs = {**attention.attributes, "causal": True}
    causal = b.create("hl.attention", qkv, attrs, [attention.results[0].type])
    rewriter.replace_op(attention, causal.results)
    erase_dead_producers([mask], rewriter)


# -- the pass --------------------------------------------------------------------------------------


@register_pass
@dataclass(frozen=True)
class RaiseAttention(Pass):
    """Replace attention spelled as matmul(q, k^T), scale, mask, softmax over the last axis,
    matmul with v by one `hl.attention` (see the module docstring for the forms recognised).

    Contract: fires only where every intermediate has no other use, every step is in one block
    and the hl.attention verifies with the original result type; results are unchanged up to
    the rounding of the scale (a divide becomes a multiply by the reciprocal), fully masked
    rows included, for every input, unless `assume-finite`. `assume-finite` (default false)
    also raises -inf where-masks that are not the causal pattern, as additive -inf masks: the
    same results whenever the scores q . k^T (and an additive mask applied after a causal
    where) hold no NaN or +inf at masked positions; and it gives every hl.attention whose
    additive mask is a constant holding the causal pattern (0 where allowed, -inf elsewhere)
    `causal = true` and no mask (the same results under the same assumption: s + -inf is -inf
    for every other s). A where-mask with a finite fill is never
    raised. New ops take the location of the last matmul, whose result name the hl.attention
    keeps; the ops replaced, and constants and transposes left unused, are erased.
    """

    name = "raise-attention"
    summary = "Replace spelled-out attention (matmul, scale, mask, softmax, matmul) by hl.attention"

    assume_finite: bool = option(
        False,
        "also raise -inf where-masks and make causal -inf masks `causal`, assuming the scores "
        "hold no NaN or +inf",
    )

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        rewriter = Rewriter()
        for op in [op for op in func.walk() if op.name == "atomic.matmul"]:
            if op.block is None:
                continue  # erased by an earlier rewrite
            plan = _plan(op, self.assume_finite)
            if plan is None:
                continue
            _rewrite(op, plan, rewriter)
            stats.bump("raised attention")
            if plan.causal:
                stats.bump("raised attention (causal)")
            if plan.additive is not None or plan.wheres:
                stats.bump("raised attention (masked)")
        if not self.assume_finite:
            return
        for op in [op for op in func.walk() if op.name == "hl.attention"]:
            if _is_causal_mask(op):
                _make_causal(op, rewriter)
                stats.bump("causal masks made causal")
