"""tgc-run: run one function of a module on numpy (or, where there is one, the GPU)."""

from __future__ import annotations

import argparse
import os
import sys
import textwrap
from dataclasses import dataclass

import numpy as np

import tgc
from tgc.diagnostics import TgcError
from tgc.planner import DEFAULT_MEASURE_BUDGET
from tgc.types import CHECK_TOLERANCE
from tgc.tools._common import (
    add_common_flags,
    add_kernels,
    with_kernels,
    parse_args,
    EXIT_OK,
    PLANNING_PIPELINE,
    add_planner_backends,
    add_planning_db,
    guarded,
    non_negative_float,
    non_negative_int,
    read_input,
)

# The route of --backend auto when -p does not give one: it ends in planned IR.
AUTO_PIPELINE = f"{PLANNING_PIPELINE},select-kernels"


CHECK_RULE = (
    "a result passes when it holds NaN exactly where the float64 reference does, the same "
    "infinity where the reference has one, and elsewhere finite values within tol * max(1, "
    "largest finite |reference|) of it, tol by element type: f64 1e-9, f32 2e-4, f16 2e-2, bf16 "
    "3e-2; integers and i1 must be equal."
)

RANDOM_RULE = (
    "random inputs depend on the seed and the function only (not on -p): floats from N(0, 1), "
    "except weights (the right-hand operand of hl.linear or atomic.matmul), drawn from N(0, "
    "1/fan_in) with fan_in the contracted dimension, as models initialise them, so values stay "
    "of order 1 through the layers; gather indices in range; other integers in [0, 4)."
)


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tgc-run",
        description="Run a function of a .tg module.",
        epilog="\n\n".join(
            textwrap.fill(p, 79)
            for p in (f"--random-inputs: {RANDOM_RULE}", f"--check: {CHECK_RULE}")
        ),
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    ap.add_argument("input", help="input .tg file ('-' for stdin)")
    ap.add_argument("--func", default=None, help="function to run (default: the only one)")
    ap.add_argument(
        "--input",
        dest="inputs",
        action="append",
        default=[],
        metavar="NAME=FILE.npy",
        help="bind argument NAME (its name without '%%', or its index) to a .npy file",
    )
    ap.add_argument(
        "--random-inputs",
        type=non_negative_int("SEED"),  # numpy seeds are non-negative
        default=None,
        metavar="SEED",
        help="seeded random values for arguments not bound by --input (default 0; see below)",
    )
    ap.add_argument(
        "--backend",
        choices=["numpy", "cuda", "auto"],
        default="numpy",
        help="cuda: the GPU route (planner/route.py): 'lower-for-planning' (or -p), kernel "
        "instances the measurement database does not know measured (see --measure-budget), "
        "select-kernels over tgc's CUDA kernels, cuBLAS and PyTorch's, the plan timed whole "
        "beside the plan of library kernels alone, the fastest run on the GPU; auto: run "
        f"'{AUTO_PIPELINE}' (unless -p is given; it must end in planned IR, e.g. "
        "'lower-hl,select-kernels{tolerance=1e-4}'), then the planned function on the kernels "
        "it chose, on every backend that loads here (numpy, torch, cuda; see "
        "--planner-backends)",
    )
    add_planner_backends(ap, "--backend auto: plan")
    add_planning_db(ap, "select-kernels")
    ap.add_argument(
        "--measure-budget",
        type=non_negative_float("SECONDS"),
        default=None,
        metavar="S",
        help="--backend cuda: seconds of measuring kernel instances on first use (default "
        f"{DEFAULT_MEASURE_BUDGET:g}); they are recorded in the database (--db, else the one "
        "in the user cache directory), so the next run measures nothing",
    )
    ap.add_argument(
        "--no-measure",
        action="store_true",
        help="--backend cuda: measure nothing; plan from what the database knows",
    )
    ap.add_argument(
        "--precision",
        choices=["native", "f64"],
        default="native",
        help="f64: compute every float in float64 (reference runs; numpy backend only)",
    )
    ap.add_argument(
        "-p",
        "--passes",
        default=None,
        help="pipeline to run before executing (default: none; with --backend cuda: "
        f"'{PLANNING_PIPELINE}', then the route plans; with --backend auto: '{AUTO_PIPELINE}')",
    )
    ap.add_argument(
        "--check",
        action="store_true",
        help="compare the results with a float64 numpy run of the unoptimised module (rule below)",
    )
    ap.add_argument(
        "-o", dest="output_dir", default=None, metavar="DIR", help="write DIR/result_<i>.npy"
    )
    add_kernels(ap)
    add_common_flags(ap)
    return ap


