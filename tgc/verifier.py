"""Verify a module: every op's own checks (tgc.opdef.verify_op) plus SSA dominance.

Runs after parsing and after every pass. Raises the first `VerifyError`, located at the op.
"""

from __future__ import annotations

from tgc.diagnostics import Note, VerifyError
from tgc.ir import Block, Operation, Value
from tgc.opdef import ISOLATED, TERMINATOR, verify_op


def verify(root: Operation) -> None:
    _verify_op_tree(root, [], [])


# `scopes` is the chain of value sets visible at a point (innermost last); `hidden` holds the
# scopes cut off by an isolated-from-above op, only to word the error. Chains, not merged sets,
# keep verification linear in the number of ops.


def _verify_op_tree(op: Operation, scopes: list[set[Value]], hidden: list[set[Value]]) -> None:
    for i, v in enumerate(op.operands):
        if any(v in s for s in scopes):
            continue
        if any(v in s for s in hidden):
            raise VerifyError(
                f"'{op.name}' op operand #{i} is defined outside the isolated region that uses it",
                op.loc,
            )
        raise VerifyError(f"'{op.name}' op operand #{i} does not dominate this use", op.loc)
    verify_op(op)
    if not op.regions:
        return
    if ISOLATED in op.traits:
        hidden, scopes = hidden + scopes, []
    for region in op.regions:
        for block in region.blocks:
            _verify_block(block, scopes + [set()], hidden)


def _verify_block(block: Block, scopes: list[set[Value]], hidden: list[set[Value]]) -> None:
    local = scopes[-1]
    local.update(block.args)
    for op in block.ops:
        if op.has_trait(TERMINATOR) and op.next is not None:
            raise VerifyError(
                f"'{op.name}' op must be the last operation of its block",
                op.loc,
                [Note(op.next.loc, "followed by this operation")],
            )
        _verify_op_tree(op, scopes, hidden)
        local.update(op.results)
