"""`raise-gelu`: find GELU spelled out in elementwise ops (how torch.export writes Hugging Face
GPT-2's `gelu_new`, how older ONNX exports write BERT's) and replace it by one `hl.gelu`, so that
every spelling lowers to the one form `hl.gelu`'s decomposition writes, and a kernel whose
reference graph is that form (cuBLASLt's GEMM with the bias and GELU in its epilogue) matches it.

The patterns, over one value `x` (`*` and `+` in either operand order, products regrouped):

    0.5 * x * (1 + tanh(c2 * (x + c1 * x**3)))     hl.gelu {approximate = "tanh"}
    0.5 * x * (1 + erf(x / sqrt(2)))               hl.gelu (or x * (1 / sqrt(2)) inside)

where `x**3` is `atomic.pow(x, 3)` or `x * x * x`, tanh is `hl.tanh`, erf `atomic.erf`, and
c1 = 0.044715, c2 = sqrt(2 / pi) and the square roots hold up to the rounding of x's element
type (the importer rounds GPT-2's float scalars to bf16: 0.0446777 and 0.796875). The constants
are splats; every intermediate has no use outside the pattern and sits in the root's block.

When `x` is an `atomic.reshape` of a value the pattern alone reads, the GELU is applied before
the reshape: `reshape(gelu(y))`. An elementwise op commutes with a reshape, and a linear
layer's bias add is then directly followed by its GELU, as the kernels' reference graphs have it
(a GPT-2 MLP reshapes its [tokens, 3072] product to [batch, seq, 3072] before the GELU).

The values are the same function; the result may differ by the rounding of the constants (at
most one unit of x's precision) and by how tanh and erf are computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.ir import Operation, Value
from tgc.pass_manager import Pass, PassStatistics, register_pass
from tgc.passes.canonicalize import float_splat
from tgc.patterns import erase_dead_producers
from tgc.rewriter import Rewriter

C1 = 0.044715
C2 = math.sqrt(2.0 / math.pi)
TANH, ERF = "hl.tanh", "atomic.erf"
# how far a constant may be from its exact value, relative: a rounding of the element type
RELATIVE_ROUNDING = {"bf16": 2.0**-8, "f16": 2.0**-11, "f32": 2.0**-23, "f64": 2.0**-52}


def _is(v: Value, exact: float, element_type: str) -> bool:
    value = float_splat(v)
    return value is not None and abs(value - exact) <= abs(exact) * RELATIVE_ROUNDING.get(
        element_type, 0.0
    )


@dataclass
class _Match:
    x: Value
    ops: list[Operation]  # the pattern's ops, root included
    approximate: str  # hl.gelu's attribute: "tanh", or "none" (the erf form)

    @property
    def attributes(self) -> dict:
        return {"approximate": "tanh"} if self.approximate == "tanh" else {}


class _Reader:
    """Reads one candidate: every op it walks through is collected, and it walks only through
    ops in `block` whose result has no use outside the ops collected by the end (checked by
    `_closed`)."""

    def __init__(self, root: Operation) -> None:
        self.block = root.block
        self.ops: list[Operation] = [root]

    def through(self, v: Value, name: str | tuple[str, ...]) -> Operation | None:
        op = v.defining_op
        names = (name,) if isinstance(name, str) else name
        if op is None or op.name not in names or op.block is not self.block:
            return None
        self.ops.append(op)
        return op

    def factors(self, v: Value, top: bool = False) -> list[Value]:
        """The factors of a product of atomic.muls (the root's own operands when `top`)."""
        op = v.defining_op if top else self.through(v, "atomic.mul")
        if op is None or (top and op.name != "atomic.mul"):
            return [v]
        return self.factors(op.operands[0]) + self.factors(op.operands[1])

    def plus_one(self, v: Value, t) -> Value | None:
        """`a` where v = a + 1 or 1 + a."""
        op = self.through(v, "atomic.add")
        if op is None:
            return None
        a, b = op.operands
        if _is(b, 1.0, t):
            return a
        return b if _is(a, 1.0, t) else None

    def pow_cube(self, v: Value, x: Value, t) -> bool:
        """Whether v = atomic.pow(x, 3), its op collected."""
        op = v.defining_op
        if op is None or op.name != "atomic.pow" or op.block is not self.block:
            return False
        if op.operands[0] is not x or not _is(op.operands[1], 3.0, t):
            return False
        self.ops.append(op)
        return True


def _read(root: Operation) -> _Match | None:
    """The GELU whose last multiply is `root`, or None (module doc)."""
    t = root.results[0].type
    if not t.is_float:
        return None
    et = t.element_type
    factors = _Reader(root).factors(root.results[0], top=True)
    halves = [f for f in factors if _is(f, 0.5, et)]
    rest = [f for f in factors if not _is(f, 0.5, et)]
    if len(halves) != 1 or len(rest) != 2:
        return None
    for x, bracket in (rest, rest[::-1]):
        found = _Reader(root)
        found.factors(root.results[0], top=True)  # the same muls collected
        inner = found.plus_one(bracket, et)
        function = None if inner is None else found.through(inner, (TANH, ERF))
        if function is None:
            continue
        read = _tanh_argument if function.name == TANH else _erf_argument
        if read(found, function.operands[0], x, et) and _closed(found.ops, x):
            return _Match(x, found.ops, "tanh" if function.name == TANH else "none")
    return None


def _tanh_argument(found: _Reader, v: Value, x: Value, et: str) -> bool:
    """Whether v = c2 * (x + c1 * x**3), its ops collected."""
    scaled = found.factors(v)
    c2 = [f for f in scaled if _is(f, C2, et)]
    inner = [f for f in scaled if not _is(f, C2, et)]
    if len(c2) != 1 or len(inner) != 1:
        return False
    add = found.through(inner[0], "atomic.add")
    if add is None:
        return False
    for a, b in (add.operands, add.operands[::-1]):
        if a is not x:
            continue
        term = found.factors(b)  # c1 and the cube: pow(x, 3), or x * x * x flattened
        c1 = [f for f in term if _is(f, C1, et)]
        cube = [f for f in term if not _is(f, C1, et)]
        if len(c1) != 1:
            return False
        if len(cube) == 3 and all(f is x for f in cube):
            return True
        return len(cube) == 1 and found.pow_cube(cube[0], x, et)
    return False


def _erf_argument(found: _Reader, v: Value, x: Value, et: str) -> bool:
    """Whether v = x / sqrt(2) (or x * (1 / sqrt(2))), its ops collected."""
    op = v.defining_op
    if op is not None and op.name == "atomic.div" and op.block is found.block:
        if op.operands[0] is x and _is(op.operands[1], math.sqrt(2.0), et):
            found.ops.append(op)
            return True
        return False
    scaled = found.factors(v)
    return len(scaled) == 2 and any(
        a is x and _is(b, math.sqrt(0.5), et) for a, b in (scaled, scaled[::-1])
    )


def _closed(ops: list[Operation], x: Value) -> bool:
    """Every op's result but the root's (the first) is read by the pattern alone, and x's type
    is the root's."""
    inside = set(map(id, ops))
    for op in ops[1:]:
        if any(id(user) not in inside for user in op.results[0].users()):
            return False
    return x.type == ops[0].results[0].type


def _rewrite(match: _Match, rewriter: Rewriter) -> bool:
    """Replace the pattern by hl.gelu (before a reshape of x that only the pattern reads); whether
    the GELU moved before a reshape."""
    source, root = match.x.defining_op, match.ops[0]
    b = rewriter.builder_before(root)
    inside = set(map(id, match.ops))
    moved = (
        source is not None
        and source.name == "atomic.reshape"
        and all(id(user) in inside for user in match.x.users())
    )
    if moved:
        y = source.operands[0]
        gelu = b.hl.gelu(y, **match.attributes)
        result = b.atomic.reshape(gelu, result_type=root.results[0].type)
    else:
        result = b.hl.gelu(match.x, **match.attributes)
    dead = [operand for op in match.ops for operand in op.operands]
    rewriter.replace_op(root, result)
    for op in match.ops[1:]:
        if op.block is not None and not any(r.uses for r in op.results):
            rewriter.erase_op(op)
    if moved and source.block is not None and not match.x.uses:
        rewriter.erase_op(source)
    erase_dead_producers(dead, rewriter)
    return moved


@register_pass
@dataclass(frozen=True)
class RaiseGelu(Pass):
    """Replace GELU spelled out in elementwise ops, its tanh and erf forms, by `hl.gelu` (the
    forms recognised: the module docstring).

    Contract: fires only where every intermediate has no use outside the pattern and every op
    of it sits in one block; results are unchanged up to the rounding of the constants (within
    one unit of the element type) and of tanh or erf. A reshape of x that only the pattern
    reads moves after the hl.gelu. The ops replaced and the constants left unused are erased.
    """

    name = "raise-gelu"
    summary = (
        "Replace GELU spelled out (0.5*x*(1+tanh(...)) or 0.5*x*(1+erf(x/sqrt(2)))) by hl.gelu"
    )

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        rewriter = Rewriter()
        for op in [op for op in func.walk() if op.name == "atomic.mul"]:
            if op.block is None:
                continue  # erased by an earlier rewrite
            match = _read(op)
            if match is None:
                continue
            moved = _rewrite(match, rewriter)
            stats.bump("raised GELU")
            if moved:
                stats.bump("GELU moved before a reshape")
