"""The mutable SSA IR: values with use lists, operations, blocks and regions.

The shape follows MLIR: an `Operation` has operands (values), results (values it defines),
attributes (one dict), regions (each a list of blocks) and a location. A `Block` is a doubly
linked list of operations with block arguments; a `Region` is a list of blocks. Every value
knows its uses, so "replace all uses" and "is this value dead" are O(uses).

Op classes (one per op, see `tgc.opdef`) subclass `Operation` and add class-level facts: the
op name, operand and attribute signature, traits, type inference, verifier and numpy semantics.
Mutate IR through the methods here (or `tgc.rewriter.Rewriter`): they keep use lists and
parent links consistent.
"""

from __future__ import annotations

import gc
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, ClassVar

from tgc.diagnostics import UNKNOWN_LOC, Location
from tgc.types import TensorType

if TYPE_CHECKING:
    from tgc.opdef import AttrDef, OperandDef


class UseList:
    """The uses of a value, `(op, operand index)` pairs in insertion order.

    Reads like a list (iteration, len, `uses[0]`, slices, `==` with a list, `in`) but removes a
    use in O(1), so rewriting the users of a value with thousands of uses (a shared constant
    after CSE) stays linear.
    """

    __slots__ = ("_uses",)

    def __init__(self, uses=None) -> None:
        self._uses: dict[tuple[Operation, int], None] = dict.fromkeys(uses) if uses else {}

    def append(self, use: tuple[Operation, int]) -> None:
        self._uses[use] = None

    def remove(self, use: tuple[Operation, int]) -> None:
        try:
            del self._uses[use]
        except KeyError:
            raise ValueError(f"{use!r} is not a use of this value") from None

    def __iter__(self):
        return iter(self._uses)

    def __len__(self) -> int:
        return len(self._uses)

    def __bool__(self) -> bool:
        return bool(self._uses)

    def __contains__(self, use) -> bool:
        return use in self._uses

    def __getitem__(self, index):
        if index == 0 and self._uses:
            return next(iter(self._uses))
        return list(self._uses)[index]

    def __eq__(self, other) -> bool:
        return list(self._uses) == list(other)

    def __repr__(self) -> str:
        return repr(list(self._uses))


class Value:
    """An SSA value. `name_hint` is the source name (without `%`), kept by the printer."""

    __slots__ = ("type", "_uses", "name_hint")

    def __init__(self, type: TensorType, name_hint: str | None = None) -> None:
        self.type = type
        self._uses = UseList()
        self.name_hint = name_hint

    @property
    def uses(self) -> UseList:
        """`(op, operand index)` for every use, in the order they were made."""
        return self._uses

    @uses.setter
    def uses(self, uses) -> None:
        self._uses = uses if isinstance(uses, UseList) else UseList(uses)

    @property
    def owner(self) -> Operation | Block:
        raise NotImplementedError

    @property
    def defining_op(self) -> Operation | None:
        return None

    def has_uses(self) -> bool:
        return bool(self.uses)

    def users(self) -> list[Operation]:
        """Distinct using operations, in first-use order."""
        return list(dict.fromkeys(op for op, _ in self.uses))

    def replace_all_uses_with(self, new: Value) -> None:
        if new is self:
            return
        for op, index in self.uses:
            op.operands[index] = new
            new.uses.append((op, index))
        self.uses = UseList()

    def replace_uses_if(self, new: Value, predicate) -> None:
        keep = []
        for op, index in self.uses:
            if predicate(op):
                op.operands[index] = new
                new.uses.append((op, index))
            else:
                keep.append((op, index))
        self.uses = keep


class OpResult(Value):
    __slots__ = ("op", "index")

    def __init__(self, type: TensorType, op: Operation, index: int, name_hint=None) -> None:
        super().__init__(type, name_hint)
        self.op = op
        self.index = index

    @property
    def owner(self) -> Operation:
        return self.op

    @property
    def defining_op(self) -> Operation:
        return self.op

    def __repr__(self) -> str:
        return f"<OpResult #{self.index} of {self.op.name}: {self.type}>"


class BlockArgument(Value):
    __slots__ = ("block", "index")

    def __init__(self, type: TensorType, block: Block, index: int, name_hint=None) -> None:
        super().__init__(type, name_hint)
        self.block = block
        self.index = index

    @property
    def owner(self) -> Block:
        return self.block

    def __repr__(self) -> str:
        return f"<BlockArgument #{self.index}: {self.type}>"


