"""Lowerings of the aten ops of vision models to the hl vision ops: convolution (and its
transposed form), the pools (max_pool{k}d and max_pool{k}d_with_indices without the indices,
avg_pool{k}d, _adaptive_avg_pool{k}d where the input divides into the output), the upsampling
ops (nearest, (bi/tri)linear; nearest-exact reaches the importer as index ops) as hl.resize, native_group_norm as hl.group_norm
and the inference batch norms (_native_batch_norm_legit_no_training, and native_batch_norm /
batch_norm with training=False) as hl.batch_norm.

PyTorch's pads are symmetric, one per spatial dim: hl's [begins..., ends...] repeat them.
A pool's stride defaults to its kernel (an empty list in aten). An upsampling op given scale
factors maps coordinates by 1/scale; hl.resize by the sizes' ratio, the same where the output
size is the input's times the scale, which is checked (a fractional one is refused).
"""

from __future__ import annotations

from tgc.importers.torch._context import Cx
from tgc.importers.torch._registry import lowering
from tgc.ir import Value


def _spatial(cx: Cx, x: Value) -> int:
    spatial = x.type.rank - 2
    if spatial not in (1, 2, 3):
        raise cx.error(f"the input {x.type} is not [N, C, ...] with 1 to 3 spatial dims")
    return spatial


def _per_dim(cx: Cx, value, spatial: int, what: str) -> list[int]:
    """An int or a list of one or `spatial` ints as one per spatial dim."""
    values = [value] if isinstance(value, int) else [int(v) for v in value]
    if len(values) == 1:
        values = values * spatial
    if len(values) != spatial:
        raise cx.error(f"{what} {values} must have 1 or {spatial} entries")
    return values


def _without_defaults(**attributes) -> dict:
    defaults = {"strides": 1, "dilations": 1, "pads": 0, "groups": 1, "output_padding": 0}
    out = {}
    for key, value in attributes.items():
        values = value if isinstance(value, list) else [value]
        if any(v != defaults[key] for v in values):
            out[key] = value
    return out


@lowering("convolution")
def convolution(cx: Cx) -> Value:
    elem = cx.out.element_type
    x, w = cx.value("input", elem), cx.value("weight", elem)
    spatial = _spatial(cx, x)
    operands = [x, w] + ([cx.value("bias", elem)] if cx.arg("bias") is not None else [])
    pads = _per_dim(cx, cx.arg("padding"), spatial, "padding")
    options = _without_defaults(
        strides=_per_dim(cx, cx.arg("stride"), spatial, "stride"),
        dilations=_per_dim(cx, cx.arg("dilation"), spatial, "dilation"),
        pads=pads + pads,
        groups=int(cx.arg("groups")),
    )
    if cx.arg("transposed"):
        extra = _per_dim(cx, cx.arg("output_padding"), spatial, "output_padding")
        options |= _without_defaults(output_padding=extra)
        return getattr(cx.b.hl, f"conv_transpose{spatial}d")(*operands, **options)
    return getattr(cx.b.hl, f"conv{spatial}d")(*operands, **options)


def _pool_window(cx: Cx, spatial: int) -> dict:
    kernel = _per_dim(cx, cx.arg("kernel_size"), spatial, "kernel_size")
    stride = cx.args.get("stride") or kernel  # [] (the default) is the kernel
    pads = _per_dim(cx, cx.args.get("padding", 0), spatial, "padding")
    attributes = _without_defaults(
        strides=_per_dim(cx, stride, spatial, "stride"),
        pads=pads + pads,
        dilations=_per_dim(cx, cx.args.get("dilation", 1), spatial, "dilation"),
    )
    attributes["kernel"] = kernel
    if cx.args.get("ceil_mode"):
        attributes["ceil_mode"] = True
    return attributes


@lowering(
    "max_pool1d",
    "max_pool2d",
    "max_pool3d",
    "max_pool2d_with_indices",
    "max_pool3d_with_indices",
)
def max_pool(cx: Cx):
    x = cx.value("self")
    spatial = _spatial(cx, x)
    y = getattr(cx.b.hl, f"max_pool{spatial}d")(x, **_pool_window(cx, spatial))
    if not cx.node.target._opname.endswith("_with_indices"):
        return y
    if 1 in cx.used_outputs():
        raise cx.error("the indices of a max pool (argmax positions) have no tgc op")
    return (y, None)


@lowering("avg_pool1d", "avg_pool2d", "avg_pool3d")
def avg_pool(cx: Cx) -> Value:
    x = cx.value("self")
    spatial = _spatial(cx, x)
    if cx.args.get("divisor_override") is not None:
        raise cx.error("divisor_override is not supported (hl.avg_pool divides by the count)")
    attributes = _pool_window(cx, spatial)
    if cx.args.get("count_include_pad", True):  # PyTorch's default
        attributes["count_include_pad"] = True
    return getattr(cx.b.hl, f"avg_pool{spatial}d")(x, **attributes)


