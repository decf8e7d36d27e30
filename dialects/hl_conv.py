"""hl convolutions: `hl.conv1d/2d/3d` and `hl.conv_transpose1d/2d/3d` (NC... layout).

One class per family, generic over the number of spatial dims; each op sets its name and that
number. Window attributes (strides, pads in ONNX's [begin..., end...] order, dilations) are
described in dialects/_windows.py.

Decompositions (see docs/vision.md):
- a convolution is im2col: pad with zero constants (`atomic.concat`), one strided
  `atomic.slice` per kernel tap, the taps concatenated into columns [N, groups, C/groups * taps,
  positions] and one batched `atomic.matmul` with the weights as [groups, O/groups, C/groups *
  taps], then the bias. A 1x1 convolution without padding or strides is a reshape and a matmul.
  The columns copy the activation once per tap: the decomposition is the op's meaning in
  primitives, not its fast form (that is a kernel's job).
- a transposed convolution is a convolution of the input spread by the strides (zeros between
  its elements, built by concatenating zero constants and reshaping), padded by
  dilation * (size - 1) - pads (cropped where that is negative), with the weights flipped in
  every spatial dim (`atomic.gather` with reversed constant indices) and their two channel dims
  exchanged per group.
"""

from __future__ import annotations

import numpy as np

from tgc.diagnostics import VerifyError
from tgc.dialects._shapes import same_element_type, same_encoding
from tgc.dialects._windows import (
    DIM_NAMES,
    Window,
    check_layout,
    channel_column,
    constant,
    filled,
    np_pad,
    np_taps,
    pad,
    pad_axis,
    reshape,
    spatial_ints,
    taps,
    total,
    window_of,
)
from tgc.dialects.hl import HLOp, register_hl
from tgc.opdef import INT, INTS, Attr, Operand, OptionalOperand, attrs

_WINDOW_ATTRS = (
    Attr("strides", INTS, default=None),
    Attr("pads", INTS, default=None),
    Attr("dilations", INTS, default=None),
    Attr("groups", INT, default=1),
)


class _ConvBase(HLOp):
    """What convolutions and transposed convolutions share: x [N, C, *spatial], a weight of
    rank 2 + spatial, an optional bias [out channels], groups."""

    spatial = 2
    operand_defs = (Operand("x"), Operand("w"), OptionalOperand("b"))
    weight_layout = ""  # for messages

    def window(self) -> Window:
        return window_of(self, self.operands[1].type.shape[2:])

    def check_operands(self) -> tuple[int, int]:
        """Layouts, types and groups; returns (groups, out channels)."""
        types = [v.type for v in self.operands]
        x, w = types[0], types[1]
        check_layout(x, self.spatial, "x")
        if w.rank != self.spatial + 2:
            raise VerifyError(
                f"w must be [{self.weight_layout}, {DIM_NAMES[self.spatial]}] "
                f"(rank {self.spatial + 2}), got {w}"
            )
        same_element_type(types)
        same_encoding(types)
        if any(d < 1 for d in w.shape[2:]):
            raise VerifyError(f"the kernel of w {w} has a dim of size 0")
        groups = self.attr("groups")
        if groups < 1:
            raise VerifyError(f"groups {groups} must be >= 1")
        if x.shape[1] % groups:
            raise VerifyError(f"x has {x.shape[1]} channels, which {groups} groups do not divide")
        return groups, self.out_channels(groups)

    def out_channels(self, groups: int) -> int:
        raise NotImplementedError

    def verify_(self):
        if len(self.operands) == 3:
            channels = self.results[0].type.shape[1]
            bias = self.operands[2].type
            if bias.shape != (channels,):
                raise VerifyError(f"bias {bias} must be [{channels}], one per output channel")


