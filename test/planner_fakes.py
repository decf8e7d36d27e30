"""Fake kernels, random costs and random small graphs for the planner tests.

Kernels here are never registered: a test passes them to `PlanContext(kernels=...)`, so the
real numpy backend does not take part. Two backends: "numpy" (host) and "cuda" (device), with
the registered copy kernels between them. Graph kernels are faked by a matcher (`cone_matcher`)
that covers an op with the producers of its operands whose results it alone reads, and a region
with two results (`MULTI`) by one that also covers a producer whose result later ops read.
"""

from __future__ import annotations

import random

from tgc.builder import FunctionBuilder, tensor
from tgc.builtin import FuncOp
from tgc.ir import Operation
from tgc.planner.cost import Cost, DictCostSource
from tgc.planner.kernel import Kernel
from tgc.planner.match import Match, matches_at
from tgc.planner.options import COPY_KERNELS

T = tensor("4x8xf32")
UNARY = ("atomic.exp", "atomic.neg", "atomic.abs", "atomic.sin")
BINARY = ("atomic.add", "atomic.mul", "atomic.sub")
HL = ("hl.relu", "hl.silu")
# The ops the decompositions of HL build (after canonicalize): each needs a kernel too.
DECOMPOSED = (
    "atomic.constant",
    "atomic.max",
    "atomic.mul",
    "atomic.exp",
    "atomic.neg",
    "atomic.abs",
    "atomic.add",
    "atomic.cmp",
    "atomic.recip",
    "atomic.div",
    "atomic.where",
)
BACKENDS = ("numpy", "cuda")


def fake_kernels(rng: random.Random, both: float = 0.6) -> list[Kernel]:
    """One op kernel per op and backend; with probability 1-`both` an op has a kernel on one
    backend only (which one at random)."""
    names = sorted(set(UNARY + BINARY + HL + DECOMPOSED))
    out = []
    for name in names:
        backends = BACKENDS if rng.random() < both else (rng.choice(BACKENDS),)
        out += [Kernel(f"{b}.t.{name}", b, op=name) for b in backends]
    return out


def random_costs(rng: random.Random, kernels: list[Kernel]) -> DictCostSource:
    """A random time for every kernel and for both copies (1 to 10 microseconds)."""
    table = {k.name: Cost(rng.uniform(1e-6, 1e-5), "measured") for k in kernels}
    for name in COPY_KERNELS.values():
        table[name] = Cost(rng.uniform(1e-6, 1e-5), "measured")
    return DictCostSource(table)


# -- graphs -------------------------------------------------------------------------------------


def _apply(fb: FunctionBuilder, name: str, operands):
    dialect, op = name.split(".")
    return getattr(getattr(fb, dialect), op)(*operands)


def random_tree(rng: random.Random, ops: int, hl: float = 0.2, chain: bool = False) -> FuncOp:
    """A function whose every value has one reader: each op consumes open values (or fresh
    arguments) once. `chain`: each op reads the previous result (and fresh arguments)."""
    args = 1 if chain else rng.randint(1, 3)
    fb = FunctionBuilder("tree", [T] * args)
    open_values = list(fb.args)
    fresh = args

    def take():
        nonlocal fresh
        if open_values and (chain or rng.random() < 0.8):
            return open_values.pop(0 if chain else rng.randrange(len(open_values)))
        fresh += 1
        return fb.func.body.add_arg(T, f"a{fresh}")

    for _ in range(ops):
        kind = rng.random()
        if kind < hl:
            open_values.append(_apply(fb, rng.choice(HL), [take()]))
        elif kind < 0.55:
            open_values.append(_apply(fb, rng.choice(UNARY), [take()]))
        else:
            a = take()
            open_values.append(_apply(fb, rng.choice(BINARY), [a, take()]))
    while len(open_values) > 1:
        a, b = open_values.pop(), open_values.pop()
        open_values.append(_apply(fb, rng.choice(BINARY), [a, b]))
    return _finish(fb, open_values[0])