def load_npy(path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise TgcError(f"could not open input file '{path}': no such file or directory") from None
    except MemoryError:
        raise TgcError(f"could not load '{path}': out of memory") from None
    except (ValueError, OSError, EOFError) as e:
        raise TgcError(f"'{path}' is not a readable .npy file: {e}") from None


def bind_inputs(func, specs: list[str], seed: int | None) -> list[np.ndarray]:
    from tgc.runtime.interpreter import random_inputs

    args = func.body.args
    bound: dict[int, np.ndarray] = {}
    for spec in specs:
        key, eq, path = spec.partition("=")
        if not eq:
            raise TgcError(f"--input expects NAME=FILE.npy, got '{spec}'")
        key = key.lstrip("%")
        index = next((i for i, a in enumerate(args) if a.name_hint == key), None)
        if index is None and key.isdigit() and int(key) < len(args):
            index = int(key)
        if index is None:
            names = ", ".join(f"%{a.name_hint}" for a in args)
            raise TgcError(f"@{func.sym_name} has no argument '{key}' (arguments: {names})")
        bound[index] = load_npy(path)
    missing = [i for i in range(len(args)) if i not in bound]
    if missing and seed is None and specs:
        names = ", ".join(f"%{args[i].name_hint or i}" for i in missing)
        raise TgcError(f"no value for argument(s) {names}: give --input or --random-inputs")
    randoms = random_inputs(func, seed or 0) if missing else []
    return [bound[i] if i in bound else randoms[i] for i in range(len(args))]


def summarize(i: int, a: np.ndarray) -> str:
    """One line per result: statistics of its finite values, and how many are not finite."""
    head = f"result {i}: shape {tuple(a.shape)} dtype {a.dtype}"
    if a.size == 0:
        return head + " (empty)"
    if a.dtype == np.bool_:
        return head + f" true={int(a.sum())}/{a.size}"
    f = a.astype(np.float64)
    first = f" first={f.reshape(-1)[:4].round(6).tolist()}"
    finite = np.isfinite(f)
    if finite.all():
        return head + _stats(f) + first
    counts = {"nan": np.isnan(f).sum(), "+inf": (f == np.inf).sum(), "-inf": (f == -np.inf).sum()}
    special = " ".join(f"{k}={n}" for k, n in counts.items() if n)
    n_finite = int(finite.sum())
    stats = _stats(f[finite]) + f" (of the {n_finite} finite values)" if n_finite else ""
    return head + f" {special}" + stats + first


def _stats(f: np.ndarray) -> str:
    return f" mean={f.mean():.6g} std={f.std():.6g} min={f.min():.6g} max={f.max():.6g}"


def execute(func, inputs, args) -> list[np.ndarray]:
    if args.backend == "auto":
        from tgc.planner.executor import run_plan

        return run_plan(func, inputs)
    if args.backend == "cuda":
        from tgc.planner.route import RouteOptions, compile_function

        options = RouteOptions(
            db=args.db or None,
            measure=not args.no_measure,
            measure_budget=(
                DEFAULT_MEASURE_BUDGET if args.measure_budget is None else args.measure_budget
            ),
        )
        compiled = compile_function(func, options)
        print(f"tgc-run: {compiled.report.summary()}", file=sys.stderr)
        return compiled.run_host(inputs)
    from tgc.runtime.interpreter import run_function

    return run_function(func, inputs, args.precision)


def refuse_what_cannot_fit(func, args, run=None) -> None:
    """Refuse at once, before the work, a run whose values together cannot fit in the memory
    this machine has available: the inputs, the numpy interpreter's run of `func` (it keeps every
    value until it returns) and --check's float64 reference of the program as written (`run`,
    every value in float64). Without this, two 2e9-element tensors ran for minutes into the
    out-of-memory killer. A single value too large on its own is left to the evaluator, which
    names it at the op that makes it."""
    from tgc.evaluate import available_memory, block_values, format_bytes, nbytes

    available = available_memory()
    if available is None:
        return
    reference = run or func
    arg_types = [a.type for a in reference.body.args]
    parts = [("the inputs", arg_types, "native")]
    if run is not None:  # after the passes, before the numpy run
        parts.append(("the numpy run", block_values(func.body)[len(arg_types) :], args.precision))
        if args.precision == "f64":
            parts.append(("the numpy run's float64 inputs", arg_types, "f64"))
    if args.check:
        parts.append(("--check's float64 reference", block_values(reference.body), "f64"))
    sizes = [(what, nbytes(types, precision)) for what, types, precision in parts]
    need = sum(n for _, n in sizes)
    largest = max(nbytes([t], precision) for _, types, precision in parts for t in types)
    if need <= available or largest > available:
        return
    listed = "; ".join(f"{what}: {format_bytes(n)}" for what, n in sizes)
    raise TgcError(
        f"this run needs {format_bytes(need)} of memory ({listed}), more than the "
        f"{format_bytes(available)} this machine has available",
        func.loc,
    )


def make_output_dir(path: str) -> None:
    """Create -o's directory before running, so a bad path fails before the work, not after."""
    try:
        os.makedirs(path, exist_ok=True)
    except FileExistsError:
        raise TgcError(
            f"could not create output directory '{path}': a file is in the way"
        ) from None
    except OSError as e:
        raise TgcError(f"could not create output directory '{path}': {e.strerror}") from None


def result_path(directory: str, i: int) -> str:
    return os.path.join(directory, f"result_{i}.npy")


def check_result_paths(args, module, func) -> None:
    """Before running: no result file may be one of the run's inputs (the program, an --input
    .npy, a weight the program reads, the measurement database)."""
    from tgc.tools._outputs import check_output, data_files

    inputs = [args.input, *(spec.partition("=")[2] for spec in args.inputs)]
    inputs += data_files(module, args.input)
    if args.db is not None or (args.backend in ("auto", "cuda") and not args.no_db):
        from tgc.planner.db import resolve_path

        inputs.append(resolve_path(args.db or None))
    for i in range(len(func.function_type.results)):
        check_output(result_path(args.output_dir, i), inputs, "result")


def write_results(directory: str, results: list[np.ndarray]) -> None:
    for i, r in enumerate(results):
        path = result_path(directory, i)
        try:
            np.save(path, r, allow_pickle=False)
        except OSError as e:
            raise TgcError(f"could not write output file '{path}': {e.strerror}") from None


def run(args) -> int:
    from tgc.parser import parse_module
    from tgc.pass_manager import PassManager, parse_pipeline
    from tgc.runtime.interpreter import run_function, select_function
    from tgc.verifier import verify

    passes = args.passes
    if passes is None:
        passes = {"cuda": PLANNING_PIPELINE, "auto": AUTO_PIPELINE}.get(args.backend, "")
    pipeline = parse_pipeline(passes)
    if not args.no_db:
        from tgc.planner.db import resolve_path
        from tgc.planner.select import with_database

        pipeline = with_database(pipeline, resolve_path(args.db), keep_given=args.db is None)
    if args.planner_backends is not None:
        from tgc.planner import load_backends
        from tgc.planner.select import with_backends

        load_backends(args.planner_backends, required=True)
        pipeline = with_backends(pipeline, args.planner_backends)
    if args.output_dir is not None:
        make_output_dir(args.output_dir)
    text, name = read_input(args.input)
    module = parse_module(text, name)
    verify(module)
    if args.output_dir is not None:
        check_result_paths(args, module, select_function(module, args.func))
    refuse_what_cannot_fit(select_function(module, args.func), args)
    # Inputs come from the program as written, so a seed gives the same values under every -p.
    inputs = bind_inputs(select_function(module, args.func), args.inputs, args.random_inputs)
    reference_module = parse_module(text, name) if args.check else None
    PassManager(pipeline).run(module)
    func = select_function(module, args.func)
    if args.backend == "auto":
        from tgc.planner.executor import require_planned

        require_planned(func)  # a -p that stops short of planned IR
    if args.backend not in ("auto", "cuda"):
        refuse_what_cannot_fit(
            func, args, run=select_function(reference_module or module, args.func)
        )
    results = execute(func, inputs, args)
    if args.check:
        expected = run_function(select_function(reference_module, args.func), inputs, "f64")
        for i, (got, want, t) in enumerate(zip(results, expected, func.function_type.results)):
            print(check_result(i, np.asarray(got), want, t.element_type))
    if args.output_dir is not None:
        write_results(args.output_dir, results)
    else:
        for i, r in enumerate(results):
            print(summarize(i, np.asarray(r)))
    return EXIT_OK


# -- --check ---------------------------------------------------------------------------------------


@dataclass
class Comparison:
    """Where `got` and the float64 reference `want` disagree under CHECK_RULE."""

    got: np.ndarray  # float64
    want: np.ndarray  # float64
    tolerance: float  # absolute: tol * max(1, largest finite |want|)
    error: np.ndarray  # |got - want| where both are finite, else 0
    special: np.ndarray  # bool: NaN or infinity on one side not matched on the other

    @classmethod
    def of(cls, got: np.ndarray, want: np.ndarray, element_type: str) -> Comparison:
        g, w = got.astype(np.float64), want.astype(np.float64)
        finite_w, finite_g = np.isfinite(w), np.isfinite(g)
        scale = max(1.0, float(np.abs(w[finite_w]).max(initial=0.0)))
        both = finite_w & finite_g
        error = np.where(both, np.abs(np.where(both, g, 0.0) - np.where(both, w, 0.0)), 0.0)
        same_special = (np.isnan(g) & np.isnan(w)) | (~finite_w & (g == w))
        special = ~both & ~same_special
        return cls(g, w, CHECK_TOLERANCE.get(element_type, 0.0) * scale, error, special)

    def bad(self) -> np.ndarray:
        return self.special | (self.error > self.tolerance)


def check_result(i: int, got: np.ndarray, want: np.ndarray, element_type: str) -> str:
    """The 'ok' line for result `i`; raises TgcError naming the first disagreement."""
    c = Comparison.of(got, want, element_type)
    count = int(c.bad().sum())
    others = f"; {count} element(s) differ in all" if count > 1 else ""
    if c.special.any():
        at = _index(int(np.flatnonzero(c.special)[0]), got.shape)
        raise TgcError(
            f"check failed: result {i} is {c.got[at]:.6g} at index {at} where the float64 "
            f"reference is {c.want[at]:.6g}{others}"
        )
    worst = float(c.error.max(initial=0.0))
    if count:
        at = _index(int(np.argmax(c.error)), got.shape)
        raise TgcError(
            f"check failed: result {i} differs from the float64 reference by {worst:.3g} at "
            f"index {at} (got {c.got[at]:.6g}, expected {c.want[at]:.6g}; tolerance "
            f"{c.tolerance:.3g}){others}"
        )
    line = f"check: result {i} ok (max abs error {worst:.3g}, tolerance {c.tolerance:.3g})"
    n_nan, n_inf = int(np.isnan(c.want).sum()), int(np.isinf(c.want).sum())
    if n_nan or n_inf:
        line += f"; {n_nan} NaN and {n_inf} inf, as in the reference"
    return line


def _index(flat: int, shape: tuple[int, ...]) -> tuple[int, ...]:
    return tuple(int(k) for k in np.unravel_index(flat, shape))


def main(argv: list[str] | None = None) -> int:
    parser = build_arg_parser()
    args = parse_args(parser, argv)
    tgc.load_all()
    if args.backend in ("cuda", "auto") and args.precision != "native":
        # The kernels compute in the element types of the IR; --check compares with float64.
        parser.error(
            f"--precision {args.precision} is not supported with --backend {args.backend} (the "
            "kernels compute in the program's element types; use --check to compare with "
            "float64)"
        )
    if args.planner_backends is not None and args.backend != "auto":
        parser.error("--planner-backends needs --backend auto (it chooses the planner's backends)")
    if args.no_db and args.backend == "cuda":
        parser.error("--no-db is for --backend auto: the GPU route measures into a database")
    if (args.no_measure or args.measure_budget is not None) and args.backend != "cuda":
        parser.error("--measure-budget and --no-measure need --backend cuda")
    with np.errstate(all="ignore"):  # non-finite values are reported, not warned about
        return guarded("tgc-run", lambda: with_kernels(run, args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
