"""`select-kernels`: choose, for every op, the fastest way to run it within an error tolerance,
and write the choice as IR.

The function is first put in canonical form (`canonicalize`, `cse`: graph kernels match the
canonical form), sources read by several segments are cloned into each (`planner.blocks`), and
its live ops are cut into a chain of segments. Each segment is a problem of `planner.solve`
(exact on one-reader graphs and, by enumerating shared values, on small shared ones), solved as
a table over the placement of its input and output cut values; segments with equal structural
hashes share one table and one plan (the plan is mapped op for op). The tables are chained and
the plan read back from the end.

The result is IR: every planned op becomes a `kernel.call` (callee = the kernel's name; `op` and
the op's attributes for an op kernel, the covered subgraph in a region for a graph kernel), a
decomposition becomes the calls of its own plan, and a `kernel.copy` moves a value wherever a
kernel reads it in another memory space (values in device memory carry the "cuda" encoding).
Each call and copy is annotated with `plan.backend`, `plan.seconds` (float) and `plan.source`
("measured", "estimated" or "roofline").
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import CallOp, CopyOp, YieldOp
from tgc.ir import Block, Operation, Region, Value
from tgc.opdef import create
from tgc.pass_manager import Pass, PassStatistics, PipelineError, register_pass
from tgc.planner.blocks import (
    Segment,
    correspondence,
    localize_sources,
    segment_key,
    segments,
    uncuttable,
)
from tgc.planner.cost import CachedCosts, CostSource, RooflineCostSource
from tgc.planner.estimate import DatabaseCostSource
from tgc.planner.options import (
    DECOMPOSE,
    BlockOptions,
    Option,
    PlanContext,
    copy_kernel,
    live_ops,
)
from tgc.planner.paths import Plan, Step, default_context, plan_cost
from tgc.planner.solve import (
    EXACT_BUDGET,
    INF,
    Problem,
    Reconstruction,
    Solution,
    Solver,
    Spaces,
    first_unplannable,
)

OBJECTIVES = ("time",)


@dataclass(eq=False)
class Selection:
    """The chosen plan, its cost (`plan_cost`), the optimum the tables found, whether every
    problem was solved exactly, and, per top-level step, every option ranked by its total cost
    (the chosen one first)."""

    plan: Plan
    seconds: float
    dp_seconds: float
    exact: bool
    segments: int
    distinct_segments: int
    alternatives: dict[Step, list[tuple[Option, float]]]
    spaces: Spaces


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
    budget: int = EXACT_BUDGET,
) -> Selection:
    """The cheapest plan of `func`. The only change to `func`: a source (constant) read by
    several segments is cloned into each. `reuse`: plan segments with equal hashes once.
    Raises TgcError when some op has no option within the tolerance. Without `ctx`: every
    backend that loads, no tolerance."""
    ctx = ctx or default_context()
    costs = (
        cost_source
        if isinstance(cost_source, CachedCosts)
        else CachedCosts(cost_source or RooflineCostSource())
    )
    block = func.body
    # Before the options are found (a clone changes the matches): cuts inside a multi-op option
    # are not known yet, so two segments that turn out one may keep a copy of a source each.
    if localize_sources(block, live_ops(block)):
        ctx.forget(block)
    bo = ctx.block_options(block)
    declared = func.function_type.results
    spaces = Spaces(
        ctx.spaces() | {a.type.encoding for a in block.args} | {t.encoding for t in declared}
    )
    solver = Solver(ctx, costs, spaces, budget)
    required: dict[Value, int] = {}
    for v, t in zip(block.last.operands, declared):
        required[v] = required.get(v, 0) | spaces.bit(t.encoding)
    return _Chain(solver, bo, func, required, reuse).run()


def _no_cut(bo: BlockOptions) -> set[int]:
    return uncuttable(bo.ops, [o.ops for opts in bo.options.values() for o in opts])


class _Chain:
    """The segments of a function solved as tables, chained, and read back."""

    def __init__(self, solver: Solver, bo: BlockOptions, func: FuncOp, required, reuse: bool):
        self.s = solver
        self.bo = bo
        self.func = func
        self.required = required
        self.reuse = reuse
        self.arg_vectors = {a: solver.spread(a.type.encoding, a.type) for a in func.body.args}
        self.reconstructions: dict[tuple, Reconstruction] = {}

    def run(self) -> Selection:
        chain = segments(self.bo.ops, _no_cut(self.bo)) if self.bo.ops else []
        if len(chain) > 1:
            chain[0].input = self._first_input(chain)
        entries, tables = [], {}
        for k, seg in enumerate(chain):
            required = self.required if k == len(chain) - 1 else {}
            key = segment_key(seg, required, self._describe) if self.reuse else f"segment {k}"
            if key not in tables:
                tables[key] = (seg, self._tables(seg, required))
            entries.append((seg, *tables[key]))
        total, choices = self._chain(entries)
        if total == INF:
            self._fail(entries)
        steps, alternatives, exact = self._read_back(entries, choices)
        position = self.bo.position
        steps.sort(key=lambda s: position[s.option.root])
        plan = Plan(self.func.body, tuple(steps))
        exact = exact and self.s.inexact == 0
        # Exact: the plan costs what the tables say (planner.solve); else evaluate it.
        seconds = total if exact else plan_cost(plan, self.s.costs)
        return Selection(
            plan, seconds, total, exact, len(chain), len(tables), alternatives, self.s.spaces
        )

    def _describe(self, op: Operation, ref) -> str:
        """An op's options, named structurally: equal segments must have corresponding ones."""
        return ";".join(
            f"{o.label}[{','.join(sorted(ref(x.results[0]) for x in o.ops))}]"
            f"({','.join(ref(v) for v in o.inputs)})"
            for o in self.bo.options[op]
        )

    def _first_input(self, chain: list[Segment]) -> Value | None:
        """The argument that plays, for the first segment, the part a cut value plays for the
        others (so the first block of a model hashes like the rest): the one argument of the
        first cut value's type that no other segment reads."""
        elsewhere = {v for seg in chain[1:] for op in seg.ops for v in op.operands}
        elsewhere |= set(self.required)
        first = {v for op in chain[0].ops for v in op.operands}
        want = chain[0].output.type
        found = [
            a for a in self.func.body.args if a in first and a not in elsewhere and a.type == want
        ]
        return found[0] if len(found) == 1 else None

    def _tables(self, seg: Segment, required) -> dict[int, tuple[Problem, Solution]]:
        reads = {v for op in seg.ops for v in op.operands} | set(required)
        inputs = {
            a: self.arg_vectors[a] for a in self.func.body.args if a in reads and a is not seg.input
        }
        out = {}
        masks = self.s.spaces.masks if seg.input is not None else [0]
        for a_in in masks:
            problem_inputs = dict(inputs)
            if seg.input is not None:
                problem_inputs[seg.input] = self.s.available(a_in)
            problem = Problem(self.bo, seg.ops, problem_inputs, required, seg.output)
            out[a_in] = (problem, self.s.solve(problem))
        return out

    def _chain(self, entries) -> tuple[float, list[list]]:
        """Min-plus product of the tables along the chain; per segment, the input mask that
        achieves each output mask."""
        count = self.s.spaces.count
        vector: list[float] | None = None
        choices = []
        for seg, _, tables in entries:
            if vector is None:  # the first segment: nothing before it, or an argument
                vector = [0.0] * count if seg.input is None else self.arg_vectors[seg.input]
            cost, arg = [INF] * count, [None] * count
            for a_in, (_, solution) in tables.items():
                before = vector[a_in]
                for mask in range(count):
                    c = before + solution.cost[mask]
                    if c < cost[mask]:
                        cost[mask], arg[mask] = c, a_in
            vector = cost
            choices.append(arg)
        if vector is None:  # nothing to compute: the function returns its arguments
            return sum(self.arg_vectors[v][m] for v, m in self.required.items()), []
        return vector[0], choices

    def _read_back(self, entries, choices):
        steps: list[Step] = []
        alternatives: dict[Step, list[tuple[Option, float]]] = {}
        exact = True
        a_out = 0
        for k in reversed(range(len(entries))):
            seg, rep, tables = entries[k]
            a_in = choices[k][a_out]
            problem, solution = tables[a_in]
            exact = exact and solution.exact
            key = (id(rep), a_in, a_out)
            rec = self.reconstructions.get(key)
            if rec is None:
                rec = self.s.reconstruct(problem, solution.states[a_out], a_out)
                self.reconstructions[key] = rec
            pairs = None if rep is seg else _transfer(rec.steps, rep, seg, self.bo)
            if rep is not seg and pairs is None:
                # Ops with equal hashes (duplicates CSE would merge) map ambiguously: solve this
                # copy itself (its tables equal the representative's, so the chain holds).
                problem, solution = self._tables(seg, problem.required)[a_in]
                rec = self.s.reconstruct(problem, solution.states[a_out], a_out)
                rep = seg
            if rep is seg:
                steps += rec.steps
                alternatives.update(rec.alternatives)
            else:
                for old, new in pairs:
                    steps.append(new)
                    alternatives[new] = rec.alternatives[old]
            a_out = a_in
        return steps, alternatives, exact

    def _fail(self, entries) -> None:
        for seg, _, tables in entries:
            for problem, _ in tables.values():
                op = first_unplannable(self.s, problem)
                if op is not None:
                    raise _no_kernel(op, self.s.ctx)
        raise TgcError(f"select-kernels: no plan of @{self.func.sym_name} is within reach")


