"""tgc-plan: the ways a function can run, what they cost, and the one select-kernels chooses.

    tgc-plan FILE [--func NAME] [--list-paths N] [--explain [-k K]] [--tolerance T] [-p PIPE]
             [--db PATH] [--no-db] [--planner-backends LIST]

The function (after `-p`, by default `lower-for-planning`, the program `tgc-run --backend auto`
plans; then the canonical form select-kernels plans: canonicalize, cse) is
planned on every backend that loads here (numpy always), or with `--planner-backends LIST` on
the kernels of those backends alone (as `select-kernels{backends=LIST}` plans). Without --list-paths or --explain, the
chosen plan is printed on one line with its estimated time. `--list-paths N` prints the first N
complete plans, one line each with its cost, and how many there are in all (counted, not
enumerated). `--explain` prints, for each op the plan runs, its options ranked by cost (the
chosen one marked `*`, the next K), with each kernel's own time and where that number came from:
the measurement database (`--db PATH`, else the default one: measured, estimated, else
roofline), or with `--no-db` the roofline model alone.
"""

from __future__ import annotations

import argparse
import math
import sys

import tgc
from tgc.diagnostics import TgcError
from tgc.tools._common import (
    add_common_flags,
    add_kernels,
    with_kernels,
    parse_args,
    EXIT_OK,
    EXIT_USAGE,
    add_planner_backends,
    add_planning_passes,
    add_planning_db,
    guarded,
    read_input,
)


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(
        prog="tgc-plan",
        description="List the execution plans of a function, their costs, and the chosen one.",
    )
    ap.add_argument("input", help="input .tg file ('-' for stdin)")
    ap.add_argument("--func", default=None, help="function to plan (default: the only one)")
    ap.add_argument(
        "--list-paths",
        type=int,
        default=None,
        metavar="N",
        help="print the first N complete plans and the number of plans",
    )
    ap.add_argument(
        "--explain",
        action="store_true",
        help="print each op's options ranked by cost beside the chosen one",
    )
    ap.add_argument(
        "--why-not",
        default=None,
        metavar="KERNEL",
        help="say, for each place KERNEL could apply, why it was not chosen there (not "
        "matched and where, refused, an option that lost) or that it was",
    )
    ap.add_argument(
        "-k",
        "--alternatives",
        type=int,
        default=3,
        metavar="K",
        help="alternatives shown per op by --explain (default 3)",
    )
    ap.add_argument(
        "--tolerance",
        type=float,
        default=1e-5,
        metavar="T",
        help="largest stated kernel error allowed (default 1e-5)",
    )
    add_planning_db(ap, "select-kernels")
    add_planner_backends(ap, "plan")
    add_planning_passes(ap)
    add_kernels(ap)
    add_common_flags(ap)
    return ap


def usage_error(args) -> str | None:
    if args.list_paths is not None and args.list_paths < 0:
        return f"--list-paths needs N >= 0, got {args.list_paths}"
    if args.alternatives < 0:
        return f"--alternatives needs K >= 0, got {args.alternatives}"
    if not args.tolerance >= 0:
        return f"--tolerance needs T >= 0, got {args.tolerance}"
    return None