class Operation:
    """Base of every op class. Instances are made by the op class: `AddOp.create(...)`."""

    __slots__ = ("operands", "results", "attributes", "regions", "loc", "block", "prev", "next")

    # Facts every op class declares (see tgc.opdef).
    name: ClassVar[str] = ""
    operand_defs: ClassVar[tuple[OperandDef, ...]] = ()
    attr_defs: ClassVar[dict[str, AttrDef]] = {}
    traits: ClassVar[frozenset[str]] = frozenset()
    num_results: ClassVar[int | None] = 1  # None: decided per instance (variadic results)
    num_regions: ClassVar[int] = 0
    accepts_extra_attributes: ClassVar[bool] = False  # kernel.call forwards its op's attributes

    def __init__(
        self,
        operands: list[Value],
        result_types: list[TensorType],
        attributes: dict | None = None,
        regions: list[Region] | None = None,
        loc: Location = UNKNOWN_LOC,
        result_names: list[str | None] | None = None,
    ) -> None:
        self.operands = list(operands)
        for i, v in enumerate(self.operands):
            v.uses.append((self, i))
        names = result_names or [None] * len(result_types)
        self.results = [OpResult(t, self, i, names[i]) for i, t in enumerate(result_types)]
        self.attributes = dict(attributes) if attributes else {}
        self.regions = regions or []
        for r in self.regions:
            r.parent = self
        self.loc = loc
        self.block: Block | None = None
        self.prev: Operation | None = None
        self.next: Operation | None = None

    # -- hooks that op classes override --------------------------------------------------------

    def infer(self) -> list[TensorType] | None:
        """Result types from operand types and attributes; None when the op cannot infer them
        (reshape, cast, constant, ...): then `verify_` checks the declared types instead."""
        return None

    def verify_(self) -> None:
        """Op-specific checks beyond the signature; raise `VerifyError("message")`."""

    def reference(self, *inputs):
        """The numpy meaning of the op: arrays in, an array (or a tuple of them) out."""
        raise NotImplementedError(f"'{self.name}' has no numpy reference semantics")

    # -- convenience -------------------------------------------------------------------------

    @property
    def result(self) -> OpResult:
        """The single result (ops with exactly one result)."""
        assert len(self.results) == 1, f"{self.name} has {len(self.results)} results"
        return self.results[0]

    def attr(self, key: str):
        """The attribute `key`, or its declared default when absent."""
        if key in self.attributes:
            return self.attributes[key]
        attr_def = self.attr_defs.get(key)
        return None if attr_def is None else attr_def.default

    def has_trait(self, trait: str) -> bool:
        return trait in self.traits

    @property
    def parent_op(self) -> Operation | None:
        if self.block is None or self.block.region is None:
            return None
        return self.block.region.parent

    def walk(self) -> Iterator[Operation]:
        """This op and every op nested in its regions, in program order (pre-order)."""
        yield self
        for region in self.regions:
            for block in region.blocks:
                for op in block.ops:
                    yield from op.walk()

    def is_before_in_block(self, other: Operation) -> bool:
        """True when self precedes `other` in the same block (linear scan; use sparingly)."""
        op = self.next
        while op is not None:
            if op is other:
                return True
            op = op.next
        return False

    # -- mutation ------------------------------------------------------------------------------

    def set_operand(self, index: int, value: Value) -> None:
        old = self.operands[index]
        old.uses.remove((self, index))
        self.operands[index] = value
        value.uses.append((self, index))

    def set_operands(self, values: list[Value]) -> None:
        self.drop_operand_uses()
        self.operands = list(values)
        for i, v in enumerate(self.operands):
            v.uses.append((self, i))

    def drop_operand_uses(self) -> None:
        for i, v in enumerate(self.operands):
            try:
                v.uses.remove((self, i))
            except ValueError:
                pass

    def detach(self) -> None:
        """Unlink from the parent block, keeping operands and results intact."""
        if self.block is not None:
            self.block._unlink(self)

    def erase(self) -> None:
        """Remove from the block and drop operand uses. Results must be unused."""
        for r in self.results:
            if r.uses:
                raise ValueError(f"cannot erase '{self.name}': result #{r.index} still has uses")
        for region in self.regions:
            for block in region.blocks:
                for op in list(block.ops_reversed()):
                    op.erase()
        self.detach()
        self.drop_operand_uses()

    def __repr__(self) -> str:
        from tgc.printer import print_op

        return print_op(self).strip()


