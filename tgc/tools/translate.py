"""tgc-translate: turn a module into another language: Graphviz DOT, or standalone CUDA."""

from __future__ import annotations

import argparse
import sys

import tgc
from tgc.diagnostics import TgcError
from tgc.tools._common import (
    add_common_flags,
    add_kernels,
    parse_args,
    with_kernels,
    EXIT_OK,
    guarded,
    read_input,
)
from tgc.tools._outputs import check_output, data_files
from tgc.tools.opt import write_output

EMITTERS = ("dot", "cuda")
# What --emit=cuda plans when -p does not say: what the GPU route plans (planner/standalone.py).
CUDA_PIPELINE = "lower-for-planning"


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tgc-translate", description="Translate a .tg module.")
    ap.add_argument("input", nargs="?", default="-", help="input file ('-' for stdin)")
    ap.add_argument("--emit", choices=EMITTERS, required=True, help="output language")
    ap.add_argument("-o", dest="output", default="-", help="output file (default stdout)")
    ap.add_argument(
        "-p",
        "--passes",
        default=None,
        help=f"pipeline to run first (for cuda: what is planned for the GPU, by default "
        f"'{CUDA_PIPELINE}'; '' plans the module as written, 'optimize' lowers attention too)",
    )
    ap.add_argument(
        "--arch",
        default=None,
        help="the GPU the .cu is for, as nvcc names it (e.g. sm_90: the attention kernel is then "
        "the wgmma one, which needs sm_90a); default: kernels for any sm_80 or later",
    )
    ap.add_argument(
        "--no-libraries",
        action="store_true",
        help="cuda: plan on tgc's generated kernels alone (no cuBLAS or cuBLASLt calls): a file "
        "that needs only the CUDA runtime",
    )
    add_kernels(ap)
    add_common_flags(ap)
    return ap


def run(args) -> int:
    from tgc.codegen.render import is_gpu_arch
    from tgc.parser import parse_module
    from tgc.pass_manager import PassManager, parse_pipeline
    from tgc.verifier import verify

    if args.arch is not None and not is_gpu_arch(args.arch):
        raise TgcError(f"--arch: '{args.arch}' is not a GPU as nvcc names one (e.g. sm_90)")
    check_output(args.output, [args.input])
    text, name = read_input(args.input)
    module = parse_module(text, name)
    verify(module)
    check_output(args.output, data_files(module, args.input))
    if args.emit == "dot":
        from tgc.codegen.dot import emit_dot

        PassManager(parse_pipeline(args.passes or "")).run(module)
        write_output(args.output, emit_dot(module))
        return EXIT_OK
    from tgc.planner.standalone import emit_standalone_cuda

    pipeline = args.passes if args.passes is not None else CUDA_PIPELINE
    PassManager(parse_pipeline(pipeline)).run(module)
    source = emit_standalone_cuda(module, arch=args.arch, libraries=not args.no_libraries)
    write_output(args.output, source)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_arg_parser(), argv)
    tgc.load_all()
    return guarded("tgc-translate", lambda: with_kernels(run, args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
