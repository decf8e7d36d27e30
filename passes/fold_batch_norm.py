"""`fold-batch-norm`: an inference batch norm after a convolution folded into the convolution's
weights and bias, when they and the norm's parameters are fixed (parameters or constants).

    %c = hl.conv2d %x, %w, %b                      %f = gamma * rsqrt(var + eps)      [O]
    %y = hl.batch_norm %c, %gamma, %beta,    ->    %w2 = %w * %f (per output channel)
                       %mean, %var                 %b2 = (%b - mean) * %f + beta      [O]
                                                   %y = hl.conv2d %x, %w2, %b2

(without a bias, %b2 = beta - mean * %f). The new weights and bias are atomic ops on fixed
values, so a plan computes them once (planner/fixed.py) and `canonicalize` folds them where
the inputs are constants: the norm's per-element work is gone.

It fires when the convolution (hl.conv1d/2d/3d) is used by the norm alone and its weight, its
bias and the norm's four parameters are fixed (tgc/fixed.py: `{tgc.param}` arguments, constants
and pure ops on them). Results are unchanged up to rounding: the scale is applied to the weights
before the sum instead of to the sum.
"""

from __future__ import annotations

from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.dialects.hl import _scalar
from tgc.dialects.hl_conv import ConvOp
from tgc.dialects.hl_image import BatchNormOp
from tgc.fixed import VARIES, StateMemo, fixed_state
from tgc.pass_manager import Pass, PassStatistics, register_pass
from tgc.rewriter import Rewriter


def _foldable(norm: BatchNormOp, memo: StateMemo) -> ConvOp | None:
    """The convolution `norm` can be folded into, or None."""
    conv = norm.operands[0].defining_op
    if not isinstance(conv, ConvOp) or len(conv.results[0].uses) != 1:
        return None
    fixed = [*conv.operands[1:], *norm.operands[1:]]
    if any(fixed_state(v, memo) == VARIES for v in fixed):
        return None
    return conv


def _fold(rewriter: Rewriter, norm: BatchNormOp, conv: ConvOp) -> None:
    b = rewriter.builder_before(norm)
    x, w, *bias = conv.operands
    _, gamma, beta, mean, var = norm.operands
    factor = b.atomic.mul(
        gamma, b.atomic.rsqrt(b.atomic.add(var, _scalar(b, var, norm.attr("eps"))))
    )
    column = factor.type.with_shape(factor.type.shape + (1,) * (w.type.rank - 1))
    weights = b.atomic.mul(w, b.atomic.reshape(factor, result_type=column))
    centred = b.atomic.sub(bias[0], mean) if bias else b.atomic.neg(mean)
    shift = b.atomic.add(b.atomic.mul(centred, factor), beta)
    folded = b.create(conv.name, [x, weights, shift], dict(conv.attributes))
    rewriter.replace_op(norm, folded.results[0])
    rewriter.erase_op(conv)


@register_pass
@dataclass(frozen=True)
class FoldBatchNorm(Pass):
    """Fold hl.batch_norm into the hl.conv{1,2,3}d it follows (see the module doc).

    Contract: fires only where the convolution's result has no other use and every weight, bias
    and norm parameter is fixed; results unchanged up to rounding; one walk over the function.
    """

    name = "fold-batch-norm"
    summary = "Fold inference batch norms into the convolutions before them"

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        rewriter, memo = Rewriter(), {}
        for norm in [op for op in func.walk() if isinstance(op, BatchNormOp)]:
            conv = _foldable(norm, memo)
            if conv is not None:
                _fold(rewriter, norm, conv)
                stats.bump("folded-batch-norms")
