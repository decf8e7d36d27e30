"""The dynamic programme behind `select-kernels`: the cheapest plan, placements and copies
included, in time linear in the size of the function.

State. The memory spaces in play are numbered; a *mask* is a set of them. For a value v and a
mask A, `best[v][A]` is the cheapest way found to have v available in every space of A (produced
in one, copied to the others). A kernel option at op x running in space p costs

    kernel(p) + sum over its distinct inputs u of read(u, {p})

and gives each result r the vector kernel-cost + copies from p to A \\ {p}. A decomposition
option costs, for each placement A_in of its operands (masks), the operands' reads plus its
table F[A_in][A_out], the cost of the decomposition's own (nested) problem with argument i
available in A_in[i] and its result wanted in A_out: planned once per op signature. The value's
vector is the minimum over the options; `read(u, A)` is `best[u][A]`.

What it guarantees. On a problem where every value (and every op) has one reader, the minimum
is the optimum of the plan cost (`planner.paths.plan_cost`) over all plans, decompositions
solved exactly: each value is bought once, by its one reader, with the copies it needs.

Shared values. A value read by several ops (or a multi-result op read more than once: a *unit*)
would be paid once per reader. So the solver enumerates the unit states: for each unit, the
mask it is available in (or "not computed", for an op some graph kernel may cover inside or
read by value), pays
each unit once in that state, and lets readers read it for free where it is available and not
at all elsewhere; the rest is again one reader per value, solved by the recurrence. This is
exact, and exponential in the number of units of one problem only; a problem whose search
would evaluate more than `EXACT_BUDGET` ops falls back to the plain recurrence (each reader
pays for its value: an over-estimate, the plan computes the value once) and is reported
inexact.

Problems are small: the segments of a function (cut at single values, see `planner.blocks`),
chained through the placement of their cut values, and the decompositions, one table per op
signature. So planning is linear in the number of segments and ops.
"""

from __future__ import annotations

import itertools
import math
from dataclasses import dataclass, field

from tgc.ir import Operation, Value
from tgc.planner.cost import CachedCosts
from tgc.planner.options import DECOMPOSE, BlockOptions, Option, PlanContext
from tgc.planner.paths import Plan, Step, copy_seconds

INF = math.inf
EXACT_BUDGET = 50_000  # op evaluations of one problem's search (see `_Run._work`)


class Spaces:
    """The memory spaces in play, numbered (host first), and masks over them."""

    def __init__(self, spaces) -> None:
        self.names = sorted(set(spaces), key=lambda s: (s is not None, s or ""))
        self.index = {s: i for i, s in enumerate(self.names)}
        self.count = 1 << len(self.names)  # masks 0 .. count-1
        self.masks = range(1, self.count)

    def bit(self, space) -> int:
        return 1 << self.index[space]

    def members(self, mask: int) -> list:
        return [s for i, s in enumerate(self.names) if mask >> i & 1]

    def describe(self, mask: int) -> str:
        return "{" + ", ".join(str(s or "host") for s in self.members(mask)) + "}"


@dataclass(eq=False)
class Problem:
    """Ops to plan (block order), outside values with their cost vectors (index: mask),
    values the terminator reads with the mask each needs, and the value whose cost vector is
    the answer (None: a single cost, index 0)."""

    bo: BlockOptions
    ops: list[Operation]
    inputs: dict[Value, list[float]]
    required: dict[Value, int]
    table_value: Value | None


@dataclass(eq=False)
class Solution:
    """The cost of a problem for each mask of its table value, the unit states reaching it,
    and whether the problem was solved exactly."""

    cost: list[float]
    states: list[dict | None]
    exact: bool


@dataclass(eq=False)
class Reconstruction:
    steps: list[Step]
    needs: dict[Value, int]  # masks the plan reads its outside values in
    alternatives: dict[Step, list[tuple[Option, float]]] = field(default_factory=dict)


