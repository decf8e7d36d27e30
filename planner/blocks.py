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

Copies. Cheaper than the hash, and first: `copy_map` pairs a segment with an earlier one that
it copies op for op, in the same order (flat lists of op classes, attributes, result types and
wiring compared at C speed); the planner then neither matches nor hashes nor solves it. Cuts
are counted in bulk (`cuts`: flat lists, live counts by numpy).
"""

from __future__ import annotations

import hashlib
import itertools
from bisect import bisect_left
from collections.abc import Callable
from dataclasses import dataclass, field
from operator import attrgetter

import numpy as np

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
        if op.regions:
            continue
        for v in op.operands:
            if v.defining_op not in found:
                break
        else:
            found.add(op)
    return found


@dataclass(eq=False)
class Segment:
    """Ops of one segment (block order: `core`, its ops that are not sources, and the sources
    it owns), the cut value it reads (None for the first) and the cut value it produces (None
    for the last, which feeds the terminator)."""

    ops: list[Operation]
    input: Value | None
    output: Value | None
    key: str = ""
    op_hash: dict[Operation, str] = field(default_factory=dict)
    core: list[Operation] = field(default_factory=list)
    layout: _Layout | None = None  # see `copy_map`


def _digest(text: str) -> str:
    return hashlib.blake2b(text.encode(), digest_size=8).hexdigest()


def cuts(
    ops: list[Operation], no_cut: set[int] = frozenset(), sources: set | None = None
) -> list[tuple[int, Value]]:
    """(i, v) for each cut: after ops[i], `v` is the only value live, counting computed values
    (not sources) from their definition and function arguments from their first use, each up
    to its last use. An argument read before and after a cut would be read by two segments, so
    none lies between its first and last use (a weight read once never blocks a cut). No cut
    follows an index in `no_cut` (inside a multi-op option, see `uncuttable`). `ops` are the
    live ops of a block, in order.

    Counted in bulk (flat lists built by `map`, the live counts by numpy): every pass is a
    C loop, so cutting costs a fraction of a microsecond an op."""
    sources = source_ops(ops) if sources is None else sources
    end = len(ops)
    if not end:
        return []
    operand_lists = list(map(_OPERANDS, ops))
    operands = list(itertools.chain.from_iterable(operand_lists))
    readers = _positions(operand_lists)
    last_use = dict(zip(operands, readers))  # the last reader wins
    first_use = dict(zip(reversed(operands), reversed(readers)))
    for v in ops[-1].block.last.operands:
        last_use[v] = end
        first_use.setdefault(v, end)
    result_lists = list(map(_RESULTS, ops))
    start = dict(zip(itertools.chain.from_iterable(result_lists), _positions(result_lists)))
    for op in sources:
        start.update(dict.fromkeys(op.results, end))  # a source's values never count
    values = list(last_use)
    # A computed value is live from its op, an argument from its first use.
    starts = np.fromiter(map(start.get, values, map(first_use.__getitem__, values)), np.int64)
    lasts = np.fromiter(last_use.values(), np.int64, len(values))
    counted = starts < lasts
    starts, lasts = starts[counted], lasts[counted]
    born = np.bincount(starts, minlength=end + 1)
    live = np.cumsum(born - np.bincount(lasts, minlength=end + 1))  # live after op i
    out = []
    for i in np.flatnonzero(live[: end - 1] == 1).tolist():
        op = ops[i]
        if i in no_cut or op in sources:
            continue
        v = _live_at(i, op, values, counted, starts, lasts, start, last_use)
        if v.defining_op is not None:
            out.append((i, v))
    return out


def _positions(lists: list[list]) -> list[int]:
    """For each element of the lists flattened, the index of its list."""
    lengths = np.fromiter(map(len, lists), np.int64, len(lists))
    return np.repeat(np.arange(len(lists)), lengths).tolist()


def _live_at(i: int, op: Operation, values, counted, starts, lasts, start, last_use) -> Value:
    """The one value live after op i: mostly a result of op i itself."""
    for r in op.results:
        if start.get(r) == i and last_use.get(r, i) > i:
            return r
    k = np.flatnonzero((starts <= i) & (lasts > i))[0]
    return list(itertools.compress(values, counted.tolist()))[k]


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


def segments(
    ops: list[Operation], no_cut: set[int] = frozenset(), sources: set | None = None
) -> list[Segment]:
    """The chain of segments of `ops` (the live ops of a block, block order); each source goes
    with the first segment that reads it (directly or through other sources)."""
    return split(ops, no_cut, sources)[0]


def split(
    ops: list[Operation], no_cut: set[int] = frozenset(), sources: set | None = None
) -> tuple[list[Segment], dict]:
    """`segments` and `source_owners` of `ops`."""
    sources = source_ops(ops) if sources is None else sources
    found = cuts(ops, no_cut, sources)
    values = [None, *(v for _, v in found), None]
    out: list[Segment] = []
    lo = 0
    for k, hi in enumerate([*(i for i, _ in found), len(ops) - 1]):
        core = [op for op in ops[lo : hi + 1] if op not in sources]
        out.append(Segment(list(core), values[k], values[k + 1], core=core))
        lo = hi + 1
    owners = source_owners(ops, out, sources) if sources else {}
    if owners:
        got = set()
        for op in ops:
            if op in sources:
                k = min(owners[op])
                out[k].ops.append(op)
                got.add(k)
        position = dict(zip(ops, range(len(ops))))
        for k in got:
            out[k].ops.sort(key=position.__getitem__)
    return out, owners


def _ends(chain: list[Segment], position: dict, count: int) -> list[int]:
    """The position of each segment's last op: a segment is a run of ops in block order, so an
    op's segment is `bisect_left(ends, its position)`."""
    return [position[seg.core[-1]] for seg in chain[:-1]] + [count - 1]


