"""Converters of the ops whose outputs are known at import: Shape and Size (the type says
them), ConstantOfShape and Range (from inputs that must be known), EyeLike and the windows
HannWindow, HammingWindow, BlackmanWindow (from a shape or a size). Each returns a numpy array;
the walker makes it a constant where an op reads it as a value.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.types import NUMPY_DTYPES

from .context import NodeContext
from .dtypes import element_type, onnx_type_name
from .registry import converter


def _ints(array: np.ndarray) -> list[int]:
    return [int(v) for v in np.asarray(array).reshape(-1)]


def _dtype(ctx: NodeContext, code: int, what: str) -> np.dtype:
    elem = element_type(code)
    if elem is None:
        raise ctx.error(f"{what} {onnx_type_name(code)} is not supported")
    return NUMPY_DTYPES[elem]


@converter("Shape")
def shape(ctx: NodeContext):
    """The input's shape (int64), dims start..end (negative from the end, clamped)."""
    dims = ctx.input_type(0).shape
    rank = len(dims)
    start, end = ctx.attr("start", 0), ctx.attr("end", rank)
    start = min(max(start + rank if start < 0 else start, 0), rank)
    end = min(max(end + rank if end < 0 else end, 0), rank)
    return np.array(dims[start:end], dtype=np.int64)


@converter("Size")
def size(ctx: NodeContext):
    return np.array(ctx.input_type(0).num_elements, dtype=np.int64)


@converter("ConstantOfShape")
def constant_of_shape(ctx: NodeContext):
    """A tensor of `shape` filled with `value` (a one-element tensor, default float32 0)."""
    dims = _ints(ctx.require_static(0, "'shape'"))
    if any(d < 0 for d in dims):
        raise ctx.error(f"shape {dims} has a negative dim")
    value = ctx.attr("value", None)
    value = np.zeros(1, np.float32) if value is None else np.asarray(value)
    if value.size != 1:
        raise ctx.error(f"'value' must have one element, got {value.size}")
    return np.full(dims, value.reshape(()), dtype=value.dtype)


@converter("Range")
def range_(ctx: NodeContext):
    """start, start + delta, ... up to limit (excluded), in start's element type."""
    start = ctx.require_static(0, "'start'")
    limit = ctx.require_static(1, "'limit'")
    delta = ctx.require_static(2, "'delta'")
    if any(v.size != 1 for v in (start, limit, delta)):
        raise ctx.error("start, limit and delta must be scalars")
    if delta.reshape(()) == 0:
        raise ctx.error("delta must not be 0")
    start, limit, delta = (v.reshape(()) for v in (start, limit, delta))
    count = max(math.ceil((float(limit) - float(start)) / float(delta)), 0)
    return (start + np.arange(count, dtype=start.dtype) * delta).astype(start.dtype)


@converter("EyeLike")
def eye_like(ctx: NodeContext):
    """A 2-D tensor of the input's shape with ones on diagonal k, of `dtype` (default the
    input's element type): known at import."""
    t = ctx.input_type(0)
    if t.rank != 2:
        raise ctx.error(f"needs a 2-D input, got {t}")
    code = ctx.attr("dtype", None)
    dtype = t.dtype if code is None else _dtype(ctx, code, "dtype")
    return np.eye(*t.shape, k=ctx.attr("k", 0), dtype=dtype)


# Cosine sums: w[n] = sum_j c_j cos(2 pi j n / N), N the size (periodic) or the size - 1.
WINDOWS = {
    "HannWindow": (0.5, -0.5),
    "HammingWindow": (25 / 46, -21 / 46),
    "BlackmanWindow": (0.42, -0.5, 0.08),
}


@converter(*WINDOWS)
def window(ctx: NodeContext):
    """A window of `size` samples (a known scalar), of `output_datatype` (default float)."""
    size = ctx.require_static(0, "'size'")
    if size.size != 1 or int(size.reshape(())) < 0:
        raise ctx.error(f"size must be one non-negative integer, got {_ints(size)}")
    count = int(size.reshape(()))
    dtype = _dtype(ctx, ctx.attr("output_datatype", 1), "output_datatype")
    period = count if ctx.attr("periodic", 1) else count - 1
    if period == 0:  # one sample of a symmetric window: 1, as torch.*_window gives
        return np.ones(count, dtype)
    n = np.arange(count, dtype=np.float64)
    values = sum(
        c * np.cos(2 * math.pi * j * n / period) for j, c in enumerate(WINDOWS[ctx.op_type])
    )
    return np.asarray(values).astype(dtype)