def run(args) -> int:
    from tgc.parser import parse_module
    from tgc.pass_manager import PassManager, parse_pipeline
    from tgc.planner import kernel_backends, load_backends
    from tgc.planner.blocks import localize_sources
    from tgc.planner.cost import CachedCosts, RooflineCostSource
    from tgc.planner.options import PlanContext, live_ops
    from tgc.planner.select import plan_function, prepare
    from tgc.runtime.interpreter import select_function
    from tgc.verifier import verify

    problem = usage_error(args)
    if problem is not None:
        print(f"tgc-plan: error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    pipeline = parse_pipeline(args.passes)
    text, name = read_input(args.input)
    module = parse_module(text, name)
    verify(module)
    PassManager(pipeline).run(module)
    func = select_function(module, args.func)
    families = args.planner_backends
    load_backends(families, required=families is not None)
    prepare(func)
    localize_sources(func.body, live_ops(func.body))
    allowed = None if families is None else kernel_backends(families)
    ctx = PlanContext(tolerance=args.tolerance, backends=allowed)
    costs = CachedCosts(RooflineCostSource())
    if not args.no_db:
        from tgc.planner.db import resolve_path
        from tgc.planner.estimate import DatabaseCostSource

        costs = CachedCosts(DatabaseCostSource(resolve_path(args.db)))
    selection = plan_function(func, ctx, costs)
    if args.why_not is not None:
        print("\n".join(why_not_lines(args.why_not, func, ctx, selection)))
        return EXIT_OK
    if args.list_paths is not None:
        print_paths(func, ctx, costs, args.list_paths, selection.plan)
    if args.explain:
        print(explain(func, selection, costs, args.alternatives, args.tolerance))
    elif args.list_paths is None:
        print(f"{format_seconds(selection.seconds)}  {selection.plan}")
    return EXIT_OK


def why_not_lines(name: str, func, ctx, selection) -> list[str]:
    from tgc.pass_manager import did_you_mean
    from tgc.planner.kernel import KERNELS
    from tgc.planner.paths import value_names
    from tgc.planner.why_not import why_not

    kernel = KERNELS.get(name)
    if kernel is None:
        raise TgcError(f"--why-not: no kernel named '{name}'{did_you_mean(name, KERNELS)}")
    names = value_names(selection.plan)
    return why_not(kernel, func, ctx, selection, lambda op: _describe(op, names))


def format_seconds(seconds: float) -> str:
    return "inf s" if math.isinf(seconds) else f"{seconds:.3e} s"


def print_paths(func, ctx, costs, n: int, chosen) -> None:
    """The first `n` plans enumerated, as a table sorted by estimated time: the plan
    select-kernels chooses marked `*` and written out a step a line below the table, each other
    plan by the steps it has that the chosen one does not."""
    from tgc.planner.paths import count_paths, format_step, paths, plan_cost, value_names

    total = count_paths(func, ctx)
    chosen_steps = {_step_key(s) for s in chosen.steps}
    found = [(plan_cost(p, costs), i, p) for i, p in zip(range(n), paths(func, ctx))]
    if not any(p.key() == chosen.key() for _, _, p in found):
        found.append((plan_cost(chosen, costs), -1, chosen))
    found.sort(key=lambda row: (row[0], row[1]))
    plural = "s" if total != 1 else ""
    print(
        f"@{func.sym_name}: {total} plan{plural}; the first {min(n, total)} enumerated, "
        "sorted by estimated time (* the one select-kernels chooses)"
    )
    for rank, (seconds, _, plan) in enumerate(found, 1):
        if plan.key() == chosen.key():
            print(f"* {rank:>3}  {format_seconds(seconds)}  the chosen plan, below")
            continue
        names = value_names(plan)
        extra = [format_step(s, names) for s in plan.steps if _step_key(s) not in chosen_steps]
        print(f"  {rank:>3}  {format_seconds(seconds)}  differs in: {' ; '.join(extra)}")
    names = value_names(chosen)
    print(f"the chosen plan ({format_seconds(plan_cost(chosen, costs))}), a step a line:")
    for step in chosen.steps:
        print(f"  {format_step(step, names)}")


def _step_key(step) -> tuple:
    """What makes two plans' steps the same: the kernel and the ops it covers (and for a
    decomposition, its own plan)."""
    nested = step.nested.key() if step.nested is not None else ()
    return (step.option.label, tuple(map(id, step.option.ops)), nested)


# -- --explain ----------------------------------------------------------------------------------


def explain(func, selection, costs, k: int, tolerance: float) -> str:
    """The chosen plan, op by op, beside the k next-best options of each op; a step that runs
    once per set of parameters (planner/fixed.py) is marked so."""
    from tgc.planner.fixed import Fixed
    from tgc.planner.paths import value_names

    exact = "optimal" if selection.exact else "not proven optimal (shared values)"
    header = (
        f"@{func.sym_name}: {format_seconds(selection.seconds)} estimated, {exact}; "
        f"tolerance {tolerance:g}; {selection.segments} segment(s), "
        f"{selection.distinct_segments} planned"
    )
    notes = [
        "  total: the cheapest way to have the op's results where they are read, inputs included",
        "  n/a: the option reads a value this plan leaves uncomputed (inside another kernel)",
        "  <op:line>: a value computed inside another kernel, by the op at that line",
        "  segments: the parts the function is planned in, cut where a value is read by several"
        " ops; a part repeated (a model's layers) is planned once",
    ]
    fixed = Fixed()
    once = {s for s in selection.plan.steps if fixed.reads(s.option.inputs)}
    if once:
        notes.append(
            "  once per parameters: reads only {tgc.param} arguments (and constants); runs when"
            " they change, its time not in the estimate"
        )
    lines = [header, *notes]
    names = value_names(selection.plan)
    for step in selection.plan.steps:
        mark = "  (once per parameters)" if step in once else ""
        lines.append(_describe(step.option.root, names) + mark)
        for rank, (option, total) in enumerate(selection.alternatives[step][: k + 1]):
            mark = "*" if rank == 0 else " "
            shown = "n/a" if math.isinf(total) else format_seconds(total)
            lines.append(
                f"  {mark} {option.label:<28} total {shown:>12}  {_own_cost(option, costs)}"
            )
        if step.nested is not None:
            kernels = step.nested.kernels()
            lines.append(f"      decomposed into {len(kernels)} kernel(s): {', '.join(kernels)}")
    return "\n".join(lines)


def _describe(op, names: dict) -> str:
    """`%y = hl.tanh(%x)  at model.tg:3:8`: values named as in the printed plans, else by their
    source name, else by the op that makes them inside another kernel (`<atomic.mul:5>`: the op
    at line 5)."""
    results = ", ".join(_value(r, names) for r in op.results)
    operands = ", ".join(_value(v, names) for v in op.operands)
    where = f"  at {op.loc}" if op.loc is not None and op.loc.line else ""
    return f"{results} = {op.name}({operands}){where}"


def _value(v, names: dict) -> str:
    if v in names:
        return names[v]
    if v.name_hint:
        return f"%{v.name_hint}"
    owner = v.owner
    line = getattr(getattr(owner, "loc", None), "line", None)
    return f"<{owner.name}:{line}>" if line else f"<{getattr(owner, 'name', 'argument')}>"


def _own_cost(option, costs) -> str:
    """The kernel's own time and its source (a decomposition's is its plan's)."""
    if option.kernel is None:
        return "(its own plan)"
    p = option.space
    cost = costs.cost(
        option.kernel,
        [v.type.with_encoding(p) for v in option.inputs],
        [v.type.with_encoding(p) for v in option.outputs],
    )
    spread = f" ±{cost.rel_uncertainty:.0%}" if cost.rel_uncertainty else ""
    return f"kernel {format_seconds(cost.seconds)} {cost.source}{spread} on {option.kernel.backend}"


def main(argv: list[str] | None = None) -> int:
    args = parse_args(build_arg_parser(), argv)
    tgc.load_all()
    return guarded("tgc-plan", lambda: with_kernels(run, args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
