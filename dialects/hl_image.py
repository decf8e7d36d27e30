"""hl ops on [N, C, *spatial] images other than windows: the per-channel normalisations
`hl.group_norm` and `hl.batch_norm` (inference), and resampling, `hl.resize`.

`hl.resize` maps each output position of the spatial dims (the result type gives their sizes)
to a source coordinate c, one dim at a time:
- `coordinate = "half_pixel"`: c = (i + 0.5) * L_in / L_out - 0.5 (PyTorch's align_corners =
  False, ONNX's half_pixel);
- `"align_corners"`: c = i * (L_in - 1) / (L_out - 1) (0 where L_out = 1);
- `"asymmetric"`: c = i * L_in / L_out (PyTorch's nearest).
`mode = "nearest"` reads x at the index `nearest` of c ("floor", "ceil", "round_prefer_floor",
"round_prefer_ceil"), clamped to [0, L_in - 1]; `mode = "linear"` clamps c to [0, L_in - 1] and
interpolates between floor(c) and the next index (the last index where there is none) with
weights 1 - f and f, f = c - floor(c): bilinear in 2-D, as `F.interpolate(mode="bilinear")`.
The source indices and weights depend on the shapes alone, so the decomposition is one
`atomic.gather` per dim with constant indices (two and a weighted sum for linear).
"""

from __future__ import annotations

import numpy as np

from tgc.diagnostics import VerifyError
from tgc.dialects._shapes import same_element_type, same_encoding
from tgc.dialects._windows import channel_column, constant, reshape
from tgc.dialects.hl import HLOp, _const, _float_operand, _scalar, register_hl
from tgc.opdef import FLOAT, INT, Attr, Operand, attrs, enum


def _channel_params(op: HLOp, names: tuple[str, ...]) -> None:
    """x is [N, C, ...] of rank >= 2 and every other operand is [C], of x's element type."""
    types = [v.type for v in op.operands]
    x = types[0]
    _float_operand(x)
    if x.rank < 2:
        raise VerifyError(f"x must be [N, C, ...] (rank >= 2), got {x}")
    same_element_type(types)
    same_encoding(types)
    for name, t in zip(names, types[1:]):
        if t.shape != (x.shape[1],):
            raise VerifyError(f"{name} {t} must be [{x.shape[1]}], one per channel of x")


def _per_channel(p: np.ndarray, rank: int) -> np.ndarray:
    return p.reshape((-1,) + (1,) * (rank - 2))


@register_hl
class GroupNormOp(HLOp):
    """Group normalisation: the channels of x [N, C, ...] split into `groups`, each group of each
    sample normalised by its mean and biased variance over its channels and spatial positions,
    then scaled and shifted per channel by gamma and beta [C].
    `%y = hl.group_norm %x, %g, %b {eps = 1e-05, groups = 2} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x4x3x3xf32>`
    """

    name = "hl.group_norm"
    operand_defs = (Operand("x"), Operand("gamma"), Operand("beta"))
    attr_defs = attrs(Attr("groups", INT), Attr("eps", FLOAT, default=1e-5))

    def infer(self):
        _channel_params(self, ("gamma", "beta"))
        return [self.operands[0].type]

    def verify_(self):
        x = self.operands[0].type
        groups = self.attr("groups")
        if groups < 1 or x.shape[1] % groups:
            raise VerifyError(f"groups {groups} must be >= 1 and divide the {x.shape[1]} channels")
        if x.num_elements == 0:
            raise VerifyError(f"x {x} has no elements: the mean of a group is undefined")
        if self.attr("eps") < 0:
            raise VerifyError(f"eps {self.attr('eps')} must be non-negative")

    def grouped_shape(self) -> tuple[int, int, int]:
        x = self.operands[0].type
        n, groups = x.shape[0], self.attr("groups")
        return n, groups, x.num_elements // (n * groups)

    def reference(self, x, gamma, beta):
        g = x.reshape(self.grouped_shape())
        centred = g - g.mean(axis=-1, keepdims=True)
        var = np.mean(centred * centred, axis=-1, keepdims=True)
        normal = (centred / np.sqrt(var + _const(x, self.attr("eps")))).reshape(x.shape)
        return normal * _per_channel(gamma, x.ndim) + _per_channel(beta, x.ndim)

    def decompose(self, b):
        """x as [N, groups, rest]; centred = x - mean; centred * rsqrt(mean(centred**2) + eps)
        (the two-pass variance, as hl.layernorm); back to x's shape; * gamma + beta per
        channel."""
        x, gamma, beta = self.operands
        spatial = x.type.rank - 2
        g = reshape(b, x, self.grouped_shape())
        centred = b.atomic.sub(g, b.hl.mean(g, axes=[-1], keepdims=True))
        var = b.hl.mean(b.atomic.mul(centred, centred), axes=[-1], keepdims=True)
        inv_std = b.atomic.rsqrt(b.atomic.add(var, _scalar(b, x, self.attr("eps"))))
        normal = reshape(b, b.atomic.mul(centred, inv_std), x.type.shape)
        scaled = b.atomic.mul(normal, channel_column(b, gamma, spatial))
        return [b.atomic.add(scaled, channel_column(b, beta, spatial))]


