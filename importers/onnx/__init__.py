"""ONNX models as tgc modules.

    from tgc.importers.onnx import import_onnx
    module = import_onnx("model.onnx")                 # a verified builtin.module, one func.func
    module = import_onnx(model_proto, weights_as_args=True, input_shapes={"ids": (1, 128)})

Reads opset 13 and later. A model tgc cannot express (an op, an attribute value, an element type,
a dynamic shape) is refused with one `TgcError` naming the node, its op type and what is not
supported; a file that is not a valid ONNX model is refused the same way.

The walker is graph.py, the converter registry registry.py, what a converter sees context.py;
converters live in the `ops_*.py` modules, one per family, all imported below.
"""

from __future__ import annotations

import importlib
import os
import pkgutil
from pathlib import Path

import onnx
from onnx import ModelProto

import tgc.dialects  # noqa: F401  (registers the ops the converters build)
from tgc.builtin import ModuleOp
from tgc.diagnostics import TgcError

from .graph import DEFAULT_INLINE_LIMIT, FileLocation, GraphImporter, ImportOptions, ImportResult
from .registry import supported_op_types

__all__ = ["DEFAULT_INLINE_LIMIT", "ImportResult", "import_model", "import_onnx", "load_model"]

# Every converter family registers its ops when imported.
for _module in pkgutil.iter_modules(__path__):
    if _module.name.startswith("ops_"):
        importlib.import_module(f"{__name__}.{_module.name}")


def import_onnx(
    source: str | os.PathLike | bytes | ModelProto,
    *,
    weights_as_args: bool = False,
    inline_limit: int = DEFAULT_INLINE_LIMIT,
    weights_dir: str | None = None,
    name: str | None = None,
    input_shapes: dict[str, tuple[int, ...]] | None = None,
) -> ModuleOp:
    """Import an ONNX model (a path, the bytes of a .onnx file, or a ModelProto) as a module.

    weights_as_args: float initializers of more than one element become function arguments
    marked `{tgc.param}` instead of constants. weights_dir: constants of more than
    `inline_limit` elements refer to `<weights_dir>/<name>.npy` (relative to the .tg file
    the module is written to; `import_model` returns the arrays to write there); None keeps
    every constant inline. name: the function's name (default: the graph's, else "main").
    input_shapes: static shapes for graph inputs whose ONNX shape has symbolic dims.
    """
    return import_model(
        source,
        weights_as_args=weights_as_args,
        inline_limit=inline_limit,
        weights_dir=weights_dir,
        name=name,
        input_shapes=input_shapes,
    ).module


def import_model(source, **options) -> ImportResult:
    """As `import_onnx`, also returning the arrays of file-backed constants by path."""
    model, display = load_model(source)
    opts = ImportOptions(**{k: v for k, v in options.items() if v is not None})
    return GraphImporter(model, display, opts).run()


def load_model(source) -> tuple[ModelProto, str]:
    """(the checked model, the name diagnostics use for it)."""
    if isinstance(source, ModelProto):
        display = "<onnx model>"
        model = source
    elif isinstance(source, (bytes, bytearray)):
        display = "<onnx bytes>"
        model = _parse(bytes(source), display)
    else:
        display = os.fspath(source)
        model = _parse(_read(display), display)
        _load_external_data(model, display)
    if not isinstance(source, (str, os.PathLike)):
        _refuse_external_data(model, display)
    _check(model, display)
    return model, display


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except FileNotFoundError:
        raise TgcError(f"could not open input file '{path}': no such file or directory") from None
    except IsADirectoryError:
        raise TgcError(f"could not open input file '{path}': it is a directory") from None
    except OSError as e:
        raise TgcError(f"could not read input file '{path}': {e.strerror or e}") from None


def _parse(data: bytes, display: str) -> ModelProto:
    model = ModelProto()
    try:
        model.ParseFromString(data)
    except Exception:  # protobuf's DecodeError and friends: truncated or not protobuf at all
        raise TgcError(
            "not a valid ONNX model (the file is not a readable ONNX protobuf: truncated or "
            "corrupt?)",
            FileLocation(display, 0, 0),
        ) from None
    return model


def _load_external_data(model: ModelProto, path: str) -> None:
    from onnx.external_data_helper import load_external_data_for_model, uses_external_data

    tensors = list(model.graph.initializer)
    if not any(uses_external_data(t) for t in tensors):
        return
    try:
        load_external_data_for_model(model, str(Path(path).parent))
    except Exception as e:
        raise TgcError(
            f"could not load the model's external data: {_first_line(e)}",
            FileLocation(path, 0, 0),
        ) from None


def _refuse_external_data(model: ModelProto, display: str) -> None:
    """Without a path there is no folder to find external data in (not the working directory)."""
    from onnx.external_data_helper import uses_external_data

    for tensor in model.graph.initializer:
        if uses_external_data(tensor):
            raise TgcError(
                f"initializer '{tensor.name}' keeps its data in an external file: import the "
                "model from its path, so that the file is found beside it",
                FileLocation(display, 0, 0),
            )


def _check(model: ModelProto, display: str) -> None:
    """onnx.checker, so that bytes protobuf happens to parse (garbage can) are refused."""
    try:
        onnx.checker.check_model(model)
    except Exception as e:
        raise TgcError(
            f"not a valid ONNX model: {_first_line(e)}", FileLocation(display, 0, 0)
        ) from None


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def supported_ops() -> list[str]:
    """The ONNX op types tgc-import converts."""
    return supported_op_types()
