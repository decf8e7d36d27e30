"""The `hl` dialect: the high-level ops people write.

Each op is one class: signature, traits, type inference, verifier and numpy meaning. The numpy
meaning computes in the operand's dtype (constants are cast to it) and is written to stay finite
where the mathematical function is: softmax subtracts the row maximum, sigmoid never takes the
exponential of a positive number.

Every hl op also carries its decomposition, `decompose(b)`: it builds, with the builder `b`, lower
ops computing the same value (atomic ops, or other hl ops that decompose in turn) and returns the
results. The decompositions are as stable as the numpy meaning: no intermediate overflows where
the function is finite. A decomposition may never contain its own op: `register_hl` checks each
op when it registers by decomposing its docstring examples all the way down to atomic ops
(tgc.dialects._decomposition_check). The built-in hl ops (this module, hl_conv, hl_image,
hl_pool) are checked together by `check_decompositions()` in the test suite
(test_lower_hl.py), not at import: the check parses and decomposes every docstring example, a
third of a tool's start-up (0.18 of 0.54 s for `tgc-opt`), paid by every lit RUN line. An op
registered once they have loaded (a user's, a test's) is checked when it registers.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.attributes import DenseAttr
from tgc.builder import Builder
from tgc.diagnostics import VerifyError
from tgc.dialects._decomposition_check import check_decomposition
from tgc.dialects._shapes import (
    broadcast_shapes,
    normalize_axes,
    normalize_axis,
    reduced_shape,
    require_elements,
    same_element_type,
    same_encoding,
)
from tgc.dialects.atomic import _erf
from tgc.ir import Operation, Value
from tgc.opdef import (
    BOOL,
    ELEMENTWISE,
    FLOAT,
    INT,
    INTS,
    OPS,
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

    def decompose(self, b: Builder) -> list[Value]:
        """Build, with the builder `b`, lower ops computing the same value; return the results."""
        raise NotImplementedError(f"'{self.name}' has no decomposition")


def _scalar(b: Builder, like: Value, value) -> Value:
    """`value` as a rank-0 constant of `like`'s element type and memory space (it broadcasts)."""
    t = TensorType.get((), like.type.element_type, like.type.encoding)
    return b.atomic.constant(value=DenseAttr.splat(value, t.with_encoding(None)), result_type=t)


def _cast(b: Builder, x: Value, element_type: str) -> Value:
    return b.atomic.cast(x, result_type=x.type.with_element_type(element_type))


# -- registration: no decomposition may contain its own op ----------------------------------------

_LOADED = False  # set once the built-in hl ops have registered; later ones are checked at once


def register_hl(cls: type[HLOp]) -> type[HLOp]:
    """Register an hl op; once this module has loaded, also check its decomposition (a class
    whose decomposition contains its own op, or fails to build, is unregistered and rejected)."""
    register(cls)
    if _LOADED:
        _check_or_unregister(cls)
    return cls


def check_decompositions() -> None:
    """Check the decomposition of every registered hl op (see `check_decomposition`)."""
    for cls in [c for name, c in OPS.items() if name.startswith("hl.")]:
        _check_or_unregister(cls)


def _check_or_unregister(cls: type[HLOp]) -> None:
    try:
        check_decomposition(cls)
    except Exception:
        if OPS.get(cls.name) is cls:
            del OPS[cls.name]
        raise


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


