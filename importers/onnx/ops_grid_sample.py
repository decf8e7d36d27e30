"""The converter of GridSample (opset 16 and later, any number of spatial dims): X sampled at the
normalised positions of a grid known only when the model runs.

Per spatial dim: the grid's coordinate is mapped to the input's (align_corners or not), rounded
half to even for "nearest", and moved back inside by the padding mode when it falls outside
(clamped for "border", reflected about the borders for "reflection"); then the 1 ("nearest"),
2 ("linear") or 4 ("cubic", Keys' a = -0.75) neighbours and their weights. Each combination of
neighbours over the dims is one gather of X at the flat index of the pixel, which "zeros"
padding masks where a neighbour lies outside. Rounding uses casts: atomic has no floor, so
floor(x) = trunc(x) - (trunc(x) > x), with trunc a cast to i64 and back.
"""

from __future__ import annotations

import itertools
import math

import numpy as np

from tgc.ir import Value
from tgc.types import TensorType

from .context import NodeContext
from .ops_shape import reshape_to
from .registry import converter

MODES = ("nearest", "linear", "cubic")
PADDINGS = ("zeros", "border", "reflection")
CUBIC_A = -0.75


class _Math:
    """Elementwise helpers on one float type (the grid's) and i64."""

    def __init__(self, ctx: NodeContext, like: Value) -> None:
        self.ctx = ctx
        self.b = ctx.b
        self.like = like

    def c(self, value: float) -> Value:
        return self.ctx.scalar(value, like=self.like)

    def i(self, value: int) -> Value:
        return self.ctx.constant(np.int64(value))

    def to_int(self, x: Value) -> Value:  # toward zero
        return self.b.atomic.cast(x, result_type=x.type.with_element_type("i64"))

    def to_float(self, x: Value) -> Value:
        return self.b.atomic.cast(
            x, result_type=x.type.with_element_type(self.like.type.element_type)
        )

    def trunc(self, x: Value) -> Value:
        return self.to_float(self.to_int(x))

    def floor(self, x: Value) -> Value:
        t = self.trunc(x)
        above = self.b.atomic.cmp(t, x, pred="gt")
        return self.b.atomic.where(above, self.b.atomic.sub(t, self.c(1.0)), t)

    def is_odd(self, whole: Value) -> Value:
        """Whether a float holding an integer is odd."""
        n = self.to_int(whole)
        half = self.b.atomic.mul(self.b.atomic.div(n, self.i(2)), self.i(2))
        return self.b.atomic.cmp(n, half, pred="ne")

    def rint(self, x: Value) -> Value:
        """Round half to even (numpy's rint, PyTorch's nearest)."""
        f = self.floor(x)
        r = self.b.atomic.sub(x, f)
        half = self.b.atomic.cmp(r, self.c(0.5), pred="eq")
        up = self.b.atomic.where(half, self.is_odd(f), self.b.atomic.cmp(r, self.c(0.5), pred="gt"))
        return self.b.atomic.where(up, self.b.atomic.add(f, self.c(1.0)), f)

    def clamp(self, x: Value, lo: float, hi: float) -> Value:
        return self.b.atomic.min(self.b.atomic.max(x, self.c(lo)), self.c(hi))

    def outside(self, x: Value, lo: float, hi: float) -> Value:
        below = self.b.atomic.cmp(x, self.c(lo), pred="lt")
        return self.b.atomic.where(below, below, self.b.atomic.cmp(x, self.c(hi), pred="gt"))

    def reflect(self, x: Value, lo: float, hi: float) -> Value:
        """x folded back into [lo, hi] by reflecting about the nearer border repeatedly."""
        b = self.b
        span = hi - lo
        if span <= 0:
            return b.atomic.broadcast(self.c(lo), result_type=x.type)
        below = b.atomic.cmp(x, self.c(lo), pred="lt")
        above = b.atomic.cmp(x, self.c(hi), pred="gt")
        distance = b.atomic.where(below, b.atomic.sub(self.c(lo), x), b.atomic.sub(x, self.c(hi)))
        turns = self.trunc(b.atomic.div(distance, self.c(span)))
        rest = b.atomic.sub(distance, b.atomic.mul(turns, self.c(span)))
        even = b.atomic.cmp(self.is_odd(turns), self.ctx.constant(np.bool_(False)), pred="eq")
        from_lo, from_hi = b.atomic.add(self.c(lo), rest), b.atomic.sub(self.c(hi), rest)
        low_side = b.atomic.where(even, from_lo, from_hi)
        high_side = b.atomic.where(even, from_hi, from_lo)
        return b.atomic.where(below, low_side, b.atomic.where(above, high_side, x))


