"""Converters of ONNX's convolutions and pools to the hl vision ops: Conv and ConvTranspose to
hl.conv{k}d and hl.conv_transpose{k}d, MaxPool and AveragePool to hl.max_pool{k}d and
hl.avg_pool{k}d, GlobalAveragePool and GlobalMaxPool to the same pools with the window the whole
spatial extent (k = 1, 2 or 3 spatial dims; the global pools of other ranks reduce with
hl.mean / atomic.reduce_max).

`auto_pad` is resolved here into explicit pads, as ONNX defines it: SAME_UPPER and SAME_LOWER
give ceil(L / stride) outputs, the extra pad at the end (UPPER) or the beginning (LOWER); VALID
none. ConvTranspose's `output_shape` gives its pads (the total split as ONNX's formula says).
MaxPool's second output (the argmax indices) is refused, as is a MaxPool of integers.
"""

from __future__ import annotations

import math

from tgc.ir import Value

from .context import NodeContext
from .registry import converter

AUTO_PADS = ("NOTSET", "SAME_UPPER", "SAME_LOWER", "VALID")


def _spatial_input(ctx: NodeContext) -> tuple[Value, int]:
    x = ctx.input(0)
    if not x.type.is_float:
        raise ctx.error(f"the input must be a float tensor, got {x.type}")
    spatial = x.type.rank - 2
    if spatial not in (1, 2, 3):
        raise ctx.error(
            f"the input must be [N, C, ...] with 1 to 3 spatial dims, got {x.type} (tgc has "
            "1-, 2- and 3-D windows)"
        )
    return x, spatial


def _ints(ctx: NodeContext, name: str, count: int, default: int) -> list[int]:
    values = ctx.attr(name, [default] * count)
    if len(values) != count:
        raise ctx.error(f"{name} {values} must have {count} entries, one per spatial dim")
    return [int(v) for v in values]


