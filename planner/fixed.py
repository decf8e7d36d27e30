"""What a plan computes once per set of parameters rather than on every call.

A function argument marked `{tgc.param}` (`FuncOp.is_param`) is a weight that does not change
between calls. An op with no side effects (every op but the terminators is PURE; `kernel.call`
and `kernel.copy` are too) whose operands are all fixed and at least one of them comes from a
parameter computes the same values on every call with the same parameter arrays: such an op is
*once*. The planner runs such ops once per set of parameter arrays:

- planning (planner/solve.py, chain.py, paths.py `plan_cost`): a once option's kernel time, and
  the copies of a once value, count `ONCE_WEIGHT` of their time: kernels are still chosen for
  such an op by tolerance, availability and (among themselves) time, but its time is not in the
  plan's per-call cost;
- select-kernels marks a once `kernel.call` or `kernel.copy` `plan.once`;
- the executor (planner/executor.py `PlannedFunction`) runs the once steps only when some
  parameter array differs, by identity, from the previous call's.

A value computed from constants alone (a splat, an iota, a mask made of them) is fixed too but
not once for planning: it reads no parameter, and is costed on every call as before (hoisting
it as well would change the cost of every plan that has constants). The executor runs it with
the once steps all the same (`Fixed.runs_once`): recomputing it on every call would only add
host work, and a constant made on the host and copied to the device on every call would keep
the call from being replayed as a CUDA graph (planner/graphs.py).

The rule reads values only (operands, not what a kernel covers), so it holds alike for the
program as planned (an option is once when its inputs are), for the flat plan of `plan_cost`
and for the placed function of kernel calls and copies the executor runs.
"""

from __future__ import annotations

from collections.abc import Iterable

from tgc.attributes import UNIT
from tgc.builtin import FuncOp
from tgc.fixed import CONST, PARAM, combine_states, fixed_state
from tgc.ir import Operation, Value
from tgc.opdef import PURE

# A once kernel's (or copy's) time counted per call: small enough that no once work outweighs
# the per-call work of a plan, big enough that among the ways to do it the fastest wins.
ONCE_WEIGHT = 1e-6

ONCE_ATTR = "plan.once"


class Fixed:
    """The states of the values of one function (asked lazily, remembered: the function may
    gain values, e.g. sources cloned into segments, but its values do not change meaning)."""

    def __init__(self) -> None:
        self.memo: dict[Value, int] = {}

    def state(self, value: Value) -> int:
        return fixed_state(value, self.memo)

    def value(self, value: Value) -> bool:
        """Whether `value` is computed once per set of parameters (a parameter included)."""
        return self.state(value) == PARAM

    def reads(self, values: Iterable[Value]) -> bool:
        """Whether a pure kernel reading `values` (all of them) is once."""
        return combine_states(self.state(v) for v in values) == PARAM

    def op(self, op: Operation) -> bool:
        """Whether `op` is once: pure, its operands fixed, one of them from a parameter."""
        return op.has_trait(PURE) and self.reads(op.operands)

    def runs_once(self, op: Operation) -> bool:
        """Whether the executor runs `op` once per set of parameters: pure, its operands all
        fixed (from parameters, constants or both; module doc)."""
        if not op.has_trait(PURE):
            return False
        return combine_states(self.state(v) for v in op.operands) in (PARAM, CONST)


def once_ops(func: FuncOp) -> list[Operation]:
    """The ops of `func`'s body that are once (block order)."""
    fixed = Fixed()
    return [op for op in func.body.ops if op is not func.body.last and fixed.op(op)]


def mark_once(func: FuncOp) -> int:
    """Mark the once ops of a placed function `plan.once` (what select-kernels writes); how many."""
    ops = once_ops(func)
    for op in ops:
        op.attributes[ONCE_ATTR] = UNIT
    return len(ops)
