"""What every tgc tool shares: reading input, and turning errors into diagnostics and exit codes.

Exit codes: 0 success, 1 the input was wrong (a diagnostic was printed), 2 usage error.
No Python traceback reaches the user unless --debug is given.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable

from tgc.diagnostics import TgcError
from tgc.pass_manager import PipelineError

EXIT_OK, EXIT_INPUT, EXIT_USAGE = 0, 1, 2

# What tgc-plan and tgc-profile run before planning when -p does not say, and tgc-run --backend
# auto before its select-kernels: the three look at the same program (passes/optimize.py).
PLANNING_PIPELINE = "lower-for-planning"


def read_input(path: str) -> tuple[str, str]:
    """(text, name) of a file, or of stdin for '-'."""
    if path == "-":
        return sys.stdin.read(), "<stdin>"
    try:
        with open(path, encoding="utf-8") as f:
            return f.read(), path
    except FileNotFoundError:
        raise TgcError(f"could not open input file '{path}': no such file or directory") from None
    except IsADirectoryError:
        raise TgcError(f"could not open input file '{path}': it is a directory") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TgcError(f"could not read input file '{path}': {e}") from None


def guarded(tool: str, body: Callable[[], int], debug: bool) -> int:
    """Run `body`, mapping failures to a one-line diagnostic and an exit code."""
    try:
        return body()
    except PipelineError as e:
        print(f"{tool}: {e.render()}", file=sys.stderr)
        return EXIT_USAGE
    except TgcError as e:
        if debug:
            raise
        print(e.render(), file=sys.stderr)
        return EXIT_INPUT
    except KeyboardInterrupt:
        print(f"{tool}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:
        return EXIT_OK
    except MemoryError as e:  # the interpreter names the op and the bytes; this is the rest
        if debug:
            raise
        detail = f": {e}" if str(e) else ""
        print(f"{tool}: error: out of memory{detail}", file=sys.stderr)
        return EXIT_INPUT
    except Exception as e:  # a bug in tgc, not in the input: still no traceback by default
        if debug:
            raise
        print(
            f"{tool}: internal error: {type(e).__name__}: {e} (rerun with --debug for a traceback)",
            file=sys.stderr,
        )
        return EXIT_INPUT


def non_negative_float(metavar: str) -> Callable[[str], float]:
    """An argparse type: a finite non-negative number, refused as "METAVAR must be a
    non-negative number, got '...'" (a usage error, exit 2)."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = -1.0
        if not 0 <= value < float("inf"):
            raise argparse.ArgumentTypeError(
                f"{metavar} must be a non-negative number, got '{text}'"
            )
        return value

    return parse


def non_negative_int(metavar: str) -> Callable[[str], int]:
    """An argparse type: a non-negative integer, refused as "METAVAR must be a non-negative
    integer, got '...'" (a usage error, exit 2)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = -1
        if value < 0:
            raise argparse.ArgumentTypeError(
                f"{metavar} must be a non-negative integer, got '{text}'"
            )
        return value

    return parse


def version() -> str:
    """tgc's version, as installed."""
    from importlib.metadata import PackageNotFoundError
    from importlib.metadata import version as installed

    try:
        return installed("tgc")
    except PackageNotFoundError:
        return "unknown (tgc is not installed: pip install -e .)"


class _Version(argparse.Action):
    """`--version`: the version looked up when asked for, not at every tool's start."""

    def __init__(self, option_strings, dest, **kwargs) -> None:
        super().__init__(option_strings, dest, nargs=0, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None) -> None:
        print(f"{parser.prog} {version()}")
        parser.exit()


def add_common_flags(ap) -> None:
    """`--debug` and `--version`, on every tool."""
    ap.add_argument("--debug", action="store_true", help="show Python tracebacks for errors")
    add_version(ap)


def add_version(ap) -> None:
    ap.add_argument("--version", action=_Version, help="show the version and exit")


DB_HELP = (
    "the measurement database (default: $TGC_DB, else measurements.sqlite in the user cache "
    "directory: the one database every tool reads and tgc-profile and the GPU route write)"
)


def add_db(ap) -> None:
    """`--db PATH`, the same flag on every tool that reads or writes measurements."""
    ap.add_argument("--db", default=None, metavar="PATH", help=DB_HELP)


