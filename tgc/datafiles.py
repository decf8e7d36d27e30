"""Constants kept in `.npy` files beside a .tg file: `dense_file<"w/fc.npy"> : tensor<..>`.

An imported model's large weights would make its .tg file unreadable, so tgc-import writes them
as NumPy `.npy` files and the module refers to them by a path relative to the .tg file. The rules,
in one place for the parser and for whoever writes them:

- the path is relative, and it may not leave the .tg file's folder: no absolute path, no `..`,
  and no symbolic link that resolves outside (a model file must not read `/etc/shadow`);
- a text without a file (stdin, a string) resolves paths against the working directory;
- the file holds exactly the constant's shape, in its element type; bf16, which NumPy's `.npy`
  format cannot name, is stored as its raw 16-bit patterns (`uint16`);
- the data is memory-mapped read-only, so a large weight costs no memory until it is used, and
  never pickled objects (`allow_pickle=False`).
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path, PurePosixPath

import numpy as np

from tgc.attributes import DenseAttr
from tgc.ir import Operation
from tgc.types import TensorType


_NPY_MAGIC = b"\x93NUMPY"


class DataFileError(ValueError):
    """A `dense_file` that cannot be used; the message says why (the caller adds the place)."""


def resolve(base_dir: Path, written: str) -> Path:
    """The file a `dense_file<"written">` in a .tg file of folder `base_dir` names."""
    rel = PurePosixPath(written)
    if not written or rel.is_absolute() or Path(written).is_absolute():
        raise DataFileError(f"data file path '{written}' must be relative to the .tg file")
    if ".." in rel.parts:
        raise DataFileError(f"data file path '{written}' may not leave the folder of the .tg file")
    if "\0" in written:
        raise DataFileError(f"data file path {shown(written)} holds a NUL character")
    try:
        root = base_dir.resolve()
        path = (root / Path(*rel.parts)).resolve()
    except (OSError, RuntimeError, ValueError) as e:  # a symbolic-link loop (RuntimeError)
        why = "a symbolic-link loop" if isinstance(e, RuntimeError) else str(e)
        raise DataFileError(f"data file path {shown(written)} cannot be resolved: {why}") from None
    if not path.is_relative_to(root):
        raise DataFileError(
            f"data file '{written}' resolves outside the folder of the .tg file (a symbolic link)"
        )
    return path


def shown(text: str) -> str:
    """`text` quoted for a diagnostic, control characters as escapes (a NUL as \\x00)."""
    from tgc.diagnostics import printable

    return f"'{printable(text)}'"


def load(base_dir: Path, written: str, type: TensorType) -> DenseAttr:
    """Read the constant `dense_file<"written"> : type`, checking shape and element type."""
    path = resolve(base_dir, written)
    try:
        with open(path, "rb") as f:
            if f.read(len(_NPY_MAGIC)) != _NPY_MAGIC:
                raise DataFileError(f"data file '{written}' is not a .npy file (no NumPy header)")
        array = np.load(path, mmap_mode="r", allow_pickle=False)
    except DataFileError:
        raise
    except FileNotFoundError:
        raise DataFileError(f"data file '{written}' not found (looked at '{path}')") from None
    except IsADirectoryError:
        raise DataFileError(f"data file '{written}' is a directory") from None
    except (OSError, ValueError, EOFError) as e:
        raise DataFileError(f"data file '{written}' is not a readable .npy file: {e}") from None
    if not isinstance(array, np.ndarray):
        raise DataFileError(f"data file '{written}' is not a .npy array")
    stored = _stored_dtype(type)
    if array.dtype != stored or tuple(array.shape) != type.shape:
        shape = "x".join(map(str, array.shape)) or "scalar"
        raise DataFileError(
            f"data file '{written}' holds {shape} {array.dtype} values, not {type}"
            + (" (bf16 is stored as uint16 bit patterns)" if type.element_type == "bf16" else "")
        )
    if stored != type.dtype:
        array = array.view(type.dtype)
    return DenseAttr.in_file(array, type, written)


def _stored_dtype(type: TensorType) -> np.dtype:
    return np.dtype(np.uint16) if type.element_type == "bf16" else np.dtype(type.dtype)


def file_constants(root: Operation) -> Iterator[DenseAttr]:
    """Every file-backed constant under `root`, once per file."""
    seen: set[str] = set()
    for op in root.walk():
        for value in op.attributes.values():
            if isinstance(value, DenseAttr) and value.file is not None and value.file not in seen:
                seen.add(value.file)
                yield value


def write(attr: DenseAttr, base_dir: Path) -> Path:
    """Write a file-backed constant to its file under `base_dir` (folders made as needed)."""
    assert attr.file is not None, "only a constant made with DenseAttr.in_file has a file"
    path = resolve(base_dir, attr.file)
    path.parent.mkdir(parents=True, exist_ok=True)
    array = np.ascontiguousarray(attr.array)
    if attr.type.element_type == "bf16":
        array = array.view(np.uint16)
    with open(path, "wb") as f:
        np.save(f, array, allow_pickle=False)
    return path