def source_owners(ops: list[Operation], chain: list[Segment], sources: set) -> dict:
    """For each source op, the segments that read it, directly or through other sources (the
    last segment for a source only the terminator reads)."""
    position = dict(zip(ops, range(len(ops))))
    ends = _ends(chain, position, len(ops))
    owners: dict[Operation, set[int]] = {}
    for op in reversed(ops):
        if op not in sources:
            continue
        readers: set[int] = set()
        for r in op.results:
            for user, _ in r.uses:
                if user in sources:
                    readers |= owners.get(user, set())
                else:
                    p = position.get(user)
                    if p is not None:
                        readers.add(bisect_left(ends, p))
        owners[op] = readers or {len(chain) - 1}
    return owners


def localize_sources(block: Block, ops: list[Operation], no_cut: set[int] = frozenset()) -> bool:
    """Give every segment that reads a source (and the sources it is made of) its own copy,
    placed before its first reader there, so that segments share only cut values. Returns
    whether anything changed."""
    sources = source_ops(ops)
    chain, owners = split(ops, no_cut, sources)
    return localize(chain, ops, sources, owners)


def localize(
    chain: list[Segment],
    ops: list[Operation],
    sources: set,
    owners: dict,
    origin: dict | None = None,
) -> bool:
    """`localize_sources` on the segments `chain` of `ops` (with `owners`, see `split`), in
    place: each segment's `ops` then hold its copies of the sources it reads (in block order),
    and `sources` the copies too; `origin` (if given) maps each copy to the source it copies.
    Returns whether anything changed."""
    if not owners:
        return False
    first = {op: min(k) for op, k in owners.items()}
    position = dict(zip(ops, range(len(ops))))
    ends = _ends(chain, position, len(ops))
    # The reads of a source by ops of a segment that does not own it, found from the sources'
    # uses (few) rather than every op's operands. A source read by a source belongs to the
    # segment of its reader (the reader's copies read copies); a source owned by one segment
    # and read by one owned by another is copied for the latter too.
    reads: dict[int, list[tuple[int, int, Operation]]] = {}
    for d in owners:
        for r in d.results:
            for user, i in r.uses:
                p = position.get(user)
                if p is None:
                    continue
                k = first[user] if user in sources else bisect_left(ends, p)
                if k != first[d]:
                    reads.setdefault(k, []).append((p, i, user))
    for k in sorted(reads):
        seg = chain[k]
        clones: dict[Operation, Operation] = {}
        before: dict[Operation, list[Operation]] = {}
        for _, i, user in sorted(reads[k], key=lambda read: read[:2]):
            v = user.operands[i]
            made: list[Operation] = []
            local = _local_copy(v.defining_op, user, k, first, clones, made)
            user.set_operand(i, local.results[v.index])
            before.setdefault(user, []).extend(made)
        sources.update(clones.values())
        if origin is not None:
            origin.update((clone, op) for op, clone in clones.items())
        new_ops = []
        for op in seg.ops:
            new_ops += before.get(op, ())
            new_ops.append(op)
        seg.ops = new_ops
    return bool(reads)


