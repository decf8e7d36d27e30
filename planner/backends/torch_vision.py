"""PyTorch's kernels for the hl vision ops (dialects/hl_conv.py, hl_pool.py, hl_image.py), as
entries of planner/backends/torch.py's table: op -> (function of the op and its operand tensors,
max_rel_error). Imported by that module only (it needs PyTorch).

The library call is used as it is where its arguments say what the op says: `F.conv{k}d`
(asymmetric pads applied first with `F.pad`), `F.conv_transpose{k}d` (asymmetric pads: the
smaller on both sides, the rest cropped), `F.max_pool{k}d` and `F.avg_pool{k}d` (symmetric pads
of at most half the kernel, which is PyTorch's limit; otherwise the input is padded explicitly,
and an average is the window sum of a depthwise convolution with ones divided by the op's own
counts), `F.group_norm`, `F.batch_norm` and `F.interpolate` (nearest with asymmetric
coordinates and floor, nearest-exact, (bi/tri)linear with half_pixel or align_corners; other
resize modes gather the op's own source indices with `index_select`). Convolutions and the
normalisations sum in another order than numpy: the torch module's SUMS bound; a max pool and a
nearest resize select elements: exact.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from tgc.dialects.hl_image import linear_taps, nearest_indices
from tgc.ir import Operation

EXACT, SUMS = 0.0, 1e-5


def _pairs(window, extra=()) -> list[int]:
    """F.pad's order: the last dim's (begin, end) first."""
    k = window.spatial
    extra = tuple(extra) or (0,) * k
    return [p for i in reversed(range(k)) for p in (window.begin(i), window.end(i) + extra[i])]


def _symmetric(window) -> bool:
    k = window.spatial
    return window.pads[:k] == window.pads[k:]


def _conv(op: Operation, x, w, b=None):
    window, k = op.window(), op.spatial
    padding = list(window.pads[:k])
    if not _symmetric(window):
        x, padding = F.pad(x, _pairs(window)), 0
    fn = getattr(F, f"conv{k}d")
    return fn(x, w, b, window.strides, padding, window.dilations, op.attr("groups"))


def _conv_transpose(op: Operation, x, w, b=None):
    window, k = op.window(), op.spatial
    both = [min(window.begin(i), window.end(i)) for i in range(k)]
    fn = getattr(F, f"conv_transpose{k}d")
    y = fn(
        x,
        w,
        b,
        window.strides,
        both,
        op.output_padding(),
        op.attr("groups"),
        window.dilations,
    )
    outs = op.results[0].type.shape[2:]
    crop = tuple(
        slice(window.begin(i) - both[i], window.begin(i) - both[i] + o) for i, o in enumerate(outs)
    )
    return y[(Ellipsis, *crop)]


def _library_pool(window) -> bool:
    """F.max_pool/avg_pool take the pads themselves: symmetric, at most half the kernel."""
    k = window.spatial
    return _symmetric(window) and all(window.pads[i] <= window.size[i] // 2 for i in range(k))


def _padded_for_windows(op: Operation, x, fill: float):
    """x padded explicitly, ceil mode's extra end included: every window is a plain one."""
    window, outs = op.window(), op.results[0].type.shape[2:]
    return F.pad(x, _pairs(window, window.extra_end(x.shape[2:], outs)), value=fill)


def _crop(op: Operation, y):
    outs = op.results[0].type.shape[2:]
    return y[(Ellipsis, *(slice(0, o) for o in outs))]


def _max_pool(op: Operation, x):
    window, k = op.window(), op.spatial
    fn = getattr(F, f"max_pool{k}d")
    if _library_pool(window):
        return fn(x, window.size, window.strides, list(window.pads[:k]), window.dilations,
                  ceil_mode=window.ceil_mode)  # fmt: skip
    padded = _padded_for_windows(op, x, -math.inf)
    return _crop(op, fn(padded, window.size, window.strides, 0, window.dilations))


def _avg_pool(op: Operation, x):
    window, k = op.window(), op.spatial
    if _library_pool(window) and window.dilations == (1,) * k:
        fn = getattr(F, f"avg_pool{k}d")
        return fn(x, window.size, window.strides, list(window.pads[:k]), window.ceil_mode,
                  bool(op.attr("count_include_pad")))  # fmt: skip
    channels = x.shape[1]
    ones = torch.ones((channels, 1) + tuple(window.size), dtype=x.dtype, device=x.device)
    conv = getattr(F, f"conv{k}d")
    padded = _padded_for_windows(op, x, 0.0)
    sums = _crop(op, conv(padded, ones, None, window.strides, 0, window.dilations, channels))
    return sums / torch.as_tensor(op.counts(), dtype=x.dtype, device=x.device)


def _group_norm(op: Operation, x, gamma, beta):
    return F.group_norm(x, op.attr("groups"), gamma, beta, op.attr("eps"))


def _batch_norm(op: Operation, x, gamma, beta, mean, var):
    return F.batch_norm(x, mean, var, gamma, beta, False, 0.0, op.attr("eps"))


_INTERPOLATE = {  # (mode, coordinate, nearest) -> F.interpolate's mode and align_corners
    ("nearest", "asymmetric", "floor"): ("nearest", None),
    ("nearest", "half_pixel", "round_prefer_ceil"): ("nearest-exact", None),
    ("linear", "half_pixel", None): ("linear", False),
    ("linear", "align_corners", None): ("linear", True),
}
_LINEAR_BY_RANK = {1: "linear", 2: "bilinear", 3: "trilinear"}


def _resize(op: Operation, x):
    mode, coordinate = op.attr("mode"), op.attr("coordinate")
    key = (mode, coordinate, op.attr("nearest") if mode == "nearest" else None)
    size = op.results[0].type.shape[2:]
    spatial = x.dim() - 2
    if key in _INTERPOLATE and (mode == "nearest" or spatial in _LINEAR_BY_RANK):
        name, corners = _INTERPOLATE[key]
        name = _LINEAR_BY_RANK[spatial] if name == "linear" else name
        return F.interpolate(x, size=size, mode=name, align_corners=corners)
    for axis, n_in, n_out in op.plan():
        if mode == "nearest":
            index = nearest_indices(n_in, n_out, coordinate, op.attr("nearest"))
            x = x.index_select(axis, torch.as_tensor(index, device=x.device))
            continue
        lo, hi, f = linear_taps(n_in, n_out, coordinate)
        shape = (-1,) + (1,) * (x.dim() - 1 - axis)
        w_hi = torch.as_tensor(f.reshape(shape), dtype=x.dtype, device=x.device)
        w_lo = torch.as_tensor((1 - f).reshape(shape), dtype=x.dtype, device=x.device)
        lower = x.index_select(axis, torch.as_tensor(lo, device=x.device))
        upper = x.index_select(axis, torch.as_tensor(hi, device=x.device))
        x = lower * w_lo + upper * w_hi
    return x


OP_FUNCTIONS = {
    **{f"hl.conv{k}d": (_conv, SUMS) for k in (1, 2, 3)},
    **{f"hl.conv_transpose{k}d": (_conv_transpose, SUMS) for k in (1, 2, 3)},
    **{f"hl.max_pool{k}d": (_max_pool, EXACT) for k in (1, 2, 3)},
    **{f"hl.avg_pool{k}d": (_avg_pool, SUMS) for k in (1, 2, 3)},
    "hl.group_norm": (_group_norm, SUMS),
    "hl.batch_norm": (_batch_norm, SUMS),
    # linear weights: F.interpolate computes them in the tensor's type, numpy's meaning in
    # float64 then rounded (a few ulp)
    "hl.resize": (_resize, SUMS),
}
