"""The `hl` dialect: the high-level ops people write.

Each op is one class: signature, traits, type inference, verifier and numpy meaning. The numpy
meaning computes in the operand's dtype (constants are cast to it) and is written to stay finite
where the mathematical function is: softmax subtracts the row maximum, sigmoid never takes the
exponential of a positive number. Every hl op will also carry a decomposition into lower ops
(`decompose`); until one is written, `HLOp.decompose` raises NotImplementedError.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.diagnostics import VerifyError
from tgc.dialects._shapes import (
    broadcast_shapes,
    normalize_axes,
    normalize_axis,
    reduced_shape,
    same_element_type,
    same_encoding,
)
from tgc.dialects.atomic import _erf
from tgc.ir import Operation
from tgc.opdef import (
    BOOL,
    ELEMENTWISE,
    FLOAT,
    INT,
    INTS,
    PURE,
    Attr,
    Operand,
    OptionalOperand,
    attrs,
    enum,
    register,
)
from tgc.types import TensorType


class HLOp(Operation):
    """Base of every hl op: pure, with a decomposition into lower ops."""

    traits = frozenset({PURE})

    def decompose(self, b):
        """Build, with the builder `b`, lower ops computing the same value; return the results."""
        raise NotImplementedError(f"'{self.name}' has no decomposition yet")


def _float_operand(t: TensorType, what: str = "operand") -> None:
    if not t.is_float:
        raise VerifyError(f"{what} must have a float element type, got {t}")


def _const(x: np.ndarray, value: float):
    """`value` as a scalar of x's dtype, so arithmetic stays in that dtype (bf16 included)."""
    return x.dtype.type(value)


def _check_broadcasts_into(t: TensorType, target: tuple[int, ...], what: str) -> None:
    """`t` must broadcast to `target` without changing it (numpy rules, rank <= len(target))."""
    ok = t.rank <= len(target)
    if ok:
        try:
            ok = broadcast_shapes(t.shape, target) == tuple(target)
        except VerifyError:
            ok = False
    if not ok:
        raise VerifyError(f"{what} {t} does not broadcast to shape {list(target)}")


def _softmax(x: np.ndarray, axis: int) -> np.ndarray:
    shifted = x - np.max(x, axis=axis, keepdims=True)
    e = np.exp(shifted)
    return e / np.sum(e, axis=axis, keepdims=True)


def _sigmoid(x: np.ndarray) -> np.ndarray:
    e = np.exp(-np.abs(x))  # in (0, 1]: never overflows
    one = _const(x, 1)
    return np.where(x >= 0, one / (one + e), e / (one + e)).astype(x.dtype, copy=False)


# -- elementwise activations ----------------------------------------------------------------------


class HLUnaryOp(HLOp):
    """Base of one-operand elementwise hl ops: the result has the operand's type."""

    operand_defs = (Operand("x"),)
    traits = frozenset({PURE, ELEMENTWISE})
    float_only = True

    def infer(self):
        (x,) = self.operands
        if self.float_only:
            _float_operand(x.type)
        elif x.type.element_type == "i1":
            raise VerifyError(f"operand must be a float or an integer, got {x.type}")
        return [x.type]


@register
class TanhOp(HLUnaryOp):
    """Hyperbolic tangent. `%y = hl.tanh %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "hl.tanh"

    def reference(self, x):
        return np.tanh(x)


@register
class SigmoidOp(HLUnaryOp):
    """1 / (1 + e**-x). `%y = hl.sigmoid %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "hl.sigmoid"

    def reference(self, x):
        return _sigmoid(x)


@register
class ReluOp(HLUnaryOp):
    """max(x, 0); floats or integers. `%y = hl.relu %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "hl.relu"
    float_only = False

    def reference(self, x):
        return np.maximum(x, _const(x, 0))


