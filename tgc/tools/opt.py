"""tgc-opt: parse, verify, run a pass pipeline, print. MLIR's mlir-opt flags without `mlir-`."""

from __future__ import annotations

import argparse
import re
import sys
from dataclasses import dataclass

import tgc
from tgc.diagnostics import Location, TgcError
from tgc.pass_manager import (
    PASSES,
    Instrumentation,
    PassManager,
    PipelineError,
    did_you_mean,
    kebab,
    parse_pipeline,
)
from tgc.tools._common import (
    add_common_flags,
    add_kernels,
    with_kernels,
    parse_args,
    EXIT_INPUT,
    EXIT_OK,
    EXIT_USAGE,
    guarded,
    read_input,
)
from tgc.tools._outputs import check_output, data_files

SPLIT_MARKER = re.compile(r"^// -----.*$", re.MULTILINE)
EXPECTED = re.compile(
    r"//\s*expected-(error|note|warning|remark)\s*(@(?:[+-]\d+|above|below))?\s*\{\{(.*?)\}\}"
)


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tgc-opt",
        description="Parse a .tg module, run a pass pipeline over it and print the result.",
    )
    ap.add_argument("input", nargs="?", default="-", help="input file ('-' for stdin)")
    ap.add_argument("-o", dest="output", default="-", help="output file (default stdout)")
    ap.add_argument(
        "-p",
        "--passes",
        dest="passes",
        default=None,
        help="flat pipeline, e.g. 'lower-hl,canonicalize{fast-math=true},cse'",
    )
    ap.add_argument(
        "--pass-pipeline",
        default=None,
        help="MLIR-style pipeline, e.g. 'builtin.module(func.func(cse,dce))'",
    )
    ap.add_argument(
        "--split-input-file",
        action="store_true",
        help="treat '// -----' lines as separators between independent inputs",
    )
    ap.add_argument(
        "--verify-diagnostics",
        action="store_true",
        help="check diagnostics against '// expected-error {{...}}' comments",
    )
    ap.add_argument("--print-generic", action="store_true", help="print MLIR's generic op form")
    ap.add_argument("--print-ir-after-all", action="store_true", help="dump IR after each pass")
    ap.add_argument(
        "--print-ir-after",
        action="append",
        default=[],
        metavar="PASS",
        help="dump IR after the named pass (repeatable, or comma-separated)",
    )
    ap.add_argument(
        "--disable-verify", action="store_true", help="do not verify the IR after each pass"
    )
    ap.add_argument("--time-passes", action="store_true", help="report the time of each pass")
    ap.add_argument(
        "--pass-statistics", action="store_true", help="report the rewrites each pass applied"
    )
    ap.add_argument("--list-passes", action="store_true", help="list registered passes and exit")
    ap.add_argument(
        "--list-ops",
        nargs="?",
        const="",
        default=None,
        metavar="DIALECT",
        help="list the ops (of DIALECT: atomic, hl, kernel, ...), a line each, and exit; "
        "docs/ops.md has them in full",
    )
    add_kernels(ap)
    add_common_flags(ap)
    return ap


# An option's type as a pipeline writes its value.
OPTION_KINDS = {"bool": "true or false", "tuple[str, ...]": "comma-separated names", "str": "text"}


def list_passes() -> str:
    """Every pass as -p takes it, `name{option=default ...}`, its summary, and a line per option;
    a pipeline pass shows the passes it stands for."""
    import dataclasses

    from tgc.pass_manager import format_option, option_help

    lines = ["Passes and pipelines, as -p takes them (options in braces, at their defaults):"]
    for name in sorted(PASSES):
        cls = PASSES[name]
        fields = dataclasses.fields(cls)
        defaults = " ".join(f"{kebab(f.name)}={format_option(f.default)}" for f in fields)
        lines.append(f"  {name}{{{defaults}}}" if fields else f"  {name}")
        lines.append(f"      {cls.summary}" if cls.pipeline is None else f"      = {cls.pipeline}")
        for f in fields:
            kind = OPTION_KINDS.get(str(f.type), str(f.type))
            lines.append(f"      {kebab(f.name):<16} {option_help(f)} ({kind})")
    return "\n".join(lines)


def split_chunks(text: str, split: bool) -> list[str]:
    """Chunks padded with blank lines so every line keeps its number in the file."""
    if not split:
        return [text]
    chunks, start, line = [], 0, 0
    for m in SPLIT_MARKER.finditer(text):
        chunk = text[start : m.start()]
        chunks.append("\n" * line + chunk)
        line += chunk.count("\n") + 1
        start = m.end() + 1
    chunks.append("\n" * line + text[start:])
    return chunks


