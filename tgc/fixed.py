"""Which values are the same on every call of a function: the one walk that both the
`algebraic` cost model (passes/algebraic/cost.py `is_fixed`) and the planner's once work
(planner/fixed.py) ask.

A value is in one of three states:
- PARAM: a `{tgc.param}` argument of a function (`FuncOp.is_param`), or the result of an op
  with no side effects (the PURE trait) whose operands are all fixed, one of them PARAM;
- CONST: the result of such an op whose operands are all CONST (a constant reads nothing);
- VARIES: anything else (another argument, an argument of a region inside an op, the result
  of an op with side effects, or of an op reading a value that varies).
"""

from __future__ import annotations

from collections.abc import Iterable

from tgc.builtin import FuncOp
from tgc.ir import BlockArgument, Value
from tgc.opdef import PURE

PARAM, CONST, VARIES = 2, 1, 0

# The states of the values asked so far, by value: shared by the queries of one analysis so that
# each value's producers are walked once (a walk up a long chain for every op would be quadratic).
StateMemo = dict[Value, int]


def combine_states(states: Iterable[int]) -> int:
    """The state of the results of a pure op whose operands are in `states`."""
    found = CONST  # an op that reads nothing (a constant) is fixed
    for s in states:
        if s == VARIES:
            return VARIES
        found = max(found, s)
    return found


def is_param_argument(value: BlockArgument) -> bool:
    """A `{tgc.param}` argument of a function (not of a region inside an op)."""
    region = value.block.region
    owner = region.parent if region is not None else None
    return isinstance(owner, FuncOp) and owner.is_param(value.index)


def fixed_state(value: Value, memo: StateMemo) -> int:
    """The state of `value` (module doc), remembered in `memo` with those of its producers."""
    stack = [value]
    while stack:  # iterative: a chain of 10^5 ops must not hit the recursion limit
        v = stack[-1]
        if v in memo:
            stack.pop()
            continue
        op = v.defining_op
        if op is None:
            param = isinstance(v, BlockArgument) and is_param_argument(v)
            memo[v] = PARAM if param else VARIES
            stack.pop()
            continue
        if not op.has_trait(PURE):
            memo[v] = VARIES
            stack.pop()
            continue
        pending = [u for u in op.operands if u not in memo]
        if pending:
            stack.extend(pending)
            continue
        found = combine_states(memo[u] for u in op.operands)
        for r in op.results:
            memo[r] = found
        stack.pop()
    return memo[value]