def _no_kernel(op: Operation, ctx: PlanContext) -> TgcError:
    tolerance = "" if math.isinf(ctx.tolerance) else f" within tolerance {ctx.tolerance:g}"
    return TgcError(
        f"select-kernels: no kernel can run '{op.name}'{tolerance}, and it has no decomposition "
        f"that can",
        op.loc,
    )


def _transfer(steps: list[Step], rep: Segment, seg: Segment, bo: BlockOptions):
    """The steps of `rep`'s plan mapped onto the equal segment `seg`, as (old step, new step)
    pairs; None when some option has no counterpart (ambiguous duplicate ops)."""
    mapping = correspondence(rep, seg)
    pairs = []
    for step in steps:
        o = step.option
        covered = {mapping[x] for x in o.ops}
        found = None
        for cand in bo.options[mapping[o.root]]:
            same = cand.kind == o.kind and cand.label == o.label and set(cand.ops) == covered
            if same and _same_inner_inputs(cand, o, mapping):
                found = cand
                break
        if found is None:
            return None
        pairs.append((step, Step(found, step.nested)))
    return pairs


def _same_inner_inputs(cand: Option, o: Option, mapping: dict) -> bool:
    for new, old in zip(cand.inputs, o.inputs):
        d = old.defining_op
        if d is not None and d in mapping and mapping[d].results[old.index] is not new:
            return False
    return len(cand.inputs) == len(o.inputs)


