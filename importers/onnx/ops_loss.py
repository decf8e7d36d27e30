"""Converters of ONNX NegativeLogLikelihoodLoss and SoftmaxCrossEntropyLoss.

The input is [N, C, d1, ...] (scores per class C) and the target [N, d1, ...] (class indices).
The picked entry input[n, target, d...] is taken with a one-hot mask (classes == target) and a
sum over C, so a target outside [0, C) (an ignore_index such as -1 or 10) picks nothing instead
of reading out of bounds; the class weights are picked the same way. Positions whose target is
ignore_index weigh 0. "mean" divides the weighted sum by the sum of the weights applied (the
number of positions not ignored, without weights), as ONNX says.
"""

from __future__ import annotations

from tgc.ir import Value

from .context import NodeContext
from .ops_nn import _reshape
from .registry import converter


def _pick(ctx: NodeContext, one_hot: Value, values: Value) -> Value:
    """sum over C of where(one_hot, values, 0): values[target] per position (0 for none)."""
    b = ctx.b
    chosen = b.atomic.where(one_hot, values, ctx.scalar(0.0, values))
    return b.atomic.reduce_sum(chosen, axes=[1])


def _nll(ctx: NodeContext, log_prob: Value, target: Value, weight: Value | None) -> Value:
    """The loss of `log_prob` [N, C, ...] against `target` [N, ...], reduced as the node says."""
    b = ctx.b
    reduction = ctx.attr("reduction", "mean")
    ignore_index = ctx.attr("ignore_index", None)
    if reduction not in ("none", "sum", "mean"):
        raise ctx.error(f"reduction '{reduction}' is not one of 'none', 'sum', 'mean'")
    shape = log_prob.type.shape
    if log_prob.type.rank < 2 or target.type.shape != shape[:1] + shape[2:]:
        raise ctx.error(
            f"target {target.type} does not fit the input {log_prob.type} ([N, C, ...])"
        )
    if target.type.element_type not in ("i32", "i64"):
        raise ctx.error(f"target must hold int32 or int64 class indices, got {target.type}")
    if weight is not None and weight.type.shape != (shape[1],):
        raise ctx.error(f"weight must have shape [{shape[1]}] (the classes), got {weight.type}")
    classes = b.atomic.iota(
        axis=1, result_type=log_prob.type.with_element_type(target.type.element_type)
    )
    one_hot = b.atomic.cmp(classes, _reshape(ctx, target, shape[:1] + (1,) + shape[2:]), pred="eq")
    loss = b.atomic.neg(_pick(ctx, one_hot, log_prob))
    applied = None  # the weight of each position, where one is applied
    if weight is not None:
        per_class = _reshape(ctx, weight, (1, shape[1]) + (1,) * (len(shape) - 2))
        applied = _pick(ctx, one_hot, per_class)
    if ignore_index is not None:
        kept = b.atomic.cmp(target, ctx.scalar(ignore_index, target), pred="ne")
        base = ctx.scalar(1.0, loss) if applied is None else applied
        applied = b.atomic.where(kept, base, ctx.scalar(0.0, loss))
    if applied is not None:
        loss = b.atomic.mul(loss, applied)
    if reduction == "none":
        return loss
    every = list(range(loss.type.rank))
    total = b.atomic.reduce_sum(loss, axes=every)
    if reduction == "sum":
        return total
    if applied is None:
        return b.hl.mean(loss, axes=every)
    return b.atomic.div(total, b.atomic.reduce_sum(applied, axes=every))


def _loss_inputs(ctx: NodeContext) -> tuple[Value, Value, Value | None]:
    scores = ctx.input(0)
    if not scores.type.is_float:
        raise ctx.error(f"the input must be a float tensor, got {scores.type}")
    weight = ctx.optional_input(2)
    if weight is not None and weight.type.element_type != scores.type.element_type:
        raise ctx.error(f"weight {weight.type} and the input {scores.type} differ in element type")
    return scores, ctx.input(1), weight


@converter("NegativeLogLikelihoodLoss")
def negative_log_likelihood_loss(ctx: NodeContext):
    scores, target, weight = _loss_inputs(ctx)
    return _nll(ctx, scores, target, weight)


@converter("SoftmaxCrossEntropyLoss")
def softmax_cross_entropy_loss(ctx: NodeContext):
    """hl.log_softmax over the classes (dim 1), then the negative log-likelihood; the second
    output, when wanted, is that log-probability."""
    scores, target, weight = _loss_inputs(ctx)
    if scores.type.rank < 2:
        raise ctx.error(f"the input must be [N, C, ...], got {scores.type}")
    log_prob = ctx.b.hl.log_softmax(scores, axis=1)
    return [_nll(ctx, log_prob, target, weight), log_prob if ctx.has_output(1) else None]