@register
class SiluOp(HLUnaryOp):
    """x * sigmoid(x) (swish). `%y = hl.silu %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "hl.silu"

    def reference(self, x):
        return x * _sigmoid(x)


@register
class GeluOp(HLUnaryOp):
    """Gaussian error linear unit. "none": 0.5 x (1 + erf(x / sqrt 2)); "tanh":
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3))).
    `%y = hl.gelu %x {approximate = "tanh"} : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "hl.gelu"
    attr_defs = attrs(Attr("approximate", enum("none", "tanh"), default="none"))

    def reference(self, x):
        half, one = _const(x, 0.5), _const(x, 1)
        if self.attr("approximate") == "tanh":
            inner = _const(x, math.sqrt(2 / math.pi)) * (x + _const(x, 0.044715) * x * x * x)
            return half * x * (one + np.tanh(inner))
        return half * x * (one + _erf(x * _const(x, 1 / math.sqrt(2))))


# -- normalisations along an axis -----------------------------------------------------------------


class AxisOp(HLOp):
    """Base of float ops along one `axis` whose result has the operand's type."""

    operand_defs = (Operand("x"),)
    attr_defs = attrs(Attr("axis", INT, default=-1))

    def infer(self):
        x = self.operands[0].type
        _float_operand(x)
        return [x]

    def verify_(self):
        normalize_axis(self.attr("axis"), self.operands[0].type.rank)


@register
class SoftmaxOp(AxisOp):
    """exp(x) / sum(exp(x)) along `axis` (computed max-subtracted).
    `%y = hl.softmax %x {axis = -1} : (tensor<4x16xf32>) -> tensor<4x16xf32>`"""

    name = "hl.softmax"

    def reference(self, x):
        return _softmax(x, self.attr("axis"))


@register
class LogSoftmaxOp(AxisOp):
    """x - log(sum(exp(x))) along `axis` (computed max-subtracted).
    `%y = hl.log_softmax %x {axis = -1} : (tensor<4x16xf32>) -> tensor<4x16xf32>`"""

    name = "hl.log_softmax"

    def reference(self, x):
        axis = self.attr("axis")
        shifted = x - np.max(x, axis=axis, keepdims=True)
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))


@register
class MeanOp(HLOp):
    """Arithmetic mean over `axes` (negative axes count from the end).
    `%m = hl.mean %x {axes = [1], keepdims = true} : (tensor<4x8xf32>) -> tensor<4x1xf32>`"""

    name = "hl.mean"
    operand_defs = (Operand("x"),)
    attr_defs = attrs(Attr("axes", INTS), Attr("keepdims", BOOL, default=False))

    def axes(self) -> tuple[int, ...]:
        return normalize_axes(self.attr("axes"), self.operands[0].type.rank)

    def infer(self):
        x = self.operands[0].type
        _float_operand(x)
        axes = self.axes()
        if not axes:
            raise VerifyError("needs at least one axis")
        return [x.with_shape(reduced_shape(x.shape, axes, self.attr("keepdims")))]

    def reference(self, x):
        return np.mean(x, axis=self.axes(), keepdims=self.attr("keepdims"))


class NormOp(HLOp):
    """Base of layernorm and rmsnorm: normalise over dims `axis`..end, then scale (and shift).

    The parameters (gamma, beta) have the shape of the normalised dims, x.shape[axis:], or any
    shape that broadcasts to it without growing it (`tensor<f32>`, `tensor<1xf32>`, ...).
    """

    def infer(self):
        types = [v.type for v in self.operands]
        _float_operand(types[0])
        same_element_type(types)
        same_encoding(types)
        return [types[0]]

    def verify_(self):
        x, *params = self.operands
        axis = normalize_axis(self.attr("axis"), x.type.rank)
        if self.attr("eps") < 0:
            raise VerifyError(f"eps {self.attr('eps')} must be non-negative")
        for d, p in zip(self.operand_defs[1:], params):
            _check_broadcasts_into(p.type, x.type.shape[axis:], d.name)

    def norm_axes(self, x: np.ndarray) -> tuple[int, ...]:
        return tuple(range(self.attr("axis") % x.ndim, x.ndim))


@register
class LayerNormOp(NormOp):
    """(x - mean) / sqrt(var + eps) * gamma + beta over dims axis..end (biased variance).
    gamma and beta have shape x.shape[axis:] or broadcast to it.
    `%y = hl.layernorm %x, %g, %b {axis = -1, eps = 1e-05} : (tensor<4x16xf32>, tensor<16xf32>, tensor<16xf32>) -> tensor<4x16xf32>`
    """

    name = "hl.layernorm"
    operand_defs = (Operand("x"), Operand("gamma"), Operand("beta"))
    attr_defs = attrs(Attr("axis", INT, default=-1), Attr("eps", FLOAT, default=1e-5))

    def reference(self, x, gamma, beta):
        axes = self.norm_axes(x)
        centred = x - np.mean(x, axis=axes, keepdims=True)
        var = np.mean(centred * centred, axis=axes, keepdims=True)
        return centred / np.sqrt(var + _const(x, self.attr("eps"))) * gamma + beta


@register
class RMSNormOp(NormOp):
    """x / sqrt(mean(x**2) + eps) * gamma over dims axis..end.
    gamma has shape x.shape[axis:] or broadcasts to it.
    `%y = hl.rmsnorm %x, %g {axis = -1, eps = 1e-06} : (tensor<4x16xf32>, tensor<16xf32>) -> tensor<4x16xf32>`
    """

    name = "hl.rmsnorm"
    operand_defs = (Operand("x"), Operand("gamma"))
    attr_defs = attrs(Attr("axis", INT, default=-1), Attr("eps", FLOAT, default=1e-6))

    def reference(self, x, gamma):
        ms = np.mean(x * x, axis=self.norm_axes(x), keepdims=True)
        return x / np.sqrt(ms + _const(x, self.attr("eps"))) * gamma


# -- linear algebra -------------------------------------------------------------------------------


@register
class LinearOp(HLOp):
    """x @ w + b with w of shape [in, out]; x is [..., in]; b (optional) broadcasts to the
    result [..., out] (usually [out]).
    `%y = hl.linear %x, %w, %b : (tensor<8x768xf32>, tensor<768x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>`
    """

    name = "hl.linear"
    operand_defs = (Operand("x"), Operand("w"), OptionalOperand("b"))

    def infer(self):
        types = [v.type for v in self.operands]
        x, w = types[0], types[1]
        _float_operand(x)
        same_element_type(types)
        same_encoding(types)
        if x.rank < 1 or w.rank != 2:
            raise VerifyError(f"x needs rank >= 1 and w rank 2, got {x} and {w}")
        if x.shape[-1] != w.shape[0]:
            raise VerifyError(
                f"contraction dimensions differ: x has {x.shape[-1]} inputs, w has {w.shape[0]}"
            )
        return [x.with_shape(x.shape[:-1] + (w.shape[1],))]

    def verify_(self):
        if len(self.operands) == 3:
            out = self.results[0].type.shape
            _check_broadcasts_into(self.operands[2].type, out, "bias")

    def reference(self, x, w, b=None):
        y = np.matmul(x, w).astype(x.dtype, copy=False)
        return y if b is None else y + b


@register
class AttentionOp(HLOp):
    """softmax(q @ k^T * scale + mask) @ v over the last two dims; batch dims broadcast.

    q is [..., seq_q, d], k is [..., seq_k, d], v is [..., seq_k, d_v]; the result is
    [..., seq_q, d_v]. `scale` defaults to 1/sqrt(d). The optional `mask` is added to the scaled
    scores and broadcasts to [..., seq_q, seq_k]. With `causal`, query i attends key j only when
    j <= i + (seq_k - seq_q): the diagonal is aligned to the end, so with seq_q == seq_k this is
    PyTorch's is_causal, and with a KV cache (seq_k > seq_q) the queries are the last positions.
    causal needs seq_q <= seq_k, so that every query sees at least one key.
    `%o = hl.attention %q, %k, %v {causal = true} : (tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>`
    """

    name = "hl.attention"
    operand_defs = (Operand("q"), Operand("k"), Operand("v"), OptionalOperand("mask"))
    attr_defs = attrs(Attr("scale", FLOAT, default=None), Attr("causal", BOOL, default=False))

    def infer(self):
        types = [v.type for v in self.operands]
        q, k, v = types[:3]
        _float_operand(q)
        same_element_type(types)
        same_encoding(types)
        if min(q.rank, k.rank, v.rank) < 2:
            raise VerifyError(f"q, k and v need rank >= 2, got {q}, {k} and {v}")
        if q.shape[-1] != k.shape[-1]:
            raise VerifyError(f"q and k head dims differ: {q.shape[-1]} and {k.shape[-1]}")
        if k.shape[-2] != v.shape[-2]:
            raise VerifyError(f"k and v sequence lengths differ: {k.shape[-2]} and {v.shape[-2]}")
        batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        return [q.with_shape(batch + (q.shape[-2], v.shape[-1]))]

    def scores_shape(self) -> tuple[int, ...]:
        q, k, v = (o.type for o in self.operands[:3])
        batch = broadcast_shapes(q.shape[:-2], k.shape[:-2], v.shape[:-2])
        return batch + (q.shape[-2], k.shape[-2])

    def scale(self) -> float:
        scale = self.attr("scale")
        return 1 / math.sqrt(self.operands[0].type.shape[-1]) if scale is None else float(scale)

    def verify_(self):
        scores = self.scores_shape()
        if len(self.operands) == 4:
            _check_broadcasts_into(self.operands[3].type, scores, "mask")
        seq_q, seq_k = scores[-2:]
        if self.attr("causal") and seq_q > seq_k:
            raise VerifyError(f"causal attention needs seq_q <= seq_k, got {seq_q} > {seq_k}")

    def reference(self, q, k, v, mask=None):
        dtype = q.dtype
        scores = np.matmul(q, np.swapaxes(k, -1, -2)).astype(dtype, copy=False)
        scores = scores * _const(q, self.scale())
        if mask is not None:
            scores = scores + mask
        if self.attr("causal"):
            seq_q, seq_k = q.shape[-2], k.shape[-2]
            allowed = np.arange(seq_k)[None, :] <= np.arange(seq_q)[:, None] + (seq_k - seq_q)
            scores = np.where(allowed, scores, _const(q, -np.inf)).astype(dtype, copy=False)
        return np.matmul(_softmax(scores, -1), v).astype(dtype, copy=False)
