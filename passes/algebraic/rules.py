"""The rewrite rules of the `algebraic` pass, as a table (the algebra is the trailing comment).

A rule is anchored on ops of some names. `find(op, ctx)` returns the places where it applies at
`op`, each as `(ops, plan)`: every op the rewrite reads or replaces (the anchor first) and a plain
value saying how (a parenthesisation, an operand side). `apply(rewriter, ops, plan)` performs it
through the rewriter, using nothing but `ops` and `plan`, so the same call replays on the real
function what the search found on a clone. A rule checks in `find` that the rewrite is legal
(types, broadcasting, transpose flags, dominance); whether it pays is the cost model's business.

    A@B + A@C -> A@(B+C)          B@A + C@A -> (B+C)@A          x*a + x*b -> x*(a+b)
    (A@B)@C <-> A@(B@C)           A@B@C@... -> its cheapest parenthesisation
    X@W1, .., X@Wn -> split(X@concat(W1, .., Wn))     (A@B)^T -> B^T@A^T     A^T@B -> A@B {ta}
    (the merge is offered for the whole group, and for its members whose products the function
    does not return, when two or more of them are)
    X@W1, .., X@Wn -> split(X@stack(W1, .., Wn)) along the new axis 0 (matrices of one shape,
    some product returned: the pieces are contiguous, returned as views)

`@` is atomic.matmul with its `transpose_a`/`transpose_b` flags; `-` works wherever `+` does.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

from tgc.builder import Builder
from tgc.diagnostics import VerifyError
from tgc.dialects._shapes import broadcast_shapes, matmul_shape
from tgc.ir import Operation, Value
from tgc.passes.algebraic.cost import CostWeights, FixedMemo, is_fixed, is_result
from tgc.rewriter import Rewriter
from tgc.types import ELEMENT_BYTES

MATMUL = "atomic.matmul"
TRANSPOSE = "atomic.transpose"
MUL = "atomic.mul"
ADD_SUB = frozenset({"atomic.add", "atomic.sub"})
MAX_CHAIN = 16  # longer chains are only reassociated step by step
MAX_SHARERS = 64  # values with more uses are not searched for matmuls to merge


@dataclass(frozen=True)
class Context:
    """What `find` may consult besides the IR: op positions, the cost weights, and which values
    are fixed (cost.is_fixed; shared by the finds of one state)."""

    index: dict[Operation, int]
    weights: CostWeights
    fixed: FixedMemo = field(default_factory=dict)


Found = list[tuple[tuple[Operation, ...], object]]


@dataclass(frozen=True)
class Rule:
    name: str
    anchors: frozenset[str]
    find: Callable[[Operation, Context], Found]
    apply: Callable[[Rewriter, tuple[Operation, ...], object], None]
    # Exact on every input, infinities and NaN included. Distributing and reassociating are
    # exact in real arithmetic only: x = -inf, a = 2, b = -1 gives x*a + x*b = NaN but
    # x*(a+b) = -inf. Those rules run only under `fast-math` (the pass's default).
    exact: bool = True


# -- helpers ---------------------------------------------------------------------------------------


def _producer(value: Value, name: str) -> Operation | None:
    op = value.defining_op
    return op if op is not None and op.name == name else None


def _flag(mm: Operation, side: int) -> bool:
    return bool(mm.attr("transpose_a" if side == 0 else "transpose_b"))


def _swapped(shape: tuple[int, ...]) -> tuple[int, ...]:
    return shape[:-2] + (shape[-1], shape[-2])


def _swap_perm(rank: int) -> tuple[int, ...]:
    return tuple(range(rank - 2)) + (rank - 1, rank - 2)


def _is_swap(op: Operation) -> bool:
    rank = op.operands[0].type.rank
    return rank >= 2 and tuple(op.attr("perm")) == _swap_perm(rank)


def _matmul(b: Builder, x: Value, y: Value, ta: bool, tb: bool) -> Value:
    return b.atomic.matmul(x, y, transpose_a=True if ta else None, transpose_b=True if tb else None)


def _transpose(b: Builder, x: Value) -> Value:
    return b.atomic.transpose(x, perm=_swap_perm(x.type.rank))


def _reshape(b: Builder, x: Value, shape: tuple[int, ...]) -> Value:
    return b.atomic.reshape(x, result_type=x.type.with_shape(shape))


def _erase_dead(rewriter: Rewriter, ops) -> None:
    """Erase the ops (users before producers) whose results lost their last use."""
    for op in ops:
        if op.block is not None and not any(r.uses for r in op.results):
            rewriter.erase_op(op)


def _single_use_matmul(value: Value, block) -> Operation | None:
    op = _producer(value, MATMUL)
    if op is None or op.block is not block or len(value.uses) != 1:
        return None
    return op


# -- distributivity --------------------------------------------------------------------------------


def _distributed_shape(m1: Operation, m2: Operation, side: int) -> tuple[int, ...] | None:
    """The result shape of `shared @ (x + y)` (side 0) or `(x + y) @ shared` (side 1)."""
    other = 1 - side
    x, y = m1.operands[other].type.shape, m2.operands[other].type.shape
    fx, fy = _flag(m1, other), _flag(m2, other)
    flag = fx
    if fx != fy:
        x, y, flag = (_swapped(x) if fx else x), (_swapped(y) if fy else y), False
    shared = m1.operands[side].type.shape
    try:
        inner = broadcast_shapes(x, y)
        if side == 0:
            return matmul_shape(shared, inner, _flag(m1, 0), flag)
        return matmul_shape(inner, shared, flag, _flag(m1, 1))
    except VerifyError:
        return None


def _find_distribute_matmul(side: int):
    def find(op: Operation, ctx: Context) -> Found:
        m1, m2 = (_producer(v, MATMUL) for v in op.operands)
        if m1 is None or m2 is None or m1 is m2:
            return []
        if m1.operands[side] is not m2.operands[side] or _flag(m1, side) != _flag(m2, side):
            return []
        if _distributed_shape(m1, m2, side) != op.results[0].type.shape:
            return []
        return [((op, m1, m2), None)]

    return find


def _apply_distribute_matmul(side: int):
    def apply(rewriter: Rewriter, ops: tuple[Operation, ...], plan) -> None:
        root, m1, m2 = ops
        other = 1 - side
        b = rewriter.builder_before(root)
        x, y = m1.operands[other], m2.operands[other]
        fx, fy = _flag(m1, other), _flag(m2, other)
        flag = fx
        if fx != fy:  # bring both to their natural layout; the sum is then not transposed
            x = _transpose(b, x) if fx else x
            y = _transpose(b, y) if fy else y
            flag = False
        inner = b.create(root.name, [x, y]).results[0]
        shared = m1.operands[side]
        if side == 0:
            new = _matmul(b, shared, inner, _flag(m1, 0), flag)
        else:
            new = _matmul(b, inner, shared, flag, _flag(m1, 1))
        rewriter.replace_op(root, new)
        _erase_dead(rewriter, (m1, m2))

    return apply


def _find_distribute_mul(op: Operation, ctx: Context) -> Found:
    m1, m2 = (_producer(v, MUL) for v in op.operands)
    if m1 is None or m2 is None or m1 is m2:
        return []
    for i in (0, 1):
        for j in (0, 1):
            if m1.operands[i] is not m2.operands[j]:
                continue
            x, a, c = m1.operands[i], m1.operands[1 - i], m2.operands[1 - j]
            try:
                shape = broadcast_shapes(x.type.shape, broadcast_shapes(a.type.shape, c.type.shape))
            except VerifyError:
                continue
            if shape == op.results[0].type.shape:
                return [((op, m1, m2), (i, j))]
    return []


def _apply_distribute_mul(rewriter: Rewriter, ops: tuple[Operation, ...], plan) -> None:
    root, m1, m2 = ops
    i, j = plan
    b = rewriter.builder_before(root)
    inner = b.create(root.name, [m1.operands[1 - i], m2.operands[1 - j]]).results[0]
    rewriter.replace_op(root, b.atomic.mul(m1.operands[i], inner))
    _erase_dead(rewriter, (m1, m2))


# -- matmul chains ---------------------------------------------------------------------------------

Tree = int | tuple  # a parenthesisation: a factor index, or (left tree, right tree)


def _chain(root: Operation, members: frozenset[Operation] | None):
    """The factors of the product computed by `root`, the tree it computes them in, and the
    matmuls of that tree (root first, users before producers).

    A factor is (value, transposed). Without `members` the chain grows through every operand
    that is a single-use matmul of the same block; with it, through exactly those ops (replay).
    """
    factors: list[tuple[Value, bool]] = []
    interior: list[Operation] = []

    def expand(value: Value, flag: bool, op: Operation | None) -> Tree:
        if op is None:
            factors.append((value, flag))
            return len(factors) - 1
        interior.append(op)
        a, b = op.operands
        ta, tb = _flag(op, 0), _flag(op, 1)
        if flag:  # (op(a) @ op(b))^T = op(b)^T @ op(a)^T
            (a, ta), (b, tb) = (b, not tb), (a, not ta)
        return (expand(a, ta, grow(a)), expand(b, tb, grow(b)))

    def grow(value: Value) -> Operation | None:
        if members is None:
            return _single_use_matmul(value, root.block)
        op = value.defining_op
        return op if op in members else None

    tree = expand(root.results[0], False, root)
    return factors, tree, interior


def _product(left, right, w: CostWeights, nbytes: int):
    """(seconds, batch, rows, cols, fixed) of multiplying two such operands, priced as
    cost.op_cost prices the matmul: its roofline plus a launch, nothing when both operands are
    fixed (the product is then fixed too, computed once)."""
    cl, bl, rows, inner, fl = left
    cr, br, _, cols, fr = right
    batch = broadcast_shapes(bl, br)
    if fl and fr:
        return cl + cr, batch, rows, cols, True
    out = math.prod(batch) * rows * cols
    moved = (math.prod(bl) * rows * inner + math.prod(br) * inner * cols + out) * nbytes
    seconds = cl + cr + max(w.flop * 2 * out * inner, w.byte * moved) + w.launch
    return seconds, batch, rows, cols, False


def _leaf(factor) -> tuple[float, tuple[int, ...], int, int, bool]:
    value, flag = factor
    shape = value.type.shape
    rows, cols = (shape[-1], shape[-2]) if flag else (shape[-2], shape[-1])
    return 0.0, shape[:-2], rows, cols, is_fixed(value)


def _tree_cost(tree: Tree, factors, w: CostWeights, nbytes: int):
    """(seconds, batch shape, rows, cols, fixed) of evaluating `tree` over `factors`."""
    if isinstance(tree, int):
        return _leaf(factors[tree])
    left = _tree_cost(tree[0], factors, w, nbytes)
    return _product(left, _tree_cost(tree[1], factors, w, nbytes), w, nbytes)


def _best_tree(factors, w: CostWeights, nbytes: int) -> tuple[float, Tree]:
    """Matrix-chain dynamic programming over the factors (batch dims broadcast)."""
    n = len(factors)
    best = {(i, i): (_leaf(f), i) for i, f in enumerate(factors)}  # (i, j) -> (priced, tree)
    for length in range(2, n + 1):
        for i in range(n - length + 1):
            j = i + length - 1
            for k in range(i, j):
                (left, tl), (right, tr) = best[i, k], best[k + 1, j]
                priced = _product(left, right, w, nbytes)
                if (i, j) not in best or priced[0] < best[i, j][0][0]:
                    best[i, j] = (priced, (tl, tr))
    priced, tree = best[0, n - 1]
    return priced[0], tree


def _is_chain_root(op: Operation) -> bool:
    uses = op.results[0].uses
    return not (len(uses) == 1 and uses[0][0].name == MATMUL and uses[0][0].block is op.block)


def _find_reorder_chain(op: Operation, ctx: Context) -> Found:
    if not _is_chain_root(op):
        return []
    factors, tree, interior = _chain(op, None)
    if not 3 <= len(factors) <= MAX_CHAIN:
        return []
    nbytes = ELEMENT_BYTES[op.results[0].type.element_type]
    current = _tree_cost(tree, factors, ctx.weights, nbytes)[0]
    cost, best = _best_tree(factors, ctx.weights, nbytes)
    if best == tree or cost >= current * (1 - 1e-9):
        return []
    return [(tuple(interior), best)]


def _rotate(tree: Tree) -> Tree:
    """((x, y), z) -> (x, (y, z)) and back."""
    left, right = tree
    if isinstance(left, tuple):
        return (left[0], (left[1], right))
    return ((left, right[0]), right[1])


def _find_reassociate(op: Operation, ctx: Context) -> Found:
    found: Found = []
    for value in op.operands:
        child = _single_use_matmul(value, op.block)
        if child is None or child is op:
            continue
        _, tree, interior = _chain(op, frozenset((op, child)))
        found.append((tuple(interior), _rotate(tree)))
    return found


def _apply_chain(rewriter: Rewriter, ops: tuple[Operation, ...], plan: Tree) -> None:
    root = ops[0]
    factors, _, interior = _chain(root, frozenset(ops))
    b = rewriter.builder_before(root)

    def build(tree: Tree) -> tuple[Value, bool]:
        if isinstance(tree, int):
            return factors[tree]
        x, fx = build(tree[0])
        y, fy = build(tree[1])
        return _matmul(b, x, y, fx, fy), False

    rewriter.replace_op(root, build(plan)[0])
    _erase_dead(rewriter, interior[1:])


# -- matmuls sharing an operand --------------------------------------------------------------------


def _merge_axis(mm: Operation, side: int) -> int:
    """The axis of the other operand (the weight) along which merged weights are joined."""
    rank = mm.operands[1 - side].type.rank
    if side == 0:  # X @ W: concatenate the columns (n) of W
        return rank - 2 if _flag(mm, 1) else rank - 1
    return rank - 1 if _flag(mm, 0) else rank - 2  # W @ X: concatenate the rows (m) of W


def _merge_key(mm: Operation, side: int, fixed: FixedMemo):
    """(what must agree for matmuls to merge, the axis of the other operand to concatenate).

    Weights that are fixed (cost.is_fixed: parameters, constants) and weights that are not go
    to different groups: the concat of fixed weights is packed once, so the fixed ones merge
    even where adding a plain weight would make the concat cost more than the merge saves. It
    also keeps each piece of the split exactly as fixed as the matmul it replaces, so the ops
    reading it keep their cost (the search prices only the ops a rewrite adds and erases)."""
    weight = mm.operands[1 - side]
    w = weight.type
    axis = _merge_axis(mm, side)
    rest = tuple(d for i, d in enumerate(w.shape) if i != axis)
    key = (_flag(mm, 0), _flag(mm, 1), w.element_type, w.encoding, w.rank, rest)
    return (*key, is_fixed(weight, fixed)), axis


def _find_merge(op: Operation, ctx: Context) -> Found:
    found: Found = []
    index = ctx.index
    for side in (0, 1):
        shared = op.operands[side]
        if len(shared.uses) > MAX_SHARERS:
            continue
        key = _merge_key(op, side, ctx.fixed)
        members = [
            user
            for user, i in shared.uses
            if i == side
            and user.name == MATMUL
            and user.block is op.block
            and user.results[0].uses  # a dead matmul is dce's business, and has no anchor
            and _merge_key(user, side, ctx.fixed) == key
        ]
        members = sorted(dict.fromkeys(members), key=index.__getitem__)
        if len(members) < 2 or members[0] is not op:
            continue  # the group is reported once, at its first matmul

        def anchor(group):  # new ops go before the first user of any of the group's results
            users = [u for m in group for u, _ in m.results[0].uses]
            return min(users, key=index.__getitem__) if users else None

        def available(value: Value, at: Operation) -> bool:
            d = value.defining_op
            return d is None or index[d] < index[at]

        at = anchor(members)
        if at is None or not available(shared, at):
            continue
        group = set(members)  # a weight computed by a member cannot feed the merged matmul
        members = [
            m
            for m in members
            if available(m.operands[1 - side], at) and m.operands[1 - side].defining_op not in group
        ]
        if len(members) < 2:
            continue
        found.append(((anchor(members), *members), side))
        # Also the members read in place alone: a returned piece would be copied out of the
        # split (cost.py), which can cost more than its matmul's launch saves.
        in_place = [m for m in members if not is_result(m.results[0])]
        if 2 <= len(in_place) < len(members):
            found.append(((anchor(in_place), *in_place), side))
        assert all(f[0][0] is not None for f in found), "a merge group without an anchor"
    return found


def _find_stack(op: Operation, ctx: Context) -> Found:
    """X@W1, .., X@Wn with X and the Wi matrices of one shape, some product returned: one
    batched matmul X@stack(W1, .., Wn) whose split along the new leading axis gives contiguous
    pieces, which a plan returns as views of the product without copying them (cost.py). Where
    no product is returned, the concat merge is as good and keeps one 2-D product (a bias add
    or a GEMM epilogue after it stays one op), so this rule leaves that case to it."""
    x = op.operands[0]
    if x.type.rank != 2 or op.operands[1].type.rank != 2:
        return []
    for found, side in _find_merge(op, ctx):
        if side != 0:
            continue
        _, *members = found
        shape = members[0].operands[1].type.shape
        if any(m.operands[1].type.shape != shape for m in members):
            continue
        if any(is_result(m.results[0]) for m in members):
            return [(found, None)]
    return []


def _apply_stack(rewriter: Rewriter, ops: tuple[Operation, ...], plan) -> None:
    at, *members = ops
    first = members[0]
    b = rewriter.builder_before(at)
    b.loc = first.loc
    w = first.operands[1].type
    stacked = b.atomic.concat(*(_reshape(b, m.operands[1], (1, *w.shape)) for m in members), axis=0)
    merged = _matmul(b, first.operands[0], stacked, _flag(first, 0), _flag(first, 1))
    pieces = b.atomic.split(merged, axis=0, sizes=(1,) * len(members))
    for m, piece in zip(members, pieces):
        rewriter.replace_op(m, _reshape(b, piece, m.results[0].type.shape))


def _apply_merge(rewriter: Rewriter, ops: tuple[Operation, ...], side: int) -> None:
    at, *members = ops
    first = members[0]
    axis = _merge_axis(first, side)
    b = rewriter.builder_before(at)
    b.loc = first.loc
    weights = b.atomic.concat(*(m.operands[1 - side] for m in members), axis=axis)
    shared = first.operands[side]
    ta, tb = _flag(first, 0), _flag(first, 1)
    if side == 0:
        merged = _matmul(b, shared, weights, ta, tb)
    else:
        merged = _matmul(b, weights, shared, ta, tb)
    split_axis = merged.type.rank - 1 if side == 0 else merged.type.rank - 2
    sizes = tuple(m.results[0].type.shape[split_axis] for m in members)
    pieces = b.atomic.split(merged, axis=split_axis, sizes=sizes)
    for m, piece in zip(members, pieces):
        rewriter.replace_op(m, piece)


# -- transposes ------------------------------------------------------------------------------------


def _find_transpose_of_matmul(op: Operation, ctx: Context) -> Found:
    mm = _producer(op.operands[0], MATMUL)
    if mm is None or not _is_swap(op):
        return []
    return [((op, mm), None)]


def _apply_transpose_of_matmul(rewriter: Rewriter, ops: tuple[Operation, ...], plan) -> None:
    t, mm = ops
    a, b_ = mm.operands
    b = rewriter.builder_before(t)
    rewriter.replace_op(t, _matmul(b, b_, a, not _flag(mm, 1), not _flag(mm, 0)))
    _erase_dead(rewriter, (mm,))


def _find_matmul_of_transpose(op: Operation, ctx: Context) -> Found:
    found: Found = []
    for side in (0, 1):
        t = _producer(op.operands[side], TRANSPOSE)
        if t is not None and _is_swap(t):
            found.append(((op, t), side))
    return found


def _apply_matmul_of_transpose(rewriter: Rewriter, ops: tuple[Operation, ...], side: int) -> None:
    mm, t = ops
    operands = list(mm.operands)
    flags = [_flag(mm, 0), _flag(mm, 1)]
    operands[side] = t.operands[0]
    flags[side] = not flags[side]
    b = rewriter.builder_before(mm)
    rewriter.replace_op(mm, _matmul(b, operands[0], operands[1], *flags))
    _erase_dead(rewriter, (t,))


# -- the table -------------------------------------------------------------------------------------

_MM = frozenset({MATMUL})
_TR = frozenset({TRANSPOSE})
_distribute_matmul_left = _find_distribute_matmul(0)
_distribute_matmul_right = _find_distribute_matmul(1)
_apply_distribute_left = _apply_distribute_matmul(0)
_apply_distribute_right = _apply_distribute_matmul(1)

RULES: tuple[Rule, ...] = (
    # A@B + A@C -> A@(B+C)
    Rule(
        "distribute-matmul-left",
        ADD_SUB,
        _distribute_matmul_left,
        _apply_distribute_left,
        exact=False,
    ),
    # B@A + C@A -> (B+C)@A
    Rule(
        "distribute-matmul-right",
        ADD_SUB,
        _distribute_matmul_right,
        _apply_distribute_right,
        exact=False,
    ),
    # x*a + x*b -> x*(a+b)
    Rule("distribute-mul", ADD_SUB, _find_distribute_mul, _apply_distribute_mul, exact=False),
    # A@B@C@... -> the cheapest parenthesisation (matrix-chain dynamic programming)
    Rule("reorder-matmul-chain", _MM, _find_reorder_chain, _apply_chain, exact=False),
    # (A@B)@C <-> A@(B@C)
    Rule("reassociate-matmul", _MM, _find_reassociate, _apply_chain, exact=False),
    # X@W1, .., X@Wn -> split(X@concat(W1, .., Wn))  and  W1@X, .. -> split(concat(W1, ..)@X)
    Rule("merge-shared-matmuls", _MM, _find_merge, _apply_merge),
    # X@W1, .., X@Wn -> pieces of split(X@stack(W1, .., Wn), axis 0)  (some product returned)
    Rule("stack-shared-matmuls", _MM, _find_stack, _apply_stack),
    # (A@B)^T -> B^T@A^T  (as transpose flags)
    Rule("transpose-of-matmul", _TR, _find_transpose_of_matmul, _apply_transpose_of_matmul),
    # A^T@B -> A@B {transpose_a}  (and B)
    Rule("matmul-of-transpose", _MM, _find_matmul_of_transpose, _apply_matmul_of_transpose),
)
RULE_NAMES = tuple(r.name for r in RULES)