# -- writing the plan as IR ---------------------------------------------------------------------


def materialise(func: FuncOp, selection: Selection, costs: CachedCosts) -> None:
    """Replace the body of `func` by the calls and copies of `selection.plan`."""
    block = func.body
    ret = block.last
    old = [op for op in block.ops if op is not ret]
    writer = _Writer(block, ret, costs)
    env: dict[Value, Value] = {a: a for a in block.args}
    writer.plan(selection.plan, env)
    declared = func.function_type.results
    ret.set_operands([writer.in_space(env[v], t.encoding) for v, t in zip(ret.operands, declared)])
    for op in reversed(old):
        op.erase()


class _Writer:
    def __init__(self, block: Block, before: Operation, costs: CachedCosts) -> None:
        self.block = block
        self.before = before
        self.costs = costs
        self.copies: dict[tuple[Value, str | None], Value] = {}

    def insert(self, op: Operation) -> Operation:
        self.block.insert_before(op, self.before)
        return op

    def plan(self, plan: Plan, env: dict[Value, Value]) -> None:
        for step in plan.steps:
            o = step.option
            if o.kind == DECOMPOSE:
                scratch = step.nested.block
                inner = {a: env[v] for a, v in zip(scratch.args, o.root.operands)}
                self.plan(step.nested, inner)
                for r, v in zip(o.root.results, scratch.last.operands):
                    env[r] = inner[v]
                    if inner[v].name_hint is None and v.defining_op is not None:
                        inner[v].name_hint = r.name_hint
                continue
            call = self.call(o, [self.in_space(env[u], o.space) for u in o.inputs])
            for r, new in zip(o.outputs, call.results):
                env[r] = new
                new.name_hint = r.name_hint

    def annotations(self, kernel, operand_types, result_types) -> dict:
        cost = self.costs.cost(kernel, operand_types, result_types)
        params = self.costs.params(kernel, operand_types, result_types)
        return {
            "plan.backend": kernel.backend,
            "plan.seconds": float(cost.seconds),
            "plan.source": cost.source,
            # the choices the kernel runs with (a one-value domain is no choice)
            **{f"param.{k}": v for k, v in params.items() if len(kernel.params[k]) > 1},
        }

    def call(self, o: Option, operands: list[Value]) -> Operation:
        kernel, p, root = o.kernel, o.space, o.root
        result_types = [v.type.with_encoding(p) for v in o.outputs]
        attrs = {"callee": kernel.name}
        attrs.update(self.annotations(kernel, [v.type for v in operands], result_types))
        regions = None
        if kernel.op is not None:
            attrs["op"] = kernel.op
            attrs.update({k: v for k, v in root.attributes.items() if "." not in k})
        else:
            regions = [self.region(o, operands, p)]
        return self.insert(create(CallOp, operands, attrs, result_types, regions, root.loc))

    def region(self, o: Option, operands: list[Value], space) -> Region:
        """The covered subgraph, cloned into an isolated region (constants read by value
        included), its values in the kernel's memory space."""
        body = Block([v.type for v in operands])
        inner: dict[Value, Value] = {}
        for program_value, arg in zip(o.inputs, body.args):
            inner.setdefault(program_value, arg)
        for op in [*o.match.constants, *o.ops]:
            clone = type(op)(
                [inner[v] for v in op.operands],
                [r.type.with_encoding(space) for r in op.results],
                dict(op.attributes),
                loc=op.loc,
            )
            body.append(clone)
            inner.update(zip(op.results, clone.results))
        body.append(YieldOp([inner[v] for v in o.outputs], [], loc=o.root.loc))
        return Region([body])

    def in_space(self, v: Value, space) -> Value:
        if v.type.encoding == space:
            return v
        found = self.copies.get((v, space))
        if found is None:
            kernel = copy_kernel(v.type.encoding, space)
            t = v.type.with_encoding(space)
            attrs = self.annotations(kernel, [v.type], [t])
            copy = self.insert(create(CopyOp, [v], attrs, [t], None, self.before.loc))
            found = copy.results[0]
            self.copies[(v, space)] = found
        return found


