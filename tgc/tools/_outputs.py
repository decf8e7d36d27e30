"""Output paths of the tools that write files (tgc-translate, tgc-import): checked before any
byte is written.

An output may never be one of the command's inputs (the model, the .tg file, a weights file it
reads): `tgc-translate s.tg --emit=cuda -o s.tg` would replace the program with its CUDA code.
Paths are compared as files (`os.path.samefile`: symbolic and hard links to the input count),
else, for a path that does not exist yet, as resolved paths. An output that exists must be a
regular file or a character device (`-o /dev/null` discards; a folder or a FIFO is refused, not
opened), and its folder must exist.

Nor may an output be the measurement database a command reads or writes, or one of the files
sqlite keeps beside it (`check_not_database`): `tgc-db export -o m.sqlite` would replace every
record with their JSON.
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


def data_files(module, source: str) -> list[Path]:
    """The .npy files the module's dense_file constants read (inputs too); `source` is the
    module's file ('-': stdin), which their paths are relative to."""
    from tgc import datafiles

    base = Path.cwd() if source == "-" else Path(source).parent
    out = []
    for attr in datafiles.file_constants(module):
        try:
            out.append(datafiles.resolve(base, attr.file))
        except datafiles.DataFileError:
            continue  # the parser has refused such a path already
    return out


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
        if path.exists() and not (path.is_file() or path.is_char_device()):
            raise TgcError(f"could not write {what} file '{output}': it is not a regular file")
        if not path.parent.is_dir():
            raise TgcError(f"could not write {what} file '{output}': its folder does not exist")
    except (OSError, ValueError) as e:  # a NUL in the path, a symbolic-link loop
        raise TgcError(f"could not write {what} file '{output!r}': {e}") from None


# The files sqlite keeps beside a database while it writes (rollback journal, WAL and its index).
SIDE_FILES = ("-journal", "-wal", "-shm")


def database_files(database: str) -> list[tuple[str, str]]:
    """(path, what it is) for the measurement database and the side files sqlite keeps beside
    it."""
    found = [(database, f"the measurement database '{database}'")]
    for suffix in SIDE_FILES:
        found.append((database + suffix, f"a file sqlite keeps beside the database '{database}'"))
    return found


def check_not_database(output: str, database: str, what: str = "output") -> None:
    """Refuse, in one line, an output path (not '-') that is the measurement database or one of
    its side files (any spelling or link of them). Call it before reading or writing anything."""
    if output == "-":
        return
    for path, which in database_files(database):
        if same_file(output, path):
            raise TgcError(
                f"refusing to write {what} file '{output}': it is {which} (give -o another path)"
            )
