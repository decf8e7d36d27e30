"""`fuse`: group producer-consumer chains into `kernel.fused` regions, one generated kernel each.

Three kinds of kernel (the `template` attribute of the region):

- `elementwise`: a chain of elementwise ops over one iteration shape; operands of other shapes
  are read through numpy broadcasting (index arithmetic, never a materialised broadcast). A
  `concat` joins as an elementwise op of its result's shape, and an elementwise group whose
  values only that concat reads (a concat operand's producers, of the operand's shape) joins
  with it: the kernel computes them inside the concat's branch for that operand, at the
  positions the branch covers. Llama's rotary embedding, `x * cos + concat(-x2, x1) * sin`,
  is one kernel so.
- `row_reduction`: reductions over a suffix of the dims (the "row", e.g. the last axis), with the
  elementwise ops before them (prologue), between them and after them (epilogue): softmax,
  log_softmax, layernorm and rmsnorm after `lower-hl` each become one kernel. Values in such a
  region are full rows (the reduced operand's shape) or one value per row (the reduction's
  result, with or without kept unit dims), or full rows reshaped to other dims and the
  elementwise ops on those: a group norm's rows of [n, groups, c/groups * h * w] reshaped back
  to [n, c, h, w] for its per-channel affine (and the SiLU after it) are the same elements in
  the same order, so the kernel computes them as it computes the rows and writes them there.
- `matmul`: one `atomic.matmul` and the elementwise ops on its result (bias, activation, scale,
  residual add): the epilogue runs on the accumulator before it is stored.
- `conv`: one convolution the implicit-GEMM CUDA kernel runs (`conv_misfit`) and the
  elementwise ops on its result (bias, activation, residual add, cast): its epilogue, as a
  matmul's. A convolution alone stays itself (cuDNN, or its decomposition, is chosen by the
  planner).
- `attention`: one `hl.attention` the fused CUDA kernel runs and the transpose that is its only
  user, when that transpose keeps the head dim last (GPT-2's merge of the heads), with the
  reshape that is the transpose's only user: the kernel writes its output in that layout, so the
  transpose is no copy kernel. An attention without such a transpose is left alone (placement
  makes it a kernel of its own). Its operands that are chains of views expressible as strides
  (`strided_layout`) are cloned into the region, where the kernel reads them through strides.

Views (ops with the VIEW trait: `broadcast`, `reshape`, `transpose`, `slice`, `split`) of a
kernel input, splat constants, `iota` and small elementwise expressions of those alone (a causal
mask) cost no memory traffic: they are cloned into every kernel that reads them and become index
arithmetic. A plain matmul without an epilogue stays `atomic.matmul` (a library kernel is
faster).

Legality. Merging two groups is allowed only when (1) their iteration spaces agree (above),
(2) the merged group creates no cycle in the graph of kernels (no path between the two through
a third kernel or op: `UnitGraph`, kept up to date as groups grow, searches only between the
two in a topological order, so fusing stays about linear in the ops), and (3) nothing is
computed twice: every op lands in exactly one kernel.

Values with several consumers. A value is computed once, in its producer's kernel. Consumers
join that kernel when they legally can (same iteration space, no cycle); then the value stays in
registers. When some consumer lives in another kernel (a matmul operand, a value of another
shape, a consumer that would close a cycle), the producer's kernel also writes the value to
memory (one more `kernel.yield` result) and that consumer reads it. Work is never duplicated to
avoid that write; only views, splat constants and iota are recomputed. See docs/fusion.md.

Contract: the function computes the same values (interpreting a `kernel.fused` runs its region);
every op that is not a view, constant or plain matmul ends up inside exactly one region; the
order of the function's ops is a topological order of the new graph.
"""

from __future__ import annotations

import math
import re
from collections.abc import Generator, Iterable
from dataclasses import dataclass, field

from tgc.builtin import FuncOp, ModuleOp
from tgc.cuda_target import CONV_OPS, attention_supported, conv_misfit
from tgc.dialects.kernel import FusedOp, YieldOp
from tgc.ir import Block, Operation, Region, Value
from tgc.opdef import ELEMENTWISE, REDUCTION, TERMINATOR, VIEW
from tgc.pass_manager import Pass, PassStatistics, option, register_pass
from tgc.patterns import erase_dead_ops
from tgc.views import head_grouped_layout, is_unit_reshape

