"""Attribute values.

Plain Python values stand for the simple attributes so that passes read them without
unwrapping: `int`, `float`, `str`, `bool`, and `tuple` for arrays (`[0, 2, 1]`). Small classes
cover the rest: `DenseAttr` (a typed numpy constant), `SymbolRef` (`@name`), `TensorType` itself
for type attributes, `FunctionTypeAttr` for `(T, T) -> T` in `func.func`, `DictAttr` for a
dictionary (`{tgc.param, k = 1}`), and `UNIT`, the value of a key written alone (MLIR's unit
attribute: `{tgc.param}` means the key is present).

Strings and symbol names follow MLIR's spelling (`escape_string`, `unescape_string`,
`format_symbol`), shared by the parser and the printer so that printed text reads back exactly.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from tgc.types import TensorType

Attribute = object  # int | float | str | bool | tuple | DenseAttr | SymbolRef | TensorType | ...


class UnitAttr:
    """The value of a key that is written alone, `{tgc.param}`: only its presence says anything."""

    __slots__ = ()
    _instance: UnitAttr | None = None

    def __new__(cls) -> UnitAttr:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "UNIT"

    def __reduce__(self):
        return (UnitAttr, ())


UNIT = UnitAttr()


class DictAttr:
    """An immutable dictionary attribute, `{tgc.param, note = "x"}` (keys kept sorted)."""

    __slots__ = ("_items",)

    def __init__(self, entries: dict | None = None) -> None:
        self._items = tuple(sorted((entries or {}).items()))

    def as_dict(self) -> dict:
        return dict(self._items)

    def get(self, key: str, default=None):
        return dict(self._items).get(key, default)

    def __contains__(self, key: str) -> bool:
        return any(k == key for k, _ in self._items)

    def __len__(self) -> int:
        return len(self._items)

    def __eq__(self, other) -> bool:
        return isinstance(other, DictAttr) and attribute_key(self) == attribute_key(other)

    def __hash__(self) -> int:
        return hash(attribute_key(self))

    def __repr__(self) -> str:
        return f"DictAttr({dict(self._items)!r})"


@dataclass(frozen=True, slots=True)
class SymbolRef:
    name: str

    def __str__(self) -> str:
        return format_symbol(self.name)


@dataclass(frozen=True, slots=True)
class FunctionTypeAttr:
    inputs: tuple[TensorType, ...]
    results: tuple[TensorType, ...]

    def __str__(self) -> str:
        ins = ", ".join(map(str, self.inputs))
        outs = ", ".join(map(str, self.results))
        return f"({ins}) -> ({outs})"


class DenseAttr:
    """`dense<[[1.0, 2.0]]> : tensor<1x2xf32>` or the splat `dense<0.5> : tensor<f32>`.

    A constant may also live in a `.npy` file beside the .tg file, `dense_file<"w/fc.npy"> :
    tensor<768x3072xf32>` (large weights of an imported model): then `file` is the path as
    written and `array` the file's data, memory-mapped by tgc.datafiles, which also writes it."""

    __slots__ = ("type", "array", "is_splat", "file", "_key")

    def __init__(
        self,
        array: np.ndarray,
        type: TensorType,
        is_splat: bool | None = None,
        file: str | None = None,
    ):
        if file is not None:
            is_splat = False  # never scan a file-sized array for a splat
        array = np.asarray(array, dtype=type.dtype)
        if math.prod(type.shape) == 0 and (is_splat or array.size == 0):
            # No element to hold: a splat or an empty literal of a zero-size type is empty.
            array, is_splat = np.zeros(type.shape, dtype=type.dtype), False
        if is_splat is None:
            is_splat = array.size > 1 and _all_bits_equal(array)
        if is_splat and array.shape != type.shape:
            array = np.broadcast_to(array.flat[:1].reshape(()), type.shape)
        elif array.shape != type.shape:
            raise ValueError(f"dense value of shape {array.shape} does not match {type}")
        self.type = type
        self.array = array
        self.is_splat = is_splat
        self.file = file
        if file is not None:
            # One file is one constant: its path is its identity, and its bytes are not read.
            self._key = (type, "file", file)
        else:
            # A splat's key is its one element, so a huge splat never has its bytes materialized.
            data = array.flat[:1] if is_splat else array
            self._key = (type, data.tobytes())

    @classmethod
    def in_file(cls, array: np.ndarray, type: TensorType, file: str) -> DenseAttr:
        """A constant that prints as `dense_file<"file">`; whoever prints it writes the file
        (tgc.datafiles.write_dense_files)."""
        return cls(array, type, file=file)

    @classmethod
    def splat(cls, value, type: TensorType) -> DenseAttr:
        """`value` at every element, held as a broadcast view (no memory per element)."""
        return cls(np.asarray(value, dtype=type.dtype), type, is_splat=True)

    def splat_value(self):
        """The scalar of a splat (or of a one-element constant), else None."""
        if self.is_splat or self.array.size == 1:
            return self.array.flat[0].item()
        return None

    def __eq__(self, other) -> bool:
        return isinstance(other, DenseAttr) and self._key == other._key

    def __hash__(self) -> int:
        return hash(self._key)

    def __repr__(self) -> str:
        if self.file is not None:
            return f"DenseAttr(file {self.file!r} : {self.type})"
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
        return format_scalar(attr.array.flat[0], elem)

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
    if isinstance(value, DictAttr):
        return (DictAttr, tuple((k, attribute_key(v)) for k, v in value._items))
    return (type(value), value)


