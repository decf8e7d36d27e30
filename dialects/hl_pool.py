"""hl pooling: `hl.max_pool1d/2d/3d` and `hl.avg_pool1d/2d/3d` over the spatial dims of
[N, C, *spatial] (window attributes in dialects/_windows.py, plus `kernel`, the window's size,
and `ceil_mode`). A global pool is the same op with `kernel` equal to the spatial dims.

The average divides each window's sum by the number of its taps that lie in the input, or with
`count_include_pad = true` in the input and its explicit pads (never the positions past the
end pads that ceil mode's last windows read): ONNX's AveragePool and PyTorch's avg_pool (whose
own default, count_include_pad = True, the importers write out). A max pool's pads are -inf.
Every pad must be smaller than the window's extent, so that every window reads the input.

Decompositions: both reductions are separable, so the window is taken one spatial dim at a
time: pad (-inf or zero constants, `atomic.concat`), then along each dim either one
`atomic.slice` and `atomic.reduce_max`/`reduce_sum` (a dim with one output position and no
dilation: a global pool is one reduction per dim) or one strided slice per tap combined by
`atomic.max`/`atomic.add`; an average divides by the counts, a constant (a scalar where every
window counts the same).
"""

from __future__ import annotations

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from tgc.diagnostics import VerifyError
from tgc.dialects._windows import (
    Window,
    check_layout,
    constant,
    np_pad,
    pad,
    spatial_ints,
    tap_counts,
    window_of,
)
from tgc.dialects.hl import HLOp, _scalar, register_hl
from tgc.opdef import BOOL, INTS, Attr, Operand, attrs

_POOL_ATTRS = (
    Attr("kernel", INTS),
    Attr("strides", INTS, default=None),
    Attr("pads", INTS, default=None),
    Attr("dilations", INTS, default=None),
    Attr("ceil_mode", BOOL, default=False),
)


class PoolOp(HLOp):
    """Base of the pools: a window over the spatial dims of x, reduced to one value."""

    spatial = 2
    fill = 0.0  # the value of a pad
    operand_defs = (Operand("x"),)
    attr_defs = attrs(*_POOL_ATTRS)

    def window(self) -> Window:
        size = spatial_ints(self, "kernel", self.spatial, 1, 1)
        return window_of(self, size, bool(self.attr("ceil_mode")))

    def infer(self):
        x = self.operands[0].type
        check_layout(x, self.spatial, "x")
        window = self.window()
        for i in range(2 * self.spatial):
            dim = i % self.spatial
            if window.pads[i] >= window.extent(dim):
                raise VerifyError(
                    f"pads {list(window.pads)} must be smaller than the window's extent "
                    f"({window.extent(dim)}) along spatial dim {dim}"
                )
        return [x.with_shape(x.shape[:2] + window.out_sizes(x.shape[2:]))]

    def windows(self, x: np.ndarray) -> np.ndarray:
        """Every window of x as [N, C, *outs, *kernel] (a view of the padded input)."""
        window, outs = self.window(), self.results[0].type.shape[2:]
        padded = np_pad(x, window, self.fill, window.extra_end(x.shape[2:], outs))
        k = self.spatial
        extents = [window.extent(i) for i in range(k)]
        view = sliding_window_view(padded, extents, axis=tuple(range(2, 2 + k)))
        index = [slice(None)] * 2
        index += [slice(0, (o - 1) * s + 1, s) for o, s in zip(outs, window.strides)]
        index += [slice(None, None, d) for d in window.dilations]
        return view[tuple(index)]

    def reduce_axis(self, b, x, axis: int, window: Window, out: int):
        """The window along one spatial dim (`axis` counts N and C)."""
        i = axis - 2
        shape = x.type.shape
        starts = [0] * len(shape)
        steps = [1] * len(shape)
        if out == 1 and window.dilations[i] == 1:
            stop = [window.extent(i) if a == axis else d for a, d in enumerate(shape)]
            part = x
            if stop != list(shape):
                part = b.atomic.slice(x, start=starts, stop=stop, step=steps)
            return self.reduction(b)(part, axes=[axis], keepdims=True)
        result = None
        for t in range(window.size[i]):
            start = t * window.dilations[i]
            begin = [start if a == axis else 0 for a in range(len(shape))]
            stop = [
                start + (out - 1) * window.strides[i] + 1 if a == axis else d
                for a, d in enumerate(shape)
            ]
            step = [window.strides[i] if a == axis else 1 for a in range(len(shape))]
            tap = b.atomic.slice(x, start=begin, stop=stop, step=step)
            result = tap if result is None else self.combine(b)(result, tap)
        return result

    def reduced(self, b):
        """x padded, then the window taken along each spatial dim in turn."""
        (x,) = self.operands
        window, outs = self.window(), self.results[0].type.shape[2:]
        y = pad(b, x, window, self.fill, window.extra_end(x.type.shape[2:], outs))
        for i, out in enumerate(outs):
            y = self.reduce_axis(b, y, 2 + i, window, out)
        return y


