"""The canonicalize rule table: local algebra as (pattern, replacement) rows.

The trailing comment of each row is its algebra; a row with `fast_math=True` changes results on
NaN, infinities or signed zeros (the comment says how) and only fires under `fast-math`. Every
row is checked numerically, special values included, by test/test_rules.py. Rewrites that look
at more than one op's neighbourhood (constant folding, associative chains, broadcasts) are
patterns in passes/canonicalize.py.
"""

from __future__ import annotations

import numpy as np

from tgc.dialects._shapes import normalize_axes
from tgc.passes.rules import ROOT, AttrVar, Const, Match, RuleTable, Var, atomic, fold, rule

x, y = Var("x"), Var("y")
c = Const("c")
p, q = AttrVar("p"), AttrVar("q")
ta, tb = AttrVar("ta"), AttrVar("tb")


# -- guards ----------------------------------------------------------------------------------------


def integer(m: Match) -> bool:
    return not m.root.results[0].type.is_float


def identity_perm(m: Match) -> bool:
    return tuple(m["p"]) == tuple(range(len(m["p"])))


def swaps_last_two(m: Match) -> bool:
    """`p` keeps the batch dims and swaps the last two (a matrix transpose)."""
    perm = tuple(m["p"])
    n = len(perm)
    return n >= 2 and perm == tuple(range(n - 2)) + (n - 1, n - 2)


def exact_reciprocal(m: Match) -> bool:
    """Every element of float constant `c` is a power of two whose reciprocal is normal."""
    if not m.type("c").is_float:
        return False
    values = m.array("c").astype(np.float64)
    with np.errstate(all="ignore"):
        recip = 1.0 / values
    finfo = np.finfo(m.type("c").dtype) if m.type("c").element_type != "bf16" else None
    tiny = finfo.tiny if finfo is not None else 1.2e-38
    big = finfo.max if finfo is not None else 3.3e38
    mantissa, _ = np.frexp(values)
    return bool(
        np.all(np.abs(mantissa) == 0.5)
        and np.all(np.abs(recip) >= tiny)
        and np.all(np.abs(recip) <= big)
        and np.all(np.abs(values) >= tiny)
    )


def reduces_size_one_dims(m: Match) -> bool:
    shape = m.type("x").shape
    return all(shape[a] == 1 for a in normalize_axes(m["p"], len(shape)))


def moves_only_unit_dims(m: Match) -> bool:
    """`p` keeps the order of `x`'s dims of size other than 1 (it moves only unit dims, so the
    elements keep their order: a reshape), and is no matrix transpose, which a matmul absorbs
    (below)."""
    shape, perm = m.type("x").shape, tuple(m["p"])
    kept = [d for d in perm if shape[d] != 1]
    return kept == sorted(kept) and not swaps_last_two(m) and not identity_perm(m)


def adds_only_unit_dims(m: Match) -> bool:
    """The broadcast's result has as many elements as `x` (it only adds dims of size 1)."""
    return m.type("x").num_elements == m.root.results[0].type.num_elements


def compose_perms(m: Match) -> tuple[int, ...]:
    """transpose(transpose(x, p), q) == transpose(x, p[q])."""
    return tuple(m["p"][i] for i in m["q"])


def flip_a(m: Match) -> bool:
    return not m["ta"]


def flip_b(m: Match) -> bool:
    return not m["tb"]


# -- the table -------------------------------------------------------------------------------------

