"""Verify a candidate rule: its most general shapes, then random testing in float64.

Shapes. The enumeration ran on square inputs; a rule may hold for rectangular ones too. Each
input gets a fresh symbol per dim, and the ops of both sides state what they need (an
elementwise op: equal shapes; a matmul: equal inner dims; a concat: equal dims off its axis,
the sum on it), solved by unification. What is left free are the rule's symbols. A rule whose
input dim is forced to a sum (an input added to a concat) is not expressible as a table row
and is dropped (`VerifyResult.reason`).

Testing. The rule is built as two functions (tgc IR, verified) for several instantiations of
its symbols: the table's own (distinct small primes, so that a reader can tell the symbols
apart) and `shapes - 1` random ones, each on `draws` fresh draws of standard normal inputs,
evaluated by the float64 interpreter (tgc.evaluate). It passes when every result agrees within
`tolerance`, relative to the largest magnitude of the source's result.

Exactly, where that is cheap. A rule whose ops are all polynomial in their inputs' entries
(add, sub, mul, neg, matmul, transpose, concat, sum: `EXACT_OPS`) is also evaluated, at each
instantiation, on random integers in exact arithmetic (Python integers): two different
polynomials of degree d agree at a point drawn from N integers with probability at most d / N
(the Schwartz-Zippel lemma), so equal results on two draws from 2^41 integers say the sides are
the same polynomial but with a probability below 1e-23 for the rules here (d <= 4). Such a rule
is marked `exact`; one that agrees in floats but not exactly is rejected. Rules with exp (or
any other op) rest on the float tests alone.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tgc.builder import FunctionBuilder
from tgc.diagnostics import TgcError, VerifyError
from tgc.evaluate import evaluate_block
from tgc.ir import Value
from tgc.passes.rulegen.terms import INPUT_NAMES, Term
from tgc.types import TensorType

TABLE_SIZES = (2, 3, 5, 7, 11, 13, 17, 19)  # the sizes of the table's symbols, in order
ONE = ("one",)


@dataclass
class VerifyResult:
    ok: bool
    reason: str = ""
    arg_shapes: tuple = ()  # each input's shape in symbols (ints), in input order
    inputs: tuple[int, ...] = ()  # the input numbers the rule reads
    draws: int = 0
    instantiations: tuple[tuple[int, ...], ...] = ()  # the symbol sizes tried
    max_rel_error: float = 0.0
    exact: bool = False  # also equal in exact integer arithmetic (module doc)


class Shapes:
    """Symbolic dims by unification: a dim is a symbol (int), ("sum", d, e) or ONE."""

    def __init__(self) -> None:
        self.bound: dict[int, object] = {}
        self.count = 0

    def fresh(self) -> int:
        self.count += 1
        return self.count

    def resolve(self, d):
        while isinstance(d, int) and d in self.bound:
            d = self.bound[d]
        if isinstance(d, tuple) and d[0] == "sum":
            return ("sum", self.resolve(d[1]), self.resolve(d[2]))
        return d

    def unify(self, d, e) -> bool:
        d, e = self.resolve(d), self.resolve(e)
        if d == e:
            return True
        if isinstance(e, int):
            d, e = e, d
        if isinstance(d, int):
            if _occurs(d, e):
                return False  # n = n + m has no positive solution
            self.bound[d] = e
            return True
        if d[0] == "sum" and e[0] == "sum":
            return self.unify(d[1], e[1]) and self.unify(d[2], e[2])
        return False

    def size(self, d, sizes: dict[int, int]) -> int:
        d = self.resolve(d)
        if isinstance(d, int):
            return sizes[d]
        if d == ONE:
            return 1
        return self.size(d[1], sizes) + self.size(d[2], sizes)


def _occurs(symbol: int, d) -> bool:
    if isinstance(d, int):
        return d == symbol
    return d[0] == "sum" and (_occurs(symbol, d[1]) or _occurs(symbol, d[2]))


def _same(shapes: Shapes, x: tuple, y: tuple) -> tuple | None:
    """An elementwise op's result: equal dims, or a ONE (from keepdims) broadcast."""
    out = []
    for d, e in zip(x, y):
        if shapes.resolve(d) == ONE:
            out.append(e)
        elif shapes.resolve(e) == ONE:
            out.append(d)
        elif shapes.unify(d, e):
            out.append(d)
        else:
            return None
    return tuple(out)


