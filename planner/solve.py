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

Options with several results. A generated region may also write a value of an op it covers
for readers outside it (`Option.extra_outputs`: fuse's kernel that writes a residual sum and
the layernorm of it). Such a value v is a unit (read inside and outside), and one of its states
is "made by region o, available in A" (`_By`, A holding o's space): v's own op does not run,
nothing reads v until o's root, o is then the root's only option (and no other option may
cover an op of o), and v is available in A after it; the copies to A are paid with the state.
Without that state such an option is never taken. The plain recurrence (no units) takes none.

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
from tgc.planner.fixed import ONCE_WEIGHT, Fixed
from tgc.planner.options import DECOMPOSE, BlockOptions, Option, PlanContext
from tgc.planner.paths import Plan, Step, copy_seconds

INF = math.inf
EXACT_BUDGET = 50_000  # op evaluations of one problem's search (see `_Run._work`)


@dataclass(frozen=True, eq=False)
class _By:
    """A unit state: the value is written by region option `option` (rooted later), and is
    available in `mask` from its root on."""

    option: Option
    mask: int


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
        # kernel seconds by (kernel, operand types, result types): the options of a model's
        # equal layers are distinct objects asking one question (planner/cost.py's CachedCosts
        # would answer it from its memo, but only after its key is built, types moved to the
        # kernel's space and parameters looked up, for every option of every layer)
        self._kernel_types: dict[tuple, float] = {}
        self._spread: dict[tuple, list[float]] = {}
        self._copies: dict[tuple, float] = {}
        self._tables: dict[tuple, dict[tuple, tuple[Problem, Solution]]] = {}
        self._nested: dict[tuple, Reconstruction] = {}
        self.inexact = 0  # problems solved by the plain recurrence
        self.problems = 0
        # which values are computed once per set of parameters (planner/fixed.py): their
        # kernels and copies weigh ONCE_WEIGHT of their time
        self.fixed = Fixed()

    # -- costs ------------------------------------------------------------------------------------

    def kernel_seconds(self, o: Option) -> float:
        found = self._kernel_seconds.get(o)
        if found is None:
            kernel = o.kernel
            key = (kernel, tuple(v.type for v in o.inputs), tuple(v.type for v in o.outputs))
            found = self._kernel_types.get(key)
            if found is None:
                p = kernel.space
                ins = tuple(t.with_encoding(p) for t in key[1])
                outs = tuple(t.with_encoding(p) for t in key[2])
                placed = (kernel, ins, outs)  # (values typed with and without their space)
                found = self._kernel_types.get(placed)
                if found is None:
                    found = self.costs.cost(kernel, ins, outs).seconds
                    self._kernel_types[placed] = found
                self._kernel_types[key] = found
            if self.fixed.reads(o.inputs):
                found *= ONCE_WEIGHT
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
                    self.copy_seconds(space, s, t) for s in self.spaces.members(mask) if s != space
                )
            self._spread[key] = found
        return found

    def copy_seconds(self, src, dst, t) -> float:
        """A copy of a value of type t from space `src` to `dst`, asked once per shape and
        element type: each mask holding `dst` needs it, and a value's type may or may not
        carry its space already."""
        key = (src, dst, t.with_encoding(None))
        found = self._copies.get(key)
        if found is None:
            found = self._copies[key] = copy_seconds(self.costs, src, dst, t)
        return found

    def spread_of(self, space, v: Value) -> list[float]:
        """`spread` for the value `v`: a once value (planner/fixed.py) is copied once per set
        of parameters."""
        if not self.fixed.value(v):
            return self.spread(space, v.type)
        key = (space, v.type, "once")
        found = self._spread.get(key)
        if found is None:
            found = self._spread[key] = [c * ONCE_WEIGHT for c in self.spread(space, v.type)]
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
        self.reader_ops = self._readers()
        self.readers = {v: len(r) for v, r in self.reader_ops.items()}
        self.unit_ops: dict[Operation, list[tuple]] = {}
        self.unit_inputs: dict[Value, list[int]] = {}
        self.fixed: dict | None = None
        # this branch's deferred values (unit state _By): the value -> its state, and each op
        # of a deferring option -> that option
        self.deferred: dict[Value, _By] = {}
        self.claimed: dict[Operation, Option] = {}

    def _readers(self) -> dict[Value, set]:
        readers: dict[Value, set] = {}
        for op in self.p.ops:
            for v in set(op.operands):
                readers.setdefault(v, set()).add(op)
        for v in self.p.required:
            readers.setdefault(v, set()).add("return")
        if self.p.table_value is not None:
            readers.setdefault(self.p.table_value, set()).add("table")
        return readers

    def plan_units(self, budget: int, fixed: dict | None = None) -> bool:
        """Choose the units to enumerate: all of them when their states times the ops stay
        within `budget` (exact), none otherwise. `fixed` pins each unit to one state."""
        units_ops: dict[Operation, list[tuple]] = {}
        units_in: dict[Value, list[int]] = {}
        optional = self.p.bo.optional
        writers = self._writers()
        for op in self.p.ops:
            used = [r for r in op.results if self.readers.get(r)]
            if sum(self.readers.get(r, 0) for r in op.results) < 2:
                continue
            states: list = list(itertools.product(self.sp.masks, repeat=len(used)))
            if op in optional:
                states.append((0,) * len(used))
            if len(used) == 1:
                states += [_By(o, m) for o, m in writers.get(used[0], ())]
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

    def _writers(self) -> dict[Value, list[tuple[Option, int]]]:
        """For each value a region option of this problem also writes: (that option, a mask
        holding its space) for each such mask, the value's _By states."""
        out: dict[Value, list[tuple[Option, int]]] = {}
        ops = set(self.p.ops)
        for root in self.p.ops:
            for o in self.p.bo.options[root]:
                if o.extra_outputs and all(x in ops for x in o.ops):
                    bit = self.sp.bit(o.space)
                    for v in o.extra_outputs:
                        out.setdefault(v, []).extend((o, m) for m in self.sp.masks if m & bit)
        return out

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
            forced = None
            if self.deferred:  # (rare: only while a value waits for the region writing it)
                at_op = {
                    id(b.option): b.option for b in self.deferred.values() if b.option.root is op
                }
                if len(at_op) > 1 or not all(map(self._all_deferred, at_op.values())):
                    return  # no such plan: two regions at one root, or a value written twice
                forced = next(iter(at_op.values()), None)
            evals = self.evaluate(op, forced)
            if forced is not None and not any(self._finite(ev) for ev in evals):
                return  # the region that was to write a deferred value cannot run here
            self.evals[op] = evals
            states = self.unit_ops.get(op)
            if states is not None:
                used = [r for r in op.results if self.readers.get(r)]
                for state in states:
                    self._leave(used)  # the claim of the state tried before
                    c = self.unit_cost(op, evals, used, state, forced is not None)
                    if c == INF or fixed + c >= self._bound():
                        continue
                    self._enter(op, used, state)
                    self._written(op)
                    self.state[op] = state
                    self._ops(i + 1, fixed + c)
                self._leave(used)
                return
            for r in op.results:
                if self.readers.get(r):
                    self.vec[r] = self.result_vector(op, evals, r)
            self._written(op)
            i += 1
        self._finish(fixed)

    def _enter(self, op: Operation, used: list[Value], state) -> None:
        """Make `state` the unit's: its values' availability, and for a _By state the claim of
        the region that writes the value."""
        self._leave(used)
        if isinstance(state, _By):
            (v,) = used
            self.avail[v] = 0  # nothing reads it before the region's root
            self.deferred[v] = state
            for x in state.option.ops:
                self.claimed[x] = state.option
            return
        for r, m in zip(used, state):
            self.avail[r] = m

    def _leave(self, used: list[Value]) -> None:
        """Undo a _By state of these values (the branch is left)."""
        if not self.deferred:
            return
        for v in used:
            b = self.deferred.pop(v, None)
            if b is not None:
                for x in b.option.ops:
                    if self.claimed.get(x) is b.option:
                        del self.claimed[x]
                self.avail.pop(v, None)

    @staticmethod
    def _finite(ev: tuple) -> bool:
        return ev[3] < INF if ev[0] == "k" else any(c < INF for c in ev[2])

    def _read_extras(self, o: Option) -> list[Value]:
        """The values `o` writes that this problem reads outside it."""
        inside = set(o.ops)
        return [v for v in o.extra_outputs if self.reader_ops.get(v, set()) - inside]

    def _all_deferred(self, o: Option) -> bool:
        """Whether every value `o` writes for outside readers is deferred to it."""
        return all(
            (b := self.deferred.get(v)) is not None and b.option is o for v in self._read_extras(o)
        )

    def _written(self, op: Operation) -> None:
        """After a region's root: the values it writes for later readers are available."""
        if not self.deferred:
            return
        for v, b in self.deferred.items():
            if b.option.root is op:
                self.avail[v] = b.mask

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

    def evaluate(self, op: Operation, forced: Option | None = None) -> list:
        """Per option: ("k", option, space, base cost) or ("d", option, cost per A_out, A_in
        achieving it per A_out). A region that writes values of other ops is an option only
        where such a value's state made it `forced` (module doc); no other option may cover an
        op of a region so claimed."""
        out = []
        claimed = self.claimed
        if claimed and op in claimed and claimed[op].root is not op:
            return out  # inside a claimed region: it runs the op
        for o in self.p.bo.options[op]:
            if forced is not None:
                if o is not forced:
                    continue
            elif (o.extra_outputs and self._read_extras(o)) or (
                claimed and any(x in claimed for x in o.ops)
            ):
                continue
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
        # a once op's decomposition runs once per set of parameters, all of it
        weight = ONCE_WEIGHT if self.s.fixed.reads(o.inputs) else 1.0
        for a_in, (_, solution) in self.s.table(o).items():
            need = dict.fromkeys(distinct, 0)
            for u, m in zip(o.inputs, a_in):
                need[u] |= m
            c = sum(self.read(u, m) for u, m in need.items())
            if c == INF:
                continue
            for mask in self.sp.masks:
                total = c + weight * solution.cost[mask]
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
                total += self.s.spread_of(p, r)[m]
        return total

    def unit_cost(
        self, op: Operation, evals: list, used: list[Value], state, forced: bool = False
    ) -> float:
        if isinstance(state, _By):
            if forced or op in self.claimed:
                return INF  # the op runs in a region already: no other may write its value
            (v,) = used
            return self.s.spread_of(state.option.space, v)[state.mask]  # its copies
        if not any(state):
            # not computed (some graph kernel covers it); a region's root must run
            return INF if forced else 0.0
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
                candidate = [base + c for c in self.s.spread_of(ev[2], r)]
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
