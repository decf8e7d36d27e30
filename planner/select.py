"""`select-kernels`: choose, for every op, the fastest way to run it within an error tolerance,
and write the choice as IR.

The function is first put in canonical form (`canonicalize`, `cse`: graph kernels match the
canonical form), sources read by several segments are cloned into each (`planner.blocks`), and
its live ops are cut into a chain of segments. Each segment is a problem of `planner.solve`
(exact on one-reader graphs and, by enumerating shared values, on small shared ones), solved as
a table over the placement of its input and output cut values. A segment that copies an
earlier one op for op (`planner.blocks.copy_map`) takes its plan, mapped, without being matched
against the kernels, hashed or solved (planner/copies.py); the others are matched, and those with
equal structural hashes share one table and one plan (mapped op for op). The tables are chained
and the plan read back from the end.

The result is IR: every planned op becomes a `kernel.call` (callee = the kernel's name; `op` and
the op's attributes for an op kernel, the covered subgraph in a region for a graph kernel), a
decomposition becomes the calls of its own plan, and a `kernel.copy` moves a value wherever a
kernel reads it in another memory space (values in device memory carry the "cuda" encoding).
Each call and copy is annotated with `plan.backend`, `plan.seconds` (float) and `plan.source`
("measured", "estimated" or "roofline"), and `plan.once` where it reads only values fixed by the
`{tgc.param}` arguments (planner/fixed.py): it runs once per set of parameter arrays, and its
time is not in the plan's per-call cost.
"""

from __future__ import annotations

from dataclasses import dataclass

from typing import TYPE_CHECKING

from tgc.builtin import FuncOp
from tgc.diagnostics import TgcError
from tgc.ir import Value, paused_gc
from tgc.pass_manager import Pass, PassStatistics, PipelineError, option, register_pass

if TYPE_CHECKING:
    from tgc.planner.chain import Selection
    from tgc.planner.cost import CachedCosts, CostSource
    from tgc.planner.materialise import materialise
    from tgc.planner.options import PlanContext

# The planner itself is imported where it is used: every tool registers this pass at start-up
# (tgc.load_all), and most runs never plan (about 40 ms of each tool's start).

# Re-exported: tools, tests and benches import these from here.
__all__ = [
    "OBJECTIVES",
    "SelectKernels",
    "Selection",
    "materialise",
    "plan_function",
    "prepare",
    "select_kernels",
    "with_backends",
    "with_database",
    "write_plan",
]

OBJECTIVES = ("time",)


def __getattr__(name: str):
    """The re-exports from the planner's modules, imported on first use."""
    if name == "Selection":
        from tgc.planner.chain import Selection

        return Selection
    if name == "materialise":
        from tgc.planner.materialise import materialise

        return materialise
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# -- planning -------------------------------------------------------------------------------------


def prepare(func: FuncOp) -> None:
    """Canonical form: graph kernels are matched against it."""
    from tgc.passes.canonicalize import Canonicalize
    from tgc.passes.cse import CSE

    stats = PassStatistics()
    Canonicalize().run_on_func(func, stats)
    CSE().run_on_func(func, stats)


def plan_function(
    func: FuncOp,
    ctx: PlanContext | None = None,
    cost_source: CostSource | CachedCosts | None = None,
    reuse: bool = True,
    budget: int | None = None,
) -> Selection:
    """The cheapest plan of `func`. The only change to `func`: a source (constant) read by
    several segments is cloned into each. `reuse`: plan segments with equal hashes once.
    `budget`: the solver's (default planner.solve.EXACT_BUDGET). Raises TgcError when some op
    has no option within the tolerance. Without `ctx`: every backend that loads, no
    tolerance."""
    from tgc.planner.cost import CachedCosts, RooflineCostSource
    from tgc.planner.paths import default_context
    from tgc.planner.solve import EXACT_BUDGET

    budget = EXACT_BUDGET if budget is None else budget
    ctx = ctx or default_context()
    costs = (
        cost_source
        if isinstance(cost_source, CachedCosts)
        else CachedCosts(cost_source or RooflineCostSource())
    )
    with paused_gc():  # thousands of small objects, no garbage (see tgc.ir.paused_gc)
        return _plan(func, ctx, costs, reuse, budget)


def _plan(
    func: FuncOp, ctx: PlanContext, costs: CachedCosts, reuse: bool, budget: int
) -> Selection:
    from tgc.planner.blocks import localize_sources
    from tgc.planner.chain import _Chain
    from tgc.planner.copies import _CopyChain
    from tgc.planner.options import live_ops
    from tgc.planner.solve import Solver, Spaces

    block = func.body
    declared = func.function_type.results
    spaces = Spaces(
        ctx.spaces() | {a.type.encoding for a in block.args} | {t.encoding for t in declared}
    )
    solver = Solver(ctx, costs, spaces, budget)
    required: dict[Value, int] = {}
    for v, t in zip(block.last.operands, declared):
        required[v] = required.get(v, 0) | spaces.bit(t.encoding)
    if reuse and ctx.options_are_local():
        selection = _CopyChain(solver, func, required).run()
        if selection is not None:
            return selection
    # Before the options are found (a clone changes the matches): cuts inside a multi-op option
    # are not known yet, so two segments that turn out one may keep a copy of a source each.
    if localize_sources(block, live_ops(block)):
        ctx.forget(block)
    bo = ctx.block_options(block)
    return _Chain(solver, bo, func, required, reuse).run()


# -- the API and the pass ---------------------------------------------------------------------------