def add_planning_db(ap, what: str) -> None:
    """`--db PATH` and `--no-db` (tgc-plan, tgc-run): what the planner costs kernels from."""
    add_db(ap)
    ap.add_argument(
        "--no-db",
        action="store_true",
        help=f"{what} costs kernels with the roofline model alone, reading no database",
    )


def add_kernels(ap) -> None:
    """`--kernels FILE_OR_MODULE` (every tool that plans): a kernel plugin to load."""
    ap.add_argument(
        "--kernels",
        action="append",
        default=[],
        metavar="FILE_OR_MODULE",
        help="load the kernels of this plugin (a .py file or a module defining tgc_kernels()), "
        "check each against its reference in float64, and plan with them (docs/kernels.md; "
        "repeat for several). Installed plugins (entry point group tgc.kernels) load anyway",
    )


# The entry point group through which an installed package offers kernels (docs/kernels.md).
KERNEL_ENTRY_POINTS = "tgc.kernels"


def with_kernels(run: Callable[[argparse.Namespace], int], args) -> int:
    """`run(args)` once the kernels of `--kernels` and of installed plugins are checked and
    registered (the planner is imported only where there are some: tgc-opt starts light)."""
    from importlib.metadata import entry_points

    installed = entry_points(group=KERNEL_ENTRY_POINTS)
    if args.kernels or installed:
        from tgc.planner.plugins import load_plugins

        load_plugins(args.kernels, installed)
    return run(args)


# Flags renamed, by tool: the old spelling is read as the new one for a release, with a warning.
RENAMED_FLAGS = {
    "tgc-profile": {"--backend": "--kernel-backend"},
    "tgc-import": {"--func-name": "--func"},
}
PROGRAM_SUFFIXES = (".tg", ".mlir", ".onnx", ".pt2")


def parse_args(ap: argparse.ArgumentParser, argv: list[str] | None) -> argparse.Namespace:
    """`ap.parse_args(argv)`, reading the old spellings of flags with a one-line warning each:
    a renamed flag (RENAMED_FLAGS) and `--db` without a path (it meant the default database,
    which is now read anyway). `--db` followed by a program is refused: the program was taken
    for the database's path before."""
    argv = list(sys.argv[1:] if argv is None else argv)
    renamed = RENAMED_FLAGS.get(ap.prog, {})
    kept: list[str] = []
    for i, token in enumerate(argv):
        if token == "--":
            kept += argv[i:]
            break
        name, eq, value = token.partition("=")
        if name in renamed:
            print(f"{ap.prog}: warning: {name} is now {renamed[name]}", file=sys.stderr)
            token = renamed[name] + eq + value
        if token == "--db":
            following = argv[i + 1] if i + 1 < len(argv) else None
            if following is None or following.startswith("-"):
                print(
                    f"{ap.prog}: warning: --db without a PATH is no longer needed: the default "
                    "database is read anyway",
                    file=sys.stderr,
                )
                continue
            if following.endswith(PROGRAM_SUFFIXES):
                ap.error(
                    f"--db takes the measurement database's path, not the program "
                    f"'{following}' (leave --db out to read the default database)"
                )
        kept.append(token)
    return ap.parse_args(kept)


def add_planning_passes(ap) -> None:
    """`-p PIPE` (tgc-plan, tgc-profile): the passes run before planning, by default those
    `tgc-run --backend auto` runs before its select-kernels."""
    ap.add_argument(
        "-p",
        "--passes",
        default=PLANNING_PIPELINE,
        help=f"pipeline to run before planning (default: '{PLANNING_PIPELINE}', what --backend "
        "auto plans; '' for none)",
    )


def add_planner_backends(ap, what: str) -> None:
    """`--planner-backends LIST` (tgc-run, tgc-plan, tgc-profile): the backend families that
    load, and whose kernels `select-kernels{backends=LIST}` considers."""
    ap.add_argument(
        "--planner-backends",
        type=_planner_backends,
        default=None,
        metavar="LIST",
        help=f"{what} with these backends only (comma-separated: numpy, cuda, torch; torch is "
        "torch-cpu and torch-cuda): only they load, and select-kernels{backends=LIST} considers "
        "their kernels alone (default: every backend that loads here)",
    )


def _planner_backends(text: str) -> tuple[str, ...]:
    """argparse type of --planner-backends: a checked list of backend families."""
    import argparse

    from tgc.planner import parse_families

    try:
        return parse_families(text)
    except TgcError as e:
        raise argparse.ArgumentTypeError(e.message) from None