MAX_KERNEL_INPUTS = 64


def is_free_leaf(op: Operation) -> bool:
    """Ops that cost nothing to recompute in every kernel that reads them."""
    if op.name == "atomic.iota":
        return True
    return op.name == "atomic.constant" and op.attr("value").splat_value() is not None


def is_free(op: Operation, depth: int = 0) -> bool:
    """A free leaf, or a small elementwise expression or view of free values only (the causal
    mask `iota <= iota`): recomputing it where it is read costs less than a load."""
    if is_free_leaf(op):
        return True
    if depth > 6 or not op.operands or not (is_elementwise(op) or op.has_trait(VIEW)):
        return False
    return all(v.defining_op is not None and is_free(v.defining_op, depth + 1) for v in op.operands)


def is_elementwise(op: Operation) -> bool:
    return op.has_trait(ELEMENTWISE) and len(op.results) == 1 and not op.regions


def reduced_suffix(op: Operation) -> int | None:
    """Number of reduced dims when `op` reduces a (non-empty) suffix of its operand's dims."""
    if not op.has_trait(REDUCTION):
        return None
    rank = op.operands[0].type.rank
    axes = sorted(op.axes())
    if not axes or axes != list(range(rank - len(axes), rank)):
        return None
    return len(axes)


@dataclass(eq=False)
class Group:
    """Ops that will become one kernel, and the iteration space they share."""

    kind: str  # "elementwise" | "row_reduction" | "matmul" | "conv" | "attention"
    space: tuple[int, ...]  # the full iteration shape
    ncols: int = 0  # row_reduction: how many trailing dims are reduced
    ops: list[Operation] = field(default_factory=list)
    # row_reduction: other shapes its full rows were reshaped to in it (a group norm's rows of
    # [n, groups, c/groups * h * w] back to [n, c, h, w]): the same elements in the same order
    reshaped: set[tuple[int, ...]] = field(default_factory=set)

    def row_shapes(self) -> tuple[tuple[int, ...], ...]:
        """Shapes a value of a row_reduction group may have: a full row, or one per row."""
        rows = self.space[: len(self.space) - self.ncols]
        return (self.space, rows + (1,) * self.ncols, rows)

    def accepts_shape(self, shape: tuple[int, ...]) -> bool:
        if self.kind == "row_reduction":
            return shape in self.row_shapes() or shape in self.reshaped
        return shape == self.space

    def relabels_rows(self, op: Operation) -> bool:
        """Is `op` a reshape of this row_reduction group's full rows to other dims (the same
        elements in the same order, so the kernel writes them where it writes the rows)?"""
        if self.kind != "row_reduction" or op.name != "atomic.reshape":
            return False
        src, dst = op.operands[0].type.shape, op.results[0].type.shape
        return (
            (src == self.space or src in self.reshaped)
            and dst != self.space
            and (math.prod(dst) == math.prod(self.space))
        )


def _compatible(a: Group, b: Group) -> Group | None:
    """The kind and space of a merged group, or None when `a` and `b` cannot share a kernel."""
    if "attention" in (a.kind, b.kind):
        return None  # only its output transpose and reshape join an attention kernel
    if a.kind in PRODUCTS and b.kind in PRODUCTS:
        return None
    if a.kind in PRODUCTS or b.kind in PRODUCTS:
        mm, other = (a, b) if a.kind in PRODUCTS else (b, a)
        return mm if other.kind == "elementwise" and other.space == mm.space else None
    if a.kind == b.kind == "row_reduction":
        return a if (a.space, a.ncols) == (b.space, b.ncols) else None
    if a.kind == "row_reduction":
        return a if a.accepts_shape(b.space) else None
    if b.kind == "row_reduction":
        return b if b.accepts_shape(a.space) else None
    return a if a.space == b.space else None


def _concat_branch(home: Group, g: Group, concat: Operation) -> Group | None:
    """`home` when `concat` (just made or joined into `home`, an elementwise group) is the only
    reader outside `g` of `g`'s values, `g` being an elementwise group: the kernel computes `g`
    in the concat's branch for its operand (module doc), so nothing of `g` need be written out.
    Else None."""
    if concat.name != "atomic.concat" or home.kind != "elementwise" or g.kind != "elementwise":
        return None
    members = set(g.ops)
    for op in g.ops:
        for r in op.results:
            if any(u is not concat and u not in members for u in r.users()):
                return None
    return home


