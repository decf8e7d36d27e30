"""`select-kernels`: choose, for every op, the fastest way to run it within an error tolerance,
and write the choice as IR.

The function is first put in canonical form (`canonicalize`, `cse`: graph kernels match the
canonical form), sources read by several segments are cloned into each (`planner.blocks`), and
its live ops are cut into a chain of segments. Each segment is a problem of `planner.solve`
(exact on one-reader graphs and, by enumerating shared values, on small shared ones), solved as
a table over the placement of its input and output cut values. A segment that copies an
earlier one op for op (`planner.blocks.copy_map`) takes its plan, mapped, without being matched
against the kernels, hashed or solved (`_CopyChain`); the others are matched, and those with
equal structural hashes share one table and one plan (mapped op for op). The tables are chained
and the plan read back from the end.

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
from typing import ClassVar

from tgc.builtin import FuncOp
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import CallOp, CopyOp, YieldOp
from tgc.ir import Block, Operation, Region, Value, paused_gc
from tgc.opdef import create
from tgc.pass_manager import Pass, PassStatistics, PipelineError, register_pass
from tgc.planner.blocks import (
    Segment,
    copy_map,
    correspondence,
    localize,
    localize_sources,
    segment_key,
    segments,
    source_ops,
    split,
    uncuttable,
)
from tgc.planner.cost import CachedCosts, CostSource, RooflineCostSource
from tgc.planner.estimate import DatabaseCostSource
from tgc.planner.kernel import KERNELS, canonical_references, reference_root, registry_version
from tgc.planner.match import Match
from tgc.planner.options import (
    DECOMPOSE,
    FUSED_OPTIONS,
    BlockOptions,
    Option,
    PlanContext,
    _default_match,
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
    with paused_gc():  # thousands of small objects, no garbage (see tgc.ir.paused_gc)
        return _plan(func, ctx, costs, reuse, budget)


def _plan(
    func: FuncOp, ctx: PlanContext, costs: CachedCosts, reuse: bool, budget: int
) -> Selection:
    block = func.body
    declared = func.function_type.results
    spaces = Spaces(
        ctx.spaces() | {a.type.encoding for a in block.args} | {t.encoding for t in declared}
    )
    solver = Solver(ctx, costs, spaces, budget)
    required: dict[Value, int] = {}
    for v, t in zip(block.last.operands, declared):
        required[v] = required.get(v, 0) | spaces.bit(t.encoding)
    if reuse and _options_are_local(ctx):
        selection = _CopyChain(solver, func, required).run()
        if selection is not None:
            return selection
    # Before the options are found (a clone changes the matches): cuts inside a multi-op option
    # are not known yet, so two segments that turn out one may keep a copy of a source each.
    if localize_sources(block, live_ops(block)):
        ctx.forget(block)
    bo = ctx.block_options(block)
    return _Chain(solver, bo, func, required, reuse).run()


def _no_cut(bo: BlockOptions) -> set[int]:
    return uncuttable(bo.ops, [o.ops for opts in bo.options.values() for o in opts])


class _ArgumentVectors(dict):
    """Per function argument, its cost vector (available where its type says, copied to the
    other spaces), made when first asked for: a model has many weights, each read once."""

    def __init__(self, solver: Solver) -> None:
        super().__init__()
        self.solver = solver

    def __missing__(self, a: Value) -> list[float]:
        found = self[a] = self.solver.spread(a.type.encoding, a.type)
        return found


@dataclass(eq=False)
class _Kind:
    """Segments with one table: the one it was solved for and the table (input mask ->
    problem and solution)."""

    rep: Segment
    tables: dict[int, tuple[Problem, Solution]]


@dataclass(eq=False)
class _Entry:
    """A segment of the chain and its table. A copy (`copy_of`, see `planner.blocks.copy_map`)
    takes the plan of the segment it copies, mapped by `values` and `ops`."""

    seg: Segment
    kind: _Kind | None = None
    copy_of: Segment | None = None
    values: dict[Value, Value] | None = None
    ops: dict[Operation, Operation] | None = None


class _Chain:
    """The segments of a function solved as tables, chained, and read back."""

    def __init__(self, solver: Solver, bo, func: FuncOp, required, reuse: bool):
        self.s = solver
        self.bo = bo
        self.func = func
        self.required = required
        self.reuse = reuse
        self.arg_vectors = _ArgumentVectors(solver)
        self.reconstructions: dict[tuple, Reconstruction] = {}
        self.segment_plans: dict[tuple, list[tuple[Step, list]]] = {}
        self.final = 0  # the mask the chain's last table is read at (see `_close`)
        self.last_required = required

    def run(self) -> Selection:
        chain = segments(self.bo.ops, _no_cut(self.bo)) if self.bo.ops else []
        if len(chain) > 1:
            chain[0].input = self._first_input(chain, self.bo.position)
        self._close(chain)
        entries, kinds = [], {}
        for k, seg in enumerate(chain):
            required = self.last_required if k == len(chain) - 1 else {}
            key = segment_key(seg, required, self._describe) if self.reuse else f"segment {k}"
            if key not in kinds:
                kinds[key] = _Kind(seg, self._tables(seg, required))
            entries.append(_Entry(seg, kinds[key]))
        return self._finish(entries, len(kinds), self.bo.position)

    def _close(self, chain: list[Segment]) -> None:
        """A function returning one value computed in its last segment: that value is the last
        segment's output, like any cut value, and the chain's answer its table at the mask the
        signature asks for. So the last block of a model is a copy of the ones before (one
        table less to solve) and its plan the same as if it returned through `required`."""
        if len(self.required) != 1 or not chain:
            return
        ((v, mask),) = self.required.items()
        if v.defining_op is not None and v.defining_op in set(chain[-1].ops):
            chain[-1].output = v
            self.final = mask
            self.last_required = {}

    def _finish(self, entries: list[_Entry], distinct: int, position: dict) -> Selection:
        total, choices = self._chain(entries)
        if total == INF:
            self._fail(entries)
        steps, alternatives, exact = self._read_back(entries, choices)
        steps.sort(key=lambda s: position[s.option.root])
        plan = Plan(self.func.body, tuple(steps))
        exact = exact and self.s.inexact == 0
        # Exact: the plan costs what the tables say (planner.solve); else evaluate it.
        seconds = total if exact else plan_cost(plan, self.s.costs)
        return Selection(
            plan, seconds, total, exact, len(entries), distinct, alternatives, self.s.spaces
        )

    def _describe(self, op: Operation, ref) -> str:
        """An op's options, named structurally: equal segments must have corresponding ones."""
        return ";".join(
            f"{o.label}[{','.join(sorted(ref(x.results[0]) for x in o.ops))}]"
            f"({','.join(ref(v) for v in o.inputs)})"
            for o in self.bo.options[op]
        )

    def _first_input(self, chain: list[Segment], live) -> Value | None:
        """The argument that plays, for the first segment, the part a cut value plays for the
        others (so the first block of a model hashes like the rest): the one argument of the
        first cut value's type that no other segment reads."""
        first = chain[0]
        members = set(first.ops)
        want = first.output.type
        found = [
            a
            for a in self.func.body.args
            if a.type is want
            and a not in self.required
            and any(u in members for u, _ in a.uses)
            and all(u in members for u, _ in a.uses if u in live)
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

    def _chain(self, entries: list[_Entry]) -> tuple[float, list[list]]:
        """Min-plus product of the tables along the chain; per segment, the input mask that
        achieves each output mask."""
        count = self.s.spaces.count
        vector: list[float] | None = None
        choices = []
        for entry in entries:
            if vector is None:  # the first segment: nothing before it, or an argument
                first = entry.seg.input
                vector = [0.0] * count if first is None else self.arg_vectors[first]
            cost, arg = [INF] * count, [None] * count
            for a_in, (_, solution) in entry.kind.tables.items():
                before = vector[a_in]
                for mask in range(count):
                    c = before + solution.cost[mask]
                    if c < cost[mask]:
                        cost[mask], arg[mask] = c, a_in
            vector = cost
            choices.append(arg)
        if vector is None:  # nothing to compute: the function returns its arguments
            return sum(self.arg_vectors[v][m] for v, m in self.required.items()), []
        return vector[self.final], choices

    def _read_back(self, entries: list[_Entry], choices):
        steps: list[Step] = []
        alternatives: dict[Step, list[tuple[Option, float]]] = {}
        exact = True
        a_out = self.final
        for k in reversed(range(len(entries))):
            entry = entries[k]
            a_in = choices[k][a_out]
            exact = exact and entry.kind.tables[a_in][1].exact
            if entry.copy_of is None:
                for step, ranked in self._segment_plan(entry.seg, entry.kind, a_in, a_out):
                    steps.append(step)
                    alternatives[step] = ranked
            else:
                own = self._segment_plan(entry.copy_of, entry.kind, a_in, a_out)
                values, ops = entry.values, entry.ops
                for step, ranked in own:
                    new = Step(_map_option(step.option, values, ops), step.nested)
                    steps.append(new)
                    alternatives[new] = ranked
            a_out = a_in
        return steps, alternatives, exact

    def _segment_plan(self, seg: Segment, kind: _Kind, a_in: int, a_out: int) -> list:
        """The steps of `seg` (and each one's ranked alternatives) in the plan of its table
        with input mask `a_in` and output mask `a_out` (once per segment and masks)."""
        key = (id(seg), a_in, a_out)
        found = self.segment_plans.get(key)
        if found is not None:
            return found
        rep = kind.rep
        problem, solution = kind.tables[a_in]
        rec = self._reconstruct(rep, problem, solution, a_in, a_out)
        if rep is seg:
            found = [(s, rec.alternatives[s]) for s in rec.steps]
        else:
            pairs = _transfer(rec.steps, rep, seg, self.bo)
            if pairs is None:
                # Ops with equal hashes (duplicates CSE would merge) map ambiguously: solve this
                # segment itself (its tables equal the representative's, so the chain holds).
                problem, solution = self._tables(seg, problem.required)[a_in]
                rec = self._reconstruct(seg, problem, solution, a_in, a_out)
                found = [(s, rec.alternatives[s]) for s in rec.steps]
            else:
                found = [(new, rec.alternatives[old]) for old, new in pairs]
        self.segment_plans[key] = found
        return found

    def _reconstruct(self, seg, problem, solution, a_in, a_out) -> Reconstruction:
        key = (id(seg), a_in, a_out)
        rec = self.reconstructions.get(key)
        if rec is None:
            rec = self.s.reconstruct(problem, solution.states[a_out], a_out)
            self.reconstructions[key] = rec
        return rec

    def _fail(self, entries: list[_Entry]) -> None:
        for entry in entries:
            for problem, _ in entry.kind.tables.values():
                op = first_unplannable(self.s, problem)
                if op is not None:
                    raise _no_kernel(op, self.s.ctx)
        raise TgcError(f"select-kernels: no plan of @{self.func.sym_name} is within reach")


# -- copies of segments ---------------------------------------------------------------------------


def _options_are_local(ctx: PlanContext) -> bool:
    """Whether the options at an op are the registered kernels' matches there (and its
    decomposition): what `_CopyChain` knows how far they reach."""
    return ctx.match is _default_match and not FUSED_OPTIONS


class _SegmentOptions:
    """The options of the ops that `_CopyChain` matched (what `planner.solve` reads of a
    `BlockOptions`)."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self.options: dict[Operation, list[Option]] = {}
        self.optional: set[Operation] = set()

    def add(self, op: Operation, options: list[Option]) -> None:
        self.options[op] = options
        for o in options:
            self.optional.update(o.ops[:-1])
            if o.match is not None:
                self.optional.update(o.match.constants)


class _CopyChain(_Chain):
    """Planning where a segment that copies an earlier one op for op (`copy_map`) is neither
    matched nor hashed nor solved: its plan is the earlier one's, mapped. The rest is
    `_Chain`'s: segments matched, hashed by structure and options, one table per hash.

    A match could reach back over a cut into the segment before, and then the options of a copy
    would not be those of the segment it copies. Where the cut value's defining op could be
    covered inside some graph kernel's reference (same name and use count), the options at the
    ops that could root such a match are found and compared; a segment whose matched options
    cross a cut gives the function back to `_Chain` (None), which never cuts inside an option."""

    def __init__(self, solver: Solver, func: FuncOp, required) -> None:
        super().__init__(solver, _SegmentOptions(func.body), func, required, True)

    def run(self) -> Selection | None:
        block = self.func.body
        ops = live_ops(block)
        if not ops:
            return None
        # Every op live: the use counts of a copy's values need no comparing (`copy_map`).
        counts = len(ops) != len(block) - 1
        sources = source_ops(ops)
        chain, owners = split(ops, sources=sources)
        self.origin: dict[Operation, Operation] = {}
        localize(chain, ops, sources, owners, self.origin)
        live = set(ops)
        live.update(sources)  # the copies of sources made for each segment
        if len(chain) > 1:
            chain[0].input = self._first_input(chain, live)
        self._close(chain)
        entries = self._classify(chain, sources, live, counts)
        if entries is None:
            return None
        kinds: dict[str, _Kind] = {}
        kind_of: dict[Segment, _Kind] = {}
        for k, entry in enumerate(entries):
            if entry.copy_of is None:
                seg = entry.seg
                required = self.last_required if k == len(entries) - 1 else {}
                key = segment_key(seg, required, self._describe)
                if key not in kinds:
                    kinds[key] = _Kind(seg, self._tables(seg, required))
                kind_of[seg] = kinds[key]
            entry.kind = kind_of[entry.copy_of or entry.seg]
        position = {op: i for i, op in enumerate(block.ops)}
        return self._finish(entries, len(kinds), position)

    def _classify(
        self, chain: list[Segment], sources: set, live: set, counts: bool
    ) -> list[_Entry] | None:
        """Each segment as a copy of an earlier one, or with its options matched; None when
        some matched option crosses a cut."""
        reach = _Reach.of(self.s.ctx)
        firsts: dict[tuple, list[Segment]] = {}  # core op classes -> segments matched
        entries = []
        # (segment copied before, segment copied): no match can cross the cut between them.
        # Valid for all such pairs when every use count is known alike (`counts` False).
        self.unreached: set[tuple] = set()
        for seg in chain:
            shape = tuple(map(type, seg.core))
            entry = None
            if seg.output is not None:  # (not a last segment returning through `required`)
                before = entries[-1].copy_of or entries[-1].seg if entries else None
                for rep in firsts.get(shape, ()):
                    mapped = copy_map(rep, seg, sources, counts, self.origin)
                    if mapped is None:
                        continue
                    pair = (before, rep)
                    if pair not in self.unreached:
                        same = self._reach(seg, *mapped, reach, live)
                        if same is False:
                            continue
                        if same is None and not counts:
                            self.unreached.add(pair)
                    entry = _Entry(seg, None, rep, *mapped)
                    break
            if entry is None:
                if not self._match(seg, live):
                    return None
                entry = _Entry(seg)
                if seg.output is not None:
                    firsts.setdefault(shape, []).append(seg)
            entries.append(entry)
        return entries

    def _match(self, seg: Segment, live: set) -> bool:
        """Find the options of the segment's ops; False when one crosses a cut."""
        members = set(seg.ops)
        for op in seg.ops:
            kept = []
            for o in self.s.ctx.options_at(op):
                if all(x in members for x in o.ops):
                    kept.append(o)
                elif all(x in live for x in o.ops):
                    return False
            self.bo.add(op, kept)
        return True

    def _reach(self, seg, values, ops, reach: _Reach, live: set) -> bool | None:
        """Whether no option of `seg` reaches back over its input cut: None when no op of `seg`
        could root such a match (that depends only on the ops and use counts of `seg` and of
        the segment before, so it holds for every copy of the pair), else whether the options
        at those ops are those of the segment `seg` copies, mapped."""
        v = seg.input
        d = v.defining_op if v is not None else None
        if d is None:
            return None
        roots = reach.roots(d)
        if not roots:
            return None
        inverse = {b: a for a, b in ops.items()}
        inside = [(x, inverse[x]) for x in roots if x in inverse]  # else: the next one's check
        for x, a in inside:
            found = [o for o in self.s.ctx.options_at(x) if all(y in live for y in o.ops)]
            mapped = [_map_option(o, values, ops) for o in self.bo.options[a]]
            if len(found) != len(mapped) or not all(map(_same_option, found, mapped)):
                return False
        return True if inside else None


class _Reach:
    """Which ops of a program could root a graph-kernel match that covers a given op inside:
    the reference ops of every graph kernel considered, by name, with their use counts."""

    # (registry version, ids of the graph kernels) -> those kernels (held, so that their ids
    # stay theirs) and what they reach.
    _cache: ClassVar[dict[tuple, tuple[tuple, _Reach]]] = {}

    def __init__(self, kernels) -> None:
        self.inner: dict[str, list[tuple[Operation, int, Operation]]] = {}
        for k in kernels:
            for ref in canonical_references(k):
                root = reference_root(ref)
                for op in ref.body.ops:
                    if op is root or op is ref.body.last or op.name == "atomic.constant":
                        continue
                    uses = sum(len(r.uses) for r in op.results)
                    self.inner.setdefault(op.name, []).append((op, uses, root))

    @classmethod
    def of(cls, ctx: PlanContext) -> _Reach:
        pool = KERNELS.values() if ctx.kernels is None else ctx.kernels
        graph = tuple(k for k in pool if k.op is None)
        key = (registry_version(), tuple(map(id, graph)))
        found = cls._cache.get(key)
        if found is None:
            if len(cls._cache) >= 8:
                cls._cache.clear()
            found = cls._cache[key] = (graph, cls(graph))
        return found[1]

    def roots(self, d: Operation) -> list[Operation]:
        """Program ops that a match covering `d` (not as its root) could be rooted at: those
        reached from `d` along uses through ops named like a path from a reference op named
        like `d`, with as many uses, to its reference's root."""
        candidates = self.inner.get(d.name)
        if not candidates:
            return []
        uses = sum(len(r.uses) for r in d.results)
        found: dict[Operation, None] = {}
        for op, count, root in candidates:
            if count != uses:
                continue
            pairs, seen = [(op, d)], set()
            while pairs:
                r, p = pairs.pop()
                if r is root:
                    found[p] = None
                    continue
                for ru in {u for x in r.results for u, _ in x.uses}:
                    for pu in {u for y in p.results for u, _ in y.uses}:
                        if pu.name == ru.name and (ru, pu) not in seen:
                            seen.add((ru, pu))
                            pairs.append((ru, pu))
        return list(found)


def _map_option(o: Option, values: dict, ops: dict) -> Option:
    """The option of a segment's copy that stands for `o` (see `copy_map`).

    Made as `dataclasses.replace` would (the model's fields, with another root, ops, inputs and
    outputs, and a match moved alike) but without the frozen dataclasses' `__init__`, which
    sets every field through `object.__setattr__`: a microsecond an option, and a copy's plan
    makes one per op."""
    root = ops[o.root]
    m = o.match
    if m is None or m.kernel.op is not None:  # the op alone: its operands and results
        covered, inputs, outputs = (root,), tuple(root.operands), tuple(root.results)
        constants = ()
    else:
        covered = tuple(ops[x] for x in o.ops)
        inputs = tuple(values[u] for u in o.inputs)
        outputs = tuple(values[r] for r in o.outputs)
        constants = tuple(ops[c] for c in m.constants)
    new = _new(Option)
    state = new.__dict__
    state.update(o.__dict__)
    state["root"] = root
    state["ops"] = covered
    state["inputs"] = inputs
    state["outputs"] = outputs
    if m is not None:
        match = _new(Match)
        moved = match.__dict__
        moved.update(m.__dict__)
        moved["root"] = root
        moved["ops"] = covered
        moved["inputs"] = inputs
        moved["outputs"] = outputs
        moved["constants"] = constants
        state["match"] = match
    return new


_new = object.__new__


def _same_option(a: Option, b: Option) -> bool:
    return (
        a.kind == b.kind
        and a.kernel is b.kernel
        and a.decomposition is b.decomposition
        and a.ops == b.ops
        and a.inputs == b.inputs
        and a.outputs == b.outputs
    )


def _no_kernel(op: Operation, ctx: PlanContext) -> TgcError:
    tolerance = "" if math.isinf(ctx.tolerance) else f" within tolerance {ctx.tolerance:g}"
    return TgcError(
        f"select-kernels: no kernel can run '{op.name}'{tolerance}, and it has no decomposition "
        f"that can",
        op.loc,
    )


def _transfer(steps: list[Step], rep: Segment, seg: Segment, bo):
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
    backends: tuple[str, ...] | None = None,
) -> Selection:
    """Plan `func` and replace its body by the plan (see the module doc); returns the
    Selection. `backends` (family names: numpy, cuda, torch) loads those backends and limits
    the kernels considered to theirs (None: every backend that loads here); `kernels` limits
    them to a pool (None: every registered one; nothing more is loaded) and `match` replaces
    the matcher (tests)."""
    from tgc.planner import kernel_backends, load_backends

    load_backends(backends if kernels is None else ("numpy",))
    if canonicalize:
        prepare(func)
    allowed = None if backends is None else kernel_backends(backends)
    ctx = (
        PlanContext(kernels, tolerance, backends=allowed)
        if match is None
        else PlanContext(kernels, tolerance, match, backends=allowed)
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
    `db` (a measurement database file; empty: none), `backends` (comma-separated backend
    families, numpy, cuda, torch: only their kernels are considered; empty: every backend that
    loads here).
    """

    name = "select-kernels"
    summary = "Choose kernels and placements (DP over placements, within a tolerance)"

    tolerance: float = 1e-5
    objective: str = "time"
    db: str = ""
    backends: tuple[str, ...] = ()

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


def with_database(passes: list, path: str) -> list:
    """`passes` with every select-kernels pass costing from the measurement database `path`
    (the tools' `--db`)."""
    import dataclasses

    return [dataclasses.replace(p, db=path) if isinstance(p, SelectKernels) else p for p in passes]


def with_backends(passes: list, families: tuple[str, ...]) -> list:
    """`passes` with every select-kernels pass limited to the backend families `families`
    (the tools' `--planner-backends`)."""
    import dataclasses

    return [
        dataclasses.replace(p, backends=families) if isinstance(p, SelectKernels) else p
        for p in passes
    ]