class MaxPoolOp(PoolOp):
    fill = -np.inf

    def reference(self, x):
        return self.windows(x).max(axis=tuple(range(-self.spatial, 0)))

    def reduction(self, b):
        return b.atomic.reduce_max

    def combine(self, b):
        return b.atomic.max

    def decompose(self, b):
        """-inf pads, then the maximum along each spatial dim in turn."""
        return [self.reduced(b)]


class AvgPoolOp(PoolOp):
    attr_defs = attrs(*_POOL_ATTRS, Attr("count_include_pad", BOOL, default=False))

    def counts(self) -> np.ndarray:
        x, y = self.operands[0].type, self.results[0].type
        include = bool(self.attr("count_include_pad"))
        return tap_counts(x.shape[2:], y.shape[2:], self.window(), include)

    def reference(self, x):
        total = self.windows(x).sum(axis=tuple(range(-self.spatial, 0)))
        return total / self.counts().astype(x.dtype)

    def reduction(self, b):
        return b.atomic.reduce_sum

    def combine(self, b):
        return b.atomic.add

    def decompose(self, b):
        """Zero pads, the sum along each spatial dim in turn, then the division by the number
        of taps counted (one constant)."""
        (x,) = self.operands
        counts = self.counts()
        if np.all(counts == counts.flat[0]):
            divisor = _scalar(b, x, float(counts.flat[0]))
        else:
            divisor = constant(b, counts.astype(x.type.dtype), x)
        return [b.atomic.div(self.reduced(b), divisor)]


@register_hl
class MaxPool1dOp(MaxPoolOp):
    """The maximum over windows along the length of x [N, C, L].
    `%y = hl.max_pool1d %x {kernel = [3], strides = [2]} : (tensor<2x3x9xf32>) -> tensor<2x3x4xf32>`
    """

    name = "hl.max_pool1d"
    spatial = 1


@register_hl
class MaxPool2dOp(MaxPoolOp):
    """The maximum over windows of x [N, C, H, W]; pads are -inf, [top, left, bottom, right].
    `%y = hl.max_pool2d %x {kernel = [3, 3], pads = [1, 1, 1, 1], strides = [2, 2]} : (tensor<1x4x8x8xf32>) -> tensor<1x4x4x4xf32>`
    `%y = hl.max_pool2d %x {ceil_mode = true, dilations = [1, 2], kernel = [2, 2], strides = [2, 2]} : (tensor<1x2x5x6xf32>) -> tensor<1x2x3x3xf32>`
    """

    name = "hl.max_pool2d"
    spatial = 2


@register_hl
class MaxPool3dOp(MaxPoolOp):
    """The maximum over windows of x [N, C, D, H, W].
    `%y = hl.max_pool3d %x {kernel = [2, 2, 2], strides = [2, 2, 2]} : (tensor<1x2x4x4x4xf32>) -> tensor<1x2x2x2x2xf32>`
    """

    name = "hl.max_pool3d"
    spatial = 3


@register_hl
class AvgPool1dOp(AvgPoolOp):
    """The mean over windows along the length of x [N, C, L].
    `%y = hl.avg_pool1d %x {kernel = [3], pads = [1, 1]} : (tensor<2x3x9xf32>) -> tensor<2x3x9xf32>`
    """

    name = "hl.avg_pool1d"
    spatial = 1


@register_hl
class AvgPool2dOp(AvgPoolOp):
    """The mean over windows of x [N, C, H, W] (see the module doc for the pads' count);
    `kernel` equal to [H, W] is the global average pool.
    `%y = hl.avg_pool2d %x {count_include_pad = true, kernel = [3, 3], pads = [1, 1, 1, 1]} : (tensor<1x4x6x6xf32>) -> tensor<1x4x6x6xf32>`
    `%y = hl.avg_pool2d %x {ceil_mode = true, kernel = [2, 2], pads = [1, 0, 0, 1], strides = [2, 2]} : (tensor<1x2x5x5xf32>) -> tensor<1x2x3x3xf32>`
    `%y = hl.avg_pool2d %x {kernel = [6, 6]} : (tensor<1x4x6x6xf32>) -> tensor<1x4x1x1xf32>`
    """

    name = "hl.avg_pool2d"
    spatial = 2


@register_hl
class AvgPool3dOp(AvgPoolOp):
    """The mean over windows of x [N, C, D, H, W].
    `%y = hl.avg_pool3d %x {kernel = [2, 2, 2], strides = [2, 2, 2]} : (tensor<1x2x4x4x4xf32>) -> tensor<1x2x2x2x2xf32>`
    """

    name = "hl.avg_pool3d"
    spatial = 3
