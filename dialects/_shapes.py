"""Shape rules shared by the dialects: broadcasting, axis normalisation, matmul shapes.

Each function raises `VerifyError` with a message worded for the user; the verifier prefixes the
op name and adds the location.
"""

from __future__ import annotations

from collections.abc import Sequence

from tgc.diagnostics import VerifyError
from tgc.types import TensorType


def broadcast_shapes(*shapes: Sequence[int]) -> tuple[int, ...]:
    """numpy broadcasting of several shapes."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dim = 1
        for s in shapes:
            d = s[i - rank + len(s)] if i - rank + len(s) >= 0 else 1
            if d == 1:
                continue
            if dim not in (1, d):
                listed = " and ".join(str(tuple(s)) for s in shapes)
                raise VerifyError(f"shapes {listed} are not broadcast-compatible")
            dim = d
        out.append(dim)
    return tuple(out)


def same_element_type(types: Sequence[TensorType]) -> str:
    elems = {t.element_type for t in types}
    if len(elems) != 1:
        listed = ", ".join(str(t) for t in types)
        raise VerifyError(f"operands must have the same element type, got {listed}")
    return types[0].element_type


def same_encoding(types: Sequence[TensorType]) -> str | None:
    encs = {t.encoding for t in types}
    if len(encs) != 1:
        raise VerifyError("operands live in different memory spaces: " + ", ".join(map(str, types)))
    return types[0].encoding


def normalize_axis(axis: int, rank: int) -> int:
    """A possibly negative axis as a non-negative index; raises when out of range."""
    if rank == 0 or not -rank <= axis < rank:
        raise VerifyError(f"axis {axis} out of range for rank {rank}")
    return axis % rank


def normalize_axes(axes: Sequence[int], rank: int) -> tuple[int, ...]:
    out = tuple(normalize_axis(a, rank) for a in axes)
    if len(set(out)) != len(out):
        raise VerifyError(f"axes {list(axes)} repeat an axis")
    return out


def require_elements(t: TensorType, axes: Sequence[int], what: str) -> None:
    """A reduction without an identity (max, min, mean, softmax, ...) has no value over no
    elements: reject reducing an axis of size 0. `what` names the value ("the maximum")."""
    empty = sorted(a for a in axes if t.shape[a] == 0)
    if empty:
        listed = ", ".join(map(str, empty))
        plural = "es" if len(empty) > 1 else "is"
        raise VerifyError(
            f"reduces ax{plural} {listed} of {t}, of size 0: {what} of no elements is undefined"
        )


def reduced_shape(shape: Sequence[int], axes: Sequence[int], keepdims: bool) -> tuple[int, ...]:
    if keepdims:
        return tuple(1 if i in axes else d for i, d in enumerate(shape))
    return tuple(d for i, d in enumerate(shape) if i not in axes)


def matmul_shape(a: Sequence[int], b: Sequence[int], transpose_a: bool, transpose_b: bool):
    """np.matmul's result shape for operands of rank >= 2 (after optional transposes)."""
    if len(a) < 2 or len(b) < 2:
        raise VerifyError(f"operands must have rank >= 2, got ranks {len(a)} and {len(b)}")
    m, k = (a[-1], a[-2]) if transpose_a else (a[-2], a[-1])
    k2, n = (b[-1], b[-2]) if transpose_b else (b[-2], b[-1])
    if k != k2:
        raise VerifyError(f"contraction dimensions differ: {k} and {k2}")
    batch = broadcast_shapes(a[:-2], b[:-2])
    return batch + (m, n)