# Groups of one product (a matmul, a convolution) and its epilogue: two never share a kernel,
# and nothing joins their operands.
PRODUCTS = ("matmul", "conv")


def only_user(v: Value) -> Operation | None:
    """The one op that reads `v` (once), or None."""
    users = v.users()
    return users[0] if len(v.uses) == 1 and len(users) == 1 else None


def writes_transposed(op: Operation) -> bool:
    """Can the attention kernel write its output through this transpose of it? Yes when the
    permutation keeps the last dim (the head dim, written in contiguous runs) last."""
    if op.name != "atomic.transpose":
        return False
    perm = list(op.attr("perm"))
    return perm[-1] == len(perm) - 1


def folds_output_transpose(att: Operation) -> bool:
    """An `hl.attention` the fused kernel runs whose only user is a transpose it can write."""
    if att.name != "hl.attention" or not attention_supported(att):
        return False
    user = only_user(att.results[0])
    return user is not None and writes_transposed(user)


def _feeds_matmul(group: Group, other: Group, group_of: dict[Operation, Group]) -> bool:
    """True when `other` computes an operand of the matmul or convolution of `group` (no
    prologue fusion)."""
    # Only a product group holds a product (no merge or join turns it into another kind), and
    # it is its first op: this stays O(1) for the large elementwise and row groups.
    if group.kind not in PRODUCTS:
        return False
    matmul = group.ops[0]
    return any(group_of.get(v.defining_op) is other for v in matmul.operands)


class UnitNode:
    """A vertex of the graph of units (one group, or one op in no group): its edges and its
    position in a topological order of that graph."""

    __slots__ = ("order", "pred", "succ")

    def __init__(self, order: int) -> None:
        self.order = order
        self.succ: set[UnitNode] = set()
        self.pred: set[UnitNode] = set()


class UnitGraph:
    """The DAG of units, kept up to date as units are contracted, with a topological order.

    The cycle check asks whether a path joins two units through a third. In a topological order
    such a path from `lo` to `hi` only visits nodes ordered between them, so the search stays in
    that window (for chains of ops, a few nodes) instead of the whole graph. Contracting two
    units keeps the order valid by renumbering only the nodes of that window that lie on paths
    from `lo` or to `hi` (the Pearce-Kelly dynamic topological order). Nothing is rebuilt per
    query: fusing n ops costs about n window searches.
    """

    def add_ops(self, ops: Iterable[Operation]) -> dict[Operation, UnitNode]:
        """One node per op, ordered by position (a block's order is topological), with an edge
        from each operand's defining op in `ops` to its user."""
        node_of: dict[Operation, UnitNode] = {}
        for i, op in enumerate(ops):
            node = node_of[op] = UnitNode(i)
            for v in op.operands:
                producer = node_of.get(v.defining_op)
                if producer is not None:
                    producer.succ.add(node)
                    node.pred.add(producer)
        return node_of

    def path_through_third(self, a: UnitNode, b: UnitNode) -> bool:
        """Is there a path between `a` and `b` other than a direct edge?"""
        lo, hi = (a, b) if a.order < b.order else (b, a)
        _, found = _first_to_finish(_reach(lo, hi, True), _reach(hi, lo, False))
        return found is None

    def contract(self, a: UnitNode, b: UnitNode) -> UnitNode:
        """Merge `a` and `b` (joined by no path through a third) into one node, returned."""
        lo, hi = (a, b) if a.order < b.order else (b, a)
        forward, backward = _reach(lo, hi, True), _reach(hi, lo, False)
        which, found = _first_to_finish(forward, backward)
        if found is None:
            raise ValueError("contracting these units would close a cycle")
        keep, gone = (a, b) if len(a.succ) + len(a.pred) >= len(b.succ) + len(b.pred) else (b, a)
        if not found:
            # Nothing between lo and hi reaches hi (or is reached from lo): the merged node
            # can take lo's (hi's) place as it is, whatever the other side holds.
            order = lo.order if which is backward else hi.order
            self._absorb(keep, gone)
            keep.order = order
            return keep
        after = found if which is forward else _finish(forward)
        before = found if which is backward else _finish(backward)
        # Nodes between lo and hi that reach hi must precede the merged node, those reached from
        # lo must follow it: hand their positions out again in that order (one is left free).
        slots = sorted([lo.order, hi.order, *(n.order for n in before), *(n.order for n in after)])
        self._absorb(keep, gone)
        for node, slot in zip(sorted(before, key=_by_order), slots):
            node.order = slot
        keep.order = slots[len(before)]
        for node, slot in zip(sorted(after, key=_by_order), slots[len(slots) - len(after) :]):
            node.order = slot
        return keep

    @staticmethod
    def _absorb(keep: UnitNode, gone: UnitNode) -> None:
        """Move the edges of `gone` to `keep`. `keep` is the node with more edges, so a kernel
        with many neighbours is not walked again each time a small unit joins it."""
        for nxt in gone.succ:
            nxt.pred.discard(gone)
            if nxt is not keep:
                nxt.pred.add(keep)
                keep.succ.add(nxt)
        for prev in gone.pred:
            prev.succ.discard(gone)
            if prev is not keep:
                prev.succ.add(keep)
                keep.pred.add(prev)
        gone.succ.clear()
        gone.pred.clear()


