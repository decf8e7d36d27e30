"""Which values an op may overwrite: a kernel that writes a few rows of a large tensor (a KV
cache's update, `atomic.write_rows`) writes them into the tensor's own memory instead of a copy
of it, where that memory is free to take.

It is where nothing could see the difference: the op that asks is the value's only reader, so
no other op reads the old contents, before or after it; and the memory belongs to the value
alone:
- a function argument the caller donated (`{tgc.donated}`, tgc/builtin.py): the caller takes
  a result as the argument's new value and reads the old one no more. The torch.compile
  backend donates each input the graph updates in place (tgc/dynamo/lowering.py), so a KV
  cache's rows are written into the caller's cache itself;
- the result of an op that makes new memory for it: not a view of another value's memory (an
  op with the VIEW or FREE trait, or a kernel running one, may return its operand's memory), and
  not fixed between calls (a value made from parameters and constants alone is kept by the plan
  and read again by the next call: tgc/fixed.py).

Anything else is copied whole before the rows are written, which is always right.
"""

from __future__ import annotations

from tgc.builtin import FuncOp
from tgc.fixed import VARIES, fixed_state
from tgc.ir import BlockArgument, Operation
from tgc.opdef import FREE, VIEW, lookup


def may_overwrite(op: Operation, index: int) -> bool:
    """Whether `op` may write its result into the memory of its operand `index` (module doc)."""
    value = op.operands[index]
    if any(user is not op for user in value.users()) or op.operands.count(value) != 1:
        return False
    if isinstance(value, BlockArgument):
        region = value.block.region
        func = region.parent if region is not None else None
        return isinstance(func, FuncOp) and func.is_donated(value.index)
    producer = value.defining_op
    name = producer.attr("op") if producer.name == "kernel.call" else producer.name
    op_class = lookup(name) if isinstance(name, str) else None
    if op_class is not None and op_class.traits & {VIEW, FREE}:
        return False
    return fixed_state(value, {}) == VARIES
