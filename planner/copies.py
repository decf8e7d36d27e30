"""Reuse across copies of a segment: `_CopyChain` plans a segment that copies an earlier one op
for op (`planner.blocks.copy_map`) by mapping the earlier one's plan, without matching, hashing
or solving it; `_Reach` finds where a graph-kernel match could reach back over a cut (then the
options are compared, and a crossing gives the function back to `planner.chain._Chain`).
"""

from __future__ import annotations

from typing import ClassVar

from tgc.builtin import FuncOp
from tgc.ir import Block, Operation
from tgc.planner.blocks import Segment, copy_map, localize, segment_key, source_ops, split
from tgc.planner.chain import Selection, _Chain, _Entry, _Kind, _map_option
from tgc.planner.kernel import KERNELS, canonical_references, reference_root, registry_version
from tgc.planner.options import Option, PlanContext, live_ops
from tgc.planner.solve import Solver

# -- copies of segments ---------------------------------------------------------------------------


class _SegmentOptions:
    """The options of the ops that `_CopyChain` matched (what `planner.solve` reads of a
    `BlockOptions`)."""

    def __init__(self, block: Block) -> None:
        self.block = block
        self.options: dict[Operation, list[Option]] = {}
        self.optional: set[Operation] = set()

    def add(self, op: Operation, options: list[Option]) -> None:
        self.options[op] = options
        for o in options:
            self.optional.update(o.ops[:-1])
            if o.match is not None:
                self.optional.update(o.match.constants)


class _CopyChain(_Chain):
    """Planning where a segment that copies an earlier one op for op (`copy_map`) is neither
    matched nor hashed nor solved: its plan is the earlier one's, mapped. The rest is
    `_Chain`'s: segments matched, hashed by structure and options, one table per hash.

    A match could reach back over a cut into the segment before, and then the options of a copy
    would not be those of the segment it copies. Where the cut value's defining op could be
    covered inside some graph kernel's reference (same name and use count), the options at the
    ops that could root such a match are found and compared; a segment whose matched options
    cross a cut gives the function back to `_Chain` (None), which never cuts inside an option."""

    def __init__(self, solver: Solver, func: FuncOp, required) -> None:
        super().__init__(solver, _SegmentOptions(func.body), func, required, True)

    def run(self) -> Selection | None:
        block = self.func.body
        ops = live_ops(block)
        if not ops:
            return None
        # Every op live: the use counts of a copy's values need no comparing (`copy_map`).
        counts = len(ops) != len(block) - 1
        sources = source_ops(ops)
        chain, owners = split(ops, sources=sources)
        self.origin: dict[Operation, Operation] = {}
        localize(chain, ops, sources, owners, self.origin)
        live = set(ops)
        live.update(sources)  # the copies of sources made for each segment
        if len(chain) > 1:
            chain[0].input = self._first_input(chain, live)
        self._close(chain)
        entries = self._classify(chain, sources, live, counts)
        if entries is None:
            return None
        kinds: dict[str, _Kind] = {}
        kind_of: dict[Segment, _Kind] = {}
        for k, entry in enumerate(entries):
            if entry.copy_of is None:
                seg = entry.seg
                required = self.last_required if k == len(entries) - 1 else {}
                key = segment_key(seg, required, self._describe)
                if key not in kinds:
                    kinds[key] = _Kind(seg, self._tables(seg, required))
                kind_of[seg] = kinds[key]
            entry.kind = kind_of[entry.copy_of or entry.seg]
        position = {op: i for i, op in enumerate(block.ops)}
        return self._finish(entries, len(kinds), position)

    def _classify(
        self, chain: list[Segment], sources: set, live: set, counts: bool
    ) -> list[_Entry] | None:
        """Each segment as a copy of an earlier one, or with its options matched; None when
        some matched option crosses a cut."""
        reach = _Reach.of(self.s.ctx)
        firsts: dict[tuple, list[Segment]] = {}  # core op classes -> segments matched
        entries = []
        # (segment copied before, segment copied): no match can cross the cut between them.
        # Valid for all such pairs when every use count is known alike (`counts` False).
        self.unreached: set[tuple] = set()
        for seg in chain:
            shape = tuple(map(type, seg.core))
            entry = None
            if seg.output is not None:  # (not a last segment returning through `required`)
                before = entries[-1].copy_of or entries[-1].seg if entries else None
                for rep in firsts.get(shape, ()):
                    mapped = copy_map(rep, seg, sources, counts, self.origin)
                    if mapped is None:
                        continue
                    pair = (before, rep)
                    if pair not in self.unreached:
                        same = self._reach(seg, *mapped, reach, live)
                        if same is False:
                            continue
                        if same is None and not counts:
                            self.unreached.add(pair)
                    entry = _Entry(seg, None, rep, *mapped)
                    break
            if entry is None:
                if not self._match(seg, live):
                    return None
                entry = _Entry(seg)
                if seg.output is not None:
                    firsts.setdefault(shape, []).append(seg)
            entries.append(entry)
        return entries

    def _match(self, seg: Segment, live: set) -> bool:
        """Find the options of the segment's ops; False when one crosses a cut."""
        members = set(seg.ops)
        for op in seg.ops:
            kept = []
            for o in self.s.ctx.options_at(op):
                if all(x in members for x in o.ops):
                    kept.append(o)
                elif all(x in live for x in o.ops):
                    return False
            self.bo.add(op, kept)
        return True

    def _reach(self, seg, values, ops, reach: _Reach, live: set) -> bool | None:
        """Whether no option of `seg` reaches back over its input cut: None when no op of `seg`
        could root such a match (that depends only on the ops and use counts of `seg` and of
        the segment before, so it holds for every copy of the pair), else whether the options
        at those ops are those of the segment `seg` copies, mapped."""
        v = seg.input
        d = v.defining_op if v is not None else None
        if d is None:
            return None
        roots = reach.roots(d)
        if not roots:
            return None
        inverse = {b: a for a, b in ops.items()}
        inside = [(x, inverse[x]) for x in roots if x in inverse]  # else: the next one's check
        for x, a in inside:
            found = [o for o in self.s.ctx.options_at(x) if all(y in live for y in o.ops)]
            mapped = [_map_option(o, values, ops) for o in self.bo.options[a]]
            if len(found) != len(mapped) or not all(map(_same_option, found, mapped)):
                return False
        return True if inside else None