@lowering("_adaptive_avg_pool1d", "_adaptive_avg_pool2d", "_adaptive_avg_pool3d")
def adaptive_avg_pool(cx: Cx) -> Value:
    """An average pool with kernel = stride = input / output where the output divides the
    input (then PyTorch's adaptive windows are exactly those): an output of 1 is the global
    pool."""
    x = cx.value("self")
    spatial = _spatial(cx, x)
    outs = cx.out.shape[2:]
    ins = x.type.shape[2:]
    if any(o == 0 or n % o for n, o in zip(ins, outs)):
        raise cx.error(
            f"adaptive average pool from {list(ins)} to {list(outs)}: only outputs that divide "
            "the input are supported (uneven windows)"
        )
    kernel = [n // o for n, o in zip(ins, outs)]
    options = _without_defaults(strides=kernel)
    return getattr(cx.b.hl, f"avg_pool{spatial}d")(x, kernel=kernel, **options)


_UPSAMPLE = {  # aten op -> hl.resize's attributes
    "upsample_nearest1d": {"mode": "nearest", "coordinate": "asymmetric"},
    "upsample_nearest2d": {"mode": "nearest", "coordinate": "asymmetric"},
    "upsample_nearest3d": {"mode": "nearest", "coordinate": "asymmetric"},
    "upsample_linear1d": {"mode": "linear"},
    "upsample_bilinear2d": {"mode": "linear"},
    "upsample_trilinear3d": {"mode": "linear"},
}


@lowering(*_UPSAMPLE)
def upsample(cx: Cx) -> Value:
    x = cx.value("input" if "input" in cx.args else "self")
    _spatial(cx, x)
    attributes = dict(_UPSAMPLE[cx.node.target._opname])
    if cx.args.get("align_corners"):
        attributes["coordinate"] = "align_corners"
    ins, outs = x.type.shape[2:], cx.out.shape[2:]
    scales = cx.args.get("scale_factors")
    if scales is None:  # the .default overloads: scales_h, scales_w, ... (None: from sizes)
        scales = [v for k, v in cx.args.items() if k.startswith("scales") and v is not None]
        scales = scales or None
    if scales is not None and not attributes.get("coordinate") == "align_corners":
        for n, o, s in zip(ins, outs, scales):
            if o != n * s:
                raise cx.error(
                    f"scale factor {s} from {n} to {o} is fractional: PyTorch maps coordinates "
                    "by 1/scale, hl.resize by the sizes' ratio (give the output size instead)"
                )
    return cx.b.hl.resize(x, result_type=cx.out, **attributes)


def _channel_param(cx: Cx, name: str, default: float, channels: int, elem: str) -> Value:
    """The [C] parameter `name`, or a constant [C] of `default` where the module has none."""
    if cx.arg(name) is None:
        t = cx.out.with_shape((channels,)).with_element_type(elem)
        return cx.b.atomic.broadcast(cx.scalar(default, elem), result_type=t)
    return cx.value(name, elem)


@lowering("native_group_norm")
def group_norm(cx: Cx):
    if cx.used_outputs() & {1, 2}:
        raise cx.error("the mean and rstd results of native_group_norm are not supported")
    x = cx.value("input")
    elem, channels = x.type.element_type, x.type.shape[1]
    gamma = _channel_param(cx, "weight", 1.0, channels, elem)
    beta = _channel_param(cx, "bias", 0.0, channels, elem)
    y = cx.b.hl.group_norm(x, gamma, beta, groups=int(cx.arg("group")), eps=float(cx.arg("eps")))
    return (y, None, None)


@lowering("_native_batch_norm_legit_no_training", "native_batch_norm", "batch_norm")
def batch_norm(cx: Cx):
    """Inference batch norm with the running statistics."""
    name = cx.node.target._opname
    if name != "_native_batch_norm_legit_no_training" and cx.arg("training"):
        raise cx.error("batch norm in training mode (export the model in eval mode)")
    if name != "batch_norm" and cx.used_outputs() & {1, 2}:
        raise cx.error("the saved mean and rstd of a batch norm are not supported")
    x = cx.value("input")
    elem, channels = x.type.element_type, x.type.shape[1]
    gamma = _channel_param(cx, "weight", 1.0, channels, elem)
    beta = _channel_param(cx, "bias", 0.0, channels, elem)
    mean = cx.value("running_mean", elem)
    var = cx.value("running_var", elem)
    y = cx.b.hl.batch_norm(x, gamma, beta, mean, var, eps=float(cx.arg("eps")))
    return y if name == "batch_norm" else (y, None, None)