@register_hl
class TanhOp(HLUnaryOp):
    """Hyperbolic tangent. `%y = hl.tanh %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "hl.tanh"

    def reference(self, x):
        return np.tanh(x)

    def decompose(self, b):
        """Sign-symmetric: t = exp(-2|x|) is in (0, 1], so nothing overflows in any float type
        (exp(2x) would overflow f16 from x > 5.5); tanh(x) = ±(1 - t) / (1 + t), - where x < 0."""
        (x,) = self.operands
        one = _scalar(b, x, 1.0)
        t = b.atomic.exp(b.atomic.mul(b.atomic.abs(x), _scalar(b, x, -2.0)))
        magnitude = b.atomic.div(b.atomic.sub(one, t), b.atomic.add(one, t))
        negative = b.atomic.cmp(x, _scalar(b, x, 0.0), pred="lt")
        return [b.atomic.where(negative, b.atomic.neg(magnitude), magnitude)]


@register_hl
class SigmoidOp(HLUnaryOp):
    """1 / (1 + e**-x). `%y = hl.sigmoid %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "hl.sigmoid"

    def reference(self, x):
        return _sigmoid(x)

    def decompose(self, b):
        """As the numpy meaning: e = exp(-|x|) never overflows; 1/(1+e) for x >= 0, else
        e/(1+e)."""
        (x,) = self.operands
        e = b.atomic.exp(b.atomic.neg(b.atomic.abs(x)))
        denominator = b.atomic.add(_scalar(b, x, 1.0), e)
        non_negative = b.atomic.cmp(x, _scalar(b, x, 0.0), pred="ge")
        return [
            b.atomic.where(non_negative, b.atomic.recip(denominator), b.atomic.div(e, denominator))
        ]


@register_hl
class ReluOp(HLUnaryOp):
    """max(x, 0); floats or integers. `%y = hl.relu %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "hl.relu"
    float_only = False

    def reference(self, x):
        return np.maximum(x, _const(x, 0))

    def decompose(self, b):
        (x,) = self.operands
        return [b.atomic.max(x, _scalar(b, x, 0))]