def _local_copy(op: Operation, before: Operation, k: int, first: dict, clones: dict, made: list):
    """Segment k's copy of the source `op` (the op itself when k owns it), made of segment k's
    copies of its operands, inserted before `before` (`made` lists the new ones in order)."""
    if first[op] == k:
        return op
    if op not in clones:
        operands = [
            _local_copy(v.defining_op, before, k, first, clones, made).results[v.index]
            for v in op.operands
        ]
        types = [r.type for r in op.results]
        clone = type(op)(operands, types, dict(op.attributes), loc=op.loc)
        before.block.insert_before(clone, before)
        clones[op] = clone
        first[clone] = k
        made.append(clone)
    return clones[op]


# -- copies ---------------------------------------------------------------------------------------


def copy_map(
    rep: Segment, seg: Segment, sources: set, counts: bool = True, origin: dict | None = None
) -> tuple[dict, dict] | None:
    """`seg` as a copy of `rep` op for op, in the same order: (values of `rep` -> values of
    `seg`, ops of `rep` -> ops of `seg`), or None when it is not one.

    A copy has the same ops (class, attributes, result types, use counts: the matcher compares
    those) in the same order, reading the same values: each of `rep`'s outside values (its
    input, arguments, sources, which are compared the same way) stands for one of `seg`'s. So
    every match inside `rep` has its counterpart inside `seg` and planning `seg` is planning
    `rep` (a match that reaches over the input cut is not seen here: the planner checks that).
    `counts=False` skips comparing the use counts of values computed inside: equal anyway when
    every op of the block is live (segments share only cut values, so such a value is read
    inside its segment only, where the two read alike). Sources that copy one source
    (`origin`, from `localize`) are alike but for their use counts. Cheaper than the structural hash (the
    comparisons are of flat lists: see `_Layout`); a segment whose independent ops come in
    another order is not a copy (its hash finds it)."""
    a, b = _layout(rep), _layout(seg)
    if (
        a.regions
        or b.regions
        or a.classes != b.classes
        or a.wires != b.wires
        or a.arity != b.arity
        or a.result_counts != b.result_counts
        or a.result_types != b.result_types
        or a.attributes != b.attributes
    ):
        return None
    values = dict(zip(a.results, b.results))
    if rep.output is not None and values.get(rep.output) is not seg.output:
        return None
    if counts and _use_counts(a, rep.output) != _use_counts(b, seg.output):
        return None
    # The outside values read: one of `seg`'s for each of `rep`'s, of its class and type (the
    # input for the input), all at once.
    ext = a.outside_of(rep)
    ws = list(map(b.operands.__getitem__, ext.reads))
    classes = list(map(type, ws))
    for i in ext.input_reads:
        if ws[i] is not seg.input:
            return None
        classes[i] = None
    if classes != ext.classes or list(map(_TYPE, ws)) != ext.types:
        return None
    n = ext.distinct
    if len(set(ws)) != n or len(set(zip(ext.values, ws))) != n:
        return None  # two of `rep`'s values read as one of `seg`'s, or one as two
    values.update(zip(ext.values, ws))
    ops = dict(zip(rep.core, seg.core))
    outside = set(ws)
    for u in ext.sourced:
        if not _map_source(u, values[u], values, ops, outside, sources, origin):
            return None
    return values, ops


class _Layout:
    """A segment's core ops flattened into lists that compare at C speed (list and tuple
    equality): op classes, attribute dicts (equal dicts: an op's attribute kinds are declared,
    so `1` never meets `true`), results and their types, operand counts, and for each operand
    the index of the result it reads in `results` (None: a value from outside)."""

    __slots__ = (
        "classes",
        "attributes",
        "results",
        "result_types",
        "result_counts",
        "operands",
        "arity",
        "wires",
        "regions",
        "_outside",
    )

    def __init__(self, core: list[Operation]) -> None:
        result_lists = list(map(_RESULTS, core))
        operand_lists = list(map(_OPERANDS, core))
        self.results = results = list(itertools.chain.from_iterable(result_lists))
        self.operands = operands = list(itertools.chain.from_iterable(operand_lists))
        self.classes = tuple(map(type, core))
        self.attributes = list(map(_ATTRIBUTES, core))
        self.result_types = list(map(_TYPE, results))
        self.result_counts = list(map(len, result_lists))
        self.arity = list(map(len, operand_lists))
        self.wires = list(map(dict(zip(results, range(len(results)))).get, operands))
        self.regions = any(map(_REGIONS, core))
        self._outside = None

    def outside_of(self, seg: Segment) -> _Outside:
        if self._outside is None:
            self._outside = _Outside(self, seg.input)
        return self._outside


