"""The one gate between IR strings and generated source.

IR names are arbitrary strings (`"func.func"() ... {sym_name = "f\\n#define X ..."}` is valid
IR), so nothing from the IR may be pasted into C++ or DOT text as it is. Everything that does
reach generated code goes through one of these:

- `c_identifier(name, prefix)`: a C identifier made of `[A-Za-z0-9_]`, prefixed (so never a
  keyword, never starting with a digit or `_`), without `__` (reserved in C++), a long name cut
  and suffixed with a hash of the whole name. Lossy: `f.x` and `f_x` give the same text.
- `NameAllocator`: the symbols of one translation unit. It sanitises, then appends `_1`, `_2`,
  ... until the name (and the names derived from it, such as `<f>_scratch_bytes`) collide with
  nothing allocated or reserved before. Unique by construction, whatever the IR names.
- `display_name(text)`: printable ASCII that shows the name unambiguously: control characters,
  non-ASCII and the characters that mean something in a comment, a string or a format (`\\`,
  `"`, `%`, `?` (trigraphs), `*` (`*/`)) become `\\xNN` / `\\uNNNN` / `\\UNNNNNNNN`. The
  result never holds a backslash that is not followed by `x`, `u` or `U`, so it cannot splice
  lines or end a string, and it holds no `*/`.
- `comment_text(text)`: `display_name` of at most COMMENT_LIMIT characters: safe in `//` and
  `/* */`, and what the standalone main() prints as a function's name.
- `c_string_literal(text)`: a quoted C string literal whose bytes are exactly the UTF-8 of
  `text` (octal escapes, so no escape can swallow the next character).
- `dot_string(text)`: a quoted Graphviz string: `"` escaped, `\\` and characters that are not
  printable shown as `\\xNN` / `\\uNNNN` (Graphviz reads UTF-8, so other text stays as is), at
  most LABEL_LIMIT characters of the text.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable

MAX_IDENTIFIER = 96  # characters of a sanitised identifier before derived suffixes
HASH_CHARS = 8
COMMENT_LIMIT = 160  # characters of a name shown in a comment
LABEL_LIMIT = 200  # characters of a DOT label (Graphviz cannot lay out a node 10k characters wide)
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_SHOWN_AS_IS = frozenset(chr(c) for c in range(0x20, 0x7F)) - set('\\"%?*')


def _digest(text: str) -> str:
    data = text.encode("utf-8", "surrogatepass")
    return hashlib.sha256(data).hexdigest()[:HASH_CHARS]


def c_identifier(name: str, prefix: str = "tgc_", limit: int = MAX_IDENTIFIER) -> str:
    """`prefix` + `name` with every run of characters outside [A-Za-z0-9] turned into one `_`.
    A result longer than `limit` is cut and gets `_h<hash of name>`, so two long names that
    share a prefix stay distinct; a name with nothing left (`"αβ"`) is `h<hash>`. `prefix`
    must itself be an identifier (it is tgc's own)."""
    assert _IDENTIFIER.fullmatch(prefix) and not prefix.startswith("_"), prefix
    text = re.sub(r"[^A-Za-z0-9]+", "_", name).strip("_") or f"h{_digest(name)}"
    ident = prefix.rstrip("_") + "_" + text
    if len(ident) > limit:
        head = ident[: max(len(prefix), limit - HASH_CHARS - 2)].rstrip("_")
        ident = f"{head}_h{_digest(name)}"
    return ident


def identifiers_in(text: str) -> set[str]:
    """Every identifier-like token of `text` (to reserve the names a fixed template uses)."""
    return set(_IDENTIFIER.findall(text))


class NameAllocator:
    """The C symbols of one emitted translation unit, each allocated once."""

    def __init__(self, reserved: Iterable[str] = ()) -> None:
        self.taken: set[str] = set(reserved)

    def allocate(self, name: str, prefix: str = "tgc_", forms: Iterable[str] = ()) -> str:
        """A fresh identifier for the IR name `name`. `forms` are format strings of the other
        symbols derived from it (`"{}_scratch_bytes"`): they must be free too, and are taken."""
        return self._take(c_identifier(name, prefix), forms)

    def derive(self, symbol: str, suffix: str) -> str:
        """A fresh identifier `symbol + suffix` for tgc's own text (`tgc_run_f` + `_const0`),
        suffixed like `allocate` if something already has it."""
        assert _IDENTIFIER.fullmatch(symbol + suffix), symbol + suffix
        return self._take(symbol + suffix, ())

    def _take(self, base: str, forms: Iterable[str]) -> str:
        forms = ("{}",) + tuple(forms)
        candidate, n = base, 0
        while any(f.format(candidate) in self.taken for f in forms):
            n += 1
            candidate = f"{base}_{n}"
        self.taken.update(f.format(candidate) for f in forms)
        return candidate


def _escape_char(c: str) -> str:
    code = ord(c)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def display_name(text: str, limit: int | None = None) -> str:
    """Printable ASCII that shows `text` unambiguously (see the module docstring); with `limit`,
    at most that many of its characters (a longer text says how long it was)."""
    shown = "".join(c if c in _SHOWN_AS_IS else _escape_char(c) for c in text[:limit])
    if limit is not None and len(text) > limit:
        shown += f"... ({len(text)} characters)"
    return shown


def comment_text(text: str, limit: int = COMMENT_LIMIT) -> str:
    """`text` fit for one line of a C/C++ comment (`//` or `/* */`): `display_name` of at most
    `limit` of its characters."""
    return display_name(text, limit)


def c_string_literal(text: str) -> str:
    """A C string literal (with its quotes) holding the UTF-8 bytes of `text`. Printable ASCII
    stays readable; `"`, `\\` and `?` are escaped, every other byte is a 3-digit octal escape."""
    out = ['"']
    for byte in text.encode("utf-8", "surrogatepass"):
        c = chr(byte)
        if c in '"\\?':
            out.append("\\" + c)
        elif 0x20 <= byte <= 0x7E:
            out.append(c)
        else:
            out.append(f"\\{byte:03o}")
    out.append('"')
    return "".join(out)


def dot_string(text: str, limit: int = LABEL_LIMIT) -> str:
    """A quoted Graphviz string showing `text` (at most `limit` of its characters) on one line.
    In a DOT label a backslash starts an escape (`\\n`, `\\N`, ...), so every backslash is
    doubled, those of the escapes included."""
    shown = "".join(c if c.isprintable() and c != "\\" else _escape_char(c) for c in text[:limit])
    if len(text) > limit:
        shown += f"... ({len(text)} characters)"
    return '"' + shown.replace("\\", "\\\\").replace('"', '\\"') + '"'


__all__ = [
    "NameAllocator",
    "c_identifier",
    "c_string_literal",
    "comment_text",
    "display_name",
    "dot_string",
    "identifiers_in",
]
