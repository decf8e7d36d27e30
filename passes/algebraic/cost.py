"""The cost model of the `algebraic` pass: a roofline per kernel, plus its launch.

    seconds(op) = max(α·flops, β·bytes) + γ·launches

Every op is priced from its types alone (no measurements yet): the flops it performs, the bytes
it reads and writes (each operand as stored, before broadcasting, plus each result) and one
kernel launch. A kernel overlaps its arithmetic with its memory traffic, so it takes the longer
of the two, not their sum: a compute-bound matmul reads its operands for free. A function costs
the sum over its ops. What kind of op it is comes from its traits (tgc/opdef.py), never from a
list of names.

Some ops cost nothing per call:

- ops with the FREE trait: views read in place (`atomic.split`, `atomic.reshape`,
  `atomic.broadcast`: a consumer reads the pieces, the new shape or the broadcast operand with
  strides) and data (`atomic.constant`);
- the terminator (`func.return`);
- an op whose operands are all *fixed* and that has no side effects (the PURE trait). A value is
  fixed when it is a function argument marked `{tgc.param}` (a weight that does not change
  between calls) or the result of a PURE op whose operands are all fixed (so every constant and
  iota, which have no operands). Such an op computes the same value on every call, so a plan
  runs it once, in its prologue, before the first call with a given set of parameters
  (codegen/plan.py `prologue_steps`, runtime/cuda_executor.py): a concat of weights that are
  parameters or constants is packed once, which is what makes merging matmuls that share an
  input pay. A concat of plain arguments keeps costing its bytes and its launch on every call.

Ops with the MOVE trait (transpose, slice, concat, gather, iota, kernel.copy) move bytes but do
no arithmetic; a REDUCTION does one operation per input element rather than per output element.

The weights default to an H100 in round numbers: 50 TFLOP/s (fp32 without tensor cores), 3 TB/s
and 3 µs per launch, for what a kernel boundary costs the GPU while the host enqueues ahead. (In
issue 8's measurement the merged bf16 QKV took 0.129 ms for five kernels that would take about
0.122 ms back to back at eager's GEMM rate and full bandwidth: about 1.5 µs a boundary. A
host-bound plan of tiny kernels pays more a launch, but there any rewrite saving one wins.)
With them, merging the three GPT-2 QKV projections of x 8192x1024 (weights 1024x1024) saves two
launches, 6 µs (each matmul is compute-bound, so reading x twice less saves nothing), and with
plain-argument weights costs a concat moving 25.2 MB in f32 (8.3 µs + 3 µs) or 12.6 MB in bf16
(4.2 µs + 3 µs): both stay unmerged. With `{tgc.param}` weights the concat is free and both
merge.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.ir import BlockArgument, Operation, Value
from tgc.opdef import FREE, MOVE, PURE, REDUCTION, TERMINATOR


@dataclass(frozen=True)
class CostWeights:
    """Seconds per flop, per byte moved and per kernel launch."""

    flop: float = 2e-14
    byte: float = 3.3e-13
    launch: float = 3e-6


@dataclass(frozen=True)
class Cost:
    """The work of one kernel (or, summed, of several: for reports)."""

    flops: int = 0
    bytes: int = 0
    launches: int = 0

    def __add__(self, other: Cost) -> Cost:
        return Cost(
            self.flops + other.flops, self.bytes + other.bytes, self.launches + other.launches
        )

    def seconds(self, w: CostWeights) -> float:
        """The time of this work done by ONE kernel: its roofline plus its launch. (The time of
        several ops is the sum of theirs: `ops_seconds`, not the seconds of their summed Cost.)"""
        return max(w.flop * self.flops, w.byte * self.bytes) + w.launch * self.launches


ZERO = Cost()

# Whether a value is fixed, by value: shared by the queries of one pricing so that each value's
# producers are walked once (a walk up a long chain for every op would be quadratic).
FixedMemo = dict[Value, bool]


def matmul_flops(a_shape, b_shape, out_shape, transpose_a: bool) -> int:
    """2·batch·m·k·n for np.matmul producing `out_shape` (the contraction dim comes from a)."""
    k = a_shape[-2] if transpose_a else a_shape[-1]
    return 2 * math.prod(out_shape) * k


def _is_param_arg(value: BlockArgument) -> bool:
    region = value.block.region
    owner = region.parent if region is not None else None
    return isinstance(owner, FuncOp) and owner.is_param(value.index)


def is_fixed(value: Value, memo: FixedMemo | None = None) -> bool:
    """Whether `value` is the same on every call: a `{tgc.param}` argument, or the result of a
    PURE op whose operands are all fixed (see the module docstring). An argument of any other
    block (a kernel region's) is not known to be fixed."""
    memo = {} if memo is None else memo
    stack = [value]
    while stack:  # iterative: a chain of 10^5 ops must not hit the recursion limit
        v = stack[-1]
        if v in memo:
            stack.pop()
            continue
        op = v.defining_op
        if op is None:
            memo[v] = isinstance(v, BlockArgument) and _is_param_arg(v)
            stack.pop()
            continue
        if not op.has_trait(PURE):
            memo[v] = False
            stack.pop()
            continue
        pending = [u for u in op.operands if u not in memo]
        if pending:
            stack.extend(pending)
            continue
        fixed = all(memo[u] for u in op.operands)
        for r in op.results:
            memo[r] = fixed
        stack.pop()
    return memo[value]


def computed_once(op: Operation, memo: FixedMemo | None = None) -> bool:
    """Whether `op` runs once, when the plan is built, rather than on every call: it has no
    side effects and reads only fixed values (a constant, which reads nothing, included)."""
    memo = {} if memo is None else memo
    return op.has_trait(PURE) and all(is_fixed(v, memo) for v in op.operands)


def op_cost(op: Operation, memo: FixedMemo | None = None) -> Cost:
    """The per-call cost of one op (its nested ops, if any, are priced as one kernel)."""
    if op.has_trait(FREE) or op.has_trait(TERMINATOR) or computed_once(op, memo):
        return ZERO
    moved = sum(v.type.nbytes for v in op.operands) + sum(r.type.nbytes for r in op.results)
    if op.name == "atomic.matmul":
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
    """The summed work of `ops` (flops, bytes, launches), for reports."""
    memo: FixedMemo = {}
    total = ZERO
    for op in ops:
        total = total + op_cost(op, memo)
    return total


def ops_seconds(ops: Iterable[Operation], w: CostWeights) -> float:
    """The modelled time of running `ops` once: the sum of each op's roofline and launch."""
    memo: FixedMemo = {}
    return sum(op_cost(op, memo).seconds(w) for op in ops)


def describe(ops: Iterable[Operation], w: CostWeights) -> str:
    """`<seconds> s (flops F, bytes B, launches L)` for a report."""
    ops = list(ops)
    total = ops_cost(ops)
    return (
        f"{ops_seconds(ops, w):.4e} s (flops {total.flops}, bytes {total.bytes}, "
        f"launches {total.launches})"
    )