class Solver:
    def __init__(
        self, ctx: PlanContext, costs: CachedCosts, spaces: Spaces, budget: int = EXACT_BUDGET
    ) -> None:
        self.ctx = ctx
        self.costs = costs
        self.spaces = spaces
        self.budget = budget
        self._kernel_seconds: dict[Option, float] = {}
        self._spread: dict[tuple, list[float]] = {}
        self._tables: dict[tuple, dict[tuple, tuple[Problem, Solution]]] = {}
        self._nested: dict[tuple, Reconstruction] = {}
        self.inexact = 0  # problems solved by the plain recurrence
        self.problems = 0

    # -- costs ------------------------------------------------------------------------------------

    def kernel_seconds(self, o: Option) -> float:
        found = self._kernel_seconds.get(o)
        if found is None:
            p = o.space
            ins = [v.type.with_encoding(p) for v in o.inputs]
            outs = [v.type.with_encoding(p) for v in o.outputs]
            found = self.costs.cost(o.kernel, ins, outs).seconds
            self._kernel_seconds[o] = found
        return found

    def spread(self, space, t) -> list[float]:
        """Per mask A: the copies from `space` to every other space of A, for a value of type t."""
        key = (space, t)
        found = self._spread.get(key)
        if found is None:
            found = [0.0] * self.spaces.count
            for mask in self.spaces.masks:
                found[mask] = sum(
                    copy_seconds(self.costs, space, s, t)
                    for s in self.spaces.members(mask)
                    if s != space
                )
            self._spread[key] = found
        return found

    def available(self, mask: int) -> list[float]:
        """The vector of an outside value available in `mask` for free: 0 inside, inf outside."""
        return [0.0 if m & ~mask == 0 else INF for m in range(self.spaces.count)]

    # -- decompositions ---------------------------------------------------------------------------

    def table(self, o: Option) -> dict[tuple, tuple[Problem, Solution]]:
        """F for a decomposition option: A_in (one mask per operand) -> its nested problem and
        solution (cost per A_out)."""
        key = o.decomposition.key
        found = self._tables.get(key)
        if found is not None:
            return found
        self._tables[key] = {}  # a decomposition inside itself has no entries
        bo = self.ctx.nested(o)
        args = bo.block.args
        (ret,) = bo.block.last.operands
        found = {}
        for a_in in itertools.product(self.spaces.masks, repeat=len(args)):
            inputs = {a: self.available(m) for a, m in zip(args, a_in)}
            problem = Problem(bo, bo.ops, inputs, {}, ret)
            found[a_in] = (problem, self.solve(problem))
        self._tables[key] = found
        return found

    def nested_plan(self, o: Option, a_in: tuple, a_out: int) -> Reconstruction:
        key = (o.decomposition.key, a_in, a_out)
        found = self._nested.get(key)
        if found is None:
            problem, solution = self.table(o)[a_in]
            found = self.reconstruct(problem, solution.states[a_out], a_out)
            self._nested[key] = found
        return found

    # -- solving ----------------------------------------------------------------------------------

    def solve(self, problem: Problem) -> Solution:
        self.problems += 1
        run = _Run(self, problem)
        exact = run.plan_units(self.budget)
        if not exact:
            self.inexact += 1
        run.search()
        return Solution(run.best, run.best_states, exact)

    def reconstruct(self, problem: Problem, states: dict | None, a_out: int) -> Reconstruction:
        """The plan reaching `states` (unit states of the solution) with the table value wanted
        in `a_out`: a forward pass in those states, then a backward pass choosing each needed
        op's cheapest option for the masks its readers need."""
        run = _Run(self, problem)
        run.plan_units(self.budget if states else 0, fixed=states or {})
        run.search()
        return run.backward(a_out)


