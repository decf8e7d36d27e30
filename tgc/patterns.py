"""Rewrite patterns and the one greedy driver that applies them.

A pattern says which ops it looks at (`op_types`: op classes or op names, or `traits` that the
op must all have) and implements `match_and_rewrite(op, rewriter) -> bool`; the driver only calls
it on ops of those kinds, so a pattern body never starts with `isinstance`:

    class DoubleNegation(RewritePattern):
        op_types = (NegOp,)

        def match_and_rewrite(self, op, rewriter):
            inner = op.operands[0].defining_op
            if inner is None or inner.name != "atomic.neg":
                return False
            rewriter.replace_op(op, inner.operands[0])
            return True

or, for a function, `@op_pattern(NegOp) def double_negation(op, rewriter): ...`.

`apply_patterns_greedily(root, patterns, ...)` runs a pattern set to a fixpoint over every op
nested in `root` (a function, usually). It keeps a worklist: every op at the start of a sweep (in
program order, producers before users), then whatever the rewriter reports as inserted or
modified (the users of a replaced value, the producers of an erased op's operands). Trivially
dead pure ops are erased as they are met. A sweep that changed something is followed by another
one, up to `max_iterations` sweeps; not reaching a fixpoint by then is reported (the result's
`converged` is False, the statistics get a note and stderr a warning). Within a sweep, more than
`max_rewrites` applications (default: ten per op plus a thousand) end the sweep early, so two
patterns that undo each other cannot hang the compiler.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

from tgc.ir import Block, Operation, Value
from tgc.opdef import PURE
from tgc.rewriter import RewriteListener, Rewriter

if TYPE_CHECKING:
    from tgc.pass_manager import PassStatistics


class RewritePattern:
    """Base of rewrite patterns. Subclasses set `op_types` and/or `traits` and implement
    `match_and_rewrite`, which returns True when it changed the IR (through the rewriter only),
    or the name of the rewrite it applied (a str) when one pattern stands for several (a rule
    table), for the statistics.

    `op_types` holds op classes (subclasses match too) or op names; `traits` holds traits the
    op must all have. With neither, the pattern is offered every op. Patterns with a higher
    `benefit` are tried first; `name` (default: the class name) is the statistics key.
    """

    op_types: ClassVar[tuple[type[Operation] | str, ...]] = ()
    traits: ClassVar[frozenset[str]] = frozenset()
    benefit: ClassVar[int] = 1

    @property
    def name(self) -> str:
        return type(self).__name__

    def applies_to(self, cls: type[Operation]) -> bool:
        """Whether ops of class `cls` are offered to this pattern (decided once per class)."""
        if self.traits and not self.traits <= cls.traits:
            return False
        if not self.op_types:
            return True
        for t in self.op_types:
            if isinstance(t, str):
                if cls.name == t:
                    return True
            elif issubclass(cls, t):
                return True
        return False

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool | str:
        raise NotImplementedError


class _FunctionPattern(RewritePattern):
    def __init__(self, fn, op_types, traits, benefit, name) -> None:
        self.fn = fn
        self.op_types = tuple(op_types)
        self.traits = frozenset(traits)
        self.benefit = benefit
        self._name = name

    @property
    def name(self) -> str:
        return self._name

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        return bool(self.fn(op, rewriter))


def op_pattern(
    *op_types: type[Operation] | str,
    traits: Iterable[str] = (),
    benefit: int = 1,
    name: str | None = None,
) -> Callable[[Callable], RewritePattern]:
    """Turn `def f(op, rewriter) -> bool` into a pattern offered the ops of `op_types`.

    The statistics name defaults to the function name in kebab case (`fold_neg` -> `fold-neg`).
    """

    def wrap(fn) -> RewritePattern:
        return _FunctionPattern(
            fn, op_types, traits, benefit, name or fn.__name__.replace("_", "-")
        )

    return wrap


class PatternRewriter(Rewriter):
    """The rewriter patterns receive: tgc.rewriter.Rewriter, plus a guard that a replacement
    never changes a result's type (shape, element type or memory space)."""

    def replace_op(self, op: Operation, new_values: Sequence[Value] | Value) -> None:
        if isinstance(new_values, Value):
            new_values = [new_values]
        for old, new in zip(op.results, new_values):
            if old.type is not new.type:
                raise AssertionError(
                    f"a rewrite of '{op.name}' would change result #{old.index} from {old.type} "
                    f"to {new.type}"
                )
        super().replace_op(op, new_values)


def is_trivially_dead(op: Operation) -> bool:
    """A pure op with results, none of them used."""
    return bool(op.results) and PURE in op.traits and not any(r.uses for r in op.results)