class Block:
    """A list of operations (doubly linked) with typed arguments."""

    __slots__ = ("args", "first", "last", "region", "label", "_len")

    def __init__(self, arg_types: list[TensorType] = (), arg_names=None, label=None) -> None:
        names = arg_names or [None] * len(arg_types)
        self.args = [BlockArgument(t, self, i, names[i]) for i, t in enumerate(arg_types)]
        self.first: Operation | None = None
        self.last: Operation | None = None
        self.region: Region | None = None
        self.label = label
        self._len = 0

    def __len__(self) -> int:
        return self._len

    @property
    def ops(self) -> Iterator[Operation]:
        """Iterate in order; safe against erasing the op currently visited."""
        op = self.first
        while op is not None:
            following = op.next
            yield op
            op = following

    def ops_reversed(self) -> Iterator[Operation]:
        op = self.last
        while op is not None:
            preceding = op.prev
            yield op
            op = preceding

    @property
    def terminator(self) -> Operation | None:
        return self.last

    def add_arg(self, type: TensorType, name_hint=None) -> BlockArgument:
        arg = BlockArgument(type, self, len(self.args), name_hint)
        self.args.append(arg)
        return arg

    def append(self, op: Operation) -> Operation:
        assert op.block is None, "op is already in a block"
        op.block = self
        op.prev = self.last
        op.next = None
        if self.last is None:
            self.first = op
        else:
            self.last.next = op
        self.last = op
        self._len += 1
        return op

    def insert_before(self, op: Operation, anchor: Operation) -> Operation:
        assert op.block is None, "op is already in a block"
        assert anchor.block is self
        op.block = self
        op.next = anchor
        op.prev = anchor.prev
        if anchor.prev is None:
            self.first = op
        else:
            anchor.prev.next = op
        anchor.prev = op
        self._len += 1
        return op

    def insert_after(self, op: Operation, anchor: Operation) -> Operation:
        if anchor.next is None:
            return self.append(op)
        return self.insert_before(op, anchor.next)

    def _unlink(self, op: Operation) -> None:
        if op.prev is None:
            self.first = op.next
        else:
            op.prev.next = op.next
        if op.next is None:
            self.last = op.prev
        else:
            op.next.prev = op.prev
        op.prev = op.next = None
        op.block = None
        self._len -= 1


class Region:
    __slots__ = ("blocks", "parent")

    def __init__(self, blocks: list[Block] | None = None) -> None:
        self.blocks: list[Block] = []
        self.parent: Operation | None = None
        for b in blocks or []:
            self.add_block(b)

    def add_block(self, block: Block) -> Block:
        block.region = self
        self.blocks.append(block)
        return block

    @property
    def block(self) -> Block:
        """The single block of a single-block region."""
        return self.blocks[0]


def clone_op(op: Operation, value_map: dict[Value, Value]) -> Operation:
    """A copy of `op` (regions included) reading `value_map[v]` for each operand `v`; the
    map is extended with the copy's results."""
    regions = [_clone_region(r, value_map) for r in op.regions]
    copy = type(op)(
        [value_map.get(v, v) for v in op.operands],
        [r.type for r in op.results],
        dict(op.attributes),
        regions,
        op.loc,
        [r.name_hint for r in op.results],
    )
    for old, new in zip(op.results, copy.results):
        value_map[old] = new
    return copy


def clone_body(source: Block, target: Block, value_map: dict[Value, Value]) -> list[Value]:
    """The ops of `source` but its last (a terminator: a yield, a return) cloned onto the end of
    `target`, reading `value_map`; the terminator's operands as the clones' values."""
    for op in source.ops:
        if op is source.last:
            return [value_map[v] for v in op.operands]
        target.append(clone_op(op, value_map))
    return []


def _clone_region(region: Region, value_map: dict[Value, Value]) -> Region:
    out = Region()
    for block in region.blocks:
        new_block = Block(
            [a.type for a in block.args], [a.name_hint for a in block.args], block.label
        )
        value_map.update(zip(block.args, new_block.args))
        for op in block.ops:
            new_block.append(clone_op(op, value_map))
        out.add_block(new_block)
    return out


@contextmanager
def paused_gc() -> Iterator[None]:
    """Pause Python's cyclic garbage collector while building or rewriting IR.

    The IR is a web of reference cycles (ops, their results, use lists), so while a parser or a
    pass allocates many objects the collector keeps rescanning the whole module: it doubled
    parse time and made passes over 100k-op modules superlinear. The parser and the pass manager
    pause it; garbage made meanwhile is collected afterwards.
    """
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()
