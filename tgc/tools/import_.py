"""tgc-import: an ONNX model as a .tg module.

tgc-import model.onnx -o model.tg          # large constants in model.weights/*.npy
tgc-import model.onnx -o -                 # to stdout, every constant inline
tgc-import model.onnx --weights-as-args --input-shape ids=1x128 -o model.tg
"""

from __future__ import annotations

import argparse
import sys
import textwrap
from pathlib import Path

import tgc
from tgc.diagnostics import TgcError
from tgc.tools._common import EXIT_OK, guarded
from tgc.tools.opt import write_output

DEFAULT_INLINE_LIMIT = 1024  # importers.onnx.DEFAULT_INLINE_LIMIT (importing it needs onnx)

WEIGHTS_RULE = (
    "With -o FILE, constants of more than --inline-limit elements are written as NumPy files "
    "to FILE's folder, under <stem>.weights/ (model.tg -> model.weights/<value name>.npy), and "
    "the module refers to them by that relative path. The .npy files are outputs like the .tg "
    "file: importing again replaces the ones it writes and leaves other files alone; a path in "
    "the way that is not a regular file (a folder, a symbolic link) is an error. With -o - every "
    "constant is inline."
)


def input_shape(text: str) -> tuple[str, tuple[int, ...]]:
    """argparse type of --input-shape: NAME=DIMS, DIMS as 1x128 (empty for a scalar)."""
    name, eq, dims = text.rpartition("=")
    if not eq or not name:
        raise argparse.ArgumentTypeError(f"expected NAME=DIMS (e.g. ids=1x128), got '{text}'")
    try:
        shape = tuple(int(d) for d in dims.split("x")) if dims else ()
    except ValueError:
        shape = (-1,)
    if any(d < 0 for d in shape):
        raise argparse.ArgumentTypeError(
            f"DIMS must be non-negative integers joined by 'x' (e.g. 1x128), got '{dims}'"
        )
    return name, shape


def inline_limit(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = -1
    if value < 0:
        raise argparse.ArgumentTypeError(f"N must be a non-negative integer, got '{text}'")
    return value


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tgc-import",
        description="Import an ONNX model (opset 13 and later) as a .tg module.",
        epilog=textwrap.fill(WEIGHTS_RULE, 79),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("input", help="the .onnx file ('-' for stdin)")
    ap.add_argument("-o", dest="output", default="-", help="output .tg file (default: stdout)")
    ap.add_argument(
        "--weights-as-args",
        action="store_true",
        help="float initializers of more than one element become function arguments marked "
        "{tgc.param} instead of constants",
    )
    ap.add_argument(
        "--input-shape",
        dest="input_shapes",
        action="append",
        type=input_shape,
        default=[],
        metavar="NAME=DIMS",
        help="static shape for a graph input with symbolic dims, e.g. ids=1x128 (repeatable)",
    )
    ap.add_argument(
        "--inline-limit",
        type=inline_limit,
        default=DEFAULT_INLINE_LIMIT,
        metavar="N",
        help=f"with -o FILE, constants of more than N elements go to .npy files (default "
        f"{DEFAULT_INLINE_LIMIT})",
    )
    ap.add_argument("--func-name", default=None, help="the function's name (default: the graph's)")
    ap.add_argument("--debug", action="store_true", help="show Python tracebacks for errors")
    return ap


def run(args) -> int:
    try:
        from tgc.importers.onnx import import_model
    except ImportError as e:
        raise TgcError(
            f"tgc-import needs the onnx package ({e}): pip install 'tgc[onnx]'"
        ) from None

    to_file = args.output != "-"
    if to_file and not Path(args.output).parent.is_dir():  # before anything is written
        raise TgcError(f"could not write output file '{args.output}': its folder does not exist")
    source = sys.stdin.buffer.read() if args.input == "-" else args.input
    weights_dir = f"{Path(args.output).stem}.weights" if to_file else None
    shapes = dict(args.input_shapes)
    result = import_model(
        source,
        weights_as_args=args.weights_as_args,
        inline_limit=args.inline_limit,
        weights_dir=weights_dir,
        name=args.func_name,
        input_shapes=shapes,
    )
    text = tgc.print_ir(result.module)
    if to_file:
        write_weights(result.module, Path(args.output).parent)
    write_output(args.output, text)
    return EXIT_OK


def write_weights(module, folder: Path) -> None:
    """Write every file-backed constant under `folder` (before the .tg that refers to them)."""
    from tgc import datafiles

    for attr in datafiles.file_constants(module):
        target = folder / attr.file
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise TgcError(
                f"cannot write weights file '{target}': something that is not a regular file is "
                "in the way"
            )
        try:
            datafiles.write(attr, folder)
        except (OSError, datafiles.DataFileError) as e:
            why = getattr(e, "strerror", None) or str(e)
            raise TgcError(f"could not write weights file '{target}': {why}") from None


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    tgc.load_all()
    return guarded("tgc-import", lambda: run(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
