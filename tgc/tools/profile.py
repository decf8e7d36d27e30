"""tgc-profile: measure the kernels a module's plans could use, and keep the timings.

    tgc-profile FILE [--func NAME] [-p PIPE] [--planner-backends LIST] [--kernel-backend NAME]...
                [--db PATH] [--budget SECONDS] [--force] [--max-age DAYS] [--tune] [--dry-run]
                [--tolerance T] [--min-time SECONDS] [--quiet]

Walks the options select-kernels would consider for the function (after `-p`, by default
`lower-for-planning` as `tgc-run --backend auto` plans it, and the canonical form;
decompositions included; repeated blocks once) with the backends that load here (or with
`--planner-backends LIST` those alone, as `select-kernels{backends=LIST}` would), lists the
kernel instances with no record on this device in the measurement database, and measures each
(each op's likely winners first, by the costs select-kernels would plan with; constants, whose
data is known before a run, are never measured): fresh random inputs, the result
checked against float64 first (a wrong one is recorded as a failure), then the median of timed
runs. Each measurement is committed on its own: kill it at any moment and run it again to go on.
`--force` measures every instance again, `--max-age DAYS` those whose record is older (a record
is replaced by the new one). `--dry-run` prints what it would measure and measures nothing.
`--tune` then searches the parameters of kernels that have some (and says so where none has). The database: `--db PATH`, else `$TGC_DB`, else
measurements.sqlite in the user cache directory. Exit codes: 0, 1 (bad input or an unusable
database, one-line diagnostic), 2 (usage).
"""

from __future__ import annotations

import argparse
import sys
import time

import tgc
from tgc.tools._common import (
    non_negative_float,
    add_db,
    add_common_flags,
    add_kernels,
    with_kernels,
    parse_args,
    EXIT_OK,
    EXIT_USAGE,
    add_planner_backends,
    add_planning_passes,
    guarded,
    read_input,
)


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tgc-profile",
        description="Measure the kernels a module's plans could use, into the measurement "
        "database.",
    )
    ap.add_argument("input", help="input .tg file ('-' for stdin)")
    ap.add_argument("--func", default=None, help="function to profile (default: the only one)")
    add_planning_passes(ap)
    add_planner_backends(ap, "profile the options select-kernels has")
    ap.add_argument(
        "--kernel-backend",
        dest="backend",
        action="append",
        default=None,
        metavar="NAME",
        help="profile this kernel backend's kernels only (numpy, torch-cpu, torch-cuda, cuda; "
        "repeat for several; default: every backend loaded)",
    )
    add_db(ap)
    ap.add_argument(
        "--budget",
        type=float,
        default=None,
        metavar="SECONDS",
        help="start no new measurement after this long (run again to go on)",
    )
    ap.add_argument(
        "--force",
        action="store_true",
        help="measure every instance again, also those the database knows",
    )
    ap.add_argument(
        "--max-age",
        type=non_negative_float("DAYS"),
        default=None,
        metavar="DAYS",
        help="measure again the instances whose record is older than this (drivers, clocks "
        "and the rest of the machine change)",
    )
    ap.add_argument(
        "--tune", action="store_true", help="then search the parameters of tunable kernels"
    )
    ap.add_argument(
        "--dry-run", action="store_true", help="print what would be measured; measure nothing"
    )
    ap.add_argument(
        "--tolerance",
        type=float,
        default=1e-5,
        metavar="T",
        help="profile the kernels select-kernels may use at this tolerance (default 1e-5)",
    )
    ap.add_argument(
        "--min-time",
        type=float,
        default=None,
        metavar="SECONDS",
        help="timed calls per instance last at least this long, after warm-up (default 0.05)",
    )
    ap.add_argument("--quiet", action="store_true", help="no progress display")
    add_kernels(ap)
    add_common_flags(ap)
    return ap