def _by_order(node: UnitNode) -> int:
    return node.order


# A search between `lo` and `hi` of the unit graph yields once per edge it looks at, so that the
# forward search from lo and the backward search from hi can run in step: the cycle check costs
# the smaller of the two (a producer with thousands of consumers ahead, or an op with a long
# history behind, does not make every check walk them all).
Search = Generator[None, None, "set[UnitNode] | None"]


def _reach(start: UnitNode, end: UnitNode, forward: bool) -> Search:
    """Search from `start` towards `end` (along edges when `forward`, against them otherwise),
    through nodes ordered strictly between the two. Returns the nodes it reached, or None when
    it reached `end` other than by the direct edge between the two."""
    sign = 1 if forward else -1
    limit = sign * end.order
    seen: set[UnitNode] = set()
    stack = [start]
    while stack:
        node = stack.pop()
        for nxt in node.succ if forward else node.pred:
            yield
            if nxt is end:
                if node is start:
                    continue
                return None
            if sign * nxt.order < limit and nxt not in seen:
                seen.add(nxt)
                stack.append(nxt)
    return seen


def _finish(search: Search) -> set[UnitNode] | None:
    """Run `search` to its end; its result."""
    while True:
        try:
            next(search)
        except StopIteration as stop:
            return stop.value


def _first_to_finish(a: Search, b: Search) -> tuple[Search, set[UnitNode] | None]:
    """Advance both searches one edge at a time; the one that ends first and its result."""
    while True:
        for search in (a, b):
            try:
                next(search)
            except StopIteration as stop:
                return search, stop.value


def fusion_groups(func: FuncOp, matmul_epilogue: bool = True) -> list[tuple[str, list[Operation]]]:
    """The groups `fuse` would form in `func`, as (template kind, ops in block order), without
    changing the IR: what the planner offers as generated fused kernels."""
    return [(g.kind, list(g.ops)) for g in _Fuser.grouped(func, matmul_epilogue).groups]


