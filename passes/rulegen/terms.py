"""Terms: small graphs of atomic ops over numbered inputs, and their evaluation.

A term is an op (`OpSpec`: a tgc op with fixed attributes, such as `matmul_tb` for
`atomic.matmul {transpose_b = true}`) applied to other terms, or an input. Terms are DAGs: the
same subterm object may be read twice, and a term's size is the number of distinct ops in it
(`len(term.ops)`), as TASO counts the operators of a graph.

Evaluation goes through each op's numpy `reference` on a probe op built for the operands'
concrete types, so a term means exactly what the interpreter would compute; the probe's `infer`
also says whether the operand shapes are legal at all.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from tgc.diagnostics import VerifyError
from tgc.ir import Operation, Value
from tgc.opdef import COMMUTATIVE, OPS
from tgc.types import TensorType

INPUT_NAMES = "abcdefgh"


@dataclass(frozen=True)
class OpSpec:
    """An op the enumeration may use: a tgc op, its arity and its fixed attributes."""

    label: str
    op: str
    arity: int
    attrs: tuple[tuple[str, object], ...] = ()

    @property
    def commutative(self) -> bool:
        return self.arity == 2 and COMMUTATIVE in OPS[self.op].traits

    def attributes(self) -> dict:
        return dict(self.attrs)


def _specs() -> dict[str, OpSpec]:
    out = [
        OpSpec(name, f"atomic.{name}", 2)
        for name in ("add", "sub", "mul", "div", "max", "min", "pow")
    ]
    out += [
        OpSpec(name, f"atomic.{name}", 1)
        for name in ("neg", "exp", "log", "abs", "sqrt", "recip", "tanh")
    ]
    for ta in (False, True):
        for tb in (False, True):
            label = "matmul" + ("_ta" if ta else "") + ("_tb" if tb else "")
            attrs = tuple((k, True) for k, on in (("transpose_a", ta), ("transpose_b", tb)) if on)
            out.append(OpSpec(label, "atomic.matmul", 2, attrs))
    out.append(OpSpec("transpose", "atomic.transpose", 1, (("perm", (1, 0)),)))
    for axis in (0, 1):
        out.append(OpSpec(f"concat{axis}", "atomic.concat", 2, (("axis", axis),)))
        out.append(
            OpSpec(f"sum{axis}", "atomic.reduce_sum", 1, (("axes", (axis,)), ("keepdims", True)))
        )
    return {s.label: s for s in out if s.op in OPS}


SPECS: dict[str, OpSpec] = {}


def specs() -> dict[str, OpSpec]:
    """Every OpSpec by label (made on first use: the dialects must be loaded)."""
    if not SPECS:
        SPECS.update(_specs())
    return SPECS


class Term:
    """An input (`spec` None, `index` its number) or an op applied to terms."""

    __slots__ = ("id", "spec", "children", "index", "ops", "value", "_text")

    def __init__(self, id: int, spec: OpSpec | None, children=(), index: int = -1) -> None:
        self.id = id
        self.spec = spec
        self.children: tuple[Term, ...] = tuple(children)
        self.index = index
        ops = frozenset().union(*(c.ops for c in self.children)) if self.children else frozenset()
        self.ops: frozenset[int] = ops | {id} if spec is not None else ops
        self.value: np.ndarray | None = None
        self._text: str | None = None

    @property
    def size(self) -> int:
        return len(self.ops)

    @property
    def inputs(self) -> set[int]:
        if self.spec is None:
            return {self.index}
        return set().union(*(c.inputs for c in self.children))

    def __str__(self) -> str:
        if self._text is None:
            if self.spec is None:
                self._text = INPUT_NAMES[self.index]
            else:
                self._text = f"{self.spec.label}({', '.join(str(c) for c in self.children)})"
        return self._text

    __repr__ = __str__


class Maker:
    """Makes terms with fresh ids (`input(i)`, `op(label, *children)`): for hand-written terms."""

    def __init__(self) -> None:
        self.next_id = 0
        self.inputs: dict[int, Term] = {}

    def input(self, index: int) -> Term:
        if index not in self.inputs:
            self.inputs[index] = Term(self._id(), None, index=index)
        return self.inputs[index]

    def op(self, label: str, *children: Term) -> Term:
        return Term(self._id(), specs()[label], children)

    def _id(self) -> int:
        self.next_id += 1
        return self.next_id


class Evaluator:
    """Applies OpSpecs to float64 arrays with the ops' references, one probe op per (spec,
    operand shapes), which also answers whether those shapes are legal."""

    def __init__(self) -> None:
        self._probes: dict[tuple, Operation | None] = {}

    def probe(self, spec: OpSpec, shapes: tuple[tuple[int, ...], ...]) -> Operation | None:
        key = (spec.label, shapes)
        if key not in self._probes:
            operands = [Value(TensorType.get(s, "f64")) for s in shapes]
            op = OPS[spec.op](operands, [], spec.attributes())
            try:
                op.infer()
            except VerifyError:
                op = None
            self._probes[key] = op
        return self._probes[key]

    def apply(self, spec: OpSpec, arrays: list[np.ndarray]) -> np.ndarray | None:
        """The result of `spec` on `arrays`, or None where their shapes are not legal."""
        probe = self.probe(spec, tuple(a.shape for a in arrays))
        if probe is None:
            return None
        with np.errstate(all="ignore"):
            return np.asarray(probe.reference(*arrays), dtype=np.float64)

    def evaluate(self, term: Term, inputs: list[np.ndarray], memo: dict | None = None):
        """The value of `term` on `inputs` (None: some op's shapes are not legal)."""
        memo = {} if memo is None else memo
        if term.id in memo:
            return memo[term.id]
        if term.spec is None:
            value = inputs[term.index]
        else:
            arrays = [self.evaluate(c, inputs, memo) for c in term.children]
            value = None if any(a is None for a in arrays) else self.apply(term.spec, arrays)
        memo[term.id] = value
        return value