# fmt: off
CANONICALIZE_RULES = RuleTable("canonicalize", [
    # neutral elements
    rule(x + -0.0, x),                                       # x+(-0) -> x
    rule(x + 0, x, when=integer, name="x + 0 -> x (integers)"),  # x+0 -> x
    rule(x + 0, atomic.broadcast(x, result_type=ROOT), when=integer,
         name="x + 0 -> broadcast(x) (integers)"),          # x+zeros of a larger shape -> a view
    rule(x + 0.0, x, fast_math=True),                        # x+0 -> x: -0+0 is +0
    rule(x - 0.0, x),                                        # x-0 -> x
    rule(x - -0.0, x, fast_math=True),                       # x-(-0) -> x: -0-(-0) is +0
    rule(x * 1, x),                                          # x*1 -> x
    rule(x / 1, x),                                          # x/1 -> x
    rule(x ** 1, x),                                         # x**1 -> x
    # signs
    rule(atomic.neg(-x), x),                                 # --x -> x
    rule(x * -1, -x),                                        # x*(-1) -> -x
    rule(x / -1, -x),                                        # x/(-1) -> -x
    rule(-0.0 - x, -x),                                      # (-0)-x -> -x
    rule(0 - x, -x, when=integer, name="0 - x -> -x (integers)"),  # 0-x -> -x
    rule(0.0 - x, -x, fast_math=True),                       # 0-x -> -x: 0-0 is +0, -0 is -0
    rule(x - (-y), x + y),                                   # x-(-y) -> x+y
    rule(x + (-y), x - y),                                   # x+(-y) -> x-y
    rule((-x) * (-y), x * y),                                # (-x)*(-y) -> x*y
    rule((-x) / (-y), x / y),                                # (-x)/(-y) -> x/y
    rule(atomic.abs(-x), atomic.abs(x)),                     # |-x| -> |x|
    rule(atomic.abs(atomic.abs(x)), atomic.abs(x)),          # ||x|| -> |x|
    # constants move to where chains fold them
    rule(x - c, x + fold(-c)),                               # x-c -> x+(-c)
    rule(x / c, x * fold(1 / c), when=exact_reciprocal),     # x/c -> x*(1/c), 1/c exact
    # powers
    rule(x ** 0, 1),                                         # x**0 -> 1 (NaN**0 is 1 too)
    rule(x ** 2, x * x),                                     # x**2 -> x*x
    rule(x ** -1, atomic.recip(x)),                          # x**(-1) -> 1/x
    rule(x ** 0.5, atomic.sqrt(x), fast_math=True),          # x**0.5 -> sqrt(x): (-0)**0.5 is +0
    # absorbing elements and inverses
    rule(x * 0, 0, when=integer, name="x * 0 -> 0 (integers)"),  # x*0 -> 0
    rule(x * 0.0, 0.0, fast_math=True),                      # x*0 -> 0: inf*0 is NaN, -1*0 is -0
    rule(x - x, 0, when=integer, name="x - x -> 0 (integers)"),  # x-x -> 0
    rule(x - x, 0.0, fast_math=True),                        # x-x -> 0: inf-inf is NaN
    rule(x / x, 1.0, fast_math=True),                        # x/x -> 1: 0/0 is NaN
    rule(atomic.recip(atomic.recip(x)), x, fast_math=True),  # 1/(1/x) -> x: rounding, overflow
    rule(atomic.log(atomic.exp(x)), x, fast_math=True),      # log(e^x) -> x: e^x overflows
    rule(atomic.exp(atomic.log(x)), x, fast_math=True),      # e^log(x) -> x: NaN for x < 0
    rule(atomic.sqrt(x) * atomic.sqrt(x), x, fast_math=True),  # sqrt(x)*sqrt(x) -> x: x < 0
    # selects
    rule(atomic.where(y, x, x), x),                          # where(c, x, x) -> x
    # types, shapes and layouts (a replacement of another type never fires)
    rule(atomic.cast(x), x),                                 # cast to the same type -> x
    rule(atomic.reshape(x), x),                              # reshape to the same shape -> x
    rule(atomic.broadcast(x), x),                            # broadcast to the same shape -> x
    rule(atomic.transpose(x, perm=p), x, when=identity_perm),  # identity transpose -> x
    rule(atomic.reshape(atomic.reshape(x)), atomic.reshape(x, result_type=ROOT)),  # reshape∘reshape -> reshape
    rule(atomic.broadcast(x), atomic.reshape(x, result_type=ROOT),
         when=adds_only_unit_dims),                          # broadcast adding unit dims -> reshape
    rule(atomic.broadcast(atomic.broadcast(x)),
         atomic.broadcast(x, result_type=ROOT)),             # broadcast∘broadcast -> broadcast
    rule(atomic.transpose(atomic.transpose(x, perm=p), perm=q),
         atomic.transpose(x, perm=compose_perms)),           # transpose∘transpose -> transpose
    rule(atomic.transpose(x, perm=p), atomic.reshape(x, result_type=ROOT),
         when=moves_only_unit_dims),                         # transpose of unit dims -> reshape
    rule(atomic.reduce_sum(x, axes=p), atomic.reshape(x, result_type=ROOT) + 0.0,
         when=reduces_size_one_dims),                        # sum over size-1 dims -> x+0 (-0 -> +0)
    rule(atomic.reduce_max(x, axes=p), atomic.reshape(x, result_type=ROOT),
         when=reduces_size_one_dims),                        # max over size-1 dims -> reshape
    rule(atomic.reduce_min(x, axes=p), atomic.reshape(x, result_type=ROOT),
         when=reduces_size_one_dims),                        # min over size-1 dims -> reshape
    # matmul absorbs transposes of its operands' last two dims
    rule(atomic.matmul(atomic.transpose(x, perm=p), y, transpose_a=ta, transpose_b=tb),
         atomic.matmul(x, y, transpose_a=flip_a, transpose_b=tb),
         when=swaps_last_two),                               # matmul(xᵀ, y) -> matmul(x, y, ta)
    rule(atomic.matmul(x, atomic.transpose(y, perm=p), transpose_a=ta, transpose_b=tb),
         atomic.matmul(x, y, transpose_a=ta, transpose_b=flip_b),
         when=swaps_last_two),                               # matmul(x, yᵀ) -> matmul(x, y, tb)
])
# fmt: on