class _Fuser:
    def __init__(self, func: FuncOp, matmul_epilogue: bool = True) -> None:
        self.func = func
        self.matmul_epilogue = matmul_epilogue
        self.group_of: dict[Operation, Group] = {}
        # Insertion-ordered set: membership and removal in O(1).
        self.groups: dict[Group, None] = {}
        self.units = UnitGraph()
        self.node_of: dict[Group | Operation, UnitNode] = self.units.add_ops(func.body.ops)

    @classmethod
    def grouped(cls, func: FuncOp, matmul_epilogue: bool) -> _Fuser:
        """A fuser that has formed its groups over `func` (the IR is not changed yet)."""
        fuser = cls(func, matmul_epilogue)
        fuser.number_ops()
        fuser.run()
        return fuser

    # -- the graph of units (groups and loose ops), for the cycle check ------------------------

    def unit(self, op: Operation) -> Group | Operation:
        return self.group_of.get(op, op)

    def creates_cycle(self, a: Group | Operation, b: Group | Operation) -> bool:
        """True when contracting units `a` and `b` would close a cycle (a path through a third)."""
        return self.units.path_through_third(self.node_of[a], self.node_of[b])

    # -- building groups ----------------------------------------------------------------------

    def new_group(self, op: Operation) -> Group | None:
        if op.name == "atomic.matmul":
            group = Group("matmul", op.results[0].type.shape)
        elif op.name in CONV_OPS and conv_misfit(op) is None:
            group = Group("conv", op.results[0].type.shape)
        elif folds_output_transpose(op):
            group = Group("attention", op.results[0].type.shape)
        elif (k := reduced_suffix(op)) is not None:
            group = Group("row_reduction", op.operands[0].type.shape, k)
        elif is_elementwise(op) or op.name == "atomic.concat":
            group = Group("elementwise", op.results[0].type.shape)
        else:
            return None
        group.ops.append(op)
        self.group_of[op] = group
        self.groups[group] = None
        self.node_of[group] = self.node_of.pop(op)
        return group

    def can_join(self, group: Group, op: Operation) -> bool:
        """May `op`, which reads a value of `group`, run inside it (shapes only)?"""
        if group.kind == "attention":
            return self.extends_attention_output(group, op)
        if op.name == "atomic.matmul" or op.name in CONV_OPS:
            return False
        if group.kind in PRODUCTS and not self.matmul_epilogue:
            return False
        if (k := reduced_suffix(op)) is not None:
            if group.kind in PRODUCTS or op.operands[0].type.shape != group.space:
                return False
            return group.kind == "elementwise" or group.ncols == k
        shape = op.results[0].type.shape if len(op.results) == 1 else None
        if is_elementwise(op) or op.name == "atomic.concat":
            return group.accepts_shape(shape)
        if group.kind != "row_reduction" or shape is None:
            return False
        inner = op.operands[0].defining_op
        if inner is None or self.group_of.get(inner) is not group:
            return False
        if op.name == "atomic.broadcast" or is_unit_reshape(op):
            return group.accepts_shape(shape)
        return group.relabels_rows(op)

    @staticmethod
    def extends_attention_output(group: Group, op: Operation) -> bool:
        """The transpose of the group's attention (its only user, which the kernel can write),
        then the reshape that is that transpose's only user: a reshape of the contiguous buffer
        the kernel writes only relabels it."""
        last = group.ops[-1]
        if only_user(last.results[0]) is not op:
            return False
        if last.name == "hl.attention":
            return writes_transposed(op)
        return last.name == "atomic.transpose" and op.name == "atomic.reshape"

    def join(self, group: Group, op: Operation) -> None:
        if (k := reduced_suffix(op)) is not None and group.kind == "elementwise":
            group.kind, group.ncols = "row_reduction", k
        if group.relabels_rows(op):
            group.reshaped.add(op.results[0].type.shape)
        group.ops.append(op)
        self.group_of[op] = group
        self.node_of[group] = self.units.contract(self.node_of[group], self.node_of.pop(op))

    def merge(self, keep: Group, other: Group) -> None:
        for op in other.ops:
            self.group_of[op] = keep
        keep.ops += other.ops
        keep.reshaped |= other.reshaped
        del self.groups[other]
        self.node_of[keep] = self.units.contract(self.node_of[keep], self.node_of.pop(other))

    def producer_groups(self, op: Operation) -> list[Group]:
        found: list[Group] = []
        for v in op.operands:
            p = v.defining_op
            g = self.group_of.get(p) if p is not None else None
            if g is not None and g not in found:
                found.append(g)
        rank = {"attention": 0, "matmul": 1, "conv": 1, "row_reduction": 2, "elementwise": 3}
        return sorted(found, key=lambda g: rank[g.kind])

    def run(self) -> None:
        for op in list(self.func.body.ops):
            if op.has_trait(TERMINATOR) or is_free(op):
                continue
            candidates = self.producer_groups(op)
            home = None
            for g in candidates:
                if self.can_join(g, op) and not self.creates_cycle(g, op):
                    self.join(g, op)
                    home = g
                    break
            if home is None:
                home = self.new_group(op)
            if home is None:
                continue
            for g in candidates:
                if g is home or g not in self.groups:
                    continue
                merged = _compatible(home, g) or _concat_branch(home, g, op)
                if (
                    merged is None
                    or _feeds_matmul(home, g, self.group_of)
                    or _feeds_matmul(g, home, self.group_of)
                ):
                    continue
                if merged.kind in PRODUCTS and not self.matmul_epilogue:
                    continue
                if self.creates_cycle(home, g):
                    continue
                other = g if merged is home else home
                self.merge(merged, other)
                home = merged
        for g in self.groups:
            g.ops.sort(key=self.position)

    def position(self, op: Operation) -> int:
        return self.index[op]

    def number_ops(self) -> None:
        self.index = {op: i for i, op in enumerate(self.func.body.ops)}


