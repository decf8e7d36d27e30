"""Repeated blocks: cut a function into segments, hash them structurally, plan each kind once.

Segments. Walking the live ops in block order, a *cut* follows an op after which exactly one
value is live: a computed value between its definition and its last use, or a function argument
between its first and its last use. Values computed from constants alone (splats, iota, a
causal mask: the *sources*) do not count: each segment gets its own copy of those it reads. The
segments between cuts form a chain:
segment k reads the cut value of segment k-1, function arguments and its own sources, and
nothing else; so the planner solves each segment as a table (cost of its ops for each placement
of its input and of its output cut value) and chains the tables (`planner.select`). A GPT-2
block is two segments (attention up to the first residual add, then the MLP); nothing about
transformers is known here. Cloning the sources (`localize_sources`) leaves segments sharing
nothing but their cut values.

The structural hash. An op's hash covers its name, its attributes (discardable `dialect.name`
keys excluded), its result types and its operands' hashes, sorted for a commutative op; an
operand is the hash of its defining op and result index, or the type of the argument or segment
input it reads. A segment's hash covers the multiset of its ops' hashes, how each outside value
is shared (the multiset of its use sites), which values leave the segment and how. Value names
and the order of independent ops do not enter it; one op or one attribute more or less, or a
type, changes it. The planner adds each op's options (kernel, covered ops, inputs, named
structurally), so that two segments with equal hashes have corresponding options and are
planned once (`correspondence` maps one onto the other, op for op).
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from dataclasses import dataclass, field

from tgc.attributes import DenseAttr
from tgc.ir import Block, BlockArgument, Operation, Value
from tgc.opdef import COMMUTATIVE
from tgc.printer import format_attribute


def source_ops(ops: list[Operation]) -> set[Operation]:
    """The *sources*: ops computed from constants alone (no operands, or operands all made by
    sources: a splat, an iota, the causal mask `iota <= iota`). They depend on no input, so a
    segment may have its own copy of them."""
    found: set[Operation] = set()
    for op in ops:
        if not op.regions and all(v.defining_op in found for v in op.operands):
            found.add(op)
    return found


@dataclass(eq=False)
class Segment:
    """Ops of one segment (block order), the cut value it reads (None for the first) and the
    cut value it produces (None for the last, which feeds the terminator)."""

    ops: list[Operation]
    input: Value | None
    output: Value | None
    key: str = ""
    op_hash: dict[Operation, str] = field(default_factory=dict)


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def cuts(
    ops: list[Operation], no_cut: set[int] = frozenset(), sources: set | None = None
) -> list[tuple[int, Value]]:
    """(i, v) for each cut: after ops[i], `v` is the only value live, counting computed values
    (not sources) from their definition and function arguments from their first use, each up
    to its last use. An argument read before and after a cut would be read by two segments, so
    none lies between its first and last use (a weight read once never blocks a cut). No cut
    follows an index in `no_cut` (inside a multi-op option, see `uncuttable`)."""
    sources = source_ops(ops) if sources is None else sources
    position = {op: i for i, op in enumerate(ops)}
    end = len(ops)
    first_use: dict[Value, int] = {}
    last_use: dict[Value, int] = {}
    for i, op in enumerate(ops):
        for v in op.operands:
            first_use.setdefault(v, i)
            last_use[v] = i
    if ops:
        for v in ops[-1].block.last.operands:
            first_use.setdefault(v, end)
            last_use[v] = end
    starting: dict[int, list[Value]] = {}
    dying: dict[int, list[Value]] = {}
    for v, i in last_use.items():
        d = v.defining_op
        if d is None:
            if first_use[v] < i:
                starting.setdefault(first_use[v], []).append(v)
                dying.setdefault(i, []).append(v)
        elif d in position and d not in sources and position[d] < i:
            starting.setdefault(position[d], []).append(v)
            dying.setdefault(i, []).append(v)
    live: set[Value] = set()
    out = []
    for i, op in enumerate(ops):
        live.update(starting.get(i, ()))
        live.difference_update(dying.get(i, ()))
        if len(live) == 1 and i < end - 1 and op not in sources and i not in no_cut:
            (v,) = live
            if v.defining_op is not None:
                out.append((i, v))
    return out


def uncuttable(ops: list[Operation], spans: list[tuple[Operation, ...]]) -> set[int]:
    """Indices after which no cut may fall: inside the ops of a multi-op option (`spans`, each
    in block order), which one segment must hold whole."""
    position = {op: i for i, op in enumerate(ops)}
    starts = [0] * (len(ops) + 1)
    for span in spans:
        if len(span) > 1:
            starts[position[span[0]]] += 1
            starts[position[span[-1]]] -= 1
    out, depth = set(), 0
    for i in range(len(ops)):
        depth += starts[i]
        if depth:
            out.add(i)
    return out


def segments(ops: list[Operation], no_cut: set[int] = frozenset()) -> list[Segment]:
    """The chain of segments of `ops` (the live ops of a block, block order); each source goes
    with the first segment that reads it (directly or through other sources)."""
    sources = source_ops(ops)
    found = cuts(ops, no_cut, sources)
    bounds = [-1, *(i for i, _ in found), len(ops) - 1]
    values = [None, *(v for _, v in found), None]
    out: list[Segment] = []
    for k in range(len(bounds) - 1):
        lo, hi = bounds[k] + 1, bounds[k + 1]
        seg = Segment(
            [op for op in ops[lo : hi + 1] if op not in sources], values[k], values[k + 1]
        )
        out.append(seg)
    owner = source_owners(ops, out, sources)
    for op in ops:
        if op in sources:
            out[min(owner[op])].ops.append(op)
    position = {op: i for i, op in enumerate(ops)}
    for seg in out:
        seg.ops.sort(key=position.__getitem__)
    return out


def source_owners(ops: list[Operation], chain: list[Segment], sources: set) -> dict:
    """For each source op, the segments that read it, directly or through other sources (the
    last segment for a source only the terminator reads)."""
    segment_of = {op: k for k, seg in enumerate(chain) for op in seg.ops if op not in sources}
    owners: dict[Operation, set[int]] = {}
    for op in reversed(ops):
        if op not in sources:
            continue
        readers: set[int] = set()
        for r in op.results:
            for user, _ in r.uses:
                if user in segment_of:
                    readers.add(segment_of[user])
                elif user in owners:
                    readers |= owners[user]
        owners[op] = readers or {len(chain) - 1}
    return owners


def localize_sources(block: Block, ops: list[Operation], no_cut: set[int] = frozenset()) -> bool:
    """Give every segment that reads a source (and the sources it is made of) its own copy,
    placed before its first reader there, so that segments share only cut values. Returns
    whether anything changed."""
    sources = source_ops(ops)
    chain = segments(ops, no_cut)
    owners = source_owners(ops, chain, sources)
    changed = False
    for k, seg in enumerate(chain):
        clones: dict[Operation, Operation] = {}
        for user in [op for op in seg.ops if op not in sources]:
            for i, v in enumerate(user.operands):
                d = v.defining_op
                if d in sources and min(owners[d]) != k:
                    local = _local_copy(d, user, k, owners, clones)
                    user.set_operand(i, local.results[v.index])
                    changed = True
    return changed


def _local_copy(op: Operation, before: Operation, k: int, owners: dict, clones: dict):
    """Segment k's copy of the source `op` (the op itself when k owns it), made of segment k's
    copies of its operands, inserted before `before`."""
    if min(owners[op]) == k:
        return op
    if op not in clones:
        operands = [
            _local_copy(v.defining_op, before, k, owners, clones).results[v.index]
            for v in op.operands
        ]
        types = [r.type for r in op.results]
        clone = type(op)(operands, types, dict(op.attributes), loc=op.loc)
        before.block.insert_before(clone, before)
        clones[op] = clone
    return clones[op]


# -- the structural hash --------------------------------------------------------------------------


def _attribute_text(value) -> str:
    if isinstance(value, DenseAttr):
        return f"dense:{value.type}:{hashlib.blake2b(value._key[1], digest_size=8).hexdigest()}"
    return format_attribute(value)


def op_hashes(ops: list[Operation], inputs: dict[Value, str] | None = None) -> dict:
    """The structural hash of each op (see the module doc); `inputs` names outside values that
    are not function arguments (a segment's input: their type and role)."""
    inputs = inputs or {}
    hashes: dict[Operation, str] = {}
    members = set(ops)

    def operand(v: Value) -> str:
        d = v.defining_op
        if d is not None and d in members:
            return f"{hashes[d]}#{v.index}"
        if v in inputs:
            return inputs[v]
        if isinstance(v, BlockArgument):
            return f"arg:{v.type}"
        return f"outside:{v.type}"

    for op in ops:
        refs = [operand(v) for v in op.operands]
        if COMMUTATIVE in op.traits:
            refs.sort()
        attrs = ",".join(
            f"{k}={_attribute_text(v)}" for k, v in sorted(op.attributes.items()) if "." not in k
        )
        results = ",".join(str(r.type) for r in op.results)
        hashes[op] = _digest(f"{op.name}({';'.join(refs)}){{{attrs}}}->{results}")
    return hashes


def segment_key(
    seg: Segment, required: dict[Value, int] | None = None, describe: Callable | None = None
) -> str:
    """The structural hash of a segment (module doc); `required` are the values the terminator
    reads with the placement mask each needs (last segment). `describe(op, ref)` adds what else
    must agree between equal segments (the planner: each op's options, `ref` naming values
    structurally)."""
    inputs = {seg.input: f"input:{seg.input.type}"} if seg.input is not None else {}
    hashes = op_hashes(seg.ops, inputs)
    seg.op_hash = hashes
    members = set(seg.ops)
    sites: dict[Value, list[str]] = {}
    for op in seg.ops:
        for i, v in enumerate(op.operands):
            d = v.defining_op
            if d is None or d not in members:
                site = f"{hashes[op]}@{'c' if COMMUTATIVE in op.traits else i}"
                sites.setdefault(v, []).append(site)
    sharing = sorted(
        f"{inputs.get(v) or f'arg:{v.type}'}<-" + "|".join(sorted(s)) for v, s in sites.items()
    )
    leaving = []
    if seg.output is not None:
        leaving.append(f"out:{_value_ref(seg.output, hashes, inputs)}")
    for v, mask in sorted(
        (required or {}).items(), key=lambda item: _value_ref(item[0], hashes, inputs)
    ):
        leaving.append(f"ret:{_value_ref(v, hashes, inputs)}:{mask}")
    ops = sorted(hashes.values())
    if describe is not None:
        ops = sorted(
            f"{hashes[op]}{{{describe(op, lambda v: _value_ref(v, hashes, inputs))}}}"
            for op in seg.ops
        )
    text = "|".join(ops) + "||" + "|".join(sharing) + "||" + "|".join(leaving)
    seg.key = _digest(text)
    return seg.key


def _value_ref(v: Value, hashes: dict, inputs: dict) -> str:
    d = v.defining_op
    if d is not None and d in hashes:
        return f"{hashes[d]}#{v.index}"
    return inputs.get(v) or f"arg:{v.type}"


def block_hash(ops: list[Operation]) -> str:
    """The structural hash of a list of ops taken as one subgraph (outside values by type)."""
    seg = Segment(list(ops), None, None)
    return segment_key(seg)


def correspondence(a: Segment, b: Segment) -> dict[Operation, Operation]:
    """Map each op of `a` to the op of `b` with the same structural hash (segments with equal
    keys; ops with equal hashes, which CSE would have merged, pair up in block order)."""
    by_hash: dict[str, list[Operation]] = {}
    for op in b.ops:
        by_hash.setdefault(b.op_hash[op], []).append(op)
    out = {}
    taken: dict[str, int] = {}
    for op in a.ops:
        h = a.op_hash[op]
        i = taken.get(h, 0)
        out[op] = by_hash[h][i]
        taken[h] = i + 1
    return out
