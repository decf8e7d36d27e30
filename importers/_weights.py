"""Where an importer puts a constant: inline in the module, or in a `.npy` file beside the .tg file.

Shared by the ONNX and the torch.export importers, so that `tgc-import` names and marks weight
files one way whatever the model's format: with a folder given, a constant of more than
`inline_limit` elements (splats excepted: they print as one value) becomes
`dense_file<"<folder>/<name>.npy">` (`DenseAttr.in_file`), `<name>` being the constant's name
with every character a file name should not hold replaced by '_' (and `_1`, `_2`, ... added to
tell equal names apart). The tool writes the files (`tgc.datafiles`); `files` holds their arrays.
"""

from __future__ import annotations

import re

import numpy as np

from tgc.attributes import DenseAttr
from tgc.types import TensorType

DEFAULT_INLINE_LIMIT = 1024

_INVALID_FILE_CHARS = re.compile(r"[^A-Za-z0-9_.\-]")


class WeightFiles:
    """The constants of one import: which are inline and which refer to which file."""

    def __init__(self, folder: str | None, inline_limit: int = DEFAULT_INLINE_LIMIT) -> None:
        self.folder = folder  # relative to the .tg file; None: every constant inline
        self.inline_limit = inline_limit
        self.files: dict[str, np.ndarray] = {}  # path in the module -> array to write there
        self._names: set[str] = set()

    def dense_attr(self, array: np.ndarray, t: TensorType, name: str) -> DenseAttr:
        """The constant `array` of type `t`, inline or in a file named after `name`."""
        attr = DenseAttr(array, t)
        big = array.size > self.inline_limit
        if attr.is_splat or not big or self.folder is None:
            return attr
        path = self._file_path(name)
        self.files[path] = array
        return DenseAttr.in_file(array, t, path)

    def _file_path(self, name: str) -> str:
        stem = _INVALID_FILE_CHARS.sub("_", name).lstrip(".") or "constant"
        candidate, n = stem, 1
        while candidate in self._names:
            candidate, n = f"{stem}_{n}", n + 1
        self._names.add(candidate)
        return f"{self.folder}/{candidate}.npy"