def random_dag(rng: random.Random, ops: int, hl: float = 0.15) -> FuncOp:
    """A function whose ops read any earlier values (shared values, a shared argument)."""
    fb = FunctionBuilder("dag", [T] * rng.randint(1, 2))
    values = list(fb.args)
    for _ in range(ops):
        kind = rng.random()
        if kind < hl:
            values.append(_apply(fb, rng.choice(HL), [rng.choice(values)]))
        elif kind < 0.5:
            values.append(_apply(fb, rng.choice(UNARY), [rng.choice(values)]))
        else:
            values.append(_apply(fb, rng.choice(BINARY), [rng.choice(values), rng.choice(values)]))
    result = values[-1]
    if len(values) > 3 and rng.random() < 0.5:  # a value read twice: inside and by the return
        result = _apply(fb, "atomic.add", [result, values[len(values) // 2]])
    return _finish(fb, result)


def _finish(fb: FunctionBuilder, result) -> FuncOp:
    from tgc.verifier import verify

    fb.func.attributes["function_type"] = type(fb.func.function_type)(
        tuple(a.type for a in fb.func.body.args), ()
    )
    module = fb.ret(result)
    verify(module)
    return module.funcs[0]


# -- fake graph kernels ---------------------------------------------------------------------------

PAIR = Kernel("numpy.t.pair", "numpy", reference="(faked by cone_matcher)")
CONE = Kernel("cuda.t.cone", "cuda", reference="(faked by cone_matcher)")


def _cone(root: Operation, limit: int) -> list[Operation]:
    """`root` and, breadth first, producers (in its block, with operands) all of whose results'
    readers are already in the cone; at most `limit` ops."""
    tile = [root]
    grown = True
    while grown and len(tile) < limit:
        grown = False
        for op in list(tile):
            for v in op.operands:
                p = v.defining_op
                if p is None or p in tile or p.block is not root.block or not p.operands:
                    continue
                if all(u in tile for r in p.results for u, _ in r.uses):
                    tile.append(p)
                    grown = True
                    break
            if grown or len(tile) >= limit:
                break
    return tile


def _tile_match(kernel: Kernel, root: Operation, tile: list[Operation]) -> Match:
    members = set(tile)
    ops, op = [], root  # block order: walk back from the root (the tile precedes it)
    while len(ops) < len(tile):
        if op in members:
            ops.append(op)
        op = op.prev
    ops = tuple(reversed(ops))
    inputs = []
    for op in ops:
        for v in op.operands:
            if v.defining_op not in members and v not in inputs:
                inputs.append(v)
    return Match(kernel, root, ops, tuple(inputs), tuple(root.results))


MULTI = Kernel("cuda.t.multi", "cuda", reference="(faked by cone_matcher)")


def _multi_tile(root: Operation) -> list[Operation] | None:
    """`root` and a producer of one of its operands whose result is read outside the pair too,
    by ops after `root` only: a region that also writes that result (Option.extra_outputs)."""
    order = {op: i for i, op in enumerate(root.block.ops)}
    for v in root.operands:
        p = v.defining_op
        if p is None or p.block is not root.block or not p.operands or len(p.results) != 1:
            continue
        outside = [u for u, _ in p.results[0].uses if u is not root]
        if outside and all(order[u] > order[root] for u in outside):
            return [p, root]
    return None


def cone_matcher(op: Operation, kernels):
    """matches_at for the op kernels, plus a 2-op "pair" (numpy) and a 3-op "cone" (cuda)
    graph kernel, when in `kernels`, wherever such a tile exists (interior results read only
    inside it)."""
    out = matches_at(op, [k for k in kernels if k.op is not None])
    if len(op.results) != 1 or not op.operands or op.name == "func.return":
        return out
    pair = _cone(op, 2)
    if len(pair) == 2 and PAIR in kernels:
        out.append(_tile_match(PAIR, op, pair))
    cone = _cone(op, 3)
    if len(cone) == 3 and CONE in kernels:
        out.append(_tile_match(CONE, op, cone))
    multi = _multi_tile(op) if MULTI in kernels else None
    if multi is not None:
        p, root = multi
        inputs = tuple(
            dict.fromkeys([*p.operands, *(v for v in root.operands if v is not p.results[0])])
        )
        out.append(Match(MULTI, root, (p, root), inputs, (p.results[0], root.results[0])))
    return out


def with_graph_kernels(kernels: list[Kernel]) -> list[Kernel]:
    return [*kernels, PAIR, CONE]


def with_multi_output_regions(kernels: list[Kernel]) -> list[Kernel]:
    return [*kernels, MULTI]
