"""The rewriter: the one way passes change IR.

It keeps use lists consistent (through tgc.ir), gives new ops the location of the op they
replace, and tells a listener (the greedy driver's worklist) what was inserted, changed or
erased, so the driver can revisit exactly the affected ops.
"""

from __future__ import annotations

from collections.abc import Sequence

from tgc.builder import Builder
from tgc.ir import Operation, Value


class RewriteListener:
    def on_insert(self, op: Operation) -> None: ...
    def on_erase(self, op: Operation) -> None: ...
    def on_modify(self, op: Operation) -> None: ...


class Rewriter:
    def __init__(self, listener: RewriteListener | None = None) -> None:
        self.listener = listener or RewriteListener()
        self.changed = False

    def builder_before(self, op: Operation) -> Builder:
        """A builder inserting before `op`, with `op`'s location; new ops are reported."""
        assert op.block is not None, "op is not in a block"
        return Builder(op.block, op, op.loc, on_insert=self._inserted)

    def _inserted(self, op: Operation) -> None:
        self.changed = True
        self.listener.on_insert(op)

    def replace_all_uses(self, old: Value, new: Value) -> None:
        if old is new:
            return
        for user in old.users():
            self.listener.on_modify(user)
        old.replace_all_uses_with(new)
        self.changed = True

    def replace_op(self, op: Operation, new_values: Sequence[Value] | Value) -> None:
        """Replace every result of `op` by `new_values` (in order), then erase `op`."""
        if isinstance(new_values, Value):
            new_values = [new_values]
        assert len(new_values) == len(op.results), f"{op.name}: result count differs"
        for old, new in zip(op.results, new_values):
            if old.name_hint is not None and new.name_hint is None and new.defining_op is not None:
                new.name_hint = old.name_hint  # keep the source name on the replacement
            self.replace_all_uses(old, new)
        self.erase_op(op)

    def erase_op(self, op: Operation) -> None:
        for v in op.operands:
            if v.defining_op is not None:
                self.listener.on_modify(v.defining_op)  # its result may have become dead
        self.listener.on_erase(op)
        op.erase()
        self.changed = True

    def set_operand(self, op: Operation, index: int, value: Value) -> None:
        previous = op.operands[index].defining_op
        op.set_operand(index, value)
        self.listener.on_modify(op)
        if previous is not None:
            self.listener.on_modify(previous)  # its result may have become dead
        self.changed = True

    def set_attribute(self, op: Operation, key: str, value) -> None:
        op.attributes[key] = value
        self.listener.on_modify(op)
        self.changed = True

    def move_before(self, op: Operation, anchor: Operation) -> None:
        op.detach()
        anchor.block.insert_before(op, anchor)
        self.listener.on_modify(op)
        self.changed = True