class _Run:
    """One search over a problem: the forward recurrence, branching at each unit's states."""

    def __init__(self, solver: Solver, problem: Problem) -> None:
        self.s = solver
        self.p = problem
        self.sp = solver.spaces
        self.vec: dict[Value, list[float]] = dict(problem.inputs)
        self.avail: dict[Value, int] = {}
        self.state: dict = {}
        self.evals: dict[Operation, list] = {}
        self.best = [INF] * self.sp.count
        self.best_states: list[dict | None] = [None] * self.sp.count
        self.readers = self._readers()
        self.unit_ops: dict[Operation, list[tuple]] = {}
        self.unit_inputs: dict[Value, list[int]] = {}
        self.fixed: dict | None = None

    def _readers(self) -> dict[Value, int]:
        readers: dict[Value, set] = {}
        for op in self.p.ops:
            for v in set(op.operands):
                readers.setdefault(v, set()).add(op)
        for v in self.p.required:
            readers.setdefault(v, set()).add("return")
        if self.p.table_value is not None:
            readers.setdefault(self.p.table_value, set()).add("table")
        return {v: len(r) for v, r in readers.items()}

    def plan_units(self, budget: int, fixed: dict | None = None) -> bool:
        """Choose the units to enumerate: all of them when their states times the ops stay
        within `budget` (exact), none otherwise. `fixed` pins each unit to one state."""
        units_ops: dict[Operation, list[tuple]] = {}
        units_in: dict[Value, list[int]] = {}
        optional = self.p.bo.optional
        for op in self.p.ops:
            used = [r for r in op.results if self.readers.get(r)]
            if sum(self.readers.get(r, 0) for r in op.results) < 2:
                continue
            states = list(itertools.product(self.sp.masks, repeat=len(used)))
            if op in optional:
                states.append((0,) * len(used))
            units_ops[op] = states
        for v, vector in self.p.inputs.items():
            if self.readers.get(v, 0) >= 2:
                units_in[v] = [m for m in self.sp.masks if vector[m] < INF]
        exact = self._work(units_ops, units_in) <= budget
        if exact:
            self.unit_ops, self.unit_inputs = units_ops, units_in
        if fixed:
            self.unit_ops = {op: [fixed[op]] for op in self.unit_ops if op in fixed}
            self.unit_inputs = {v: [fixed[v]] for v in self.unit_inputs if v in fixed}
        return exact

    def _work(self, units_ops: dict, units_in: dict) -> int:
        """Ops evaluated by the search without pruning: each op once per combination of the
        states of the units before it."""
        branches = 1
        for states in units_in.values():
            branches *= max(len(states), 1)
        work = 0
        for op in self.p.ops:
            work += branches
            branches *= max(len(units_ops.get(op, ())), 1)
        return work + branches

    # -- reading ----------------------------------------------------------------------------------

    def read(self, v: Value, mask: int) -> float:
        have = self.avail.get(v)
        if have is not None:
            return 0.0 if mask & ~have == 0 else INF
        return self.vec[v][mask]

    # -- the forward pass -------------------------------------------------------------------------

    def search(self) -> None:
        self._inputs(list(self.unit_inputs), 0.0)

    def _inputs(self, pending: list[Value], fixed: float) -> None:
        if not pending:
            self._ops(0, fixed)
            return
        v, rest = pending[0], pending[1:]
        for mask in self.unit_inputs[v]:
            self.avail[v] = mask
            self.state[v] = mask
            self._inputs(rest, fixed + self.p.inputs[v][mask])
        self.avail.pop(v, None)

    def _bound(self) -> float:
        return max(self.best[1:]) if self.p.table_value is not None else self.best[0]

    def _ops(self, i: int, fixed: float) -> None:
        ops = self.p.ops
        while i < len(ops):
            op = ops[i]
            evals = self.evaluate(op)
            self.evals[op] = evals
            states = self.unit_ops.get(op)
            if states is not None:
                used = [r for r in op.results if self.readers.get(r)]
                for state in states:
                    c = self.unit_cost(op, evals, used, state)
                    if c == INF or fixed + c >= self._bound():
                        continue
                    for r, m in zip(used, state):
                        self.avail[r] = m
                    self.state[op] = state
                    self._ops(i + 1, fixed + c)
                return
            for r in op.results:
                if self.readers.get(r):
                    self.vec[r] = self.result_vector(op, evals, r)
            i += 1
        self._finish(fixed)

    def _finish(self, fixed: float) -> None:
        total = fixed
        for v, mask in self.p.required.items():
            total += self.read(v, mask)
        if self.p.table_value is None:
            if total < self.best[0]:
                self.best[0] = total
                self.best_states[0] = dict(self.state)
            return
        for mask in self.sp.masks:
            c = total + self.read(self.p.table_value, mask)
            if c < self.best[mask]:
                self.best[mask] = c
                self.best_states[mask] = dict(self.state)

    # -- options ----------------------------------------------------------------------------------

    def evaluate(self, op: Operation) -> list:
        """Per option: ("k", option, space, base cost) or ("d", option, cost per A_out, A_in
        achieving it per A_out)."""
        out = []
        for o in self.p.bo.options[op]:
            if o.kind == DECOMPOSE:
                out.append(self._decomposition(o))
                continue
            p = o.space
            bit = self.sp.bit(p)
            base = self.s.kernel_seconds(o)
            for u in dict.fromkeys(o.inputs):
                base += self.read(u, bit)
                if base == INF:
                    break
            out.append(("k", o, p, base))
        return out

    def _decomposition(self, o: Option) -> tuple:
        count = self.sp.count
        cost, argmin = [INF] * count, [None] * count
        distinct = list(dict.fromkeys(o.inputs))
        for a_in, (_, solution) in self.s.table(o).items():
            need = dict.fromkeys(distinct, 0)
            for u, m in zip(o.inputs, a_in):
                need[u] |= m
            c = sum(self.read(u, m) for u, m in need.items())
            if c == INF:
                continue
            for mask in self.sp.masks:
                total = c + solution.cost[mask]
                if total < cost[mask]:
                    cost[mask], argmin[mask] = total, a_in
        return ("d", o, cost, argmin)

    def option_cost(self, ev: tuple, op: Operation, masks: list[tuple[Value, int]]) -> float:
        """An evaluated option's cost when its results are wanted in the given masks."""
        if ev[0] == "d":
            (_, m) = masks[0] if masks else (None, 0)
            return ev[2][m] if m else min(ev[2][1:])
        _, _, p, base = ev
        total = base
        for r, m in masks:
            if m:
                total += self.s.spread(p, r.type)[m]
        return total

    def unit_cost(self, op: Operation, evals: list, used: list[Value], state: tuple) -> float:
        if not any(state):
            return 0.0  # not computed: some graph kernel covers it
        masks = list(zip(used, state))
        return min((self.option_cost(ev, op, masks) for ev in evals), default=INF)

    def result_vector(self, op: Operation, evals: list, r: Value) -> list[float]:
        """best[r][A] for every mask A: the cheapest option, copies to A included (the hot
        loop of the search: whole vectors at a time)."""
        vector = [INF] * self.sp.count
        for ev in evals:
            if ev[0] == "d":
                candidate = ev[2]
            else:
                base = ev[3]
                if base == INF:
                    continue
                candidate = [base + c for c in self.s.spread(ev[2], r.type)]
            vector = list(map(min, vector, candidate))
        vector[0] = INF
        return vector

    # -- the backward pass ------------------------------------------------------------------------

    def backward(self, a_out: int) -> Reconstruction:
        need: dict[Value, int] = dict(self.p.required)
        if self.p.table_value is not None and a_out:
            need[self.p.table_value] = need.get(self.p.table_value, 0) | a_out
        covered: set[Operation] = set()
        steps: list[Step] = []
        alternatives: dict[Step, list[tuple[Option, float]]] = {}
        for op in reversed(self.p.ops):
            masks = [(r, need.get(r, 0)) for r in op.results]
            if not any(m for _, m in masks) or op in covered:
                continue
            ranked = sorted(
                ((self.option_cost(ev, op, masks), k) for k, ev in enumerate(self.evals[op])),
                key=lambda item: item[0],
            )
            cost, k = ranked[0]
            if cost == INF:
                raise NoPlan(op)
            ev = self.evals[op][k]
            step = self._step(ev, masks, need)
            covered.update(step.option.ops[:-1])
            steps.append(step)
            alternatives[step] = [(self.evals[op][j][1], c) for c, j in ranked]
        steps.reverse()
        inputs = {v: need[v] for v in self.p.inputs if need.get(v)}
        return Reconstruction(steps, inputs, alternatives)

    def _step(self, ev: tuple, masks, need: dict[Value, int]) -> Step:
        o = ev[1]
        if ev[0] == "k":
            bit = self.sp.bit(ev[2])
            for u in o.inputs:
                need[u] = need.get(u, 0) | bit
            return Step(o)
        a_out = masks[0][1]
        a_in = ev[3][a_out]
        for u, m in zip(o.inputs, a_in):
            need[u] = need.get(u, 0) | m
        nested = self.s.nested_plan(o, a_in, a_out)
        return Step(o, Plan(o.decomposition.func.body, tuple(nested.steps)))


def first_unplannable(solver: Solver, problem: Problem) -> Operation | None:
    """The first op (block order) that no option can run, its operands free everywhere."""
    run = _Run(solver, problem)
    run.vec.update({v: [0.0] * solver.spaces.count for v in problem.inputs})
    for op in problem.ops:
        evals = run.evaluate(op)
        for r in op.results:
            run.vec[r] = run.result_vector(op, evals, r)
        if all(run.vec[r][m] == INF for r in op.results for m in solver.spaces.masks):
            return op
    return None


class NoPlan(Exception):
    """No option of `op` can run within the tolerance (or reach the spaces needed)."""

    def __init__(self, op: Operation) -> None:
        super().__init__(op.name)
        self.op = op