class ConvOp(_ConvBase):
    """Base of hl.conv1d/2d/3d."""

    attr_defs = attrs(*_WINDOW_ATTRS)
    weight_layout = "out channels, in channels / groups"

    def out_channels(self, groups: int) -> int:
        x, w = (v.type for v in self.operands[:2])
        if w.shape[0] % groups:
            raise VerifyError(
                f"w has {w.shape[0]} output channels, which {groups} groups do not divide"
            )
        if w.shape[1] * groups != x.shape[1]:
            raise VerifyError(
                f"w has {w.shape[1]} input channels per group, expected {x.shape[1] // groups} "
                f"(x's {x.shape[1]} channels in {groups} groups)"
            )
        return w.shape[0]

    def infer(self):
        _, out_channels = self.check_operands()
        x = self.operands[0].type
        outs = self.window().out_sizes(x.shape[2:])
        return [x.with_shape((x.shape[0], out_channels) + outs)]

    def reference(self, x, w, b=None):
        """The sum over taps of each tap's weights times the input it reads."""
        window, groups = self.window(), self.attr("groups")
        (n, c), o = x.shape[:2], w.shape[0]
        outs = self.results[0].type.shape[2:]
        weights = w.reshape(groups, o // groups, c // groups, -1)
        y = np.zeros((n, groups, o // groups, total(outs)), dtype=x.dtype)
        for t, tap in enumerate(np_taps(np_pad(x, window, 0), window, outs)):
            y += np.matmul(weights[..., t], tap.reshape(n, groups, c // groups, -1))
        y = y.reshape((n, o) + tuple(outs))
        return y if b is None else y + b.reshape((o,) + (1,) * self.spatial)

    def decompose(self, b):
        """im2col: zero pads, one strided slice per tap, one batched matmul, the bias."""
        x, w, *bias = self.operands
        window, groups = self.window(), self.attr("groups")
        (n, c), o = x.type.shape[:2], w.type.shape[0]
        outs = self.results[0].type.shape[2:]
        cg, positions = c // groups, total(outs)
        columns = taps(b, pad(b, x, window, 0.0), window, outs)
        count = len(columns)
        if count > 1:
            pieces = [reshape(b, t, (n, groups, cg, 1, positions)) for t in columns]
            columns = [b.atomic.concat(*pieces, axis=3)]
        lead = (n, groups) if groups > 1 else (n,)
        cols = reshape(b, columns[0], lead + (cg * count, positions))
        weights = (groups, o // groups) if groups > 1 else (o,)
        y = b.atomic.matmul(reshape(b, w, weights + (cg * count,)), cols)
        y = reshape(b, y, (n, o) + tuple(outs))
        return [b.atomic.add(y, channel_column(b, bias[0], self.spatial)) if bias else y]


@register_hl
class Conv1dOp(ConvOp):
    """1-D convolution (cross-correlation, as in PyTorch and ONNX) of x [N, C, L] with
    w [O, C/groups, K] plus the optional bias [O].
    `%y = hl.conv1d %x, %w {pads = [1, 1]} : (tensor<2x3x10xf32>, tensor<4x3x3xf32>) -> tensor<2x4x10xf32>`
    """

    name = "hl.conv1d"
    spatial = 1


@register_hl
class Conv2dOp(ConvOp):
    """2-D convolution (cross-correlation, as in PyTorch and ONNX) of x [N, C, H, W] with
    w [O, C/groups, kH, kW] plus the optional bias [O]; pads are [top, left, bottom, right].
    groups = C = O is a depthwise convolution.
    `%y = hl.conv2d %x, %w, %b {pads = [1, 1, 1, 1], strides = [2, 2]} : (tensor<1x4x8x8xf32>, tensor<8x4x3x3xf32>, tensor<8xf32>) -> tensor<1x8x4x4xf32>`
    `%y = hl.conv2d %x, %w {dilations = [2, 2], groups = 4} : (tensor<1x4x8x8xf32>, tensor<4x1x3x3xf32>) -> tensor<1x4x4x4xf32>`
    """

    name = "hl.conv2d"
    spatial = 2


@register_hl
class Conv3dOp(ConvOp):
    """3-D convolution of x [N, C, D, H, W] with w [O, C/groups, kD, kH, kW] plus the optional
    bias [O].
    `%y = hl.conv3d %x, %w : (tensor<1x2x4x4x4xf32>, tensor<3x2x2x2x2xf32>) -> tensor<1x3x3x3x3xf32>`
    """

    name = "hl.conv3d"
    spatial = 3


# -- transposed convolutions ----------------------------------------------------------------------


class ConvTransposeOp(_ConvBase):
    """Base of hl.conv_transpose1d/2d/3d: the gradient of a convolution with respect to its
    input. Output length along each dim: (L - 1) * stride - pad_begin - pad_end
    + dilation * (size - 1) + output_padding + 1."""

    attr_defs = attrs(*_WINDOW_ATTRS, Attr("output_padding", INTS, default=None))
    weight_layout = "in channels, out channels / groups"

    def out_channels(self, groups: int) -> int:
        x, w = (v.type for v in self.operands[:2])
        if w.shape[0] != x.shape[1]:
            raise VerifyError(f"w has {w.shape[0]} input channels, x has {x.shape[1]}")
        return w.shape[1] * groups

    def output_padding(self) -> tuple[int, ...]:
        return spatial_ints(self, "output_padding", self.spatial, 0, 0)

    def infer(self):
        _, out_channels = self.check_operands()
        x = self.operands[0].type
        window, extra = self.window(), self.output_padding()
        outs = []
        for i, length in enumerate(x.shape[2:]):
            if extra[i] >= max(window.strides[i], window.dilations[i]):
                raise VerifyError(
                    f"output_padding {list(extra)} must be smaller than the stride or the "
                    f"dilation of its dim"
                )
            size = (length - 1) * window.strides[i] - window.begin(i) - window.end(i)
            size += window.extent(i) + extra[i]
            if size < 1:
                raise VerifyError(f"the output has no elements along spatial dim {i} ({size})")
            outs.append(size)
        return [x.with_shape((x.shape[0], out_channels) + tuple(outs))]

    def reference(self, x, w, b=None):
        """Each input element scatters its weights times itself over the output: per tap,
        add into the full output's strided positions, then crop the pads."""
        window, groups = self.window(), self.attr("groups")
        (n, c), og = x.shape[:2], w.shape[1]
        lengths = x.shape[2:]
        outs = self.results[0].type.shape[2:]
        full = [
            (length - 1) * s + e + p
            for length, s, e, p in zip(
                lengths,
                window.strides,
                [window.extent(i) for i in range(self.spatial)],
                self.output_padding(),
            )
        ]
        y = np.zeros((n, groups * og) + tuple(full), dtype=x.dtype)
        weights = w.reshape(groups, c // groups, og, -1)
        inputs = x.reshape(n, groups, c // groups, -1)
        for t, tap in enumerate(window.taps()):
            part = np.matmul(np.swapaxes(weights[..., t], -1, -2), inputs)
            index = tuple(
                slice(k * d, k * d + (length - 1) * s + 1, s)
                for k, d, length, s in zip(tap, window.dilations, lengths, window.strides)
            )
            y[(Ellipsis, *index)] += part.reshape((n, groups * og) + tuple(lengths))
        crop = tuple(slice(window.begin(i), window.begin(i) + o) for i, o in enumerate(outs))
        y = y[(Ellipsis, *crop)]
        return y if b is None else y + b.reshape((groups * og,) + (1,) * self.spatial)

    def decompose(self, b):
        """A convolution of the input spread by the strides, padded by dilation * (size - 1)
        - pads, with the weights flipped and their channel dims exchanged per group."""
        x, w, *bias = self.operands
        window, groups = self.window(), self.attr("groups")
        c, og = w.type.shape[:2]
        kernel = w.type.shape[2:]
        for i, stride in enumerate(window.strides):
            x = _spread(b, x, 2 + i, stride)
        for i, extra in enumerate(self.output_padding()):
            full = window.extent(i) - 1
            x = pad_axis(b, x, 2 + i, full - window.begin(i), full - window.end(i) + extra, 0.0)
        for i, size in enumerate(kernel):
            if size > 1:
                reverse = constant(b, np.arange(size - 1, -1, -1, dtype=np.int32), w)
                w = b.atomic.gather(w, reverse, axis=2 + i)
        w = reshape(b, w, (groups, c // groups, og) + kernel)
        perm = [0, 2, 1] + list(range(3, 3 + self.spatial))
        w = b.atomic.transpose(w, perm=perm)
        w = reshape(b, w, (groups * og, c // groups) + kernel)
        conv = getattr(b.hl, f"conv{self.spatial}d")
        options = {"dilations": window.dilations, "groups": groups}
        options = {k: v for k, v in options.items() if v not in (1, (1,) * self.spatial)}
        return [conv(x, w, *bias, **options)]


def _spread(b, x, axis: int, stride: int):
    """x with stride - 1 zeros between neighbours along `axis` (length (L - 1) * stride + 1)."""
    if stride == 1:
        return x
    shape = x.type.shape
    column = reshape(b, x, shape[: axis + 1] + (1,) + shape[axis + 1 :])
    zeros = filled(b, x, shape[: axis + 1] + (stride - 1,) + shape[axis + 1 :], 0.0)
    rows = b.atomic.concat(column, zeros, axis=axis + 1)
    flat = reshape(b, rows, shape[:axis] + (shape[axis] * stride,) + shape[axis + 1 :])
    stop = [
        (shape[axis] - 1) * stride + 1 if i == axis else d for i, d in enumerate(flat.type.shape)
    ]
    return b.atomic.slice(flat, start=[0] * len(shape), stop=stop, step=[1] * len(shape))


@register_hl
class ConvTranspose1dOp(ConvTransposeOp):
    """1-D transposed convolution of x [N, C, L] with w [C, O/groups, K] plus the optional
    bias [O].
    `%y = hl.conv_transpose1d %x, %w {groups = 2, strides = [3]} : (tensor<1x4x5xf32>, tensor<4x1x2xf32>) -> tensor<1x2x14xf32>`
    """

    name = "hl.conv_transpose1d"
    spatial = 1


@register_hl
class ConvTranspose2dOp(ConvTransposeOp):
    """2-D transposed convolution of x [N, C, H, W] with w [C, O/groups, kH, kW] plus the
    optional bias [O] (PyTorch's ConvTranspose2d, ONNX's ConvTranspose with explicit pads).
    `%y = hl.conv_transpose2d %x, %w, %b {output_padding = [1, 1], pads = [1, 1, 1, 1], strides = [2, 2]} : (tensor<1x4x5x5xf32>, tensor<4x3x3x3xf32>, tensor<3xf32>) -> tensor<1x3x10x10xf32>`
    """

    name = "hl.conv_transpose2d"
    spatial = 2


@register_hl
class ConvTranspose3dOp(ConvTransposeOp):
    """3-D transposed convolution of x [N, C, D, H, W] with w [C, O/groups, kD, kH, kW] plus
    the optional bias [O].
    `%y = hl.conv_transpose3d %x, %w {strides = [2, 2, 2]} : (tensor<1x2x2x2x2xf32>, tensor<2x2x2x2x2xf32>) -> tensor<1x2x4x4x4xf32>`
    """

    name = "hl.conv_transpose3d"
    spatial = 3
