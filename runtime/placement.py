"""Place a function on the GPU: every op becomes something the CUDA runtime can run.

`place_on_device(func)` rewrites a (fused) function so that:
- each argument is copied to the device once (`kernel.copy` to a `"cuda"` type) and each
  result back to the host;
- every value computed inside the function lives in device memory (its type has the `"cuda"`
  encoding, regions included);
- plain matmuls become `kernel.call {callee = "cublas.gemm", op = "atomic.matmul"}` (with
  `library=False`, or where cuBLAS cannot express the batch broadcasting, a one-op
  `kernel.fused` with the matmul template);
- `atomic.split` becomes one `atomic.slice` per piece; every op left outside a kernel
  (elementwise ops, reductions, views such as transpose and slice, iota, concat, gather) is
  wrapped into a one-op `kernel.fused`; only `atomic.reshape` (an alias of the same buffer)
  and `atomic.constant` (uploaded once) stay as they are.

The numpy interpreter still runs the result (kernel.copy is a copy), so this step is testable
without a GPU.
"""

from __future__ import annotations

import os

from tgc.builder import Builder
from tgc.builtin import FuncOp, ReturnOp
from tgc.codegen.attention import attention_supported, strided_layout
from tgc.codegen.plan import cublas_can_run
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import CallOp, CopyOp, FusedOp
from tgc.ir import Operation
from tgc.opdef import OPS, create
from tgc.passes.fuse import (
    REDUCE_OPS,
    VIEW_OPS,
    Group,
    Materializer,
    existing_kernel_names,
    is_elementwise,
    is_free,
    unique_kernel_name,
)

DEVICE = "cuda"
KERNEL_OPS = ("kernel.fused", "kernel.call", "kernel.copy")
SINGLE_OP_KERNELS = VIEW_OPS | {"atomic.iota", "atomic.concat", "atomic.gather"}


def _split_to_slices(func: FuncOp) -> None:
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


class _AttentionMaterializer(Materializer):
    """The region of one `hl.attention`: an operand that is a chain of views of a value computed
    elsewhere (the head-splitting reshape + transpose of a slice of qkv) is cloned into the
    region, where the kernel reads it through strides; anything else is a whole input."""

    def takes_whole(self, op: Operation, v) -> bool:
        if op.name != "hl.attention":
            return super().takes_whole(op, v)
        found = strided_layout(v)
        if found is None:
            return True
        root = found[0].defining_op
        return root is not None and is_free(root)


def _wrap(func: FuncOp, op: Operation, kind: str, taken: set[str]) -> None:
    name = unique_kernel_name(f"{func.sym_name}_{op.name.split('.', 1)[1]}", taken)
    space = op.results[0].type.shape
    anchor = op.next
    cls = _AttentionMaterializer if kind == "attention" else Materializer
    cls(func, Group(kind, space, 0, [op]), name).build(anchor)


def _kernelize(func: FuncOp, library: bool, taken: set[str]) -> None:
    # Last op first: a view read by a later view is cloned into that view's kernel, not copied.
    for op in reversed(list(func.body.ops)):
        if op.block is None or op is func.body.last or op.name in KERNEL_OPS:
            continue
        if op.name in ("atomic.reshape", "atomic.constant"):
            continue
        if not any(r.uses for r in op.results):
            continue
        if op.name == "atomic.matmul":
            if library and cublas_can_run(op):
                b = Builder.before_op(op)
                attrs = {"callee": "cublas.gemm", "op": "atomic.matmul"}
                attrs.update({k: v for k, v in op.attributes.items()})
                call = b.create("kernel.call", list(op.operands), attrs, [op.results[0].type])
                call.results[0].name_hint = op.results[0].name_hint
                op.results[0].replace_all_uses_with(call.results[0])
                op.erase()
            else:
                _wrap(func, op, "matmul", taken)
            continue
        if op.name == "hl.attention" and attention_supported(op):
            _wrap(func, op, "attention", taken)
        elif op.name in REDUCE_OPS:
            _wrap(func, op, "row_reduction", taken)
        elif is_elementwise(op) or op.name in SINGLE_OP_KERNELS:
            _wrap(func, op, "elementwise", taken)
        else:
            raise TgcError(
                f"no CUDA kernel can run '{op.name}' (lower it first, e.g. lower-hl)", op.loc
            )
    _erase_dead(func)


