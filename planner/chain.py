"""The planning tables of `select-kernels` (planner/select.py): a function's segments solved as
tables over the placement of their input and output cut values (`planner.solve`), chained by a
min-plus product and read back into a `Selection`. Segments with equal structural hashes share
one table and one plan, mapped op for op (`_transfer`); the copies of `planner/copies.py` take
theirs through `_map_option`.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.diagnostics import TgcError
from tgc.ir import Operation, Value
from tgc.planner.blocks import (
    Segment,
    correspondence,
    segment_key,
    segments,
    source_ops,
    uncuttable,
)
from tgc.planner.match import Match
from tgc.planner.options import BlockOptions, Option, PlanContext
from tgc.planner.paths import Plan, Step, plan_cost
from tgc.planner.solve import (
    INF,
    Problem,
    Reconstruction,
    Solution,
    Solver,
    Spaces,
    first_unplannable,
)


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


def _no_cut(bo: BlockOptions) -> set[int]:
    """No cut inside an option's span: its covered ops, and the ops it reads by value that are
    not sources. Such an op (a generated kernel's view of an input, `reshape %w`) is recomputed
    by the option from its own operands, which the option reads: a cut between it and the root
    would leave them outside the root's segment, read there but no input of its problem.
    Sources are cloned into each segment that reads them (`localize_sources`), and their
    operands are sources too: they never stretch a span."""
    sources = source_ops(bo.ops)
    position = bo.position
    spans = []
    for opts in bo.options.values():
        for o in opts:
            by_value = o.match.constants if o.match is not None else ()
            reads = [c for c in by_value if c in position and c not in sources]
            spans.append(tuple(sorted([*reads, *o.ops], key=position.__getitem__)))
    return uncuttable(bo.ops, spans)


class _ArgumentVectors(dict):
    """Per function argument, its cost vector (available where its type says, copied to the
    other spaces; a parameter's copies once per set of parameters, planner/fixed.py), made when
    first asked for: a model has many weights, each read once."""

    def __init__(self, solver: Solver) -> None:
        super().__init__()
        self.solver = solver

    def __missing__(self, a: Value) -> list[float]:
        found = self[a] = self.solver.spread_of(a.type.encoding, a)
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
        # Equal segments have as many ops: a segment alone of its size is not hashed (a model
        # that no cut splits, GPT-2 with its tied embedding, is one segment of every op).
        sizes = Counter(len(seg.ops) for seg in chain)
        for k, seg in enumerate(chain):
            required = self.last_required if k == len(chain) - 1 else {}
            if self.reuse and sizes[len(seg.ops)] > 1:
                key = segment_key(seg, required, self._describe)
            else:
                key = f"segment {k}"
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