class _Reach:
    """Which ops of a program could root a graph-kernel match that covers a given op inside:
    the reference ops of every graph kernel considered, by name, with their use counts."""

    # (registry version, ids of the graph kernels) -> those kernels (held, so that their ids
    # stay theirs) and what they reach.
    _cache: ClassVar[dict[tuple, tuple[tuple, _Reach]]] = {}

    def __init__(self, kernels) -> None:
        self.inner: dict[str, list[tuple[Operation, int, Operation]]] = {}
        for k in kernels:
            for ref in canonical_references(k):
                root = reference_root(ref)
                for op in ref.body.ops:
                    if op is root or op is ref.body.last or op.name == "atomic.constant":
                        continue
                    uses = sum(len(r.uses) for r in op.results)
                    self.inner.setdefault(op.name, []).append((op, uses, root))

    @classmethod
    def of(cls, ctx: PlanContext) -> _Reach:
        pool = KERNELS.values() if ctx.kernels is None else ctx.kernels
        graph = tuple(k for k in pool if k.op is None)
        key = (registry_version(), tuple(map(id, graph)))
        found = cls._cache.get(key)
        if found is None:
            if len(cls._cache) >= 8:
                cls._cache.clear()
            found = cls._cache[key] = (graph, cls(graph))
        return found[1]

    def roots(self, d: Operation) -> list[Operation]:
        """Program ops that a match covering `d` (not as its root) could be rooted at: those
        reached from `d` along uses through ops named like a path from a reference op named
        like `d`, with as many uses, to its reference's root."""
        candidates = self.inner.get(d.name)
        if not candidates:
            return []
        uses = sum(len(r.uses) for r in d.results)
        found: dict[Operation, None] = {}
        for op, count, root in candidates:
            if count != uses:
                continue
            pairs, seen = [(op, d)], set()
            while pairs:
                r, p = pairs.pop()
                if r is root:
                    found[p] = None
                    continue
                for ru in {u for x in r.results for u, _ in x.uses}:
                    for pu in {u for y in p.results for u, _ in y.uses}:
                        if pu.name == ru.name and (ru, pu) not in seen:
                            seen.add((ru, pu))
                            pairs.append((ru, pu))
        return list(found)


def _same_option(a: Option, b: Option) -> bool:
    return (
        a.kind == b.kind
        and a.kernel is b.kernel
        and a.decomposition is b.decomposition
        and a.ops == b.ops
        and a.inputs == b.inputs
        and a.outputs == b.outputs
    )
