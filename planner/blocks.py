"""Repeated blocks: cut a function into segments, hash them structurally, plan each kind once.

Segments. Walking the live ops in block order, a *cut* follows an op after which exactly one
value is live: a computed value between its definition and its last use, or a function argument
between its first and its last use (ops without operands, the *sources*, do not count: they are
cloned where needed). The segments between cuts form a chain:
segment k reads the cut value of segment k-1, function arguments and its own sources, and
nothing else; so the planner solves each segment as a table (cost of its ops for each placement
of its input and of its output cut value) and chains the tables (`planner.select`). A GPT-2
block is two segments (attention up to the first residual add, then the MLP); nothing about
transformers is known here. A source used by several segments is cloned into each
(`localize_sources`), so that segments share nothing but their cut values.

The structural hash. An op's hash covers its name, its attributes (discardable `dialect.name`
keys excluded), its result types and its operands' hashes, sorted for a commutative op; an
operand is the hash of its defining op and result index, or the type of the argument or segment
input it reads. A segment's hash covers the multiset of its ops' hashes, how each outside value
is shared (the multiset of its use sites), which values leave the segment and how. Value names
and the order of independent ops do not enter it; one op or one attribute more or less, or a
type, changes it. Two segments with equal hashes are planned once (`correspondence` maps one
onto the other, op for op).
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

from tgc.attributes import DenseAttr
from tgc.ir import Block, BlockArgument, Operation, Value
from tgc.opdef import COMMUTATIVE
from tgc.printer import format_attribute


def is_source(op: Operation) -> bool:
    return not op.operands and not op.regions


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


def cuts(ops: list[Operation], no_cut: set[int] = frozenset()) -> list[tuple[int, Value]]:
    """(i, v) for each cut: after ops[i], `v` is the only value live, counting computed values
    (not sources) from their definition and function arguments from their first use, each up
    to its last use. An argument read before and after a cut would be read by two segments, so
    none lies between its first and last use (a weight read once never blocks a cut). No cut
    follows an index in `no_cut` (inside a multi-op option, see `uncuttable`)."""
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
        elif d in position and not is_source(d) and position[d] < i:
            starting.setdefault(position[d], []).append(v)
            dying.setdefault(i, []).append(v)
    live: set[Value] = set()
    out = []
    for i, op in enumerate(ops):
        live.update(starting.get(i, ()))
        live.difference_update(dying.get(i, ()))
        if len(live) == 1 and i < end - 1 and not is_source(op) and i not in no_cut:
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
    with the first segment that reads it."""
    found = cuts(ops, no_cut)
    bounds = [-1, *(i for i, _ in found), len(ops) - 1]
    values = [None, *(v for _, v in found), None]
    segment_of: dict[Operation, int] = {}
    out: list[Segment] = []
    for k in range(len(bounds) - 1):
        lo, hi = bounds[k] + 1, bounds[k + 1]
        inp, outp = values[k], values[k + 1]
        seg = Segment([op for op in ops[lo : hi + 1] if not is_source(op)], inp, outp)
        for op in seg.ops:
            segment_of[op] = k
        out.append(seg)
    users_segment = _first_reader_segment(ops, segment_of, len(out))
    for op in ops:
        if is_source(op):
            out[users_segment[op]].ops.append(op)
    position = {op: i for i, op in enumerate(ops)}
    for seg in out:
        seg.ops.sort(key=position.__getitem__)
    return out


def _first_reader_segment(ops, segment_of, count: int) -> dict[Operation, int]:
    found = {}
    for op in ops:
        if not is_source(op):
            continue
        readers = [segment_of[u] for r in op.results for u, _ in r.uses if u in segment_of]
        found[op] = min(readers) if readers else count - 1
    return found


def localize_sources(block: Block, ops: list[Operation], no_cut: set[int] = frozenset()) -> bool:
    """Clone every source read by several segments into each of them (before its first reader
    there), so that segments share only cut values. Returns whether anything changed."""
    chain = segments(ops, no_cut)
    position = {op: i for i, op in enumerate(ops)}
    segment_of = {op: k for k, seg in enumerate(chain) for op in seg.ops if not is_source(op)}
    changed = False
    for op in [op for op in ops if is_source(op)]:
        by_segment: dict[int, list[tuple[Operation, int]]] = {}
        for r in op.results:
            for user, index in r.uses:
                if user in segment_of:
                    by_segment.setdefault(segment_of[user], []).append((user, index))
        for k in sorted(by_segment)[1:]:
            uses = by_segment[k]
            first = min((u for u, _ in uses), key=position.__getitem__)
            clone = type(op)([], [r.type for r in op.results], dict(op.attributes), loc=op.loc)
            block.insert_before(clone, first)
            for user, index in uses:
                user.set_operand(index, clone.results[op.results.index(user.operands[index])])
            changed = True
    return changed


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


def segment_key(seg: Segment, required: dict[Value, int] | None = None) -> str:
    """The structural hash of a segment (module doc); `required` are the values the terminator
    reads with the placement mask each needs (last segment)."""
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
    text = "|".join(sorted(hashes.values())) + "||" + "|".join(sharing) + "||" + "|".join(leaving)
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