def symbolic_shape(term: Term, shapes: Shapes, args: dict[int, tuple], memo: dict):
    """The shape of `term` in symbols (None: the constraints cannot hold)."""
    if term.id in memo:
        return memo[term.id]
    if term.spec is None:
        if term.index not in args:
            args[term.index] = (shapes.fresh(), shapes.fresh())
        out = args[term.index]
    else:
        kids = [symbolic_shape(c, shapes, args, memo) for c in term.children]
        out = None if any(k is None for k in kids) else _op_shape(term, kids, shapes)
    memo[term.id] = out
    return out


def _op_shape(term: Term, kids: list, shapes: Shapes):
    spec, attrs = term.spec, term.spec.attributes()
    op = spec.op
    if op == "atomic.matmul":
        a, b = kids
        a = a[::-1] if attrs.get("transpose_a") else a
        b = b[::-1] if attrs.get("transpose_b") else b
        return (a[0], b[1]) if shapes.unify(a[1], b[0]) else None
    if op == "atomic.transpose":
        return kids[0][::-1]
    if op == "atomic.concat":
        axis = attrs["axis"]
        a, b = kids
        if not shapes.unify(a[1 - axis], b[1 - axis]):
            return None
        out = list(a)
        out[axis] = ("sum", a[axis], b[axis])
        return tuple(out)
    if op == "atomic.reduce_sum":
        out = list(kids[0])
        out[attrs["axes"][0]] = ONE
        return tuple(out)
    if spec.arity == 1:
        return kids[0]
    return _same(shapes, kids[0], kids[1])


def generalise(src: Term, tgt: Term) -> tuple[Shapes, dict[int, tuple]] | str:
    """(solved dims, each input's symbolic shape), or why the rule has no table form."""
    shapes, args = Shapes(), {}
    a = symbolic_shape(src, shapes, args, {})
    b = symbolic_shape(tgt, shapes, args, {})
    if a is None or b is None or len(a) != len(b):
        return "the two sides have no common shape"
    for d, e in zip(a, b):
        if not shapes.unify(d, e):
            return "the two sides have no common shape"
    for shape in args.values():
        if any(not isinstance(shapes.resolve(d), int) for d in shape):
            return "an input's shape is not free (it is a sum or 1)"
    return shapes, args


def free_symbols(shapes: Shapes, args: dict[int, tuple]) -> list[int]:
    out: list[int] = []
    for i in sorted(args):
        for d in args[i]:
            s = shapes.resolve(d)
            if s not in out:
                out.append(s)
    return out


def build_function(term: Term, name: str, arg_types: dict[int, TensorType]):
    """`term` as a verified function of its inputs (those of `arg_types`, in order)."""
    order = sorted(arg_types)
    fb = FunctionBuilder(name, [arg_types[i] for i in order], [INPUT_NAMES[i] for i in order])
    values: dict[int, Value] = {}
    args = dict(zip(order, fb.args))

    def emit(t: Term) -> Value:
        if t.spec is None:
            return args[t.index]
        if t.id not in values:
            operands = [emit(c) for c in t.children]
            values[t.id] = fb.create(t.spec.op, operands, t.spec.attributes()).results[0]
        return values[t.id]

    return fb.ret(emit(term)).funcs[0]


def arg_types_for(shapes: Shapes, args: dict[int, tuple], sizes: dict[int, int], dtype="f64"):
    return {
        i: TensorType.get(tuple(shapes.size(d, sizes) for d in shape), dtype)
        for i, shape in args.items()
    }


# Ops whose results are polynomials in their operands' entries, as exact functions of object
# arrays of Python integers (the module doc's exact check).
EXACT_OPS = {
    "atomic.add": lambda a, b, **_: a + b,
    "atomic.sub": lambda a, b, **_: a - b,
    "atomic.mul": lambda a, b, **_: a * b,
    "atomic.neg": lambda a, **_: -a,
    "atomic.matmul": lambda a, b, transpose_a=False, transpose_b=False: (
        (a.T if transpose_a else a) @ (b.T if transpose_b else b)
    ),
    "atomic.transpose": lambda a, perm: a.transpose(perm),
    "atomic.concat": lambda a, b, axis: np.concatenate([a, b], axis=axis),
    "atomic.reduce_sum": lambda a, axes, keepdims: a.sum(axis=tuple(axes), keepdims=keepdims),
}
EXACT_RANGE = 2**40  # integers drawn from [-EXACT_RANGE, EXACT_RANGE]
EXACT_DRAWS = 2


