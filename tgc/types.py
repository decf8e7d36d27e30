"""The tensor type: `tensor<4x16xf32>`, `tensor<f32>`, `tensor<4x16xf32, "cuda">`.

Types are immutable and interned: `TensorType.get(...)` returns the same object for the same
shape, element type and encoding, so comparisons are cheap and parsing a type seen before is a
dictionary lookup.
"""

from __future__ import annotations

import math
import re

import ml_dtypes
import numpy as np

FLOAT_TYPES = ("f16", "bf16", "f32", "f64")
INT_TYPES = ("i1", "i8", "i32", "i64")
ELEMENT_TYPES = FLOAT_TYPES + INT_TYPES

NUMPY_DTYPES: dict[str, np.dtype] = {
    "f16": np.dtype(np.float16),
    "bf16": np.dtype(ml_dtypes.bfloat16),
    "f32": np.dtype(np.float32),
    "f64": np.dtype(np.float64),
    "i1": np.dtype(np.bool_),
    "i8": np.dtype(np.int8),
    "i32": np.dtype(np.int32),
    "i64": np.dtype(np.int64),
}
ELEMENT_TYPE_OF_DTYPE = {dt: name for name, dt in NUMPY_DTYPES.items()}

# How far a result may be from its float64 reference, by element type: relative to the largest
# finite magnitude of the reference (at least 1). `tgc-run --check` compares so, and the GPU
# route plans within it (planner/route.py). Integers and i1 compare exactly.
CHECK_TOLERANCE = {"f64": 1e-9, "f32": 2e-4, "f16": 2e-2, "bf16": 3e-2}

# Bytes per element, used by cost models and codegen.
ELEMENT_BYTES = {"f16": 2, "bf16": 2, "f32": 4, "f64": 8, "i1": 1, "i8": 1, "i32": 4, "i64": 8}

# Limits every type meets: numpy holds at most 64 dimensions, and MLIR sizes are int64.
MAX_RANK = 64
MAX_DIM = 2**63 - 1
_ENCODING = re.compile(r"[A-Za-z0-9_\-]*\Z")  # what the type syntax can spell


class TypeSyntaxError(ValueError):
    """A malformed type; `column` is the 0-based offset of the problem inside the type text."""

    def __init__(self, message: str, column: int = 0) -> None:
        super().__init__(message)
        self.column = column


class TensorType:
    __slots__ = ("shape", "element_type", "encoding", "_text")
    _interned: dict[tuple, TensorType] = {}

    shape: tuple[int, ...]
    element_type: str
    encoding: str | None

    def __new__(cls, shape, element_type: str, encoding: str | None = None) -> TensorType:
        return cls.get(tuple(shape), element_type, encoding)

    @classmethod
    def get(cls, shape: tuple[int, ...], element_type: str, encoding: str | None = None):
        key = (shape, element_type, encoding)
        found = cls._interned.get(key)
        if found is not None:
            return found
        if element_type not in ELEMENT_TYPES:
            raise ValueError(f"unknown element type '{element_type}'")
        if len(shape) > MAX_RANK or any(
            not isinstance(d, int) or not 0 <= d <= MAX_DIM for d in shape
        ):
            raise ValueError(f"invalid shape {shape}")
        if encoding is not None and not _ENCODING.match(encoding):
            raise ValueError(f"invalid encoding {encoding!r}")
        self = object.__new__(cls)
        self.shape = shape
        self.element_type = element_type
        self.encoding = encoding
        dims = "".join(f"{d}x" for d in shape)
        enc = f', "{encoding}"' if encoding is not None else ""
        self._text = f"tensor<{dims}{element_type}{enc}>"
        cls._interned[key] = self
        return self

    # Interned: identity is equality. Pickling and copying keep that property.
    def __reduce__(self):
        return (TensorType.get, (self.shape, self.element_type, self.encoding))

    def __str__(self) -> str:
        return self._text

    __repr__ = __str__

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    @property
    def dtype(self) -> np.dtype:
        return NUMPY_DTYPES[self.element_type]

    @property
    def is_float(self) -> bool:
        return self.element_type in FLOAT_TYPES

    @property
    def nbytes(self) -> int:
        return self.num_elements * ELEMENT_BYTES[self.element_type]

    def with_shape(self, shape) -> TensorType:
        return TensorType.get(tuple(shape), self.element_type, self.encoding)

    def with_element_type(self, element_type: str) -> TensorType:
        return TensorType.get(self.shape, element_type, self.encoding)

    def with_encoding(self, encoding: str | None) -> TensorType:
        return TensorType.get(self.shape, self.element_type, encoding)


def contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    """The strides, in elements, of a row-major tensor of `shape` (the last dim's is 1)."""
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return tuple(reversed(strides))


# ASCII only: Python's \d and \s would take other scripts' digits and U+2028 for whitespace.
_TYPE_BODY = re.compile(
    r'tensor<\s*((?:\d+\s*x\s*)*)([a-z0-9]+)\s*(?:,\s*"([A-Za-z0-9_\-]*)"\s*)?>\Z', re.ASCII
)
_parsed_cache: dict[str, TensorType] = {}


def parse_type(text: str) -> TensorType:
    """Parse `tensor<...>` text; raises TypeSyntaxError with a column inside `text`."""
    found = _parsed_cache.get(text)
    if found is not None:
        return found
    m = _TYPE_BODY.match(text)
    if m is None:
        raise TypeSyntaxError(_explain_bad_type(text), _bad_type_column(text))
    dims_text, elem, enc = m.groups()
    if elem not in ELEMENT_TYPES:
        raise TypeSyntaxError(
            f"unknown element type '{elem}' (expected one of {', '.join(ELEMENT_TYPES)})",
            m.start(2),
        )
    dims = [d.strip() for d in dims_text.split("x") if d.strip()]
    if len(dims) > MAX_RANK:
        raise TypeSyntaxError(f"rank {len(dims)} exceeds the maximum of {MAX_RANK}", 0)
    for d in dims:  # checked as text first: int() refuses more than 4300 digits
        if len(d.lstrip("0")) > 19 or int(d) > MAX_DIM:
            raise TypeSyntaxError(f"dimension {_shorten(d)} is larger than 2^63 - 1", text.find(d))
    result = TensorType.get(tuple(int(d) for d in dims), elem, enc)
    _parsed_cache[text] = result
    return result


def _explain_bad_type(text: str) -> str:
    if "?" in text:
        return f"dynamic dimensions are not supported in '{_visible(text)}'"
    col = _bad_type_column(text)
    if col < len(text) and not (text[col].isascii() and text[col].isprintable()):
        return f"unexpected character {_visible(text[col])} in a tensor type"
    return f"malformed tensor type '{_visible(text)}' (expected e.g. tensor<4x16xf32>)"


def _bad_type_column(text: str) -> int:
    """Column of the first character that stops `text` from being a well-formed type."""
    i = len("tensor<")
    while i < len(text) and text[i] in "0123456789x \t":
        i += 1
    return min(i, max(len(text) - 1, 0))


def _visible(text: str) -> str:
    """Type text for a message: characters other than printable ASCII as U+XXXX."""
    return "".join(c if c.isascii() and c.isprintable() else f"U+{ord(c):04X}" for c in text)


def _shorten(digits: str) -> str:
    return digits if len(digits) <= 24 else f"{digits[:20]}... ({len(digits)} digits)"
