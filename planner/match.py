"""Where a kernel applies: matching kernels against a function's ops.

An op kernel applies at every op of its name (if its constraints accept the types). A graph
kernel applies where one of its canonical reference graphs (`kernel.canonical_references`)
equals the subgraph of the program that ends at the op, the program being in canonical form
too (`canonicalize,cse`, as `select-kernels` runs it first). The match walks from the value the
reference returns backwards, pairing each reference op with a program op:

- same op name, operand and result counts, no regions; equal attributes (declared defaults
  included, discardable `dialect.name` keys ignored); `atomic.constant`s compared by value
  (same shape, equal values in the narrower of the two element types); an op whose result
  types cannot be inferred (cast, reshape, broadcast, iota) also needs the same result types;
- a commutative op (trait COMMUTATIVE) matches its operands in either order (associative
  chains are already in one canonical shape); alternatives are explored by backtracking;
- a reference op reached twice (DAG sharing, `exp(x)` used twice) binds the same program op,
  and two reference ops never bind one program op; a reference constant read twice may bind
  two program constants of the same value (planning gives each reader its own copy);
- for a kernel with `shape_constants`, a scalar float constant of another value matches where
  both are the same function of a dimension of the bound arguments (`kernel.shape_constant`: a
  mean's divisor, an attention scale), and `x * c` matches `x / d` where c is that function's
  reciprocal (canonicalize writes a division by a power of two as a product);
- each reference argument binds one program value, consistently (several arguments may bind
  the same value); value names and types are ignored: types come from the program, and the
  kernel's `constraints` then accept or refuse them;
- covered ops are in the root's block, and a covered op other than the root has no use outside
  the match (else the kernel would have to recompute it); the root's other results are unused.

Constants are part of the kernel (its reference holds them): a matched program constant is not
covered (other ops may share it, DCE removes it when nothing else does) and is listed in
`Match.constants`.

Matching costs O(reference size) per candidate root (times the commutative alternatives
tried); graph kernels are indexed by their root op's name, so an op no kernel can end at costs
one dict look-up and `find_matches` over a block is linear in the block.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import numpy as np

from tgc.attributes import DenseAttr, attribute_key
from tgc.builtin import FuncOp
from tgc.ir import Block, BlockArgument, Operation, Value
from tgc.opdef import COMMUTATIVE
from tgc.planner.kernel import (
    KERNELS,
    Kernel,
    canonical_references,
    reference_root,
    registry_version,
    shape_constant,
)

# Safety caps on one reference at one root: distinct covers kept, consistent bindings looked at.
MAX_MATCHES_PER_ROOT = 16
MAX_BINDINGS_TRIED = 256


@dataclass(frozen=True, eq=False)
class Match:
    """A kernel applied at `root`: the ops it covers (block order, root last), the program values
    bound to its arguments (in the kernel's argument order), and the values it produces.

    For a graph kernel, `reference` is the canonical alternative that matched and `constants`
    the program constants it read by value (not covered, see the module docstring)."""

    kernel: Kernel
    root: Operation
    ops: tuple[Operation, ...]
    inputs: tuple[Value, ...]
    outputs: tuple[Value, ...]
    constants: tuple[Operation, ...] = ()
    reference: FuncOp | None = None


# Whether a kernel's constraints accept the operand and result types, by (kernel, operand types,
# result types): a constraint is a function of the types alone (planner/kernel.py), and a model's
# layers ask the same question at every layer (twelve equal linears, one answer). Types are
# interned, so the key hashes at C speed. Kept while it stays small: generated kernels are made
# per region, and the table must not hold every kernel a long process made.
_ACCEPTED: dict[tuple, bool] = {}
_ACCEPTED_LIMIT = 100_000


def accepts(kernel: Kernel, operand_types, result_types) -> bool:
    """Whether `kernel`'s constraints accept these types (asked once per distinct question)."""
    key = (kernel, tuple(operand_types), tuple(result_types))
    found = _ACCEPTED.get(key)
    if found is None:
        if len(_ACCEPTED) >= _ACCEPTED_LIMIT:
            _ACCEPTED.clear()
        found = _ACCEPTED[key] = kernel.constraints((list(key[1]), list(key[2]))) is None
    return found


# -- the index: op kernels by op name, graph-kernel references by root op name -----------------


@dataclass
class _Index:
    version: int = -1
    op_kernels: dict[str, list[Kernel]] = field(default_factory=dict)
    roots: dict[str, list[tuple[Kernel, FuncOp]]] = field(default_factory=dict)


_INDEX = _Index()


def _index() -> _Index:
    """The index of the registry as it is now (rebuilt after a kernel is added or removed)."""
    global _INDEX
    if _INDEX.version != registry_version():
        _INDEX = _indexed(KERNELS.values(), registry_version())
    return _INDEX


def _indexed(kernels, version: int) -> _Index:
    index = _Index(version)
    for k in kernels:
        if k.op is not None:
            index.op_kernels.setdefault(k.op, []).append(k)
            continue
        for ref in canonical_references(k):
            index.roots.setdefault(reference_root(ref).name, []).append((k, ref))
    return index


# The index of the last few kernel lists passed in (a planner passes one list for every op):
# id of the list -> (its kernels when indexed, the index).
_LIST_INDEXES: dict[int, tuple[tuple[Kernel, ...], _Index]] = {}


def _list_index(kernels: list[Kernel]) -> _Index:
    """The index of a list of kernels, kept while the list holds the same kernels (compared
    at C speed) and the registry the same reference graphs."""
    snapshot = tuple(kernels)
    found = _LIST_INDEXES.get(id(kernels))
    version = registry_version()
    if (
        found is None
        or found[1].version != version
        or len(found[0]) != len(snapshot)
        or not all(map(operator.is_, found[0], snapshot))
    ):
        if len(_LIST_INDEXES) >= 8:
            _LIST_INDEXES.clear()
        found = _LIST_INDEXES[id(kernels)] = (snapshot, _indexed(snapshot, version))
    return found[1]


def _candidates(op: Operation, kernels: list[Kernel] | None):
    """(op kernels named like `op`, graph-kernel references whose root is named like `op`)."""
    index = _index() if kernels is None else _list_index(kernels)
    return index.op_kernels.get(op.name, ()), index.roots.get(op.name, ())


# -- the API --------------------------------------------------------------------------------------


def matches_at(
    op: Operation,
    kernels: list[Kernel] | None = None,
    positions: dict[Operation, int] | None = None,
) -> list[Match]:
    """Every match of a registered kernel (or of `kernels`) whose root is `op`.

    `positions` (op -> index in its block) orders a match's ops without walking the block;
    `find_matches` passes it."""
    op_kernels, refs = _candidates(op, kernels)
    out = []
    if op_kernels:
        ins = tuple(v.type for v in op.operands)
        outs = tuple(r.type for r in op.results)
    for k in op_kernels:
        if accepts(k, ins, outs):
            out.append(Match(k, op, (op,), tuple(op.operands), tuple(op.results)))
    for k, ref in refs:
        out += _graph_matches(k, ref, op, positions)
    return out


def find_matches(block: Block, kernels: list[Kernel] | None = None) -> dict[Operation, list[Match]]:
    """Every op of `block` (in order) mapped to the matches rooted at it (possibly none)."""
    ops = list(block.ops)
    positions = {op: i for i, op in enumerate(ops)}
    return {op: matches_at(op, kernels, positions) for op in ops}


# -- graph kernels ----------------------------------------------------------------------------


def _graph_matches(
    kernel: Kernel, ref: FuncOp, root: Operation, positions: dict[Operation, int] | None
) -> list[Match]:
    returned = ref.body.last.operands[0]
    if returned.index >= len(root.results):
        return []
    if any(r.uses for i, r in enumerate(root.results) if i != returned.index):
        return []
    output = root.results[returned.index]
    matcher = _Matcher(root.block, kernel.shape_constants)
    found: dict[frozenset, Match] = {}
    for tried, _ in enumerate(matcher.value(returned, output)):
        if tried >= MAX_BINDINGS_TRIED:
            break
        match = _accept(kernel, ref, root, output, matcher, positions)
        if match is None:
            continue
        # Bindings that cover the same ops compute the same value (they differ by commutative
        # swaps, `b*c` against `c*b`): one option for the planner, the first one is kept.
        found.setdefault(frozenset(map(id, match.ops)), match)
        if len(found) >= MAX_MATCHES_PER_ROOT:
            break
    return list(found.values())


def _accept(kernel, ref, root, output, matcher, positions) -> Match | None:
    """The match for the current binding, or None when a covered op is used outside it or the
    kernel's constraints refuse the bound types."""
    covered, constants = [], []
    for r_op, p_op in matcher.ops.items():
        if p_op.name == "atomic.constant":
            constants.append(p_op)
            continue
        if p_op is not root and _use_count(p_op) != _use_count(r_op):
            return None  # a result of p_op is used outside the match
        covered.append(p_op)
    constants += matcher.copies
    inputs = tuple(matcher.args[a] for a in ref.body.args)
    arg_types = [v.type for v in inputs]
    for r_op, p_op, reciprocal in matcher.shaped:
        value = shape_constant(ref, r_op, arg_types)
        if value is None or not _scalar_equals(p_op, 1.0 / value if reciprocal else value):
            return None
    if not accepts(kernel, arg_types, (output.type,)):
        return None
    ops = _in_block_order(covered, root, positions)
    return Match(kernel, root, ops, inputs, (output,), tuple(constants), ref)


def _use_count(op: Operation) -> int:
    return sum(len(r.uses) for r in op.results)


def _in_block_order(covered: list[Operation], root: Operation, positions) -> tuple:
    if positions is not None:
        return tuple(sorted(covered, key=positions.__getitem__))
    # Covered ops all precede the root in its block: walk back until every one was seen.
    wanted, out, op = set(covered), [], root
    while op is not None and len(out) < len(wanted):
        if op in wanted:
            out.append(op)
        op = op.prev
    return tuple(reversed(out))


class _Matcher:
    """The binding of one reference graph to the program, extended and undone by generators:
    each `yield` is one consistent binding; resuming undoes the last step and tries the next."""

    def __init__(self, block: Block, shape_constants: bool = False) -> None:
        self.block = block
        self.shape_constants = shape_constants  # the kernel's (kernel.Kernel)
        self.ops: dict[Operation, Operation] = {}  # reference op -> program op
        self.used: set[Operation] = set()  # program ops bound so far
        self.args: dict[Value, Value] = {}  # reference argument -> program value
        # reference constants bound to program constants of another value, which must be the
        # same function of a dimension (kernel.shape_constant) once the arguments are bound, or
        # its reciprocal (a product matched against a division)
        self.shaped: list[tuple[Operation, Operation, bool]] = []
        self.copies: list[Operation] = []  # program constants bound as copies of a bound one

    def value(self, rv: Value, pv: Value) -> Iterator[None]:
        if isinstance(rv, BlockArgument):
            yield from self._argument(rv, pv)
            return
        r_op, p_op = rv.defining_op, pv.defining_op
        if p_op is None or pv.index != rv.index:
            return
        bound = self.ops.get(r_op)
        if bound is not None:
            if bound is p_op:
                yield
            else:
                yield from self._copy_of_constant(bound, p_op)
            return
        if p_op in self.used:
            return
        if not _same_op(r_op, p_op):
            if not self.shape_constants:
                return
            if _maybe_shape_constant(r_op, p_op):
                yield from self._shaped(r_op, p_op, reciprocal=False)
            elif _scaling_pair(r_op, p_op):
                yield from self._scaling(r_op, p_op)
            return
        if p_op.block is not self.block and p_op.name != "atomic.constant":
            return
        with self._binding(r_op, p_op):
            yield from self._operands(r_op, p_op)

    @contextmanager
    def _binding(self, r_op: Operation | None, p_op: Operation):
        """Reference op `r_op` bound to program op `p_op` while the body runs (None: `p_op`
        only taken, as a copy of a constant bound already)."""
        if r_op is not None:
            self.ops[r_op] = p_op
        self.used.add(p_op)
        try:
            yield
        finally:
            if r_op is not None:
                del self.ops[r_op]
            self.used.discard(p_op)

    def _shaped(self, r_op: Operation, p_op: Operation, reciprocal: bool) -> Iterator[None]:
        """Bind reference constant `r_op` to program constant `p_op` of another value, to be
        checked once the arguments are bound (`_accept`): the program's must be the same
        function of a dimension (its reciprocal with `reciprocal`)."""
        bound = self.ops.get(r_op)
        if bound is not None:  # a constant read twice (a mean's divisor, by both means)
            if (r_op, bound, reciprocal) in self.shaped:
                if bound is p_op:
                    yield
                else:
                    yield from self._copy_of_constant(bound, p_op)
            return
        if p_op in self.used:
            return
        self.shaped.append((r_op, p_op, reciprocal))
        with self._binding(r_op, p_op):
            yield
        self.shaped.pop()

    def _copy_of_constant(self, bound: Operation, p_op: Operation) -> Iterator[None]:
        """A reference constant read twice, bound already to program constant `bound`, against
        another program constant `p_op` of the same value: planning gives each reader its own
        copy of a constant (blocks.localize_sources), where the reference shares one."""
        if bound.name != "atomic.constant" or p_op.name != "atomic.constant":
            return
        if p_op in self.used or not _same_constant(bound.attr("value"), p_op.attr("value")):
            return
        self.copies.append(p_op)
        with self._binding(None, p_op):
            yield
        self.copies.pop()

    def _scaling(self, r_op: Operation, p_op: Operation) -> Iterator[None]:
        """`x * c` against `x / d` (or the other way round): canonicalize writes a division by
        a power of two as a product with its exact reciprocal, so a mean's divisor written at 8
        wide is `* 0.125` where a 768-wide program has `/ 768`."""
        r_x, r_c = _scaled_operands(r_op)
        p_x, p_c = _scaled_operands(p_op)
        with self._binding(r_op, p_op):
            for _ in self.value(r_x, p_x):
                yield from self._shaped(r_c.defining_op, p_c.defining_op, reciprocal=True)

    def _argument(self, rv: Value, pv: Value) -> Iterator[None]:
        bound = self.args.get(rv)
        if bound is None:
            self.args[rv] = pv
            yield
            del self.args[rv]
        elif bound is pv:
            yield

    def _operands(self, r_op: Operation, p_op: Operation) -> Iterator[None]:
        yield from self._sequence(r_op.operands, p_op.operands, 0)
        a, b = p_op.operands[:2] if len(p_op.operands) == 2 else (None, None)
        if COMMUTATIVE in r_op.traits and a is not None and a is not b:
            yield from self._sequence(r_op.operands, [b, a], 0)

    def _sequence(self, rs: list[Value], ps: list[Value], i: int) -> Iterator[None]:
        if i == len(rs):
            yield
            return
        for _ in self.value(rs[i], ps[i]):
            yield from self._sequence(rs, ps, i + 1)


def _same_op(r: Operation, p: Operation) -> bool:
    if r.name != p.name or r.regions or p.regions:
        return False
    if len(r.operands) != len(p.operands) or len(r.results) != len(p.results):
        return False
    if r.name == "atomic.constant":
        return _same_constant(r.attr("value"), p.attr("value"))
    keys = set(r.attr_defs) | set(r.attributes) | set(p.attributes)
    if not all(_same_attr(r.attr(k), p.attr(k)) for k in keys if "." not in k):
        return False
    return not _pinned(r) or [v.type for v in r.results] == [v.type for v in p.results]


_PINNED: dict[Operation, bool] = {}


def _pinned(ref_op: Operation) -> bool:
    """Whether a reference op's result types are part of its meaning: an op that cannot infer
    them from its operands and attributes (cast, reshape, broadcast, iota) matches only a
    program op with the very same result types (cached: reference ops live as long as their
    kernel)."""
    pinned = _PINNED.get(ref_op)
    if pinned is None:
        pinned = _PINNED[ref_op] = ref_op.infer() is None
    return pinned


def _same_attr(x, y) -> bool:
    numbers = (int, float)
    if isinstance(x, numbers) and isinstance(y, numbers):
        if isinstance(x, bool) or isinstance(y, bool):
            return x is y
        return x == y or (math.isnan(x) and math.isnan(y))  # NaN equals NaN here
    return attribute_key(x) == attribute_key(y)


def _same_constant(x: DenseAttr, y: DenseAttr) -> bool:
    """Equal shapes and values; floats of two widths compare in the narrower one (a reference
    written in f32 matches the same constant in an f16 or f64 program)."""
    a, b = x.array, y.array
    if a.shape != b.shape:
        return False
    if a.dtype == b.dtype:
        return x == y or bool(np.array_equal(a, b, equal_nan=a.dtype.kind == "f"))
    if _is_float(a.dtype) and _is_float(b.dtype):
        narrow = a.dtype if a.dtype.itemsize <= b.dtype.itemsize else b.dtype
        with np.errstate(over="ignore"):
            return bool(np.array_equal(a.astype(narrow), b.astype(narrow), equal_nan=True))
    return bool(np.array_equal(a.astype(np.float64), b.astype(np.float64)))


def _maybe_shape_constant(r: Operation, p: Operation) -> bool:
    """Two scalar float constants of different values: the reference's may be a function of a
    dimension (checked in `_accept`)."""
    if r.name != "atomic.constant" or p.name != "atomic.constant":
        return False
    a, b = r.attr("value").array, p.attr("value").array
    return a.size == 1 and b.size == 1 and a.shape == b.shape and _is_float(a.dtype)


def _scaled_operands(op: Operation) -> tuple[Value, Value] | tuple[None, None]:
    """(x, c) of `x * c`, `c * x` or `x / c` with c a scalar float constant; (None, None) else."""
    if op.name not in ("atomic.mul", "atomic.div") or len(op.operands) != 2:
        return None, None
    orders = [(0, 1), (1, 0)] if op.name == "atomic.mul" else [(0, 1)]
    for i, j in orders:
        c = op.operands[j].defining_op
        if c is not None and c.name == "atomic.constant":
            array = c.attr("value").array
            if array.size == 1 and _is_float(array.dtype):
                return op.operands[i], op.operands[j]
    return None, None


def _scaling_pair(r: Operation, p: Operation) -> bool:
    """A product by a scalar constant against a division by one (either way round)."""
    if {r.name, p.name} != {"atomic.mul", "atomic.div"}:
        return False
    if r.results[0].type.shape != r.results[0].type.shape:
        return False
    return _scaled_operands(r)[0] is not None and _scaled_operands(p)[0] is not None


def _scalar_equals(const: Operation, value: float) -> bool:
    """The program constant holds `value`, in its own element type."""
    array = const.attr("value").array
    want = np.asarray(value, dtype=np.float64).astype(array.dtype).astype(np.float64)
    return bool(array.reshape(-1)[0].astype(np.float64) == want)


def _is_float(dtype: np.dtype) -> bool:
    """numpy's floats and ml_dtypes' bfloat16 (whose numpy kind is "V", not "f")."""
    return dtype.kind == "f" or dtype.name == "bfloat16"
