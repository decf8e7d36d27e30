"""The passes of the CUDA route that only it needs: `lower-unsupported-attention` and
`place-on-device`. The `cuda` pipeline (passes/optimize.py) spells the whole route.

`place-on-device` rewrites a (fused) function so that:
- each argument is copied to the device once (`kernel.copy` to a `"cuda"` type) and each
  result back to the host;
- every value computed inside the function lives in device memory (its type has the `"cuda"`
  encoding, regions included);
- plain matmuls become `kernel.call {callee = "cublas.gemm", op = "atomic.matmul"}` (with
  `library-gemm=false`, or where cuBLAS cannot express the batch broadcasting, a one-op
  `kernel.fused` with the matmul template);
- an `hl.attention` the fused attention kernel runs becomes a one-op `kernel.fused` with the
  attention template, whose region reads the head-splitting views of its operands through
  strides (`attention-kernel=false`: such an op is an error, as any op no kernel runs);
- `atomic.split` becomes one `atomic.slice` per piece; every op left outside a kernel
  (elementwise ops, reductions, views such as transpose and slice, iota, concat, gather) is
  wrapped into a one-op `kernel.fused`; only `atomic.reshape` (an alias of the same buffer),
  `atomic.constant` (uploaded once) and an `atomic.slice` that is one contiguous range of its
  operand (a view into its buffer, e.g. a piece of a split along a leading axis) stay as they
  are.

The result is *placed IR*, what the CUDA executor and the standalone emitter read
(`unplaced_op` names the first op that is not). The numpy interpreter still runs it
(kernel.copy is a copy), so placement is testable without a GPU.
"""

from __future__ import annotations

from dataclasses import dataclass

from tgc.builder import Builder
from tgc.builtin import FuncOp, ModuleOp, ReturnOp
from tgc.diagnostics import TgcError
from tgc.cuda_target import attention_supported, cublas_can_run
from tgc.dialects.kernel import CopyOp
from tgc.ir import Operation
from tgc.opdef import MOVE, OPS, REDUCTION, create
from tgc.pass_manager import Pass, PassStatistics, register_pass
from tgc.passes.cuda_support import contiguous_slice_offset
from tgc.passes.fuse import (
    Group,
    Materializer,
    existing_kernel_names,
    is_elementwise,
    unique_kernel_name,
)
from tgc.patterns import erase_dead_ops
from tgc.rewriter import Rewriter

DEVICE = "cuda"
KERNEL_OPS = ("kernel.fused", "kernel.call", "kernel.copy")
# Ops a placed function holds outside kernels: aliases and host constants the runtime handles.
UNWRAPPED_OPS = ("atomic.reshape", "atomic.constant")


@register_pass
@dataclass(frozen=True)
class LowerUnsupportedAttention(Pass):
    """Replace each `hl.attention` that the fused CUDA attention kernel cannot run (element type
    other than f32/bf16/f16, a head dim over 128, an empty dim) by its decomposition, so that
    `lower-hl{keep=attention}` after it lowers those and keeps the others for the kernel.

    Contract: only such `hl.attention` ops change, each into its decomposition (one level:
    softmax, matmul... stay hl ops where the decomposition emits them); results are unchanged up
    to rounding; new ops take the location of the op they replace.
    """

    name = "lower-unsupported-attention"
    summary = "Lower each hl.attention the fused CUDA attention kernel cannot run"

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        rewriter = Rewriter()
        for op in list(func.walk()):
            if op.name == "hl.attention" and not attention_supported(op):
                rewriter.replace_op(op, op.decompose(rewriter.builder_before(op)))
                stats.bump("lowered hl.attention")


@register_pass
@dataclass(frozen=True)
class PlaceOnDevice(Pass):
    """Place every function on the GPU: every op becomes a kernel, a cuBLAS call or a copy in
    device memory (see the module docstring for what each op becomes).

    Contract: afterwards each function holds only kernel.copy (each used argument copied to the
    device once, each result back to the host), kernel.fused, kernel.call, atomic.reshape and
    atomic.constant ops before its return, and every value it computes (inside regions too) has
    the "cuda" encoding; it computes the same values. `library-gemm` (default true) turns plain
    matmuls cuBLAS runs into cuBLAS calls, else into matmul kernels; `attention-kernel`
    (default true) lets an `hl.attention` the fused kernel runs become an attention kernel. An
    op no kernel runs (an hl op left, an unsupported attention) is an error at its location. A
    function that already holds a kernel.copy is left as it is (placing twice changes nothing).
    Dead ops are erased through the rewriter in one reverse walk.
    """

    name = "place-on-device"
    summary = "Place functions on the GPU: kernels, cuBLAS calls and copies on device memory"

    library_gemm: bool = True
    attention_kernel: bool = True

    def run_on_module(self, module: ModuleOp, stats: PassStatistics) -> None:
        taken = existing_kernel_names(module)
        for func in module.funcs:
            self.place(func, taken, stats)

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        self.place(func, existing_kernel_names(func.parent_op or func), stats)

    def place(self, func: FuncOp, taken: set[str], stats: PassStatistics) -> None:
        if any(isinstance(op, CopyOp) for op in func.body.ops):
            return  # already placed
        _split_to_slices(func, stats)
        self.kernelize(func, taken, stats)
        erase_dead_ops(func.body, stats, "erased dead ops", nested=False)
        _to_device_types(func, stats)

    def kernelize(self, func: FuncOp, taken: set[str], stats: PassStatistics) -> None:
        # Last op first: a view read by a later view is cloned into that view's kernel, not copied.
        for op in reversed(list(func.body.ops)):
            if op.block is None or op is func.body.last or op.name in KERNEL_OPS:
                continue
            if stays_unwrapped(op) or not any(r.uses for r in op.results):
                continue
            kind = self.kernel_kind(op)
            if kind == "cublas":
                _to_cublas_call(op)
            else:
                _wrap(func, op, kind, taken)
            stats.bump(f"placed ({kind})")

    def kernel_kind(self, op: Operation) -> str:
        """What runs `op`: "cublas" or the template of its one-op kernel; a located error when
        no CUDA kernel can."""
        if op.name == "atomic.matmul":
            return "cublas" if self.library_gemm and cublas_can_run(op) else "matmul"
        if op.name == "hl.attention" and self.attention_kernel and attention_supported(op):
            return "attention"
        if op.has_trait(REDUCTION):
            return "row_reduction"
        if is_elementwise(op) or op.has_trait(MOVE):  # views, iota, concat, gather
            return "elementwise"
        if op.name == "hl.attention":
            why = "attention-kernel=false" if not self.attention_kernel else "unsupported"
            raise TgcError(
                f"no CUDA kernel can run this 'hl.attention' ({why}): lower it first "
                "(lower-unsupported-attention or lower-hl)",
                op.loc,
            )
        raise TgcError(
            f"no CUDA kernel can run '{op.name}' (lower it first, e.g. lower-hl)", op.loc
        )