@register_hl
class SiluOp(HLUnaryOp):
    """x * sigmoid(x) (swish). `%y = hl.silu %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "hl.silu"

    def reference(self, x):
        return x * _sigmoid(x)

    def decompose(self, b):
        (x,) = self.operands
        return [b.atomic.mul(x, b.hl.sigmoid(x))]


@register_hl
class GeluOp(HLUnaryOp):
    """Gaussian error linear unit. "none": 0.5 x (1 + erf(x / sqrt 2)); "tanh":
    0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x**3))).
    `%y = hl.gelu %x {approximate = "tanh"} : (tensor<4xf32>) -> tensor<4xf32>`
    `%y = hl.gelu %x : (tensor<4xf32>) -> tensor<4xf32>`"""

    name = "hl.gelu"
    attr_defs = attrs(Attr("approximate", enum("none", "tanh"), default="none"))

    def reference(self, x):
        half, one = _const(x, 0.5), _const(x, 1)
        if self.attr("approximate") == "tanh":
            inner = _const(x, math.sqrt(2 / math.pi)) * (x + _const(x, 0.044715) * x * x * x)
            return half * x * (one + np.tanh(inner))
        return half * x * (one + _erf(x * _const(x, 1 / math.sqrt(2))))

    def decompose(self, b):
        """Either form as written above, the tanh form through hl.tanh (stable)."""
        (x,) = self.operands
        if self.attr("approximate") == "tanh":
            # x + 0.044715 x**3 as x (1 + 0.044715 x**2): in f16 x**3 overflows from |x| > 40
            square = b.atomic.mul(_scalar(b, x, 0.044715), b.atomic.mul(x, x))
            inner = b.atomic.mul(x, b.atomic.add(_scalar(b, x, 1.0), square))
            gate = b.hl.tanh(b.atomic.mul(_scalar(b, x, math.sqrt(2 / math.pi)), inner))
        else:
            gate = b.atomic.erf(b.atomic.mul(x, _scalar(b, x, 1 / math.sqrt(2))))
        half_x = b.atomic.mul(_scalar(b, x, 0.5), x)
        return [b.atomic.mul(half_x, b.atomic.add(_scalar(b, x, 1.0), gate))]


# -- normalisations along an axis -----------------------------------------------------------------


class AxisOp(HLOp):
    """Base of float ops along one `axis` whose result has the operand's type; they reduce
    along it, so it may not have size 0."""

    what = ""  # the value computed, for messages
    operand_defs = (Operand("x"),)
    attr_defs = attrs(Attr("axis", INT, default=-1))

    def infer(self):
        x = self.operands[0].type
        _float_operand(x)
        return [x]

    def verify_(self):
        x = self.operands[0].type
        require_elements(x, [normalize_axis(self.attr("axis"), x.rank)], f"the {self.what}")


@register_hl
class SoftmaxOp(AxisOp):
    """exp(x) / sum(exp(x)) along `axis` (computed max-subtracted).
    `%y = hl.softmax %x {axis = -1} : (tensor<4x16xf32>) -> tensor<4x16xf32>`"""

    name = "hl.softmax"
    what = "softmax"

    def reference(self, x):
        return _softmax(x, self.attr("axis"))

    def decompose(self, b):
        """e = exp(x - max(x)) (every exponent <= 0), then e / sum(e)."""
        (x,) = self.operands
        axes = (self.attr("axis"),)
        shifted = b.atomic.sub(x, b.atomic.reduce_max(x, axes=axes, keepdims=True))
        e = b.atomic.exp(shifted)
        return [b.atomic.div(e, b.atomic.reduce_sum(e, axes=axes, keepdims=True))]


@register_hl
class LogSoftmaxOp(AxisOp):
    """x - log(sum(exp(x))) along `axis` (computed max-subtracted).
    `%y = hl.log_softmax %x {axis = -1} : (tensor<4x16xf32>) -> tensor<4x16xf32>`"""

    name = "hl.log_softmax"
    what = "log-softmax"

    def reference(self, x):
        axis = self.attr("axis")
        shifted = x - np.max(x, axis=axis, keepdims=True)
        return shifted - np.log(np.sum(np.exp(shifted), axis=axis, keepdims=True))

    def decompose(self, b):
        """s = x - max(x), then s - log(sum(exp(s))): the sum is >= 1, its log finite."""
        (x,) = self.operands
        axes = (self.attr("axis"),)
        shifted = b.atomic.sub(x, b.atomic.reduce_max(x, axes=axes, keepdims=True))
        total = b.atomic.reduce_sum(b.atomic.exp(shifted), axes=axes, keepdims=True)
        return [b.atomic.sub(shifted, b.atomic.log(total))]


@register_hl
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

    def verify_(self):
        require_elements(self.operands[0].type, self.axes(), "the mean")

    def reference(self, x):
        return np.mean(x, axis=self.axes(), keepdims=self.attr("keepdims"))

    def decompose(self, b):
        """sum(x) / n, n the number of elements reduced."""
        (x,) = self.operands
        count = math.prod(x.type.shape[a] for a in self.axes())
        keepdims = True if self.attr("keepdims") else None  # None: left at its default
        total = b.atomic.reduce_sum(x, axes=self.attr("axes"), keepdims=keepdims)
        return [b.atomic.div(total, _scalar(b, x, float(count)))]


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
        require_elements(x.type, range(axis, x.type.rank), "the mean")
        if self.attr("eps") < 0:
            raise VerifyError(f"eps {self.attr('eps')} must be non-negative")
        for d, p in zip(self.operand_defs[1:], params):
            _check_broadcasts_into(p.type, x.type.shape[axis:], d.name)

    def norm_axes(self, x: np.ndarray) -> tuple[int, ...]:
        return tuple(range(self.attr("axis") % x.ndim, x.ndim))

    def norm_axes_of_operand(self) -> tuple[int, ...]:
        rank = self.operands[0].type.rank
        return tuple(range(self.attr("axis") % rank, rank))


@register_hl
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

    def decompose(self, b):
        """centred = x - mean(x); centred * rsqrt(mean(centred**2) + eps) * gamma + beta (the
        two-pass variance: never negative, unlike E[x**2] - E[x]**2)."""
        x, gamma, beta = self.operands
        axes = self.norm_axes_of_operand()
        centred = b.atomic.sub(x, b.hl.mean(x, axes=axes, keepdims=True))
        var = b.hl.mean(b.atomic.mul(centred, centred), axes=axes, keepdims=True)
        inv_std = b.atomic.rsqrt(b.atomic.add(var, _scalar(b, x, self.attr("eps"))))
        scaled = b.atomic.mul(b.atomic.mul(centred, inv_std), gamma)
        return [b.atomic.add(scaled, beta)]


@register_hl
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

    def decompose(self, b):
        """x * rsqrt(mean(x**2) + eps) * gamma."""
        x, gamma = self.operands
        ms = b.hl.mean(b.atomic.mul(x, x), axes=self.norm_axes_of_operand(), keepdims=True)
        inv_rms = b.atomic.rsqrt(b.atomic.add(ms, _scalar(b, x, self.attr("eps"))))
        return [b.atomic.mul(b.atomic.mul(x, inv_rms), gamma)]


# -- linear algebra -------------------------------------------------------------------------------


@register_hl
class LinearOp(HLOp):
    """x @ w + b with w of shape [in, out]; x is [..., in]; b (optional) broadcasts to the
    result [..., out] (usually [out]).
    `%y = hl.linear %x, %w, %b : (tensor<8x768xf32>, tensor<768x64xf32>, tensor<64xf32>) -> tensor<8x64xf32>`
    `%y = hl.linear %x, %w : (tensor<768xf32>, tensor<768x64xf32>) -> tensor<64xf32>`
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

    def decompose(self, b):
        """atomic.matmul (a rank-1 x is reshaped to one row and back), then atomic.add of b."""
        x, w, *bias = self.operands
        if x.type.rank == 1:
            row = b.atomic.reshape(x, result_type=x.type.with_shape((1, x.type.shape[0])))
            y = b.atomic.reshape(b.atomic.matmul(row, w), result_type=self.result.type)
        else:
            y = b.atomic.matmul(x, w)
        return [b.atomic.add(y, bias[0]) if bias else y]


