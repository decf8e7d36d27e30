"""`canonicalize`: simplify to a canonical form with one greedy worklist (tgc.patterns).

What it does: the rule table of passes/canonicalize_rules.py (neutral elements, double
negation, sign and power rules, identity and composed transposes, reshape and broadcast chains,
transposes folded into matmul, and, under `fast-math`, the rules that change NaN/inf/signed-zero
results), plus four patterns that look further than a rule row:

- `fold-constant`: a pure op whose operands are all constants becomes a constant, computed with
  the op's numpy `reference` (as the interpreter would). Folding never grows the IR: the result
  must be a splat or no bigger than the largest operand constant.
- `associative-chain`: a tree of one associative, commutative op (add, mul, max, min) whose inner
  nodes have no other use is rebuilt in one canonical shape. Its constants are folded into one;
  in a sum, a leaf repeated k times becomes leaf*k (`x+x+x -> x*3`); in max/min a repeated leaf
  is dropped. Leaves are grouped by shape, biggest first; each group is a left-deep chain
  (non-constants ordered by a deterministic key, constants last) and the groups are combined
  smallest-first, so every element is combined at the smallest shape it can be:
  `(m1+s1)+(m2+s2) -> (m1+m2)+(s1+s2)` for scalars s, and `c+x -> x+c`.
- `sort-commutative-operands`: the same order for commutative ops outside chains.
- `broadcast-late`: an elementwise op does not compute on explicitly broadcast operands: it uses
  their sources and broadcasts its result (nothing at all when numpy broadcasting already gives
  the result's shape).

Contract: results keep their types and, in float64, their values up to reassociation rounding
(bit-for-bit for NaN, infinities and signed zeros unless `fast-math`). New ops take the location
of the op they replace. Runs in time linear in the function's size (plus sorting chain leaves).
Hitting `max-iterations` sweeps without reaching a fixpoint is reported on stderr and in
`--pass-statistics` (an error with `test-convergence`).
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass
from functools import cache

import numpy as np

from tgc.builtin import FuncOp
from tgc.diagnostics import TgcError, VerifyError
from tgc.dialects._shapes import broadcast_shapes
from tgc.dialects.atomic import AddOp, MaxOp, MinOp, MulOp
from tgc.ir import BlockArgument, Operation, Value
from tgc.opdef import ASSOCIATIVE, COMMUTATIVE, ELEMENTWISE, PURE, create, dialect_ops
from tgc.pass_manager import Pass, PassStatistics, PipelineError, option, register_pass
from tgc.passes.canonicalize_rules import CANONICALIZE_RULES
from tgc.passes.rules import make_constant, run_reference
from tgc.patterns import PatternRewriter, RewritePattern, apply_patterns_greedily

# -- constants -------------------------------------------------------------------------------------


def constant_array(v: Value) -> np.ndarray | None:
    op = v.defining_op
    if op is None or op.name != "atomic.constant":
        return None
    return op.attr("value").array


def is_splat(array: np.ndarray) -> bool:
    flat = array.reshape(-1)
    return flat.size > 0 and (array.strides == (0,) * array.ndim or bool(np.all(flat == flat[0])))


def float_splat(v: Value) -> float | None:
    """The value of a float constant holding one value everywhere, else None."""
    array = constant_array(v)
    if array is None or not v.type.is_float or not is_splat(array):
        return None
    return float(np.asarray(array).reshape(-1)[0])


def worth_folding(result: np.ndarray, inputs: list[np.ndarray]) -> bool:
    """Folding may not grow the IR: a splat, or no more elements than the biggest input."""
    if result.size <= max((a.size for a in inputs), default=0) or result.size <= 1:
        return True
    return is_splat(result)


class FoldConstant(RewritePattern):
    """A pure atomic op whose operands are all constants -> constants (its numpy reference)."""

    benefit = 10
    name = "fold-constant"

    def __init__(self) -> None:
        self.op_types = tuple(
            cls for cls in dialect_ops("atomic") if PURE in cls.traits and cls.operand_defs
        )

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if not op.operands:
            return False
        arrays = [constant_array(v) for v in op.operands]
        if any(a is None for a in arrays):
            return False
        if (
            op.name == "atomic.div"
            and not op.results[0].type.is_float
            and any(np.any(a == 0) for a in arrays[1:])
        ):
            return False  # integer division by zero has no value to fold to
        outs = run_reference(op, arrays, [r.type.dtype for r in op.results])
        if outs is None or any(o.shape != r.type.shape for o, r in zip(outs, op.results)):
            return False
        if not all(worth_folding(o, arrays) for o in outs):
            return False
        b = rewriter.builder_before(op)
        rewriter.replace_op(op, [make_constant(b, o, r.type) for o, r in zip(outs, op.results)])
        return True


# -- canonical operand order -----------------------------------------------------------------------


def _shallow_key(v: Value) -> tuple:
    if isinstance(v, BlockArgument):
        return (0, v.index)
    op = v.defining_op
    return (2, "") if op.name == "atomic.constant" else (1, op.name)


def value_key(v: Value) -> tuple:
    """A deterministic order: block arguments by position, then op results by op name and their
    operands' kinds, constants last. Ties keep their current order (sorts are stable)."""
    if isinstance(v, BlockArgument):
        return (0, v.index)
    op = v.defining_op
    if op.name == "atomic.constant":
        return (2, "")
    return (1, op.name, v.index, tuple(_shallow_key(o) for o in op.operands))