def exact_value(term: Term, inputs: dict[int, np.ndarray], memo: dict) -> np.ndarray:
    if term.spec is None:
        return inputs[term.index]
    if term.id not in memo:
        kids = [exact_value(c, inputs, memo) for c in term.children]
        memo[term.id] = EXACT_OPS[term.spec.op](*kids, **term.spec.attributes())
    return memo[term.id]


def is_polynomial(term: Term) -> bool:
    return term.spec is None or (
        term.spec.op in EXACT_OPS and all(is_polynomial(c) for c in term.children)
    )


def exactly_equal(src: Term, tgt: Term, types: dict[int, TensorType], rng) -> bool:
    """Both sides equal on EXACT_DRAWS draws of random integers, in exact arithmetic."""
    for _ in range(EXACT_DRAWS):
        inputs = {
            i: rng.integers(-EXACT_RANGE, EXACT_RANGE, size=t.shape, endpoint=True).astype(object)
            for i, t in types.items()
        }
        a, b = exact_value(src, inputs, {}), exact_value(tgt, inputs, {})
        if a.shape != b.shape or not bool(np.all(a == b)):
            return False
    return True


def verify_candidate(
    src: Term,
    tgt: Term,
    rng: np.random.Generator,
    shapes_tried: int = 3,
    draws: int = 16,
    tolerance: float = 1e-9,
) -> VerifyResult:
    solved = generalise(src, tgt)
    if isinstance(solved, str):
        return VerifyResult(False, solved)
    shapes, args = solved
    symbols = free_symbols(shapes, args)
    if len(symbols) > len(TABLE_SIZES):
        return VerifyResult(False, "too many shape symbols")
    instantiations = [TABLE_SIZES[: len(symbols)]]
    while len(instantiations) < shapes_tried:
        instantiations.append(tuple(int(s) for s in rng.choice(range(2, 12), len(symbols))))
    worst = 0.0
    exact = is_polynomial(src) and is_polynomial(tgt)
    for inst in instantiations:
        sizes = dict(zip(symbols, inst))
        types = arg_types_for(shapes, args, sizes)
        try:
            f = build_function(src, "src", types)
            g = build_function(tgt, "tgt", types)
        except (VerifyError, TgcError) as e:
            return VerifyResult(False, f"does not build at sizes {inst}: {e.message}")
        if f.body.last.operands[0].type is not g.body.last.operands[0].type:
            return VerifyResult(False, f"the sides' types differ at sizes {inst}")
        for _ in range(draws):
            inputs = [rng.standard_normal(t.shape) for _, t in sorted(types.items())]
            with np.errstate(all="ignore"):
                (a,) = evaluate_block(f.body, inputs, "f64")
                (b,) = evaluate_block(g.body, inputs, "f64")
            error = relative_error(a, b)
            worst = max(worst, error)
            if not error <= tolerance:
                return VerifyResult(False, f"differs by {error:.3g} at sizes {inst}")
        if exact and not exactly_equal(src, tgt, types, rng):
            return VerifyResult(False, f"differs in exact arithmetic at sizes {inst}")
    arg_shapes = tuple(tuple(shapes.resolve(d) for d in args[i]) for i in sorted(args))
    return VerifyResult(
        True,
        arg_shapes=arg_shapes,
        inputs=tuple(sorted(args)),
        draws=draws * len(instantiations),
        instantiations=tuple(instantiations),
        max_rel_error=worst,
        exact=exact,
    )


def relative_error(a: np.ndarray, b: np.ndarray) -> float:
    """max |a - b| / max |a| (0 when both are all zeros; inf where they are not finite alike)."""
    if a.shape != b.shape:
        return float("inf")
    finite = np.isfinite(a)
    if not np.array_equal(finite, np.isfinite(b)) or not np.array_equal(a[~finite], b[~finite]):
        return float("inf")
    diff = float(np.max(np.abs(a[finite] - b[finite]), initial=0.0))
    scale = float(np.max(np.abs(a[finite]), initial=0.0))
    if diff == 0.0:
        return 0.0
    return diff / scale if scale > 0 else float("inf")
