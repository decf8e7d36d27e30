"""Output paths of the tools that write files (tgc-translate, tgc-import): checked before any
byte is written.

An output may never be one of the command's inputs (the model, the .tg file, a weights file it
reads): `tgc-translate s.tg --emit=cuda -o s.tg` would replace the program with its CUDA code.
Paths are compared as files (`os.path.samefile`: symbolic and hard links to the input count),
else, for a path that does not exist yet, as resolved paths. An output that exists must be a
regular file (a folder or a FIFO is refused, not opened), and its folder must exist.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

from tgc.diagnostics import TgcError


def same_file(a: str | os.PathLike, b: str | os.PathLike) -> bool:
    try:
        return os.path.samefile(a, b)
    except (OSError, ValueError):  # one of them does not exist (or holds a NUL)
        try:
            return os.path.realpath(a) == os.path.realpath(b)
        except (OSError, ValueError):
            return False


def check_output(output: str, inputs: Iterable[str | os.PathLike], what: str = "output") -> None:
    """Refuse, in one line, an output path (not '-') that is an input or cannot be written as a
    regular file. Call it before writing anything."""
    if output == "-":
        return
    for source in inputs:
        if source != "-" and same_file(output, source):
            raise TgcError(
                f"refusing to write {what} file '{output}': it is the input '{source}' (give -o "
                "another path)"
            )
    path = Path(output)
    try:
        if path.is_dir():
            raise TgcError(f"could not write {what} file '{output}': it is a directory")
        if path.exists() and not path.is_file():
            raise TgcError(f"could not write {what} file '{output}': it is not a regular file")
        if not path.parent.is_dir():
            raise TgcError(f"could not write {what} file '{output}': its folder does not exist")
    except (OSError, ValueError) as e:  # a NUL in the path, a symbolic-link loop
        raise TgcError(f"could not write {what} file '{output!r}': {e}") from None