class SortCommutativeOperands(RewritePattern):
    """Commutative ops that are not chains (see AssociativeChain): operands in key order."""

    traits = frozenset({COMMUTATIVE})
    name = "sort-commutative-operands"

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if ASSOCIATIVE in op.traits or len(op.operands) != 2 or len(op.results) != 1:
            return False
        a, b = op.operands
        if value_key(b) >= value_key(a):
            return False
        rewriter.replace_op(op, _create_like(op, [b, a], rewriter))
        return True


def _create_like(op: Operation, operands: list[Value], rewriter: PatternRewriter) -> Value:
    new = create(type(op), operands, op.attributes, [op.results[0].type], loc=op.loc)
    return rewriter.builder_before(op).insert(new).results[0]


# -- associative chains ----------------------------------------------------------------------------

_NODE = None  # an inner node in a chain's postfix form; every other entry is a leaf


class AssociativeChain(RewritePattern):
    """Rebuild a chain of one associative, commutative op in its canonical shape."""

    op_types = (AddOp, MulOp, MaxOp, MinOp)
    name = "associative-chain"

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if _inner_node(op, op.name):
            return False  # the chain's root will handle it
        if _canonical_pair(op):
            return False
        current = _postfix(op)
        leaves = [e for e in current if e is not _NODE]
        items = _canonical_leaves(op, leaves)
        if items is None:
            return False
        target = _shape_postfix(items)
        if len(target) == len(current) and all(t is c for t, c in zip(target, current)):
            return False
        new = _materialize(op, target, rewriter)
        if new.type is not op.results[0].type:
            raise AssertionError(f"associative-chain changed {op.results[0].type} to {new.type}")
        rewriter.replace_op(op, new)
        return True


def _inner_node(op: Operation, name: str) -> bool:
    """True when `op` only feeds one op of the same kind in the same block."""
    uses = op.results[0].uses
    if len(uses) != 1:
        return False
    user = uses[0][0]
    return user.name == name and user.block is op.block


def _canonical_pair(op: Operation) -> bool:
    """Fast path for the common chain of two leaves already in canonical order."""
    a, b = op.operands
    if a is b:
        return False
    for v in (a, b):
        producer = v.defining_op
        if producer is not None and producer.name == op.name and _inner_node(producer, op.name):
            return False
    if constant_array(a) is not None and constant_array(b) is not None:
        return False
    return _leaf_key(a) <= _leaf_key(b)


def _postfix(root: Operation) -> list:
    """The chain under `root` in postfix order: leaves (values) and _NODE for each inner op."""
    out: list = []
    stack: list = [(root, False)]
    while stack:
        item, expanded = stack.pop()
        if isinstance(item, Value):
            out.append(item)
            continue
        if expanded:
            out.append(_NODE)
            continue
        stack.append((item, True))
        for v in reversed(item.operands):
            producer = v.defining_op
            if (
                producer is not None
                and producer is not root
                and producer.name == root.name
                and (_inner_node(producer, root.name))
            ):
                stack.append((producer, False))
            else:
                stack.append((v, False))
    return out


class _Leaf:
    """A leaf to create: a folded constant, or `value * count` for a repeated summand."""

    def __init__(self, type, array=None, value=None, count=0) -> None:
        self.type = type
        self.array = array
        self.value = value
        self.count = count


def _canonical_leaves(root: Operation, leaves: list[Value]) -> list | None:
    constants = [v for v in leaves if constant_array(v) is not None]
    others = [v for v in leaves if constant_array(v) is None]
    items: list = []
    counts = Counter(others)
    if root.name == "atomic.add" and root.results[0].type.element_type != "i1":
        for v in dict.fromkeys(others):
            items.append(v if counts[v] == 1 else _Leaf(v.type, value=v, count=counts[v]))
    elif root.name in ("atomic.max", "atomic.min"):
        items += list(dict.fromkeys(others))
    else:
        items += others
    folded = _fold_constants(root, constants)
    items += constants if folded is None else [folded]
    return items


def _fold_constants(root: Operation, constants: list[Value]):
    if len(constants) < 2:
        return None
    arrays = [constant_array(v) for v in constants]
    acc, acc_type = arrays[0], constants[0].type
    for v, array in zip(constants[1:], arrays[1:]):
        acc_type = acc_type.with_shape(broadcast_shapes(acc_type.shape, v.type.shape))
        probe = type(root)([Value(acc_type), Value(v.type)], [])
        out = run_reference(probe, [acc, array], [acc_type.dtype])
        if out is None:
            return None
        acc = np.broadcast_to(out[0], acc_type.shape)
    if not worth_folding(acc, arrays):
        return None
    return _Leaf(acc_type, array=acc)