def _cubic_weights(m: _Math, t: Value) -> list[Value]:
    """Keys' weights of the neighbours at -1, 0, 1, 2 for a fraction t in [0, 1)."""
    b, a = m.b, CUBIC_A

    def near(d: Value) -> Value:  # |d| <= 1
        inner = b.atomic.sub(b.atomic.mul(m.c(a + 2), d), m.c(a + 3))
        return b.atomic.add(b.atomic.mul(b.atomic.mul(inner, d), d), m.c(1.0))

    def far(d: Value) -> Value:  # 1 < |d| < 2
        inner = b.atomic.sub(b.atomic.mul(m.c(a), d), m.c(5 * a))
        inner = b.atomic.add(b.atomic.mul(inner, d), m.c(8 * a))
        return b.atomic.sub(b.atomic.mul(inner, d), m.c(4 * a))

    one_minus = b.atomic.sub(m.c(1.0), t)
    return [
        far(b.atomic.add(t, m.c(1.0))),
        near(t),
        near(one_minus),
        far(b.atomic.add(one_minus, m.c(1.0))),
    ]


@converter("GridSample")
def grid_sample(ctx: NodeContext):
    x, grid = ctx.input(0), ctx.input(1)
    mode = ctx.attr("mode", "linear")
    mode = {"bilinear": "linear", "bicubic": "cubic"}.get(mode, mode)  # opset 16's names
    padding = ctx.attr("padding_mode", "zeros")
    align = bool(ctx.attr("align_corners", 0))
    if mode not in MODES:
        raise ctx.error(f"mode '{mode}' is not supported ({', '.join(MODES)})")
    if padding not in PADDINGS:
        raise ctx.error(f"padding_mode '{padding}' is not supported ({', '.join(PADDINGS)})")
    rank = x.type.rank - 2
    n, c, *dims = x.type.shape
    out = grid.type.shape[1:-1]
    if rank < 1 or grid.type.shape != (n, *out, rank) or len(out) != rank:
        raise ctx.error(f"grid {grid.type} must be [N, *out, {rank}] for X {x.type}")
    if not x.type.is_float or not grid.type.is_float:
        raise ctx.error(f"X and grid must be float tensors, got {x.type} and {grid.type}")
    m = _Math(ctx, grid)
    per_dim = [_neighbours(m, grid, d, dims[d], rank, mode, padding, align) for d in range(rank)]
    return _combine(ctx, x, per_dim, out, padding)