def usage_error(args, backends: list[str]) -> str | None:
    if args.budget is not None and not args.budget >= 0:
        return f"--budget needs SECONDS >= 0, got {args.budget}"
    if args.min_time is not None and not args.min_time > 0:
        return f"--min-time needs SECONDS > 0, got {args.min_time}"
    if not args.tolerance >= 0:
        return f"--tolerance needs T >= 0, got {args.tolerance}"
    for name in args.backend or []:
        if name not in backends:
            return f"backend '{name}' is not available here (available: {', '.join(backends)})"
    return None


def planning_function(args) -> tuple:
    """The function as select-kernels plans it, and the planning context of `args`."""
    from tgc.parser import parse_module
    from tgc.pass_manager import PassManager, parse_pipeline
    from tgc.planner import kernel_backends
    from tgc.planner.blocks import localize_sources
    from tgc.planner.kernel import KERNELS
    from tgc.planner.options import PlanContext, is_copy, live_ops
    from tgc.planner.select import prepare
    from tgc.runtime.interpreter import select_function
    from tgc.verifier import verify

    pipeline = parse_pipeline(args.passes)
    text, name = read_input(args.input)
    module = parse_module(text, name)
    verify(module)
    PassManager(pipeline).run(module)
    func = select_function(module, args.func)
    prepare(func)
    localize_sources(func.body, live_ops(func.body))
    kernels = None
    if args.backend:
        chosen = set(args.backend)
        kernels = [k for k in KERNELS.values() if k.backend in chosen or is_copy(k)]
    families = args.planner_backends
    allowed = None if families is None else kernel_backends(families)
    return func, PlanContext(kernels, args.tolerance, backends=allowed)


def current_costs(db) -> object:
    """The costs select-kernels would plan with, from `db` (measured, else estimated, else the
    roofline: planner/estimate.py); the roofline alone with no database. They order what is
    measured: each op's likely winners first."""
    from tgc.planner.cost import RooflineCostSource
    from tgc.planner.estimate import DatabaseCostSource

    return RooflineCostSource() if db is None else DatabaseCostSource(database=db)


def run(args) -> int:
    from tgc.planner import load_backends
    from tgc.planner.backends import BACKENDS
    from tgc.planner.db import Database, DatabaseUnavailable, resolve_path
    from tgc.planner.profile import MIN_TIME, Profiler, instances, unknown

    load_backends(args.planner_backends, required=args.planner_backends is not None)
    problem = usage_error(args, sorted(BACKENDS))
    if problem is not None:
        print(f"tgc-profile: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    func, ctx = planning_function(args)  # bad input is reported before a file is created
    path = resolve_path(args.db)
    since = 0.0 if args.max_age is None else time.time() - args.max_age * 86400
    if args.dry_run:
        # Plans, as tgc-plan would: a database that cannot be used, or damaged records in it,
        # are said once and planning goes on without them.
        from tgc.planner.estimate import DatabaseCostSource

        costs = DatabaseCostSource(path)
        insts = instances(func, ctx, costs)
        db = costs.db
        try:
            todo = insts if args.force else unknown(insts, db, since)
        except DatabaseUnavailable as e:
            costs.give_up(e.message)
            todo = unknown(insts, None)
        for inst in todo:
            print(inst.describe())
        print(
            f"{len(todo)} of {len(insts)} kernel instance(s) to measure on this machine "
            f"(database {path})"
        )
        return EXIT_OK
    with Database.open(path) as db:
        insts = instances(func, ctx, current_costs(db))
        if args.tune and not any(inst.kernel.params for inst in insts):
            loaded = ", ".join(sorted({inst.kernel.backend for inst in insts}))
            print(
                f"tgc-profile: warning: --tune: no kernel here has parameters to tune (backends: "
                f"{loaded}); only measuring",
                file=sys.stderr,
            )
        profiler = Profiler(db, args.budget, args.min_time or MIN_TIME, progress=not args.quiet)
        report = profiler.run(insts, tune=args.tune, force=args.force, since=since)
    for failure in report.failures:
        print(f"failed: {failure}")
    print(f"{report.summary()} (database {path})")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_arg_parser(), argv)
    tgc.load_all()
    return guarded("tgc-profile", lambda: with_kernels(run, args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
