"""Source locations and MLIR-style diagnostics.

Every user-facing error in tgc is a `TgcError` carrying a `Location`; tools print it as

    model.tg:7:8: error: 'hl.softmax' op axis 2 out of range for rank 2
      %y = hl.softmax %x {axis = 2} : (tensor<4x16xf32>) -> tensor<4x16xf32>
           ^

Source text is kept in a process-wide `SOURCES` table so a diagnostic can show its line without
the caller passing the text around.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True, slots=True)
class Location:
    """A position in a source file, 1-based line and column."""

    file: str
    line: int
    col: int

    def __str__(self) -> str:
        return f"{self.file}:{self.line}:{self.col}"


UNKNOWN_LOC = Location("<unknown>", 0, 0)


class SourceTable:
    """Remembers the text of every parsed buffer so diagnostics can quote source lines."""

    def __init__(self) -> None:
        self._lines: dict[str, list[str]] = {}

    def add(self, name: str, text: str) -> None:
        # Lines end at '\n' only, as the lexer counts them (splitlines would also break at form
        # feeds and U+2028, and quote the wrong line).
        lines = text.split("\n")
        if lines[-1] == "":
            lines.pop()
        self._lines[name] = lines

    def line(self, loc: Location) -> str | None:
        lines = self._lines.get(loc.file)
        if lines is None or not 1 <= loc.line <= len(lines):
            return None
        return _visible(lines[loc.line - 1].removesuffix("\r"))


SOURCES = SourceTable()


@dataclass
class Note:
    loc: Location | None
    message: str


@dataclass
class TgcError(Exception):
    """A diagnostic for bad user input. Never shown as a traceback (unless --debug)."""

    message: str
    loc: Location | None = None
    notes: list[Note] = field(default_factory=list)

    def __str__(self) -> str:
        return self.render()

    def render(self, severity: str = "error") -> str:
        parts = [_render_one(self.loc, severity, self.message)]
        parts += [_render_one(n.loc, "note", n.message) for n in self.notes]
        return "\n".join(parts)


class VerifyError(TgcError):
    """Raised by op verifiers; the verifier driver fills in the op's location."""


def printable(text: str) -> str:
    """`text` from outside tgc (a name in a model, a path) as it may appear in a one-line
    diagnostic: newline, ESC, NUL and every other non-printable character shown as an escape
    (\\n, \\t, \\x1b, \\x00, \\u2028), so that it can neither forge a line nor reach the
    terminal as a control."""
    if text.isprintable():
        return text
    out = []
    for c in text:
        if c.isprintable():
            out.append(c)
        else:
            out.append(repr(c)[1:-1] if c not in "'\"" else c)
    return "".join(out)


def _visible(line: str) -> str:
    """A quoted source line with invisible characters (controls, a BOM, U+2028...) shown as
    U+FFFD, one column each, so the caret still lines up and the terminal gets no control."""
    if line.isprintable():
        return line
    return "".join(c if c.isprintable() or c == "\t" else "\ufffd" for c in line)


def _render_one(loc: Location | None, severity: str, message: str) -> str:
    if loc is None or loc is UNKNOWN_LOC:
        return f"{severity}: {message}"
    head = f"{loc}: {severity}: {message}"
    text = SOURCES.line(loc)
    if text is None:
        return head
    caret = " " * (max(loc.col, 1) - 1) + "^"
    return f"{head}\n{text}\n{caret}"