def _worth_a_kernel(group: Group) -> bool:
    return not (group.kind in PRODUCTS and len(group.ops) == 1)


def sanitize(name: str) -> str:
    """A C identifier made of [A-Za-z0-9_], never starting with a digit."""
    text = re.sub(r"[^A-Za-z0-9_]", "_", name)
    if not text or text[0].isdigit():
        text = "k_" + text
    return text[:80]


def unique_kernel_name(base: str, taken: set[str]) -> str:
    """`sanitize(base)`, suffixed `_1`, `_2`, ... until it is not in `taken` (then taken)."""
    base = sanitize(base)
    name, n = base, 0
    while name in taken:
        n += 1
        name = f"{base}_{n}"
    taken.add(name)
    return name


def _summary(group: Group) -> str:
    names: list[str] = []
    for op in group.ops:
        short = op.name.split(".", 1)[1]
        if short not in names and not op.has_trait(VIEW):
            names.append(short)
    return "_".join(names[:3])


def reads_whole(op: Operation, v: Value) -> bool:
    """True when `op`'s kernel reads `v` as a whole buffer (a kernel input, never a cloned
    view): a matmul operand; an attention operand unless it is a chain of views of a computed
    value that strides express (a view of a free value, such as an iota mask, is computed by its
    own kernel: the attention kernel only loads). The planner's regions follow the same rule
    (planner/backends/cuda_kernels.py)."""
    if op.name == "hl.attention":
        # A grouped-query head repeat too: the kernel reads the cache's heads by index.
        found = head_grouped_layout(v)
        if found is None:
            return True
        root = found[0].defining_op
        return root is not None and is_free(root)
    return op.name == "atomic.matmul" or op.name in CONV_OPS


class Materializer:
    """Turns one group into a `kernel.fused` op placed in the function body."""

    def __init__(self, func: FuncOp, group: Group, name: str) -> None:
        self.func = func
        self.group = group
        self.name = name
        self.members = set(group.ops)
        self.inputs: list[Value] = []
        self.clones: dict[Value, Value] = {}

    def source_chain(self, v: Value) -> list[Operation] | None:
        """The view ops (and a free leaf) between `v` and a value computed elsewhere, or None
        when `v` is not a view of an outside value."""
        chain: list[Operation] = []
        while True:
            op = v.defining_op
            if op is None:
                return chain if chain else None
            if op in self.members:
                return None
            if is_free_leaf(op):
                return chain + [op]
            if not op.has_trait(VIEW):
                return chain if chain else None
            chain.append(op)
            v = op.operands[0]

    def resolve(self, v: Value, block: Block) -> Value:
        """The value inside the region that stands for the outside value `v`."""
        if v in self.clones:
            return self.clones[v]
        op = v.defining_op
        if op is not None and (is_free(op) or (op.has_trait(VIEW) and self.source_chain(v))):
            operands = [self.resolve(x, block) for x in op.operands]
            clone = type(op)(
                operands, [r.type for r in op.results], dict(op.attributes), None, op.loc
            )
            block.append(clone)
            for old, new in zip(op.results, clone.results):
                self.clones[old] = new
            return self.clones[v]
        arg = self.input(v, block)
        self.clones[v] = arg
        return arg

    def input(self, v: Value, block: Block) -> Value:
        """The block argument standing for the outside value `v` (added on first use)."""
        if v not in self.inputs:
            self.inputs.append(v)
            block.add_arg(v.type, v.name_hint)
        return block.args[self.inputs.index(v)]

    def build(self, before: Operation | None = None) -> FusedOp:
        """Make the fused op, inserted before `before` (default: the function's terminator)."""
        ops = self.group.ops
        outputs = [
            r for op in ops for r in op.results if any(u not in self.members for u in r.users())
        ]
        block = Block()
        for op in ops:
            for i, v in enumerate(op.operands):
                d = v.defining_op
                if d is None or d not in self.members:
                    # Whole buffers are kernel inputs (reads_whole); other views are cloned.
                    inner = self.input(v, block) if reads_whole(op, v) else self.resolve(v, block)
                    op.set_operand(i, inner)
            op.detach()
            block.append(op)
        block.append(YieldOp(list(outputs), [], loc=ops[-1].loc))
        attrs = {"name": self.name, "template": self.group.kind}
        fused = FusedOp(
            list(self.inputs), [v.type for v in outputs], attrs, [Region([block])], ops[-1].loc
        )
        for old, new in zip(outputs, fused.results):
            new.name_hint = old.name_hint
            old.replace_uses_if(new, lambda user: user.block is not block)
        self.func.body.insert_before(fused, before if before is not None else self.func.body.last)
        return fused