def _pads(ctx: NodeContext, lengths, kernel, strides, dilations) -> list[int]:
    """The explicit pads [begins..., ends...] of `pads` or `auto_pad`."""
    k = len(lengths)
    auto = ctx.attr("auto_pad", "NOTSET")
    if auto not in AUTO_PADS:
        raise ctx.error(f"auto_pad '{auto}' is not one of {', '.join(AUTO_PADS)}")
    if auto == "NOTSET":
        return _ints(ctx, "pads", 2 * k, 0)
    ctx.ignore_attr("pads")  # ONNX: pads are not used with an auto_pad
    if auto == "VALID":
        return [0] * (2 * k)
    begins, ends = [], []
    for length, size, stride, dilation in zip(lengths, kernel, strides, dilations):
        extent = dilation * (size - 1) + 1
        total = max(0, (-(-length // stride) - 1) * stride + extent - length)
        small, large = total // 2, total - total // 2
        begins.append(small if auto == "SAME_UPPER" else large)
        ends.append(large if auto == "SAME_UPPER" else small)
    return begins + ends


def _kernel(ctx: NodeContext, weight_kernel: tuple[int, ...]) -> None:
    """kernel_shape, when given, must be the weight's."""
    given = ctx.attr("kernel_shape", None)
    if given is not None and tuple(given) != tuple(weight_kernel):
        raise ctx.error(f"kernel_shape {given} differs from the weight's {list(weight_kernel)}")


_DEFAULTS = {"strides": 1, "dilations": 1, "pads": 0, "groups": 1, "output_padding": 0}


def _options(**attributes) -> dict:
    """The hl op's attributes, those at their defaults left out (the printed op stays short)."""
    out = {}
    for key, value in attributes.items():
        values = value if isinstance(value, list) else [value]
        if any(v != _DEFAULTS[key] for v in values):
            out[key] = value
    return out


class _ConvNode:
    """What Conv and ConvTranspose read alike: the input and its spatial rank, the weight and
    its kernel (checked against kernel_shape), the optional bias, strides and dilations."""

    def __init__(self, ctx: NodeContext) -> None:
        self.x, self.spatial = _spatial_input(ctx)
        self.w = ctx.input(1)
        bias = ctx.optional_input(2)
        self.operands = [self.x, self.w] + ([bias] if bias is not None else [])
        self.kernel = self.w.type.shape[2:]
        _kernel(ctx, self.kernel)
        self.strides = _ints(ctx, "strides", self.spatial, 1)
        self.dilations = _ints(ctx, "dilations", self.spatial, 1)
        self.groups = int(ctx.attr("group", 1))


@converter("Conv")
def conv(ctx: NodeContext):
    n = _ConvNode(ctx)
    pads = _pads(ctx, n.x.type.shape[2:], n.kernel, n.strides, n.dilations)
    options = _options(strides=n.strides, dilations=n.dilations, pads=pads, groups=n.groups)
    return getattr(ctx.b.hl, f"conv{n.spatial}d")(*n.operands, **options)


@converter("ConvTranspose")
def conv_transpose(ctx: NodeContext):
    n = _ConvNode(ctx)
    x, spatial, kernel, strides, dilations = n.x, n.spatial, n.kernel, n.strides, n.dilations
    extra = _ints(ctx, "output_padding", spatial, 0)
    lengths = x.type.shape[2:]
    auto = ctx.attr("auto_pad", "NOTSET")
    target = ctx.attr("output_shape", None)
    if target is None and auto in ("SAME_UPPER", "SAME_LOWER"):
        target = [length * stride for length, stride in zip(lengths, strides)]
    if target is None:
        pads = _pads(ctx, lengths, kernel, strides, dilations)
    else:
        ctx.ignore_attr("pads")
        target = [int(v) for v in target][-spatial:]
        begins, ends = [], []
        for i, out in enumerate(target):
            extent = dilations[i] * (kernel[i] - 1) + 1
            total = strides[i] * (lengths[i] - 1) + extra[i] + extent - out
            small, large = total // 2, total - total // 2
            begin, end = (small, large) if auto == "SAME_UPPER" else (large, small)
            if begin < 0:
                raise ctx.error(f"output_shape {target} is larger than the full output")
            if end < 0:  # a longer output: zeros at the end, as output_padding gives
                extra[i], end = extra[i] - end, 0
            begins.append(begin)
            ends.append(end)
        pads = begins + ends
    options = _options(
        strides=strides, dilations=dilations, pads=pads, groups=n.groups, output_padding=extra
    )
    return getattr(ctx.b.hl, f"conv_transpose{spatial}d")(*n.operands, **options)


def _pool(ctx: NodeContext, kind: str):
    x, spatial = _spatial_input(ctx)
    kernel = [int(v) for v in ctx.attr("kernel_shape")]
    if len(kernel) != spatial:
        raise ctx.error(f"kernel_shape {kernel} must have {spatial} entries")
    strides = _ints(ctx, "strides", spatial, 1)
    dilations = _ints(ctx, "dilations", spatial, 1)
    pads = _pads(ctx, x.type.shape[2:], kernel, strides, dilations)
    attributes = _options(strides=strides, dilations=dilations, pads=pads)
    attributes["kernel"] = kernel
    if ctx.attr("ceil_mode", 0):
        attributes["ceil_mode"] = True
    if kind == "avg" and ctx.attr("count_include_pad", 0):
        attributes["count_include_pad"] = True
    return getattr(ctx.b.hl, f"{kind}_pool{spatial}d")(x, **attributes)


@converter("MaxPool")
def max_pool(ctx: NodeContext):
    if ctx.has_output(1):
        raise ctx.error("the Indices output (argmax positions) is not supported")
    ctx.ignore_attr("storage_order")  # the layout of the Indices output only
    return _pool(ctx, "max")


@converter("AveragePool")
def average_pool(ctx: NodeContext):
    return _pool(ctx, "avg")


@converter("GlobalAveragePool", "GlobalMaxPool")
def global_pool(ctx: NodeContext):
    """The mean (maximum) over the spatial dims of [N, C, ...], kept as size-1 dims: the pool
    whose window is the whole image (1 to 3 spatial dims), else a reduction."""
    x = ctx.input(0)
    if not x.type.is_float or x.type.rank < 3:
        raise ctx.error(f"the input must be a float [N, C, ...] of rank >= 3, got {x.type}")
    axes = list(range(2, x.type.rank))
    spatial = x.type.shape[2:]
    if math.prod(spatial) == 0:
        raise ctx.error(f"the spatial dims of {x.type} hold no elements")
    average = ctx.op_type == "GlobalAveragePool"
    if len(spatial) <= 3:
        return getattr(ctx.b.hl, f"{'avg' if average else 'max'}_pool{len(spatial)}d")(
            x, kernel=list(spatial)
        )
    if average:
        return ctx.b.hl.mean(x, axes=axes, keepdims=True)
    return ctx.b.atomic.reduce_max(x, axes=axes, keepdims=True)