def _neighbours(m: _Math, grid: Value, d: int, size: int, rank: int, mode, padding, align):
    """[(index i64, weight or None, inside i1 or None)] along spatial dim d at every point."""
    b = m.b
    shape = grid.type.shape
    component = rank - 1 - d  # the grid lists x (the last dim) first
    start, stop = [0] * len(shape), list(shape)
    start[-1], stop[-1] = component, component + 1
    g = reshape_to(
        m.ctx, b.atomic.slice(grid, start=start, stop=stop, step=[1] * len(shape)), shape[:-1]
    )
    if align:
        pos = b.atomic.mul(b.atomic.add(g, m.c(1.0)), m.c((size - 1) / 2))
        lo, hi = 0.0, size - 1.0
    else:
        pos = b.atomic.div(
            b.atomic.sub(b.atomic.mul(b.atomic.add(g, m.c(1.0)), m.c(float(size))), m.c(1.0)),
            m.c(2.0),
        )
        lo, hi = -0.5, size - 0.5
    if mode == "nearest":
        pos = m.rint(pos)
    if padding == "border":
        pos = b.atomic.where(m.outside(pos, lo, hi), m.clamp(pos, 0.0, size - 1.0), pos)
    elif padding == "reflection":
        pos = m.reflect(pos, lo, hi)
    if mode == "nearest":
        return [_index(m, m.trunc(pos), None, size, padding, lo, hi)]
    base = m.floor(pos)
    t = b.atomic.sub(pos, base)
    if mode == "linear":
        offsets, weights = (0, 1), [b.atomic.sub(m.c(1.0), t), t]
    else:
        offsets, weights = (-1, 0, 1, 2), _cubic_weights(m, t)
    return [
        _index(m, b.atomic.add(base, m.c(float(o))), w, size, padding, lo, hi)
        for o, w in zip(offsets, weights)
    ]


def _index(m: _Math, at: Value, weight, size: int, padding: str, lo: float, hi: float):
    """A neighbour's integer position (a float holding it) made an index in [0, size)."""
    b = m.b
    inside = None
    if padding == "zeros":
        inside = b.atomic.where(
            b.atomic.cmp(at, m.c(0.0), pred="ge"),
            b.atomic.cmp(at, m.c(size - 1.0), pred="le"),
            m.ctx.constant(np.bool_(False)),
        )
        at = m.clamp(at, 0.0, size - 1.0)
    elif padding == "border":
        at = m.clamp(at, 0.0, size - 1.0)
    else:
        at = m.trunc(m.reflect(at, lo, hi))
        at = m.clamp(at, 0.0, size - 1.0)  # the reflection of a border pixel stays in range
    return m.to_int(at), weight, inside


def _combine(ctx: NodeContext, x: Value, per_dim, out, padding: str) -> Value:
    """Sum over every combination of neighbours of weight * X[n, c, pixel] (masked)."""
    b = ctx.b
    n, c, *dims = x.type.shape
    points = TensorType.get((n, c, *out), "i64")
    plane = math.prod(dims)
    strides = [math.prod(dims[d + 1 :]) for d in range(len(dims))]
    flat_x = reshape_to(ctx, x, (x.type.num_elements,))
    batch = b.atomic.iota(axis=0, result_type=points)
    channel = b.atomic.iota(axis=1, result_type=points)
    origin = b.atomic.mul(
        b.atomic.add(b.atomic.mul(batch, ctx.constant(np.int64(c))), channel),
        ctx.constant(np.int64(plane)),
    )
    total = None
    for combo in itertools.product(*per_dim):
        pixel = None
        weight = None
        inside = None
        for d, (index, w, ok) in enumerate(combo):
            term = b.atomic.mul(index, ctx.constant(np.int64(strides[d])))
            pixel = term if pixel is None else b.atomic.add(pixel, term)
            if w is not None:
                weight = w if weight is None else b.atomic.mul(weight, w)
            if ok is not None:
                inside = ok if inside is None else b.atomic.where(inside, ok, inside)
        spread = reshape_to(ctx, pixel, (n, 1, *out))
        at = b.atomic.add(origin, b.atomic.broadcast(spread, result_type=points))
        value = b.atomic.gather(flat_x, at, axis=0)
        if weight is not None:
            w = weight
            if w.type.element_type != x.type.element_type:
                w = b.atomic.cast(w, result_type=w.type.with_element_type(x.type.element_type))
            value = b.atomic.mul(value, reshape_to(ctx, w, (n, 1, *out)))
        if inside is not None:
            value = b.atomic.where(
                reshape_to(ctx, inside, (n, 1, *out)), value, ctx.scalar(0, like=x)
            )
        total = value if total is None else b.atomic.add(total, value)
    return total