def write_plan(func: FuncOp, selection: Selection, costs: CachedCosts) -> None:
    """Replace `func`'s body by the plan `selection` chose, ready to run: its calls and copies
    written (`materialise`, `costs` their `plan.seconds`), the steps computed once marked
    (`mark_once`), small independent siblings merged into one launch (`merge_siblings`)."""
    from tgc.planner.fixed import mark_once
    from tgc.planner.horizontal import merge_siblings
    from tgc.planner.materialise import materialise

    materialise(func, selection, costs)
    mark_once(func)
    merge_siblings(func)


def select_kernels(
    func: FuncOp,
    cost_source: CostSource | None = None,
    tolerance: float = 1e-5,
    kernels=None,
    match=None,
    reuse: bool = True,
    canonicalize: bool = True,
    backends: tuple[str, ...] | None = None,
    generated: bool = True,
) -> Selection:
    """Plan `func` and replace its body by the plan (see the module doc); returns the
    Selection. `backends` (family names: numpy, cuda, torch) loads those backends and limits
    the kernels considered to theirs (None: every backend that loads here); `kernels` limits
    them to a pool (None: every registered one; nothing more is loaded) and `match` replaces
    the matcher (tests). `generated` False: no generated fused kernel is an option (the plan
    of library kernels alone, planner/route.py)."""
    from tgc.planner import kernel_backends, load_backends
    from tgc.planner.cost import CachedCosts, RooflineCostSource
    from tgc.planner.options import PlanContext

    load_backends(backends if kernels is None else ("numpy",))
    if canonicalize:
        prepare(func)
    allowed = None if backends is None else kernel_backends(backends)
    ctx = (
        PlanContext(kernels, tolerance, backends=allowed, generated=generated)
        if match is None
        else PlanContext(kernels, tolerance, match, backends=allowed, generated=generated)
    )
    costs = CachedCosts(cost_source or RooflineCostSource())
    selection = plan_function(func, ctx, costs, reuse)
    write_plan(func, selection, costs)
    return selection


@register_pass
@dataclass(frozen=True)
class SelectKernels(Pass):
    """Choose the fastest kernels within an error tolerance and place every value (see
    planner/select.py and docs/planner.md).

    Contract: every live op of each function becomes a `kernel.call` (or the calls of its
    decomposition's plan), with a `kernel.copy` wherever a value is read in another memory space;
    each carries `plan.backend`, `plan.seconds` and `plan.source` (and `plan.once` where it runs
    once per set of parameters, planner/fixed.py). No kernel whose stated error
    exceeds `tolerance` is used. The function computes the same values (up to the kernels' stated
    errors); its signature does not change. Costs come from the roofline model, or with `db`
    from that measurement database (measured, else estimated, else roofline: planner/estimate.py;
    a kernel with parameters runs with its best measured ones, written as `param.<name>`); the
    plan is optimal for them on functions whose values have one reader each, and on shared values
    where the pass statistics say "exact". Options: `tolerance` (>= 0), `objective` (`time`),
    `db` (a measurement database file; empty: none), `backends` (comma-separated backend
    families, numpy, cuda, torch: only their kernels are considered; empty: every backend that
    loads here).
    """

    name = "select-kernels"
    summary = "Choose kernels and placements (DP over placements, within a tolerance)"

    tolerance: float = option(1e-5, "the largest stated kernel error allowed")
    objective: str = option("time", "what the plan minimises")
    db: str = option("", "the measurement database (empty: none, the roofline model)")
    backends: tuple[str, ...] = option(
        (), "backend families whose kernels are considered (empty: all)"
    )

    def __post_init__(self) -> None:
        if not self.tolerance >= 0:
            raise PipelineError(f"pass 'select-kernels' needs tolerance >= 0, got {self.tolerance}")
        if self.objective not in OBJECTIVES:
            raise PipelineError(
                f"pass 'select-kernels': unknown objective '{self.objective}' "
                f"(objectives: {', '.join(OBJECTIVES)})"
            )
        from tgc.planner import check_families

        try:
            check_families(self.backends)
        except TgcError as e:
            raise PipelineError(f"pass 'select-kernels': {e.message}") from None

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        from tgc.planner.estimate import DatabaseCostSource

        costs = DatabaseCostSource(self.db) if self.db else None
        backends = self.backends or None
        if backends is not None:
            from tgc.planner import load_backends

            load_backends(backends, required=True)  # a backend named and missing: say why
        selection = select_kernels(func, costs, tolerance=self.tolerance, backends=backends)
        stats.bump("planned-ops", len(selection.plan.steps))
        stats.bump("segments", selection.segments)
        stats.bump("distinct-segments", selection.distinct_segments)
        for op in func.body.ops:
            if op.name in ("kernel.call", "kernel.copy"):
                stats.bump(op.name)
        exact = "exact" if selection.exact else "not proven optimal (shared values)"
        stats.note(f"@{func.sym_name}: {selection.seconds:.3e} s estimated, {exact}")


def with_database(passes: list, path: str, *, keep_given: bool = False) -> list:
    """`passes` with every select-kernels pass costing from the measurement database `path`
    (the tools' `--db`); with `keep_given`, a pass that names its own `db` keeps it (the
    default database does not override a pipeline's choice)."""
    import dataclasses

    return [
        dataclasses.replace(p, db=path)
        if isinstance(p, SelectKernels) and not (keep_given and p.db)
        else p
        for p in passes
    ]


def with_backends(passes: list, families: tuple[str, ...]) -> list:
    """`passes` with every select-kernels pass limited to the backend families `families`
    (the tools' `--planner-backends`)."""
    import dataclasses

    return [
        dataclasses.replace(p, backends=families) if isinstance(p, SelectKernels) else p
        for p in passes
    ]