@register_hl
class BatchNormOp(HLOp):
    """Batch normalisation in inference form: (x - mean) / sqrt(var + eps) * gamma + beta, each
    of gamma, beta, mean and var [C], per channel of x [N, C, ...].
    `%y = hl.batch_norm %x, %g, %b, %m, %v {eps = 1e-05} : (tensor<2x4x3x3xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<2x4x3x3xf32>`
    """

    name = "hl.batch_norm"
    operand_defs = (
        Operand("x"),
        Operand("gamma"),
        Operand("beta"),
        Operand("mean"),
        Operand("var"),
    )
    attr_defs = attrs(Attr("eps", FLOAT, default=1e-5))

    def infer(self):
        _channel_params(self, ("gamma", "beta", "mean", "var"))
        return [self.operands[0].type]

    def verify_(self):
        if self.attr("eps") < 0:
            raise VerifyError(f"eps {self.attr('eps')} must be non-negative")

    def reference(self, x, gamma, beta, mean, var):
        def c(p):
            return _per_channel(p, x.ndim)

        return (x - c(mean)) / np.sqrt(c(var) + _const(x, self.attr("eps"))) * c(gamma) + c(beta)

    def decompose(self, b):
        """(x - mean) * (gamma * rsqrt(var + eps)) + beta: the per-channel factor is computed
        once on [C] (a convolution before it can absorb it: passes/fold_batch_norm.py)."""
        x, gamma, beta, mean, var = self.operands
        spatial = x.type.rank - 2
        inv_std = b.atomic.rsqrt(b.atomic.add(var, _scalar(b, x, self.attr("eps"))))
        factor = channel_column(b, b.atomic.mul(gamma, inv_std), spatial)
        centred = b.atomic.sub(x, channel_column(b, mean, spatial))
        return [b.atomic.add(b.atomic.mul(centred, factor), channel_column(b, beta, spatial))]


# -- resampling -----------------------------------------------------------------------------------

_NEAREST = {
    "floor": np.floor,
    "ceil": np.ceil,
    "round_prefer_floor": lambda c: np.ceil(c - 0.5),
    "round_prefer_ceil": lambda c: np.floor(c + 0.5),
}


def source_coordinates(n_in: int, n_out: int, coordinate: str) -> np.ndarray:
    """The source coordinate of each output position along one dim (see the module doc)."""
    i = np.arange(n_out, dtype=np.float64)
    if coordinate == "align_corners":
        return i * ((n_in - 1) / (n_out - 1)) if n_out > 1 else np.zeros(n_out)
    scale = n_in / n_out
    return (i + 0.5) * scale - 0.5 if coordinate == "half_pixel" else i * scale


def nearest_indices(n_in: int, n_out: int, coordinate: str, nearest: str) -> np.ndarray:
    c = _NEAREST[nearest](source_coordinates(n_in, n_out, coordinate))
    return np.clip(c, 0, n_in - 1).astype(np.int64)


