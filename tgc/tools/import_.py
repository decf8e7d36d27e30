"""tgc-import: an ONNX model, or a PyTorch program saved by torch.export.save (.pt2), as a .tg
module.

tgc-import model.onnx -o model.tg          # large constants in model.weights/*.npy
tgc-import model.onnx -o -                 # to stdout, every constant inline
tgc-import model.onnx --weights-as-args --input-shape ids=1x128 -o model.tg
tgc-import model.pt2 -o model.tg           # parameters as constants, the large ones in .npy files
tgc-import model.pt2 --weights-as-args     # parameters as {tgc.param} arguments
"""

from __future__ import annotations

import argparse
import sys
import textwrap
import warnings
from pathlib import Path

import tgc
from tgc.diagnostics import TgcError, printable
from tgc.importers._weights import DEFAULT_INLINE_LIMIT
from tgc.tools._common import add_common_flags, parse_args, EXIT_OK, guarded, non_negative_int
from tgc.tools._outputs import check_output, same_file
from tgc.tools.opt import write_output

TORCH_SUFFIX = ".pt2"  # a program saved by torch.export.save; anything else is read as ONNX

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


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tgc-import",
        description="Import an ONNX model (opset 13 and later), or a PyTorch program saved by\n"
        "torch.export.save (a .pt2 file), as a .tg module.",
        epilog=textwrap.fill(WEIGHTS_RULE, 79),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument(
        "input", help="the .onnx file ('-' for stdin), or a .pt2 file (torch.export.save)"
    )
    ap.add_argument("-o", dest="output", default="-", help="output .tg file (default: stdout)")
    ap.add_argument(
        "--weights-as-args",
        action="store_true",
        help="float initializers of more than one element (ONNX), the parameters and buffers "
        "(.pt2), become function arguments marked {tgc.param} instead of constants",
    )
    ap.add_argument(
        "--input-shape",
        dest="input_shapes",
        action="append",
        type=input_shape,
        default=[],
        metavar="NAME=DIMS",
        help="static shape for a graph input with symbolic dims, e.g. ids=1x128 (repeatable; "
        "ONNX only)",
    )
    ap.add_argument(
        "--inline-limit",
        type=non_negative_int("N"),
        default=DEFAULT_INLINE_LIMIT,
        metavar="N",
        help=f"with -o FILE, constants of more than N elements go to .npy files (default "
        f"{DEFAULT_INLINE_LIMIT})",
    )
    ap.add_argument(
        "--func",
        dest="func_name",
        default=None,
        help="the function's name (default: the graph's, else main; .pt2: forward)",
    )
    add_common_flags(ap)
    return ap


def is_torch_program(path: str) -> bool:
    return Path(path).suffix == TORCH_SUFFIX


def run(args) -> int:
    to_file = args.output != "-"
    check_output(args.output, [args.input])  # before anything is read or written
    weights_dir = f"{Path(args.output).stem}.weights" if to_file else None
    try:
        if is_torch_program(args.input):
            module = import_torch(args, weights_dir)
        else:
            module = import_onnx(args, weights_dir)
    except TgcError as e:  # names from the model: no forged line, no terminal control
        e.message = printable(e.message)
        raise
    text = tgc.print_ir(module)
    if to_file:
        write_weights(module, Path(args.output).parent, args.input)
    write_output(args.output, text)
    return EXIT_OK


def import_onnx(args, weights_dir: str | None):
    try:
        from tgc.importers.onnx import import_model
    except ImportError as e:
        raise TgcError(
            f"tgc-import needs the onnx package ({e}): pip install 'tgc[onnx]'"
        ) from None

    source = sys.stdin.buffer.read() if args.input == "-" else args.input
    result = import_model(
        source,
        weights_as_args=args.weights_as_args,
        inline_limit=args.inline_limit,
        weights_dir=weights_dir,
        name=args.func_name,
        input_shapes=dict(args.input_shapes),
    )
    return result.module


def import_torch(args, weights_dir: str | None):
    """A .pt2 file: its parameters and buffers are constants (large ones in files), or with
    --weights-as-args {tgc.param} arguments. Without PyTorch, one line says so."""
    from tgc.importers import torch as torch_importer  # imports PyTorch only when called

    with warnings.catch_warnings():
        # PyTorch's deprecation notes about its own internals (run_decompositions deep-copies
        # tree specs) are nothing a user of tgc-import can act on.
        warnings.simplefilter("ignore", FutureWarning)
        return torch_importer.import_file(
            args.input,
            params_as_args=args.weights_as_args,
            name=args.func_name or "forward",
            weights_dir=weights_dir,
            inline_limit=args.inline_limit,
        )


def write_weights(module, folder: Path, source: str = "-") -> None:
    """Write every file-backed constant under `folder` (before the .tg that refers to them),
    each target checked first: none may be the model read, or anything but a regular file."""
    from tgc import datafiles

    attrs = list(datafiles.file_constants(module))
    for attr in attrs:
        target = folder / attr.file
        if source != "-" and same_file(target, source):
            raise TgcError(f"refusing to write weights file '{target}': it is the input '{source}'")
        if target.is_symlink() or (target.exists() and not target.is_file()):
            raise TgcError(
                f"cannot write weights file '{target}': something that is not a regular file is "
                "in the way"
            )
    for attr in attrs:
        target = folder / attr.file
        try:
            datafiles.write(attr, folder)
        except (OSError, datafiles.DataFileError) as e:
            why = getattr(e, "strerror", None) or str(e)
            raise TgcError(f"could not write weights file '{target}': {why}") from None


def main(argv: list[str] | None = None) -> int:
    ap = build_arg_parser()
    args = parse_args(ap, argv)
    if args.input_shapes and is_torch_program(args.input):
        ap.error(
            "--input-shape is for ONNX models only: a .pt2 program has the static shapes it "
            "was exported with"
        )
    tgc.load_all()
    return guarded("tgc-import", lambda: run(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