def _split_to_slices(func: FuncOp, stats: PassStatistics) -> None:
    for op in list(func.body.ops):
        if op.name != "atomic.split":
            continue
        x = op.operands[0]
        axis = op.attr("axis") % x.type.rank
        b = Builder.before_op(op)
        start = 0
        pieces = []
        for size in op.attr("sizes"):
            lo = tuple(start if d == axis else 0 for d in range(x.type.rank))
            hi = tuple(start + size if d == axis else n for d, n in enumerate(x.type.shape))
            pieces.append(b.atomic.slice(x, start=lo, stop=hi, step=(1,) * x.type.rank))
            start += size
        for old, new in zip(op.results, pieces):
            new.name_hint = old.name_hint
            old.replace_all_uses_with(new)
        op.erase()
        stats.bump("splits into slices")


def _wrap(func: FuncOp, op: Operation, kind: str, taken: set[str]) -> None:
    name = unique_kernel_name(f"{func.sym_name}_{op.name.split('.', 1)[1]}", taken)
    space = op.results[0].type.shape
    anchor = op.next
    # Materializer clones the views an attention operand is read through (fuse's `reads_whole`).
    Materializer(func, Group(kind, space, 0, [op]), name).build(anchor)


def _to_cublas_call(op: Operation) -> None:
    b = Builder.before_op(op)
    attrs = {"callee": "cublas.gemm", "op": "atomic.matmul"}
    attrs.update(op.attributes)
    call = b.create("kernel.call", list(op.operands), attrs, [op.results[0].type])
    call.results[0].name_hint = op.results[0].name_hint
    op.results[0].replace_all_uses_with(call.results[0])
    op.erase()


def _to_device_types(func: FuncOp, stats: PassStatistics) -> None:
    body = func.body
    for op in body.ops:
        if op is body.last:
            continue
        for inner in op.walk():
            for r in inner.results:
                r.type = r.type.with_encoding(DEVICE)
            for region in inner.regions:
                for block in region.blocks:
                    for a in block.args:
                        a.type = a.type.with_encoding(DEVICE)
    first = body.first
    for arg in body.args:
        if not arg.uses:
            continue
        copy = create(
            OPS["kernel.copy"], [arg], result_types=[arg.type.with_encoding(DEVICE)], loc=func.loc
        )
        copy.results[0].name_hint = arg.name_hint
        arg.replace_uses_if(copy.results[0], lambda user, copy=copy: user is not copy)
        body.insert_before(copy, first)
        stats.bump("copies to the device")
    ret = body.last
    assert isinstance(ret, ReturnOp)
    for i, v in enumerate(list(ret.operands)):
        copy = create(
            OPS["kernel.copy"], [v], result_types=[v.type.with_encoding(None)], loc=ret.loc
        )
        body.insert_before(copy, ret)
        ret.set_operand(i, copy.results[0])
        stats.bump("copies to the host")


def stays_unwrapped(op: Operation) -> bool:
    """Ops that placed IR holds outside kernels: a reshape (the same buffer), a constant
    (uploaded once) and a slice that is one contiguous range of its operand (a pointer into the
    operand's buffer: the plan makes it a view, and a piece the function returns is no copy)."""
    return op.name in UNWRAPPED_OPS or contiguous_slice_offset(op) is not None


def unplaced_op(func: FuncOp) -> Operation | None:
    """The first op of `func` that placed IR may not hold (an op outside kernels other than
    those that `stays_unwrapped`, or a value computed outside device memory), or None."""
    body = func.body
    for op in body.ops:
        if op is body.last:
            continue
        if op.name not in KERNEL_OPS and not stays_unwrapped(op):
            return op
        if op.name != "kernel.copy" and any(r.type.encoding != DEVICE for r in op.results):
            return op
    return None


__all__ = ["LowerUnsupportedAttention", "PlaceOnDevice", "unplaced_op"]