def linear_taps(n_in: int, n_out: int, coordinate: str):
    """(lower indices, upper indices, weight of the upper) along one dim."""
    c = np.clip(source_coordinates(n_in, n_out, coordinate), 0, n_in - 1)
    lo = np.floor(c).astype(np.int64)
    return lo, np.minimum(lo + 1, n_in - 1), c - lo


@register_hl
class ResizeOp(HLOp):
    """Resampling of the spatial dims (2 on) of x [N, C, ...] to the sizes of the result type,
    by nearest neighbour or (bi)linear interpolation (the module doc gives the coordinates).
    `%y = hl.resize %x {coordinate = "asymmetric", mode = "nearest"} : (tensor<1x2x3x4xf32>) -> tensor<1x2x6x8xf32>`
    `%y = hl.resize %x {mode = "linear"} : (tensor<1x2x3x4xf32>) -> tensor<1x2x5x2xf32>`
    """

    name = "hl.resize"
    operand_defs = (Operand("x"),)
    attr_defs = attrs(
        Attr("mode", enum("nearest", "linear")),
        Attr("coordinate", enum("half_pixel", "align_corners", "asymmetric"), "half_pixel"),
        Attr("nearest", enum(*_NEAREST), default="floor"),
    )

    def infer(self):
        return None  # the result type gives the output sizes

    def verify_(self):
        x, y = self.operands[0].type, self.results[0].type
        _float_operand(x)
        if x.rank < 3:
            raise VerifyError(f"x must be [N, C, spatial...] (rank >= 3), got {x}")
        if y.rank != x.rank or y.shape[:2] != x.shape[:2]:
            raise VerifyError(f"result {y} must keep the rank and the N and C dims of x {x}")
        if y.element_type != x.element_type or y.encoding != x.encoding:
            raise VerifyError(f"result {y} must have the element type and memory space of x")
        if any(n == 0 for n in x.shape[2:]) and y.num_elements:
            raise VerifyError(f"x {x} has an empty spatial dim: nothing to resample")

    def plan(self) -> list[tuple[int, int, int]]:
        """(axis, input length, output length) of each dim that changes size."""
        x, y = self.operands[0].type.shape, self.results[0].type.shape
        return [(a, x[a], y[a]) for a in range(2, len(x)) if x[a] != y[a]]

    def reference(self, x):
        mode, coordinate = self.attr("mode"), self.attr("coordinate")
        for axis, n_in, n_out in self.plan():
            if mode == "nearest":
                x = np.take(x, nearest_indices(n_in, n_out, coordinate, self.attr("nearest")), axis)
                continue
            lo, hi, f = linear_taps(n_in, n_out, coordinate)
            shape = (-1,) + (1,) * (x.ndim - 1 - axis)
            w_lo, w_hi = ((1 - f).reshape(shape).astype(x.dtype), f.reshape(shape).astype(x.dtype))
            x = np.take(x, lo, axis) * w_lo + np.take(x, hi, axis) * w_hi
        return x

    def decompose(self, b):
        """One gather per resized dim with constant indices; linear: two gathers weighted by
        constants, lower * (1 - f) + upper * f."""
        (x,) = self.operands
        mode, coordinate = self.attr("mode"), self.attr("coordinate")
        for axis, n_in, n_out in self.plan():
            if mode == "nearest":
                index = nearest_indices(n_in, n_out, coordinate, self.attr("nearest"))
                x = b.atomic.gather(x, constant(b, index.astype(np.int32), x), axis=axis)
                continue
            lo, hi, f = linear_taps(n_in, n_out, coordinate)
            lower = b.atomic.gather(x, constant(b, lo.astype(np.int32), x), axis=axis)
            upper = b.atomic.gather(x, constant(b, hi.astype(np.int32), x), axis=axis)
            shape = (n_out,) + (1,) * (x.type.rank - 1 - axis)
            dtype = x.type.dtype
            w_lo = constant(b, (1 - f).reshape(shape).astype(dtype), x)
            w_hi = constant(b, f.reshape(shape).astype(dtype), x)
            x = b.atomic.add(b.atomic.mul(lower, w_lo), b.atomic.mul(upper, w_hi))
        return [x]