def _leaf_key(item) -> tuple:
    """Biggest shapes first; inside a shape, `value_key` order (constants last)."""
    t = item.type
    if isinstance(item, _Leaf):
        rank = (2, "") if item.array is not None else (1, "~scaled", 0, value_key(item.value))
    else:
        rank = value_key(item)
    return (-t.num_elements, t.shape, rank)


def _shape_postfix(items: list) -> list:
    """Group leaves by shape (biggest first), left-deep chains inside a group, constants last
    in each group; groups combined as g1 + (g2 + (g3 + ...))."""

    ordered = sorted(items, key=_leaf_key)
    groups: list[list] = []
    for item in ordered:
        if groups and groups[-1][0].type.shape == item.type.shape:
            groups[-1].append(item)
        else:
            groups.append([item])
    out: list = []
    for group in groups:
        out.append(group[0])
        for item in group[1:]:
            out += [item, _NODE]
    out += [_NODE] * (len(groups) - 1)
    return out


def _materialize(root: Operation, target: list, rewriter: PatternRewriter) -> Value:
    b = rewriter.builder_before(root)
    stack: list[Value] = []
    for entry in target:
        if entry is _NODE:
            rhs = stack.pop()
            lhs = stack.pop()
            stack.append(b.create(root.name, [lhs, rhs]).results[0])
        elif isinstance(entry, _Leaf) and entry.array is not None:
            stack.append(make_constant(b, entry.array, entry.type))
        elif isinstance(entry, _Leaf):
            k = make_constant(b, np.asarray(entry.count), entry.value.type.with_shape(()))
            stack.append(b.create("atomic.mul", [entry.value, k]).results[0])
        else:
            stack.append(entry)
    (result,) = stack
    return result


# -- broadcasts ------------------------------------------------------------------------------------


class BroadcastLate(RewritePattern):
    """f(broadcast(a), b) -> broadcast(f(a, b)) for elementwise f (or just f(a, b) when numpy
    broadcasting already gives the result's shape)."""

    traits = frozenset({ELEMENTWISE})
    name = "broadcast-late"

    def match_and_rewrite(self, op: Operation, rewriter: PatternRewriter) -> bool:
        if len(op.results) != 1 or op.regions:
            return False
        sources = [_broadcast_source(v) or v for v in op.operands]
        if all(s is v for s, v in zip(sources, op.operands)):
            return False
        result = op.results[0].type
        try:
            shape = broadcast_shapes(*(s.type.shape for s in sources))
        except VerifyError:
            return False
        if shape == result.shape:
            for i, (s, v) in enumerate(zip(sources, op.operands)):
                if s is not v:
                    rewriter.set_operand(op, i, s)
            return True
        small = result.with_shape(shape)
        try:
            new = create(type(op), sources, op.attributes, [small], loc=op.loc)
        except VerifyError:
            return False
        b = rewriter.builder_before(op)
        b.insert(new)
        rewriter.replace_op(op, b.atomic.broadcast(new.results[0], result_type=result))
        return True


def _broadcast_source(v: Value) -> Value | None:
    op = v.defining_op
    if op is None or op.name != "atomic.broadcast":
        return None
    return op.operands[0]


# -- the pass --------------------------------------------------------------------------------------


@cache
def canonicalize_patterns(fast_math: bool = False) -> tuple[RewritePattern, ...]:
    return (
        FoldConstant(),
        *CANONICALIZE_RULES.patterns(fast_math),
        AssociativeChain(),
        SortCommutativeOperands(),
        BroadcastLate(),
    )


@register_pass
@dataclass(frozen=True)
class Canonicalize(Pass):
    """Simplify each function to a canonical form with a greedy worklist (see the module doc).

    Contract: result types never change; float64 results are unchanged up to reassociation
    rounding, and NaN/inf/signed-zero results are kept unless `fast-math`; dead pure ops are
    erased; linear time. Options: `fast-math` (allow rules that change NaN, inf or signed-zero
    results), `max-iterations` (sweeps before giving up; reported), `test-convergence` (make not
    converging an error).
    """

    name = "canonicalize"
    summary = "Fold constants and simplify to a canonical form (greedy, to a fixpoint)"
    fast_math: bool = option(False, "allow rules that change NaN, inf or signed-zero results")
    max_iterations: int = option(10, "sweeps before giving up (reported)")
    test_convergence: bool = option(False, "make not converging an error")

    def __post_init__(self) -> None:
        if self.max_iterations < 1:
            raise PipelineError(
                f"pass 'canonicalize' needs max-iterations >= 1, got {self.max_iterations}"
            )

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        result = apply_patterns_greedily(
            func,
            canonicalize_patterns(self.fast_math),
            self.max_iterations,
            stats,
            pass_name=f"canonicalize on @{func.sym_name}",
        )
        if not result.converged and self.test_convergence:
            raise TgcError(
                f"canonicalize did not converge on @{func.sym_name} within "
                f"{self.max_iterations} iteration(s)",
                func.loc,
            )