def erase_dead_ops(
    block: Block,
    stats: PassStatistics | None = None,
    counter: str = "erased-ops",
    *,
    nested: bool = True,
    only: Callable[[Operation], bool] | None = None,
    rewriter: Rewriter | None = None,
) -> int:
    """Erase the trivially dead ops of `block` through the rewriter; returns how many (also
    counted as `counter` in `stats`). `only` narrows which dead ops go; with `nested`, the
    blocks of each op's regions are cleaned before the earlier ops of `block`.

    One walk from the end, so linear time: erasing an op leaves its producers dead when the walk
    reaches them, as they come earlier in a block in topological order.
    """
    rewriter = rewriter if rewriter is not None else Rewriter()
    erased = 0
    for op in block.ops_reversed():
        if is_trivially_dead(op) and (only is None or only(op)):
            rewriter.erase_op(op)
            erased += 1
            continue
        if nested:
            for region in op.regions:
                for inner in region.blocks:
                    erased += erase_dead_ops(inner, nested=True, only=only, rewriter=rewriter)
    if stats is not None and erased:
        stats.bump(counter, erased)
    return erased


def erase_dead_producers(values: list[Value], rewriter: Rewriter) -> None:
    """Erase, through the rewriter, the producers of `values` that a rewrite left trivially dead
    (pure, no region, no result used), and what only they used in turn: the constants and views
    a pattern pass's match read and no longer needs."""
    while values:
        op = values.pop().defining_op
        if op is None or op.block is None or op.regions or not is_trivially_dead(op):
            continue
        values += op.operands
        rewriter.erase_op(op)


@dataclass
class GreedyResult:
    converged: bool
    iterations: int
    rewrites: int


class _Worklist(RewriteListener):
    """A stack of ops (popped in program order at the start of a sweep) without duplicates."""

    def __init__(self) -> None:
        self.stack: list[Operation] = []
        self.queued: set[Operation] = set()

    def push(self, op: Operation) -> None:
        if op not in self.queued:
            self.queued.add(op)
            self.stack.append(op)

    def on_insert(self, op: Operation) -> None:
        for nested in op.walk():
            self.push(nested)

    def on_modify(self, op: Operation) -> None:
        self.push(op)

    def on_erase(self, op: Operation) -> None:
        self.queued.discard(op)


class _PatternIndex:
    """The patterns offered each op class, best benefit first, computed once per class."""

    def __init__(self, patterns: Sequence[RewritePattern]) -> None:
        self.patterns = sorted(patterns, key=lambda p: -p.benefit)
        self.by_class: dict[type[Operation], tuple[RewritePattern, ...]] = {}

    def get(self, cls: type[Operation]) -> tuple[RewritePattern, ...]:
        found = self.by_class.get(cls)
        if found is None:
            found = tuple(p for p in self.patterns if p.applies_to(cls))
            self.by_class[cls] = found
        return found


def apply_patterns_greedily(
    root: Operation,
    patterns: Sequence[RewritePattern],
    max_iterations: int = 10,
    stats: PassStatistics | None = None,
    *,
    max_rewrites: int | None = None,
    pass_name: str = "greedy rewrite",
) -> GreedyResult:
    """Apply `patterns` to the ops nested in `root` until none applies (see the module doc).

    Statistics: one counter per pattern name, `erased-dead-ops`, and a note when the iteration
    cap is hit.
    """
    return _apply(root, patterns, max_iterations, stats, max_rewrites, pass_name)


def _apply(root, patterns, max_iterations, stats, max_rewrites, pass_name) -> GreedyResult:
    index = _PatternIndex(patterns)
    worklist = _Worklist()
    rewriter = PatternRewriter(worklist)
    total = 0
    for iteration in range(1, max_iterations + 1):
        seed = [op for op in root.walk() if op is not root]
        budget = max_rewrites if max_rewrites is not None else 10 * len(seed) + 1000
        for op in reversed(seed):
            worklist.push(op)
        rewriter.changed = False
        applied = _drain(worklist, index, rewriter, budget, stats)
        total += applied
        if not rewriter.changed:
            return GreedyResult(True, iteration, total)
        worklist.stack.clear()
        worklist.queued.clear()
    message = (
        f"{pass_name} did not converge after {max_iterations} iteration(s) "
        f"({total} rewrites); raise max-iterations or look for patterns that undo each other"
    )
    if stats is not None:
        stats.note(message)
    print(f"warning: {message}", file=sys.stderr)
    return GreedyResult(False, max_iterations, total)


def _drain(
    worklist: _Worklist,
    index: _PatternIndex,
    rewriter: PatternRewriter,
    budget: int,
    stats: PassStatistics | None,
) -> int:
    applied = 0
    stack, queued = worklist.stack, worklist.queued
    while stack and applied < budget:
        op = stack.pop()
        queued.discard(op)
        if op.block is None:
            continue  # erased (or never inserted) since it was queued
        if is_trivially_dead(op):
            rewriter.erase_op(op)
            if stats is not None:
                stats.bump("erased-dead-ops")
            continue
        for pattern in index.get(type(op)):
            done = pattern.match_and_rewrite(op, rewriter)
            if done:
                applied += 1
                if stats is not None:
                    stats.bump(done if isinstance(done, str) else pattern.name)
                break
    return applied
