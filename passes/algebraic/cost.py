"""The cost model of the `algebraic` pass: seconds = α·flops + β·bytes + γ·launches.

Every op is priced from its types alone (no measurements yet): the flops it performs, the bytes
it reads and writes (each operand as stored, before broadcasting, plus each result) and one
kernel launch. What kind of op it is comes from its traits (tgc/opdef.py), never from a list of
names. Some ops cost nothing:

- ops with the FREE trait: views read in place (`atomic.split`, `atomic.reshape`,
  `atomic.broadcast`: a consumer reads the pieces, the new shape or the broadcast operand with
  strides) and data (`atomic.constant`); also any `atomic.concat` of constants (canonicalize
  folds it);
- the terminator (`func.return`).

Ops with the MOVE trait (transpose, slice, concat, gather, iota, kernel.copy) move bytes but do
no arithmetic; a REDUCTION does one operation per input element rather than per output element.

The weights default to an H100 in round numbers: 50 TFLOP/s, 3 TB/s, 5 µs per launch.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tgc.ir import Operation
from tgc.opdef import FREE, MOVE, REDUCTION, TERMINATOR


@dataclass(frozen=True)
class CostWeights:
    """Seconds per flop, per byte moved and per kernel launch."""

    flop: float = 2e-14
    byte: float = 3.3e-13
    launch: float = 5e-6


@dataclass(frozen=True)
class Cost:
    flops: int = 0
    bytes: int = 0
    launches: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.flops + other.flops, self.bytes + other.bytes, self.launches + other.launches
        )

    def seconds(self, w: CostWeights) -> float:
        return w.flop * self.flops + w.byte * self.bytes + w.launch * self.launches

    def describe(self, w: CostWeights) -> str:
        return (
            f"{self.seconds(w):.4e} s (flops {self.flops}, bytes {self.bytes}, "
            f"launches {self.launches})"
        )


ZERO = Cost()


def matmul_flops(a_shape, b_shape, out_shape, transpose_a: bool) -> int:
    """2·batch·m·k·n for np.matmul producing `out_shape` (the contraction dim comes from a)."""
    k = a_shape[-2] if transpose_a else a_shape[-1]
    return 2 * math.prod(out_shape) * k


def _is_constant(value) -> bool:
    op = value.defining_op
    return op is not None and op.name == "atomic.constant"


def op_cost(op: Operation) -> Cost:
    """The cost of one op (its nested ops, if any, are priced as one kernel)."""
    name = op.name
    if op.has_trait(FREE) or op.has_trait(TERMINATOR):
        return ZERO
    if name == "atomic.concat" and all(_is_constant(v) for v in op.operands):
        return ZERO
    moved = sum(v.type.nbytes for v in op.operands) + sum(r.type.nbytes for r in op.results)
    if name == "atomic.matmul":
        a, b = op.operands
        flops = matmul_flops(
            a.type.shape, b.type.shape, op.results[0].type.shape, op.attr("transpose_a")
        )
    elif op.has_trait(MOVE):
        flops = 0
    elif op.has_trait(REDUCTION):  # one operation per input element, not per output element
        flops = op.operands[0].type.num_elements
    else:
        flops = sum(r.type.num_elements for r in op.results)
    return Cost(flops, moved, 1)


def ops_cost(ops: Iterable[Operation]) -> Cost:
    total = ZERO
    for op in ops:
        total = total + op_cost(op)
    return total
