"""The search of the `algebraic` pass: windows, best-first search with α relaxation, replay.

1. `plan_windows` cuts the function into windows: around every op where a rule might apply
   (matmuls, muls), the op, its producers, its users, their producers, and the other matmuls
   sharing an operand, as a contiguous run of ops; overlapping runs are merged up to `window`
   ops. A function of at most `window` ops is one window. The work is linear in the function's
   size; a rewrite whose ops lie further apart than a window is not found.
2. `search` explores one window, cloned into a standalone function (see graph.py), as TASO
   does: a priority queue of states (each a sequence of moves) ordered by cost. Popping a
   state brings the one working copy there (undo back to the moves it shares with the current
   state, apply the rest), then tries every rule at every match in turn: apply, price by the
   cost of the ops added minus the ops erased, undo. A new state (by fingerprint) cheaper than
   α·best joins the queue, so a step that is worse now (by at most α) can lead to a better
   graph later. At most `budget` states are expanded.
3. `replay` applies the moves of the best state, in order, to the real ops through the rewriter.
   A move names its ops by position in the window, and the window clone keeps the real order,
   so position i of the clone is position i of the real run (the clone's `func.return` stands
   for the first op after the window).
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.ir import Block, Operation
from tgc.passes.algebraic.cost import CostWeights, ops_seconds
from tgc.passes.algebraic.graph import UndoRewriter, fingerprint, span_ops
from tgc.passes.algebraic.rules import MATMUL, MAX_SHARERS, MUL, Context, Rule
from tgc.rewriter import Rewriter

SEEDS = frozenset({MATMUL, MUL})
IMPROVEMENT = 1e-9  # relative: a state must beat the best by this much to replace it


@dataclass(frozen=True)
class Move:
    """One rule application: the rule, its ops by position in the window, its plan."""

    rule: Rule
    indices: tuple[int, ...]
    names: tuple[str, ...]
    plan: object


@dataclass(frozen=True)
class SearchResult:
    moves: tuple[Move, ...]
    cost_before: float
    cost_after: float
    expanded: int


# -- windows ---------------------------------------------------------------------------------------


def _related(op: Operation) -> list[Operation]:
    """The ops a rewrite at `op` may involve."""
    out = [op]
    for v in op.operands:
        if v.defining_op is not None:
            out.append(v.defining_op)
        if op.name == MATMUL and len(v.uses) <= MAX_SHARERS:
            out.extend(user for user, _ in v.uses if user.name == MATMUL)
    for r in op.results:
        for user, _ in r.uses[:MAX_SHARERS]:
            out.append(user)
            out.extend(v.defining_op for v in user.operands if v.defining_op is not None)
    return out


def plan_windows(block: Block, window: int) -> list[tuple[Operation | None, Operation]]:
    """Windows as (first op of the run, op after the run), in program order. The op before a
    run may be rewritten by the window before it, so take `first.prev` only when you get there;
    a window never touches the ops of the next one."""
    ops = list(block.ops)[:-1]
    terminator = block.last
    if not any(op.name in SEEDS for op in ops):
        return []
    if len(ops) <= window:
        return [(ops[0], terminator)]
    pos = {op: i for i, op in enumerate(ops)}
    intervals = []
    for i, op in enumerate(ops):
        if op.name not in SEEDS:
            continue
        near = [pos[r] for r in _related(op) if r in pos]
        lo, hi = min(near), max(near)
        if hi - lo + 1 > window:
            lo = max(lo, i - window // 2)
            hi = min(hi, lo + window - 1)
        intervals.append((lo, hi))
    spans: list[tuple[int, int]] = []
    for lo, hi in sorted(intervals):
        if spans and lo <= spans[-1][1] + 1:
            first, last = spans[-1]
            if max(hi, last) - first + 1 <= window:
                spans[-1] = (first, max(hi, last))
                continue
            lo = last + 1
            if lo > hi:
                continue
        spans.append((lo, hi))
    return [(ops[lo], ops[hi + 1] if hi + 1 < len(ops) else terminator) for lo, hi in spans]


# -- search ----------------------------------------------------------------------------------------


def find_moves(func: FuncOp, rules: tuple[Rule, ...], weights: CostWeights) -> list[Move]:
    ops = list(func.body.ops)
    index = {op: i for i, op in enumerate(ops)}
    ctx = Context(index, weights)
    moves = []
    for op in ops:
        for rule in rules:
            if op.name not in rule.anchors:
                continue
            for found_ops, plan in rule.find(op, ctx):
                indices = tuple(index[o] for o in found_ops)
                moves.append(Move(rule, indices, tuple(o.name for o in found_ops), plan))
    return moves


def apply_move(move: Move, ops: list[Operation], rewriter: Rewriter) -> None:
    found = tuple(ops[i] for i in move.indices)
    for op, name in zip(found, move.names):  # the window's func.return stands for any op
        assert name in (op.name, "func.return"), f"{move.rule.name}: replay found {op.name}"
    move.rule.apply(rewriter, found, move.plan)


def search(
    window: FuncOp, rules: tuple[Rule, ...], weights: CostWeights, alpha: float, budget: int
) -> SearchResult:
    """Best-first search over rewrites of `window` (which is left as it was)."""
    start = ops_seconds(window.body.ops, weights)
    best_cost, best_moves = start, ()
    queue: list[tuple[float, int, tuple[Move, ...]]] = [(start, 0, ())]
    seen = {fingerprint(window)}
    rewriter = UndoRewriter()
    applied: list[tuple[Move, int]] = []  # the working copy's moves, each with its undo mark
    counter = expanded = 0
    while queue and expanded < budget:
        cost, _, moves = heapq.heappop(queue)
        if cost >= alpha * best_cost and moves:
            continue
        expanded += 1
        _go_to(moves, applied, window, rewriter)
        ops = list(window.body.ops)
        for move in find_moves(window, rules, weights):
            mark = len(rewriter.log)
            apply_move(move, ops, rewriter)
            inserted, erased = rewriter.changes_since(mark)
            child_cost = cost + ops_seconds(inserted, weights) - ops_seconds(erased, weights)
            path = moves + (move,)
            if child_cost < alpha * best_cost or child_cost < best_cost:
                key = fingerprint(window)
                if key not in seen:
                    seen.add(key)
                    if child_cost < best_cost * (1 - IMPROVEMENT):
                        best_cost, best_moves = child_cost, path
                    if child_cost < alpha * best_cost:
                        counter += 1
                        heapq.heappush(queue, (child_cost, counter, path))
            rewriter.undo(mark)
    rewriter.undo(0)
    return SearchResult(best_moves, start, best_cost, expanded)


def _go_to(moves, applied: list, window: FuncOp, rewriter: UndoRewriter) -> None:
    """Bring the working copy from the state of `applied` to the state reached by `moves`."""
    common = 0
    while common < min(len(moves), len(applied)) and applied[common][0] is moves[common]:
        common += 1
    if common < len(applied):
        rewriter.undo(applied[common][1])
        del applied[common:]
    for move in moves[common:]:
        applied.append((move, len(rewriter.log)))
        apply_move(move, list(window.body.ops), rewriter)


def replay(
    moves: tuple[Move, ...],
    block: Block,
    before: Operation | None,
    after: Operation,
    rewriter: Rewriter,
) -> None:
    """Apply `moves` to the real ops strictly between `before` and `after`."""
    for move in moves:
        apply_move(move, span_ops(block, before, after) + [after], rewriter)