@register_hl
class AttentionOp(HLOp):
    """softmax(q @ k^T * scale + mask) @ v over the last two dims; batch dims broadcast.

    q is [..., seq_q, d], k is [..., seq_k, d], v is [..., seq_k, d_v]; the result is
    [..., seq_q, d_v]. `scale` defaults to 1/sqrt(d). The optional `mask` is added to the scaled
    scores and broadcasts to [..., seq_q, seq_k]. With `causal`, query i attends key j only when
    j <= i + (seq_k - seq_q): the diagonal is aligned to the end, so with seq_q == seq_k this is
    PyTorch's is_causal, and with a KV cache (seq_k > seq_q) the queries are the last positions.
    causal needs seq_q <= seq_k, so that every query sees at least one key.
    `%o = hl.attention %q, %k, %v {causal = true} : (tensor<2x8x64xf32>, tensor<2x8x64xf32>, tensor<2x8x64xf32>) -> tensor<2x8x64xf32>`
    `%o = hl.attention %q, %k, %v, %m {scale = 0.5} : (tensor<4x16xf32>, tensor<8x16xf32>, tensor<8x32xf32>, tensor<4x8xf32>) -> tensor<4x32xf32>`
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
        if seq_k == 0:
            raise VerifyError(
                "k and v have no keys (sequence length 0): the softmax over them is undefined"
            )
        if self.operands[0].type.shape[-1] == 0 and self.attr("scale") is None:
            raise VerifyError(
                "q and k have head dim 0: the default scale 1/sqrt(0) is undefined (give scale)"
            )
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

    def decompose(self, b):
        """matmul(q, k, transpose_b) * scale (+ mask); causal: atomic.where(col <= row + seq_k -
        seq_q, scores, -inf) with row and col from atomic.iota; hl.softmax; matmul with v.
        No row is fully masked by the causal mask: the verifier requires seq_q <= seq_k, so key
        0 is allowed for every query (an additive mask of -inf can still mask a whole row, as in
        the numpy meaning).

        In f16 and bf16 the operands are first cast to f32 and the result cast back, as the
        meaning computes (16-bit floats are evaluated in f32, rounded once at the end): an f16
        score above 65504 (one q element at 65504 against a key element of 2) would be inf and
        its softmax NaN, and bf16 scores rounded to 8 bits would change the softmax by percents."""
        q, k, v, *mask = self.operands
        narrow = q.type.element_type in ("f16", "bf16")
        if narrow:
            q, k, v, *mask = (_cast(b, x, "f32") for x in (q, k, v, *mask))
        scores = b.atomic.matmul(q, k, transpose_b=True)
        if self.scale() != 1.0:
            scores = b.atomic.mul(scores, _scalar(b, q, self.scale()))
        if mask:
            scores = b.atomic.add(scores, mask[0])
        if self.attr("causal"):
            seq_q, seq_k = scores.type.shape[-2:]
            positions = TensorType.get((seq_q, seq_k), "i32", q.type.encoding)
            row = b.atomic.iota(axis=0, result_type=positions)
            col = b.atomic.iota(axis=1, result_type=positions)
            if seq_k != seq_q:
                row = b.atomic.add(row, _scalar(b, row, seq_k - seq_q))
            allowed = b.atomic.cmp(col, row, pred="le")
            scores = b.atomic.where(allowed, scores, _scalar(b, q, -math.inf))
        out = b.atomic.matmul(b.hl.softmax(scores, axis=-1), v)
        return [_cast(b, out, self.results[0].type.element_type) if narrow else out]


def builtin_ops_loaded() -> None:
    """Called by tgc.dialects once its modules have registered their ops: from then on
    `register_hl` checks each op it registers."""
    global _LOADED
    _LOADED = True
