"""Graph states for the `algebraic` search: cloning, windows and structural fingerprints.

A search state is a small standalone function: a *window* of the real function (a contiguous run
of its ops) cloned into a `func.func` whose arguments are the values the window reads from
outside and whose `func.return` lists the values used after the window. Because the window is
contiguous and cloned in order, an op's position in the clone is its position in the real block:
a rewrite found on a clone can be replayed on the real ops by index (see `search.py`).
`UndoRewriter` lets the search move that one copy between states instead of copying it.
"""

from __future__ import annotations

from tgc.builtin import PARAM_ATTR, FuncOp, ReturnOp
from tgc.ir import Block, Operation, Value, clone_op
from tgc.passes.algebraic.cost import IN_PLACE_ATTR, FixedMemo, is_fixed, is_result
from tgc.rewriter import Rewriter


def clone_func(func: FuncOp) -> FuncOp:
    """A deep copy of a function (not inserted anywhere)."""
    value_map: dict[Value, Value] = {}
    copy = clone_op(func, value_map)
    assert isinstance(copy, FuncOp)
    return copy


def span_ops(block: Block, before: Operation | None, after: Operation) -> list[Operation]:
    """The ops strictly between `before` (None: the block start) and `after`."""
    out = []
    op = block.first if before is None else before.next
    while op is not None and op is not after:
        out.append(op)
        op = op.next
    return out


def extract_window(ops: list[Operation], fixed: FixedMemo | None = None) -> FuncOp:
    """Clone a contiguous run of ops into a standalone function (see the module docstring).
    An argument standing for a fixed value (cost.is_fixed: a parameter, a constant, or computed
    from such values only) is marked `{tgc.param}`, and the return lists in IN_PLACE_ATTR the
    values it returns that are not function results (cost.is_result), so the window is priced as
    the function is."""
    inside = set(ops)
    inputs: dict[Value, None] = {}
    outputs: dict[Value, None] = {}
    for op in ops:
        for v in op.operands:
            if v.defining_op not in inside:
                inputs[v] = None
        for r in op.results:
            if any(user not in inside for user, _ in r.uses):
                outputs[r] = None
    arg_values = list(inputs)
    func = FuncOp.build(
        "window",
        [v.type for v in arg_values],
        [r.type for r in outputs],
        [v.name_hint for v in arg_values],
    )
    fixed = {} if fixed is None else fixed
    for i, v in enumerate(arg_values):
        if is_fixed(v, fixed):
            func.set_arg_attr(i, PARAM_ATTR)
    value_map: dict[Value, Value] = dict(zip(arg_values, func.body.args))
    for op in ops:
        func.body.append(clone_op(op, value_map))
    # The return stands for every use after the window; mark the values that the function does
    # not return (later ops read them in place), so that a split is priced as in the function.
    in_place = tuple(i for i, r in enumerate(outputs) if not is_result(r))
    attrs = {IN_PLACE_ATTR: in_place} if in_place else {}
    func.body.append(ReturnOp([value_map[r] for r in outputs], [], attrs))
    return func


def fingerprint(func: FuncOp) -> tuple:
    """A structural key of the function body: equal for clones, different after a rewrite
    (value names and locations are ignored; op order is not)."""
    numbers: dict[Value, int] = {a: i for i, a in enumerate(func.body.args)}
    parts = []
    for op in func.body.ops:
        parts.append(
            (
                op.name,
                tuple(numbers[v] for v in op.operands),
                tuple(sorted(op.attributes.items())),
                tuple(r.type for r in op.results),
            )
        )
        for r in op.results:
            numbers[r] = len(numbers)
    return tuple(parts)


class UndoRewriter(Rewriter):
    """A rewriter that logs every change so that `undo(mark)` can revert to an earlier point.

    The search moves one working copy of a window between states (undo to the common prefix,
    apply the rest) instead of cloning a graph per state. Changes are reverted exactly, use
    lists included, in reverse order. `inserted_since(mark)` and `erased_since(mark)` give what
    a move added and removed, which is all a cost delta needs.
    """

    def __init__(self) -> None:
        super().__init__()
        self.log: list[tuple] = []

    def _inserted(self, op: Operation) -> None:
        super()._inserted(op)
        self.log.append(("insert", op))

    def replace_all_uses(self, old: Value, new: Value) -> None:
        if old is not new:
            self.log.append(("uses", old, list(old.uses), new, list(new.uses)))
        super().replace_all_uses(old, new)

    def erase_op(self, op: Operation) -> None:
        saved = [(v, list(v.uses)) for v in dict.fromkeys(op.operands)]
        self.log.append(("erase", op, op.prev, op.block, saved))
        super().erase_op(op)

    def changes_since(self, mark: int) -> tuple[list[Operation], list[Operation]]:
        """(ops inserted and still present, pre-existing ops erased) since `mark`."""
        inserted = [e[1] for e in self.log[mark:] if e[0] == "insert"]
        erased = [e[1] for e in self.log[mark:] if e[0] == "erase"]
        new = set(inserted)
        return [op for op in inserted if op.block is not None], [
            op for op in erased if op not in new
        ]

    def undo(self, mark: int = 0) -> None:
        while len(self.log) > mark:
            entry = self.log.pop()
            if entry[0] == "insert":
                entry[1].erase()
            elif entry[0] == "uses":
                _, old, old_uses, new, new_uses = entry
                for user, index in old_uses:
                    user.operands[index] = old
                old.uses, new.uses = old_uses, new_uses
            else:
                _, op, prev, block, saved = entry
                if prev is None:
                    block.insert_before(op, block.first)
                else:
                    block.insert_after(op, prev)
                for v, uses in saved:
                    v.uses = uses
