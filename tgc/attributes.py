"""Attribute values.

Plain Python values stand for the simple attributes so that passes read them without
unwrapping: `int`, `float`, `str`, `bool`, and `tuple` for arrays (`[0, 2, 1]`). Three small
classes cover the rest: `DenseAttr` (a typed numpy constant), `SymbolRef` (`@name`) and
`TensorType` itself for type attributes. `FunctionTypeAttr` holds `(T, T) -> T` for `func.func`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from tgc.types import TensorType

Attribute = object  # int | float | str | bool | tuple | DenseAttr | SymbolRef | TensorType | ...


@dataclass(frozen=True, slots=True)
class SymbolRef:
    name: str

    def __str__(self) -> str:
        return f"@{self.name}"


@dataclass(frozen=True, slots=True)
class FunctionTypeAttr:
    inputs: tuple[TensorType, ...]
    results: tuple[TensorType, ...]

    def __str__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.results))
        return f"({ins}) -> ({outs})"


class DenseAttr:
    """`dense<[[1.0, 2.0]]> : tensor<1x2xf32>` or the splat `dense<0.5> : tensor<f32>`."""

    __slots__ = ("type", "array", "is_splat", "_key")

    def __init__(self, array: np.ndarray, type: TensorType, is_splat: bool | None = None):
        array = np.asarray(array, dtype=type.dtype)
        if is_splat is None:
            is_splat = array.size > 1 and _all_bits_equal(array)
        if is_splat and array.shape != type.shape:
            array = np.broadcast_to(array.reshape(-1)[:1].reshape(()), type.shape)
        elif array.shape != type.shape:
            raise ValueError(f"dense value of shape {array.shape} does not match {type}")
        self.type = type
        self.array = array
        self.is_splat = is_splat
        self._key = (type, array.tobytes())

    @classmethod
    def splat(cls, value, type: TensorType) -> DenseAttr:
        return cls(np.full(type.shape, value, dtype=type.dtype), type, is_splat=True)

    def splat_value(self):
        """The scalar of a splat (or of a one-element constant), else None."""
        if self.is_splat or self.array.size == 1:
            return self.array.reshape(-1)[0].item()
        return None

    def __eq__(self, other) -> bool:
        return isinstance(other, DenseAttr) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        return f"DenseAttr({format_dense_body(self)} : {self.type})"


def _all_bits_equal(array: np.ndarray) -> bool:
    """Every element has the first one's bits (so -0.0 differs from 0.0, and NaNs compare)."""
    flat = np.ascontiguousarray(array).reshape(-1)
    rows = flat.view(np.uint8).reshape(flat.size, -1)
    return bool((rows == rows[:1]).all())


def format_float(x: float) -> str:
    """Shortest round-trip form, always with a '.' or exponent so it reads back as a float."""
    if math.isnan(x):
        return "nan"
    if math.isinf(x):
        return "inf" if x > 0 else "-inf"
    return _with_point(repr(float(x)))


def _with_point(text: str) -> str:
    """MLIR's float literals need a '.' in the mantissa: 1e-05 -> 1.0e-05, 3 -> 3.0."""
    mantissa, e, exponent = text.partition("e")
    if "." not in mantissa:
        mantissa += ".0"
    return mantissa + (e + exponent.lstrip("+") if e else "")


def format_scalar(value, element_type: str) -> str:
    """One element of a dense constant, as short as its own dtype allows (0.1 in f32 is 0.1)."""
    if element_type == "i1":
        return "true" if value else "false"
    if element_type.startswith("i"):
        return str(int(value))
    if math.isnan(value) or math.isinf(value):
        return format_float(float(value))
    return _with_point(str(value))  # numpy scalars print shortest round-trip for their width


def format_dense_body(attr: DenseAttr) -> str:
    elem = attr.type.element_type
    if attr.is_splat:
        return format_scalar(attr.array.reshape(-1)[0], elem)

    def nested(a: np.ndarray) -> str:
        if a.ndim == 0:
            return format_scalar(a[()], elem)
        return "[" + ", ".join(nested(sub) for sub in a) + "]"

    return nested(attr.array)


def attribute_key(value) -> tuple:
    """A hashable key that tells `1` from `1.0` and `True` (for CSE and equality)."""
    if isinstance(value, float) and math.isnan(value):
        return ("nan",)
    if isinstance(value, tuple):
        return (tuple, tuple(attribute_key(v) for v in value))
    return (type(value), value)