# -- the API and the pass ---------------------------------------------------------------------------


def select_kernels(
    func: FuncOp,
    cost_source: CostSource | None = None,
    tolerance: float = 1e-5,
    kernels=None,
    match=None,
    reuse: bool = True,
    canonicalize: bool = True,
) -> Selection:
    """Plan `func` and replace its body by the plan (see the module doc); returns the
    Selection. `kernels` limits the kernels considered (None: every registered one) and `match`
    replaces the matcher (tests)."""
    from tgc.planner import load_backends

    load_backends()
    if canonicalize:
        prepare(func)
    ctx = (
        PlanContext(kernels, tolerance) if match is None else PlanContext(kernels, tolerance, match)
    )
    costs = CachedCosts(cost_source or RooflineCostSource())
    selection = plan_function(func, ctx, costs, reuse)
    materialise(func, selection, costs)
    return selection


@register_pass
@dataclass(frozen=True)
class SelectKernels(Pass):
    """Choose the fastest kernels within an error tolerance and place every value (see
    planner/select.py and docs/planner.md).

    Contract: every live op of each function becomes a `kernel.call` (or the calls of its
    decomposition's plan), with a `kernel.copy` wherever a value is read in another memory space;
    each carries `plan.backend`, `plan.seconds` and `plan.source`. No kernel whose stated error
    exceeds `tolerance` is used. The function computes the same values (up to the kernels' stated
    errors); its signature does not change. Costs come from the roofline model, or with `db`
    from that measurement database (measured, else estimated, else roofline: planner/estimate.py;
    a kernel with parameters runs with its best measured ones, written as `param.<name>`); the
    plan is optimal for them on functions whose values have one reader each, and on shared values
    where the pass statistics say "exact". Options: `tolerance` (>= 0), `objective` (`time`),
    `db` (a measurement database file; empty: none).
    """

    name = "select-kernels"
    summary = "Choose kernels and placements (DP over placements, within a tolerance)"

    tolerance: float = 1e-5
    objective: str = "time"
    db: str = ""

    def __post_init__(self) -> None:
        if not self.tolerance >= 0:
            raise PipelineError(f"pass 'select-kernels' needs tolerance >= 0, got {self.tolerance}")
        if self.objective not in OBJECTIVES:
            raise PipelineError(
                f"pass 'select-kernels': unknown objective '{self.objective}' "
                f"(objectives: {', '.join(OBJECTIVES)})"
            )

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        costs = DatabaseCostSource(self.db) if self.db else None
        selection = select_kernels(func, costs, tolerance=self.tolerance)
        stats.bump("planned-ops", len(selection.plan.steps))
        stats.bump("segments", selection.segments)
        stats.bump("distinct-segments", selection.distinct_segments)
        for op in func.body.ops:
            if op.name in ("kernel.call", "kernel.copy"):
                stats.bump(op.name)
        exact = "exact" if selection.exact else "not proven optimal (shared values)"
        stats.note(f"@{func.sym_name}: {selection.seconds:.3e} s estimated, {exact}")


def with_database(passes: list, path: str) -> list:
    """`passes` with every select-kernels pass costing from the measurement database `path`
    (the tools' `--db`)."""
    import dataclasses

    return [dataclasses.replace(p, db=path) if isinstance(p, SelectKernels) else p for p in passes]