def _erase_dead(func: FuncOp) -> None:
    changed = True
    while changed:
        changed = False
        for op in list(func.body.ops_reversed()):
            if (
                op is not func.body.last
                and not any(r.uses for r in op.results)
                and op.name != "kernel.copy"
            ):
                op.erase()
                changed = True


def _to_device_types(func: FuncOp) -> None:
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
    ret = body.last
    assert isinstance(ret, ReturnOp)
    for i, v in enumerate(list(ret.operands)):
        copy = create(
            OPS["kernel.copy"], [v], result_types=[v.type.with_encoding(None)], loc=ret.loc
        )
        body.insert_before(copy, ret)
        ret.set_operand(i, copy.results[0])


def place_on_device(func: FuncOp, library: bool = True) -> FuncOp:
    if any(isinstance(op, CopyOp) for op in func.body.ops):
        return func  # already placed
    taken = existing_kernel_names(func.parent_op or func)
    _split_to_slices(func)
    _kernelize(func, library, taken)
    _to_device_types(func)
    return func


def attention_kernel_default() -> bool:
    """The fused attention kernel is on unless TGC_ATTENTION_KERNEL=0."""
    return os.environ.get("TGC_ATTENTION_KERNEL", "1") != "0"


def default_cuda_pipeline(attention_kernel: bool | None = None) -> str:
    """tgc-translate --emit=cuda's default pipeline: `optimize,fuse`, where optimize's lower-hl
    keeps `hl.attention` for the fused attention kernel (unless TGC_ATTENTION_KERNEL=0)."""
    if attention_kernel is None:
        attention_kernel = attention_kernel_default()
    if not attention_kernel:
        return "optimize,fuse"
    from tgc.passes.lower_hl import hl_op_names

    ops = ",".join(n for n in hl_op_names() if n != "hl.attention")
    return f"lower-hl{{ops={ops}}},canonicalize,cse,algebraic,canonicalize,cse,dce,fuse"


def lower_for_device(module, attention_kernel: bool) -> None:
    """`lower-hl`, except that with `attention_kernel` every `hl.attention` the fused kernel can
    run stays (placement gives it the `attention` template); the others are lowered."""
    from tgc.pass_manager import PASSES, PassManager
    from tgc.passes.lower_hl import LowerHL, hl_op_names
    from tgc.rewriter import Rewriter

    if "lower-hl" not in PASSES:
        return
    if not attention_kernel:
        PassManager.from_text("lower-hl").run(module)
        return
    rewriter = Rewriter()
    for op in list(module.walk()):
        if op.name == "hl.attention" and not attention_supported(op):
            rewriter.replace_op(op, op.decompose(rewriter.builder_before(op)))
    others = tuple(n for n in hl_op_names() if n != "hl.attention")
    PassManager([LowerHL(ops=others)]).run(module)


def prepare_module(
    module,
    func: FuncOp,
    library: bool = True,
    matmul_epilogue: bool | None = None,
    attention_kernel: bool | None = None,
) -> FuncOp:
    """Lower what is left of hl, fuse, and place `func` on the device; verifies the module.

    With a library (cuBLAS) for matmuls, fusion leaves matmuls alone by default, so that their
    elementwise consumers fuse forward (an elementwise consumer into the next row kernel);
    without one, each matmul kernel takes its epilogue. With `attention_kernel` (default: on,
    unless TGC_ATTENTION_KERNEL=0) `hl.attention` runs as one fused flash-attention kernel
    instead of matmul, softmax, matmul. Kernels fused before are kept."""
    from tgc.pass_manager import PassManager
    from tgc.verifier import verify

    if attention_kernel is None:
        attention_kernel = attention_kernel_default()
    if any(op.name.startswith("hl.") for op in func.walk()):
        lower_for_device(module, attention_kernel)
    epilogue = (not library) if matmul_epilogue is None else matmul_epilogue
    PassManager.from_text(f"fuse{{matmul-epilogue={str(epilogue).lower()}}}").run(module)
    place_on_device(func, library)
    verify(module)
    return func


def is_placed(func: FuncOp) -> bool:
    return all(
        op.name in KERNEL_OPS + ("atomic.reshape", "atomic.constant", "func.return")
        for op in func.body.ops
    )


__all__ = ["CallOp", "FusedOp", "cublas_can_run", "is_placed", "place_on_device", "prepare_module"]
