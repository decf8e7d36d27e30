"""The cost model of the `algebraic` pass: a roofline per kernel, plus its launch.

    seconds(op) = max(α·flops, β·bytes) + γ·launches

Every op is priced from its types alone (no measurements yet): the flops it performs, the bytes
it reads and writes (each operand as stored, before broadcasting, plus each result) and one
kernel launch. A kernel overlaps its arithmetic with its memory traffic, so it takes the longer
of the two, not their sum: a compute-bound matmul reads its operands for free. A function costs
the sum over its ops. What kind of op it is comes from its traits (tgc/opdef.py); names only
single out the matmul's flops and the split's copies.

Some ops cost nothing per call:

- ops with the FREE trait: views read in place (`atomic.split`, `atomic.reshape`,
  `atomic.broadcast`: a consumer reads the pieces, the new shape or the broadcast operand with
  strides) and data (`atomic.constant`), with one exception below;
- the terminator (`func.return`);
- an op whose operands are all *fixed* and that has no side effects (the PURE trait). A value is
  fixed when it is a function argument marked `{tgc.param}` (a weight that does not change
  between calls) or the result of a PURE op whose operands are all fixed (so every constant and
  iota, which have no operands). Such an op computes the same value on every call, so a plan
  runs it once, before the first call with a given set of parameters (planner/fixed.py, the
  executor's once steps): a concat of weights that are
  parameters or constants is packed once, which is what makes merging matmuls that share an
  input pay. A concat of plain arguments keeps costing its bytes and its launch on every call.

The exception: a piece of an `atomic.split` that the function returns, directly or through other
views (`is_result`), is its own buffer, so the plan copies it out of the split operand, one copy
kernel per piece (on the cuda route, `slice` kernels): the split costs the bytes each such piece
reads and writes, and a launch per piece. Unless the pieces are contiguous ranges of the operand
(every dim before the split axis is 1, as in the split of a stacked batched matmul along its
leading axis): the GPU plan returns those as views of the operand's buffer (the cuda
backend's `cuda.split_view`), and numpy's split makes views too, so such a split is free
however its pieces are read. Every other reader counts as reading the piece in place: an attention kernel or a fused kernel does, through strides (passes/fuse.py clones the
view into the kernel). A matmul is priced so too, although on today's cuda route a cuBLAS GEMM
reads whole buffers only (fuse.py `reads_whole`) and gets the piece through a slice kernel as
well: a function result is the one reader that needs a buffer of its own whatever a GEMM can
take. (A reshape or broadcast of a whole value may alias it, so only splits are charged.)
Inside a window of the search (graph.py), the window's `func.return` also stands for the ops
after the window: the operands it lists in `IN_PLACE_ATTR` are read by those ops, not returned.

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
(4.2 µs + 3 µs): both stay unmerged. With `{tgc.param}` weights the concat is free and they
merge where the pieces are read in place (by the attention). Where the function returns q, k and
v, the split copies each piece out: in bf16 at x 8192x768, 3 x (25.2 MB read and written, 8.3 µs,
+ 3 µs) = 34 µs against the 6 µs saved, so the three matmuls stay apart. (Issue 8 measured that
case on an H100: 0.072 ms for the merged GEMM + 0.037 ms for the three slice kernels, against
0.062 ms for three GEMMs.)
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass

from tgc.builtin import ReturnOp
from tgc.fixed import VARIES, StateMemo, fixed_state
from tgc.ir import Operation, Value
from tgc.opdef import FREE, MOVE, PURE, REDUCTION, TERMINATOR, VIEW

SPLIT = "atomic.split"
# On a search window's func.return (graph.py extract_window): the operand indices that stand for
# values the ops after the window read, rather than results of the function.
IN_PLACE_ATTR = "tgc.read_in_place"


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

# The fixed states of values (tgc/fixed.py): shared by the queries of one pricing so that each
# value's producers are walked once (a walk up a long chain for every op would be quadratic).
FixedMemo = StateMemo


def matmul_flops(a_shape, b_shape, out_shape, transpose_a: bool) -> int:
    """2·batch·m·k·n for np.matmul producing `out_shape` (the contraction dim comes from a)."""
    k = a_shape[-2] if transpose_a else a_shape[-1]
    return 2 * math.prod(out_shape) * k


def is_fixed(value: Value, memo: FixedMemo | None = None) -> bool:
    """Whether `value` is the same on every call: a `{tgc.param}` argument, or the result of a
    PURE op whose operands are all fixed (see the module docstring; the walk is tgc/fixed.py's).
    An argument of any other block (a kernel region's) is not known to be fixed."""
    return fixed_state(value, {} if memo is None else memo) != VARIES


def computed_once(op: Operation, memo: FixedMemo | None = None) -> bool:
    """Whether `op` runs once, when the plan is built, rather than on every call: it has no
    side effects and reads only fixed values (a constant, which reads nothing, included)."""
    memo = {} if memo is None else memo
    return op.has_trait(PURE) and all(is_fixed(v, memo) for v in op.operands)


def is_result(value: Value) -> bool:
    """Whether the function returns `value`, directly or through views (ops with the FREE and
    VIEW traits: split, reshape, broadcast), so that it must be written out as its own buffer.
    An operand of a window's func.return listed in its IN_PLACE_ATTR does not count."""
    stack, seen = [value], set()
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        for user, index in v.uses:
            if isinstance(user, ReturnOp):
                if index not in (user.attr(IN_PLACE_ATTR) or ()):
                    return True
            elif user.has_trait(FREE) and user.has_trait(VIEW):
                stack.extend(user.results)
    return False


def pieces_are_contiguous(split: Operation) -> bool:
    """Whether each piece of `split` is one contiguous range of its row-major operand."""
    x = split.operands[0].type
    return math.prod(x.shape[: split.attr("axis") % x.rank]) == 1


def _copied_pieces(split: Operation) -> Cost:
    """The copies that write the returned pieces of a split out (the module docstring): each
    reads and writes its piece, one launch each. Nothing when every piece is read in place, or
    when the pieces are contiguous ranges of the operand (every dim before the split axis is 1),
    which a plan returns as views."""
    if pieces_are_contiguous(split):
        return ZERO
    pieces = [r for r in split.results if is_result(r)]
    return Cost(0, 2 * sum(r.type.nbytes for r in pieces), len(pieces))


def op_cost(op: Operation, memo: FixedMemo | None = None) -> Cost:
    """The per-call cost of one op (its nested ops, if any, are priced as one kernel)."""
    if op.has_trait(TERMINATOR) or computed_once(op, memo):
        return ZERO
    if op.has_trait(FREE):
        return _copied_pieces(op) if op.name == SPLIT else ZERO
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
