"""Sliding windows over the spatial dims of NC... tensors: the attributes, the output sizes, and
the two ways of reading a window, as numpy (for the ops' meanings) and as IR (for their
decompositions). Shared by hl_conv.py and hl_pool.py.

Layout: an operand is [N, C, *spatial] (NCHW for 2-D); `k` is the number of spatial dims.
Attributes, one entry per spatial dim unless said:
- `strides` (default all 1), `dilations` (default all 1): integers >= 1;
- `pads`: 2k integers >= 0, ONNX's order [begin_0, ..., begin_{k-1}, end_0, ..., end_{k-1}]
  (for 2-D: [top, left, bottom, right]); default all 0.

A window of kernel size `size` with dilation `d` covers `d * (size - 1) + 1` positions (its
extent). Along a spatial dim of length L the window starts at `j * stride - pad_begin` for
output position j; it reads tap t at `start + t * d`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import product

import numpy as np

from tgc.attributes import DenseAttr
from tgc.builder import Builder
from tgc.diagnostics import VerifyError
from tgc.ir import Operation, Value
from tgc.types import ELEMENT_TYPE_OF_DTYPE, TensorType

DIM_NAMES = {1: "length", 2: "height and width", 3: "depth, height and width"}


def spatial_ints(op: Operation, name: str, count: int, default: int, minimum: int):
    """Attribute `name` of `op` as a tuple of `count` integers >= `minimum` (all `default`
    when absent); raises a VerifyError naming the attribute otherwise."""
    value = op.attr(name)
    if value is None:
        return (default,) * count
    if len(value) != count or any(v < minimum for v in value):
        raise VerifyError(
            f"{name} {list(value)} must be {count} integer{'s' if count > 1 else ''} >= {minimum}"
        )
    return tuple(value)


def check_layout(t: TensorType, spatial: int, what: str) -> None:
    """`t` is a float [N, C, *spatial] tensor with `spatial` spatial dims."""
    if t.rank != spatial + 2:
        raise VerifyError(
            f"{what} must be [N, C, {DIM_NAMES[spatial]}] (rank {spatial + 2}), got {t}"
        )
    if not t.is_float:
        raise VerifyError(f"{what} must have a float element type, got {t}")


@dataclass(frozen=True)
class Window:
    """A window's geometry along each spatial dim."""

    size: tuple[int, ...]
    strides: tuple[int, ...]
    dilations: tuple[int, ...]
    pads: tuple[int, ...]  # [begin..., end...]
    ceil_mode: bool = False

    @property
    def spatial(self) -> int:
        return len(self.size)

    def begin(self, i: int) -> int:
        return self.pads[i]

    def end(self, i: int) -> int:
        return self.pads[self.spatial + i]

    def extent(self, i: int) -> int:
        return self.dilations[i] * (self.size[i] - 1) + 1

    def out_sizes(self, lengths: Sequence[int]) -> tuple[int, ...]:
        """The number of window positions along each dim; a VerifyError when the window does not
        fit the padded input. In ceil mode a last, partial window is kept when it starts inside
        the input or the begin pads (PyTorch's and ONNX's rule)."""
        out = []
        for i, length in enumerate(lengths):
            span = length + self.begin(i) + self.end(i) - self.extent(i)
            if span < 0:
                raise VerifyError(
                    f"the window (extent {self.extent(i)}) is larger than the padded input "
                    f"({length + self.begin(i) + self.end(i)}) along spatial dim {i}"
                )
            stride = self.strides[i]
            n = (-(-span // stride) if self.ceil_mode else span // stride) + 1
            if self.ceil_mode and (n - 1) * stride >= length + self.begin(i):
                n -= 1
            out.append(n)
        return tuple(out)

    def extra_end(self, lengths: Sequence[int], outs: Sequence[int]) -> tuple[int, ...]:
        """Positions past the end pads that ceil mode's last windows read (never counted)."""
        return tuple(
            max(0, (o - 1) * s + self.extent(i) - (n + self.begin(i) + self.end(i)))
            for i, (n, o, s) in enumerate(zip(lengths, outs, self.strides))
        )

    def taps(self) -> Iterator[tuple[int, ...]]:
        """Every tap of the window, in row-major order (the order of a weight's kernel dims)."""
        return product(*(range(s) for s in self.size))

    def tap_slices(self, tap: tuple[int, ...], outs: Sequence[int]) -> list[tuple[int, int, int]]:
        """(start, stop, step) along each spatial dim of the padded input for one tap."""
        out = []
        for i, (t, o) in enumerate(zip(tap, outs)):
            start = t * self.dilations[i]
            out.append((start, start + (o - 1) * self.strides[i] + 1, self.strides[i]))
        return out


def window_of(op: Operation, size: tuple[int, ...], ceil_mode: bool = False) -> Window:
    k = len(size)
    return Window(
        size,
        spatial_ints(op, "strides", k, 1, 1),
        spatial_ints(op, "dilations", k, 1, 1),
        spatial_ints(op, "pads", 2 * k, 0, 0),
        ceil_mode,
    )


# -- numpy ----------------------------------------------------------------------------------------


def np_pad(x: np.ndarray, window: Window, fill: float, extra: Sequence[int] = ()) -> np.ndarray:
    """x with `fill` around its spatial dims: the window's pads (plus `extra` at the ends)."""
    extra = tuple(extra) or (0,) * window.spatial
    widths = [(0, 0), (0, 0)] + [
        (window.begin(i), window.end(i) + extra[i]) for i in range(window.spatial)
    ]
    if not any(a or b for a, b in widths):
        return x
    return np.pad(x, widths, constant_values=x.dtype.type(fill))


def np_taps(padded: np.ndarray, window: Window, outs: Sequence[int]) -> Iterator[np.ndarray]:
    """The [N, C, *outs] view of each tap of the window over `padded`, in `taps()` order."""
    for tap in window.taps():
        index = tuple(slice(*s) for s in window.tap_slices(tap, outs))
        yield padded[(Ellipsis, *index)]


def tap_counts(lengths, outs, window: Window, include_pad: bool) -> np.ndarray:
    """How many taps of each window lie in the input (or, `include_pad`, in the input and its
    pads): the divisor of an average pool, of shape `outs`."""
    count = np.ones(outs)
    for i, (n, o) in enumerate(zip(lengths, outs)):
        lo, hi = (-window.begin(i), n + window.end(i)) if include_pad else (0, n)
        starts = np.arange(o) * window.strides[i] - window.begin(i)
        positions = starts[:, None] + np.arange(window.size[i]) * window.dilations[i]
        along = ((positions >= lo) & (positions < hi)).sum(axis=1)
        count = count * along.reshape((-1,) + (1,) * (window.spatial - 1 - i))
    return count


# -- IR -------------------------------------------------------------------------------------------


def constant(b: Builder, array: np.ndarray, like: Value) -> Value:
    """`array` as a constant of `like`'s memory space (and of `array`'s element type)."""
    t = TensorType.get(array.shape, ELEMENT_TYPE_OF_DTYPE[array.dtype], like.type.encoding)
    value = DenseAttr(np.asarray(array, dtype=t.dtype), t.with_encoding(None))
    return b.atomic.constant(value=value, result_type=t)


def filled(b: Builder, like: Value, shape: Sequence[int], fill: float) -> Value:
    """A splat constant of `like`'s element type and memory space."""
    t = TensorType.get(tuple(shape), like.type.element_type, like.type.encoding)
    return b.atomic.constant(value=DenseAttr.splat(fill, t.with_encoding(None)), result_type=t)


def pad_axis(b: Builder, x: Value, axis: int, begin: int, end: int, fill: float) -> Value:
    """x with `begin` and `end` positions of `fill` along `axis` (a negative count removes that
    many positions instead)."""
    shape = list(x.type.shape)
    if begin < 0 or end < 0:
        start = [max(0, -begin) if i == axis else 0 for i in range(len(shape))]
        stop = [d - max(0, -end) if i == axis else d for i, d in enumerate(shape)]
        x = b.atomic.slice(x, start=start, stop=stop, step=[1] * len(shape))
        begin, end = max(0, begin), max(0, end)
        shape = list(x.type.shape)

    def fill_of(count: int) -> Value:
        return filled(b, x, shape[:axis] + [count] + shape[axis + 1 :], fill)

    parts = ([fill_of(begin)] if begin else []) + [x] + ([fill_of(end)] if end else [])
    return parts[0] if len(parts) == 1 else b.atomic.concat(*parts, axis=axis)


def pad(b: Builder, x: Value, window: Window, fill: float, extra: Sequence[int] = ()) -> Value:
    extra = tuple(extra) or (0,) * window.spatial
    for i in range(window.spatial):
        begin, end = window.begin(i), window.end(i) + extra[i]
        if begin or end:
            x = pad_axis(b, x, 2 + i, begin, end, fill)
    return x


def taps(b: Builder, padded: Value, window: Window, outs: Sequence[int]) -> list[Value]:
    """The [N, C, *outs] slice of each tap of the window over `padded`, in `taps()` order."""
    shape = padded.type.shape
    out = []
    for tap in window.taps():
        slices = [(0, shape[0], 1), (0, shape[1], 1)] + window.tap_slices(tap, outs)
        if all(lo == 0 and hi == d and st == 1 for (lo, hi, st), d in zip(slices, shape)):
            out.append(padded)
            continue
        start, stop, step = (list(c) for c in zip(*slices))
        out.append(b.atomic.slice(padded, start=start, stop=stop, step=step))
    return out


def reshape(b: Builder, x: Value, shape: Sequence[int]) -> Value:
    shape = tuple(int(d) for d in shape)
    if x.type.shape == shape:
        return x
    return b.atomic.reshape(x, result_type=x.type.with_shape(shape))


def channel_column(b: Builder, p: Value, spatial: int) -> Value:
    """A per-channel [C] value as [C, 1, ...] so it broadcasts against [N, C, *spatial]."""
    return reshape(b, p, p.type.shape + (1,) * spatial)


def total(sizes: Sequence[int]) -> int:
    return math.prod(sizes)