def process_chunk(text: str, name: str, args, pipeline) -> str:
    from tgc.parser import parse_module
    from tgc.printer import print_module
    from tgc.verifier import verify

    module = parse_module(text, name)
    verify(module)
    check_output(args.output, data_files(module, args.input))  # a weight it reads
    inst = Instrumentation(
        print_ir_after_all=args.print_ir_after_all,
        print_ir_after=frozenset(p for item in args.print_ir_after for p in item.split(",")),
        time_passes=args.time_passes,
        pass_statistics=args.pass_statistics,
        verify_each=not args.disable_verify,
        generic=args.print_generic,
    )
    PassManager(pipeline, inst).run(module)
    return print_module(module, generic=args.print_generic)


# -- --verify-diagnostics ------------------------------------------------------------------------


@dataclass
class Expectation:
    kind: str
    line: int
    message: str
    comment_loc: Location
    found: bool = False


def expectations(text: str, name: str) -> list[Expectation]:
    out = []
    for lineno, line in enumerate(text.splitlines(), start=1):
        for m in EXPECTED.finditer(line):
            kind, offset, message = m.group(1), m.group(2), m.group(3)
            target = lineno
            if offset == "@above":
                target = lineno - 1
            elif offset == "@below":
                target = lineno + 1
            elif offset:
                target = lineno + int(offset[1:])
            out.append(Expectation(kind, target, message, Location(name, lineno, m.start() + 1)))
    return out


def check_diagnostics(text: str, name: str, error: TgcError | None) -> list[str]:
    """Problems found (MLIR's wording); empty when diagnostics and expectations agree."""
    expected = expectations(text, name)
    produced = []
    if error is not None:
        produced.append(("error", error.loc, error.message))
        produced += [("note", n.loc, n.message) for n in error.notes]
    problems = []
    for kind, loc, message in produced:
        match = next(
            (
                e
                for e in expected
                if not e.found
                and e.kind == kind
                and loc is not None
                and loc.file == name
                and e.line == loc.line
                and e.message in message
            ),
            None,
        )
        if match is not None:
            match.found = True
        else:
            where = f"{loc}: " if loc is not None else ""
            problems.append(f"{where}error: unexpected {kind}: {message}")
    for e in expected:
        if not e.found:
            problems.append(
                f'{e.comment_loc}: error: expected {e.kind} "{e.message}" was not produced'
            )
    return problems


# -- main ----------------------------------------------------------------------------------------


def run(args) -> int:
    if args.list_ops is not None:
        from tgc.tools.ops_reference import dialects, list_ops

        if args.list_ops and args.list_ops not in dialects():
            known = ", ".join(dialects())
            print(
                f"tgc-opt: error: --list-ops: no dialect '{args.list_ops}'"
                f"{did_you_mean(args.list_ops, dialects())} (dialects: {known})",
                file=sys.stderr,
            )
            return EXIT_USAGE
        print(list_ops(args.list_ops or None))
        return EXIT_OK
    if args.list_passes:
        print(list_passes())
        return EXIT_OK
    if args.passes is not None and args.pass_pipeline is not None:
        print("tgc-opt: error: give either -p or --pass-pipeline, not both", file=sys.stderr)
        return EXIT_USAGE
    pipeline = parse_pipeline(args.passes or args.pass_pipeline or "")
    check_pass_names(args.print_ir_after)
    # The output is written last, over whatever is there: never over the program or a
    # database a select-kernels reads.
    databases = [p.db for p in pipeline if getattr(p, "db", None)]
    check_output(args.output, [args.input, *databases])
    text, name = read_input(args.input)
    outputs: list[str] = []
    status = EXIT_OK
    for chunk in split_chunks(text, args.split_input_file):
        if args.verify_diagnostics:
            error = None
            try:
                outputs.append(process_chunk(chunk, name, args, pipeline))
            except TgcError as e:
                error = e
            problems = check_diagnostics(chunk, name, error)
            for p in problems:
                print(p, file=sys.stderr)
            status = status or (EXIT_INPUT if problems else EXIT_OK)
            continue
        try:
            outputs.append(process_chunk(chunk, name, args, pipeline))
        except TgcError as e:
            if not args.split_input_file:
                raise
            print(e.render(), file=sys.stderr)
            status = EXIT_INPUT
    write_output(args.output, "// -----\n".join(outputs))
    return status


def check_pass_names(items: list[str]) -> None:
    """--print-ir-after names registered passes (a typo would otherwise print nothing)."""
    for item in items:
        for name in item.split(","):
            if name not in PASSES:
                raise PipelineError(
                    f"--print-ir-after: '{name}' does not refer to a registered pass"
                    f"{did_you_mean(name, PASSES)} (see --list-passes)"
                )


def write_output(path: str, text: str) -> None:
    if path == "-":
        sys.stdout.write(text)
        return
    try:
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        raise TgcError(f"could not write output file '{path}': {e.strerror}") from None


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_arg_parser(), argv)
    tgc.load_all()
    return guarded("tgc-opt", lambda: with_kernels(run, args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