# -- strings and symbol names ----------------------------------------------------------------------
# MLIR's rules: a string literal may hold any character but '"', '\\' and line breaks; escapes are
# \\ \" \n \t and two hex digits (\41 is 'A'), which give bytes, so the escaped bytes must form
# UTF-8 text. tgc also refuses raw control characters (a raw tab excepted), which MLIR keeps.


class StringSyntaxError(ValueError):
    """A malformed string literal; `offset` is the index of the problem in the literal's body."""

    def __init__(self, message: str, offset: int) -> None:
        super().__init__(message)
        self.offset = offset


_ESCAPE = re.compile(r'\\(?:([\\"nt])|([0-9A-Fa-f]{2}))')
_SIMPLE_ESCAPE_BYTES = {"\\": b"\\", '"': b'"', "n": b"\n", "t": b"\t"}
# C0 and C1 controls but tab, DEL, and lone surrogates (only an API caller can pass those).
_RAW_FORBIDDEN = re.compile("[\x00-\x08\x0a-\x1f\x7f-\x9f\ud800-\udfff]")
_PLAIN_STRING = re.compile(r"[ !#-\[\]-~]*\Z")  # printable ASCII but '"' and '\\'
_SHORT_ESCAPES = {"\\": "\\\\", '"': '\\"', "\n": "\\n", "\t": "\\t"}
_BARE_SYMBOL = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*\Z")


def unescape_string(body: str) -> str:
    """The value of a string literal whose text between the quotes is `body`."""
    bad = _RAW_FORBIDDEN.search(body)
    if bad is not None:
        raise StringSyntaxError(_raw_character_message(bad.group()), bad.start())
    if "\\" not in body:
        return body
    data = bytearray()
    pieces: list[tuple[int, int]] = []  # (index in data, offset in body) where each piece starts
    i = 0
    while (j := body.find("\\", i)) >= 0:
        if j > i:
            pieces.append((len(data), i))
            data += body[i:j].encode()
        m = _ESCAPE.match(body, j)
        if m is None:
            raise StringSyntaxError(_unknown_escape_message(body, j), j)
        pieces.append((len(data), j))
        simple = m.group(1)
        data += _SIMPLE_ESCAPE_BYTES[simple] if simple else bytes((int(m.group(2), 16),))
        i = m.end()
    if i < len(body):
        pieces.append((len(data), i))
        data += body[i:].encode()
    try:
        return data.decode()
    except UnicodeDecodeError as e:
        offset = max(off for start, off in pieces if start <= e.start)
        raise StringSyntaxError(
            "escaped bytes in a string literal are not UTF-8 text", offset
        ) from None


def _raw_character_message(ch: str) -> str:
    if "\ud800" <= ch <= "\udfff":
        return f"invalid character U+{ord(ch):04X} (a lone surrogate) in a string literal"
    escaped = "".join(f"\\{b:02X}" for b in ch.encode())
    return f"control character U+{ord(ch):04X} in a string literal (write it as {escaped})"


def _unknown_escape_message(body: str, j: int) -> str:
    after = body[j + 1 : j + 2]
    shown = "\\" + after if after.isprintable() and after else "\\"
    return (
        f"unknown escape '{shown}' in a string literal (allowed: \\\\, \\\", \\n, \\t and two hex "
        "digits such as \\41)"
    )


def escape_string(s: str) -> str:
    """`s` as a string literal: printable text as is, other characters as hex UTF-8 bytes."""
    if _PLAIN_STRING.match(s):
        return f'"{s}"'
    out = []
    for ch in s:
        short = _SHORT_ESCAPES.get(ch)
        if short is not None:
            out.append(short)
        elif " " <= ch <= "~" or (ch > "\x7f" and ch.isprintable()):
            out.append(ch)
        else:
            out.append("".join(f"\\{b:02X}" for b in ch.encode("utf-8", "surrogatepass")))
    return '"' + "".join(out) + '"'


def format_symbol(name: str) -> str:
    """`@name`, quoted as MLIR does (`@"weird name"`) unless it is a plain identifier."""
    return "@" + (name if _BARE_SYMBOL.match(name) else escape_string(name))