def _is_leaf(op: Operation) -> bool:
    """Views and free values: what kernels clone, and so what they may leave dead outside."""
    return op.has_trait(VIEW) or is_free(op)


def _reorder(func: FuncOp, key: dict[Operation, int]) -> None:
    """Put the body into a topological order, as close to the original order as possible."""
    import networkx as nx  # here, not at the top: importing it costs a third of a tool's start

    body = func.body
    term = body.last
    ops = [op for op in body.ops if op is not term]
    g = nx.DiGraph()
    g.add_nodes_from(ops)
    members = set(ops)
    for op in ops:
        for v in op.operands:
            p = v.defining_op
            if p in members:
                g.add_edge(p, op)
    order = list(nx.lexicographical_topological_sort(g, key=lambda op: key[op]))
    for op in ops:
        op.detach()
    for op in order:
        body.insert_before(op, term)


def existing_kernel_names(module: Operation) -> set[str]:
    return {op.attr("name") for op in module.walk() if isinstance(op, FusedOp)}


@register_pass
@dataclass(frozen=True)
class Fuse(Pass):
    """Group producer-consumer chains into `kernel.fused` regions (elementwise chains, row
    reductions with prologue and epilogue, matmul with epilogue, attention with the transpose
    that merges its heads). See the module docstring for
    the legality rules and the policy for values with several consumers.

    Contract: results are unchanged; each fused op is an isolated region whose block arguments
    are its inputs and whose `kernel.yield` gives its outputs; `name` is a unique C identifier.
    """

    name = "fuse"
    summary = "Fuse producer-consumer chains into kernel.fused regions"
    # false: leave matmuls alone (a library runs them) so that their elementwise consumers fuse
    # forward instead, e.g. attention's scale and mask into the softmax kernel.
    matmul_epilogue: bool = option(
        True, "fuse elementwise consumers into a matmul's or a convolution's epilogue"
    )

    def run_on_module(self, module: ModuleOp, stats: PassStatistics) -> None:
        taken = existing_kernel_names(module)
        for func in module.funcs:
            self.fuse_function(func, stats, taken)

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        self.fuse_function(func, stats, existing_kernel_names(func))

    def fuse_function(self, func: FuncOp, stats: PassStatistics, taken: set[str]) -> None:
        fuser = _Fuser.grouped(func, self.matmul_epilogue)
        key = dict(fuser.index)

        # Attention kernels first: the transpose they write is then already their result when
        # another kernel reads it (else that kernel would clone the transpose as a view of the
        # attention's own result, which the attention kernel does not yield).
        def order(g: Group) -> tuple[bool, int]:
            return g.kind != "attention", fuser.index[g.ops[0]]

        for group in sorted(fuser.groups, key=order):
            if not _worth_a_kernel(group):
                continue
            name = unique_kernel_name(f"{func.sym_name}_{_summary(group)}", taken)
            fused = Materializer(func, group, name).build()
            key[fused] = max(fuser.index[op] for op in group.ops)
            stats.bump(f"kernels ({group.kind})")
            stats.bump("ops fused", len(group.ops))
        for op in func.body.ops:
            key.setdefault(op, len(key))
        # The views and free values cloned into kernels; dead ops of other kinds stay (dce's).
        erase_dead_ops(func.body, nested=False, only=_is_leaf)
        _reorder(func, key)