class _Outside:
    """The operands of a segment (its `_Layout`) that read outside values: their indices, the
    values, their classes (None for the input) and types, how many distinct values, and those
    made by sources."""

    def __init__(self, layout: _Layout, input: Value | None) -> None:
        self.reads = [i for i, w in enumerate(layout.wires) if w is None]
        self.values = list(map(layout.operands.__getitem__, self.reads))
        self.classes = [None if v is input else type(v) for v in self.values]
        self.types = list(map(_TYPE, self.values))
        self.input_reads = [k for k, v in enumerate(self.values) if v is input]
        self.distinct = len(set(self.values))
        found = dict.fromkeys(v for v in self.values if v is not input)
        self.sourced = [v for v in found if v.defining_op is not None]


_TYPE, _RESULTS, _OPERANDS = attrgetter("type"), attrgetter("results"), attrgetter("operands")
_ATTRIBUTES, _REGIONS, _USES = attrgetter("attributes"), attrgetter("regions"), attrgetter("uses")


def _layout(seg: Segment) -> _Layout:
    if seg.layout is None:
        seg.layout = _Layout(seg.core)
    return seg.layout


def _use_counts(layout: _Layout, skip: Value | None) -> list[int]:
    """Uses of each result (-1 for `skip`, the value read after the segment)."""
    return [
        -1 if r is skip else n for r, n in zip(layout.results, map(len, map(_USES, layout.results)))
    ]


def _same_results(ra: list, rb: list) -> bool:
    """Same result types and use counts."""
    if len(ra) != len(rb):
        return False
    return all(x.type is y.type and len(x.uses) == len(y.uses) for x, y in zip(ra, rb))


def _same_attributes(aa: dict, ba: dict) -> bool:
    # `True == 1` in a dict: the values' classes must agree too.
    return aa is ba or (aa == ba and all(type(x) is type(ba[k]) for k, x in aa.items()))


def _same_node(a: Operation, b: Operation) -> bool:
    """Same class, attributes, operand count, result types and use counts."""
    if type(a) is not type(b) or a.regions or b.regions or len(a.operands) != len(b.operands):
        return False
    return _same_results(a.results, b.results) and _same_attributes(a.attributes, b.attributes)


def _map_source(
    u: Value, w: Value, values: dict, ops: dict, outside: set, sources: set, origin: dict | None
) -> bool:
    """Pair the source op making `rep`'s value `u` with the one making `seg`'s `w`: alike
    (copies of one source, `origin`, are alike but for their use counts), their operands
    paired too."""
    d, e = u.defining_op, w.defining_op
    if d not in sources or e not in sources or u.index != w.index:
        return False
    if d in ops:
        return ops[d] is e  # paired through another of its results
    dr, er = d.results, e.results
    if origin is not None and origin.get(d, d) is origin.get(e, e):
        if len(dr) == 1 == len(er):  # the common case, a constant or a splat: inline
            if len(dr[0].uses) != len(er[0].uses):
                return False
        elif not _same_results(dr, er):
            return False
    elif not _same_node(d, e):
        return False
    if d.operands:
        for x, y in zip(d.operands, e.operands):
            m = values.get(x)
            if m is None:
                if y in outside or not _map_source(x, y, values, ops, outside, sources, origin):
                    return False
            elif m is not y:
                return False
    ops[d] = e
    values.update(zip(dr, er))
    outside.update(er)
    return True


# -- the structural hash --------------------------------------------------------------------------


def attribute_text(value) -> str:
    """An attribute as hashed text: a dense value by its type and a digest of its bytes (or
    its file), anything else as printed."""
    if isinstance(value, DenseAttr):
        if value.file is not None:
            # A constant kept in a .npy file is known by its file, as its equality is: hashing
            # the bytes would read every weight of an imported model.
            return f"dense_file:{value.type}:{value.file}"
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
            f"{k}={attribute_text(v)}" for k, v in sorted(op.attributes.items()) if "." not in k
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


def function_hash(func) -> str:
    """The canonical hash of a whole function (a `FuncOp` in the form the planner plans): the
    structural hashes of its ops with each argument named by its position and type (two
    arguments of one type are not interchangeable here, as they are inside a segment), the
    terminator's (which values are returned, in order) and the argument types. Value names, the
    function's name and the order of independent ops do not enter it. What the GPU route keys
    its whole-plan times by (planner/plan_memory.py)."""
    args = list(func.body.args)
    hashes = op_hashes(list(func.body.ops), {a: f"arg{i}:{a.type}" for i, a in enumerate(args)})
    text = (
        ",".join(str(a.type) for a in args)
        + "||"
        + "|".join(sorted(hashes.values()))
        + "||"
        + hashes[func.body.last]
    )
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


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
