"""Converters of DFT and STFT as matmuls with transform matrices known at import.

ONNX holds a complex signal as a last dim of 2 (real, imaginary), a real one as a last dim of 1.
Along one axis the transform is linear in the real and imaginary parts, so each output part is
W_re @ re + W_im @ im with W the cosines and sines of 2 pi k n / N (zero-padding or truncating
the input to the length N is leaving columns out). The other dims are grouped around the axis
so that one `atomic.matmul` per term does every signal at once, as Resize does.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.ir import Value

from .context import NodeContext
from .ops_shape import reshape_to
from .registry import converter


def _angles(rows: np.ndarray, cols: np.ndarray, length: int) -> np.ndarray:
    """2 pi (r c mod N) / N: reduced before the float product, so that equal angles are equal."""
    return 2 * math.pi * (np.outer(rows, cols) % length) / length


def _clean(w: np.ndarray) -> np.ndarray:
    """cos(pi / 2) is 6e-17 in floats: the exact zeros and ones of the transform made exact."""
    return np.where(np.abs(w) < 1e-12, 0.0, w)


def transform_matrices(
    n_in: int, length: int, inverse: bool, onesided: bool
) -> tuple[list[np.ndarray], int]:
    """The matrices [re<-re, re<-im, im<-re, im<-im] (each outputs x n_in; im rows absent for
    a real inverse) and whether the output is complex (2) or real (1)."""
    if inverse and onesided:  # the real signal whose one-sided spectrum the input is
        bins = min(n_in, length // 2 + 1)
        k = np.arange(bins)
        weight = np.where((k == 0) | ((length % 2 == 0) & (k == length // 2)), 1.0, 2.0)
        theta = _angles(np.arange(length), k, length)
        full = np.zeros((length, n_in))
        cos, sin = full.copy(), full.copy()
        cos[:, :bins] = weight * _clean(np.cos(theta)) / length
        sin[:, :bins] = -weight * _clean(np.sin(theta)) / length
        return [cos, sin], 1
    outputs = length // 2 + 1 if onesided else length
    used = min(n_in, length)
    theta = _angles(np.arange(outputs), np.arange(used), length)
    cos, sin = np.zeros((outputs, n_in)), np.zeros((outputs, n_in))
    cos[:, :used], sin[:, :used] = _clean(np.cos(theta)), _clean(np.sin(theta))
    if inverse:  # e^{+i theta} / N
        cos, sin = cos / length, sin / length
        return [cos, _clean(-sin), sin, cos], 2
    return [cos, sin, _clean(-sin), cos], 2  # e^{-i theta}


def dft_along(
    ctx: NodeContext, x: Value, axis: int, length: int, inverse: bool, onesided: bool
) -> Value:
    """The DFT of x ([..., n, ..., 1 or 2]) along `axis`, of `length` points."""
    shape = x.type.shape
    parts = shape[-1]
    n_in = shape[axis]
    matrices, out_parts = transform_matrices(n_in, length, inverse, onesided)
    before, after = math.prod(shape[:axis]), math.prod(shape[axis + 1 : -1])
    rank = x.type.rank

    def part(p: int) -> Value:
        if parts == 1:
            piece = x
        else:
            start, stop = [0] * rank, list(shape)
            start[-1], stop[-1] = p, p + 1
            piece = ctx.b.atomic.slice(x, start=start, stop=stop, step=[1] * rank)
        return reshape_to(ctx, piece, (before, n_in, after))

    inputs = [part(p) for p in range(parts)]
    outputs = []
    for o in range(out_parts):
        total = None
        for p, grouped in enumerate(inputs):
            w = matrices[2 * o + p]
            if not w.any():
                continue
            term = ctx.b.atomic.matmul(ctx.constant(w, x.type.element_type), grouped)
            total = term if total is None else ctx.b.atomic.add(total, term)
        if total is None:  # a real input's imaginary part has no term
            rows = matrices[2 * o].shape[0]
            total = ctx.b.atomic.broadcast(
                ctx.scalar(0, like=x), result_type=x.type.with_shape((before, rows, after))
            )
        rows = total.type.shape[1]
        outputs.append(reshape_to(ctx, total, shape[:axis] + (rows,) + shape[axis + 1 : -1] + (1,)))
    return outputs[0] if len(outputs) == 1 else ctx.b.atomic.concat(*outputs, axis=rank - 1)


def _scalar_int(ctx: NodeContext, i: int, what: str) -> int:
    value = ctx.require_static(i, what).reshape(-1)
    if value.size != 1:
        raise ctx.error(f"{what} must be one integer, got {value.size} values")
    return int(value[0])


def _signal(ctx: NodeContext, x: Value) -> None:
    if not x.type.is_float or x.type.rank < 2 or x.type.shape[-1] not in (1, 2):
        raise ctx.error(f"the signal {x.type} must be float with a last dim of 1 or 2")


@converter("DFT")
def dft(ctx: NodeContext):
    """Opset 17-19: axis attribute (default 1); opset 20: axis input (default -2)."""
    x = ctx.input(0)
    _signal(ctx, x)
    if ctx.opset >= 20:
        axis = _scalar_int(ctx, 2, "'axis'") if ctx.has_input(2) else -2
    else:
        axis = ctx.attr("axis", 1)
    rank = x.type.rank
    if not -rank <= axis < rank or axis % rank == rank - 1:
        raise ctx.error(f"axis {axis} must name a signal dim of {x.type}, not the last")
    axis %= rank
    inverse = bool(ctx.attr("inverse", 0))
    onesided = bool(ctx.attr("onesided", 0))
    if onesided and not inverse and x.type.shape[-1] != 1:
        raise ctx.error("a one-sided forward DFT needs a real signal (last dim 1)")
    n_in = x.type.shape[axis]
    if ctx.has_input(1):
        length = _scalar_int(ctx, 1, "'dft_length'")
    else:
        length = 2 * (n_in - 1) if inverse and onesided else n_in
    if length < 1:
        raise ctx.error(f"dft_length {length} must be positive")
    return dft_along(ctx, x, axis, length, inverse, onesided)


@converter("STFT")
def stft(ctx: NodeContext):
    """Frames of frame_length every frame_step samples, times the window, each transformed:
    [batch, frames, bins, 2]. The frames are one gather of known positions."""
    x = ctx.input(0)
    _signal(ctx, x)
    if x.type.rank != 3:
        raise ctx.error(f"the signal {x.type} must be [batch, length, 1 or 2]")
    step = _scalar_int(ctx, 1, "'frame_step'")
    window = ctx.optional_input(2)
    if ctx.has_input(3):
        frame = _scalar_int(ctx, 3, "'frame_length'")
    elif window is not None:
        frame = window.type.shape[0]
    else:
        frame = x.type.shape[1]
    onesided = bool(ctx.attr("onesided", 1))
    samples = x.type.shape[1]
    if step < 1 or not 1 <= frame <= samples:
        raise ctx.error(f"frame_step {step} and frame_length {frame} do not fit {samples} samples")
    if window is not None and window.type.shape != (frame,):
        raise ctx.error(f"the window {window.type} must have frame_length ({frame}) samples")
    frames = 1 + (samples - frame) // step
    starts = np.arange(frames)[:, None] * step + np.arange(frame)[None, :]
    framed = ctx.b.atomic.gather(x, ctx.constant(starts.astype(np.int64)), axis=1)
    if window is not None:
        framed = ctx.b.atomic.mul(framed, reshape_to(ctx, window, (frame, 1)))
    return dft_along(ctx, framed, 2, frame, False, onesided and x.type.shape[-1] == 1)
