"""An execution plan: the buffers and the ordered steps that run a placed function on a GPU.

Both the PyCUDA executor and the standalone .cu emitter run the same plan, so what the
standalone file computes is what the runtime computes. Buffers are the function's inputs and
outputs (given by the caller), constants (uploaded once), and intermediates, which share one
scratch arena: an intermediate gets an offset when it is first written and gives its bytes back
after its last read (a reshape is the same buffer under another shape).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tgc.builtin import FuncOp
from tgc.codegen.kernels import (
    KernelSource,
    generate_epilogue_kernel,
    generate_kernel,
    matmul_of,
    module_names,
)
from tgc.codegen.names import NameAllocator
from tgc.diagnostics import Location, TgcError
from tgc.dialects.kernel import CallOp, CopyOp, FusedOp
from tgc.ir import Operation, Value
from tgc.passes.cuda_support import cublas_can_run
from tgc.passes.place_on_device import unplaced_op
from tgc.types import TensorType

ALIGNMENT = 256


@dataclass(eq=False)
class Buffer:
    kind: str  # "input" | "output" | "scratch" | "const"
    type: TensorType
    index: int = 0  # input or output position
    offset: int = 0  # scratch: offset in the arena
    data: np.ndarray | None = None  # const: the host value
    name: str = ""

    @property
    def nbytes(self) -> int:
        return self.type.nbytes


@dataclass
class Launch:
    kernel: KernelSource
    args: list[Buffer]  # inputs, then outputs


@dataclass
class Gemm:
    """C = op(A) @ op(B), row-major, `batch` times (stride 0: the operand is shared)."""

    name: str
    dtype: str
    m: int
    n: int
    k: int
    batch: int
    transpose_a: bool
    transpose_b: bool
    stride_a: int
    stride_b: int
    a: Buffer
    b: Buffer
    c: Buffer
    loc: Location | None = None


@dataclass
class DeviceCopy:
    src: Buffer
    dst: Buffer


Step = Launch | Gemm | DeviceCopy


@dataclass
class Plan:
    func_name: str
    inputs: list[TensorType]
    outputs: list[TensorType]
    buffers: list[Buffer] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    scratch_bytes: int = 0

    @property
    def kernels(self) -> list[KernelSource]:
        return [s.kernel for s in self.steps if isinstance(s, Launch)]

    @property
    def constants(self) -> list[Buffer]:
        return [b for b in self.buffers if b.kind == "const"]


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _empty_tensor(op: Operation) -> TensorType | None:
    for v in list(op.operands) + list(op.results):
        if isinstance(v.type, TensorType) and v.type.num_elements == 0:
            return v.type
    return None


def _zero_size_user(op: Operation) -> tuple[Operation, TensorType] | None:
    """The first op, in program order, that reads or writes a tensor without elements: an op
    inside a region before the region's op (its location is the source op's), kernel.copy
    skipped (placement gives it the function's location)."""
    for region in op.regions:
        for block in region.blocks:
            for inner in block.ops:
                found = _zero_size_user(inner)
                if found is not None:
                    return found
    empty = _empty_tensor(op) if op.name != "kernel.copy" else None
    return (op, empty) if empty is not None else None


def refuse_zero_size(func: FuncOp) -> None:
    """The CUDA backend does not run tensors without elements (a kernel over an empty row would
    declare zero-sized arrays): a diagnostic at the first op that touches one."""
    for op in func.body.ops:
        found = _zero_size_user(op)
        if found is not None:
            user, empty = found
            raise TgcError(
                "zero-size tensors are not supported on the cuda backend "
                f"({empty.with_encoding(None)})",
                user.loc if user.loc is not None else func.loc,
            )


def require_placed(func: FuncOp) -> None:
    """The CUDA backend reads placed IR (the output of `place-on-device`): a diagnostic at the
    first op of `func` that is not."""
    op = unplaced_op(func)
    if op is not None:
        kernel = op.name.startswith("kernel.")
        what = "computes in host memory" if kernel else "is not placed on the device"
        raise TgcError(
            f"'{op.name}' {what}: the CUDA backend runs placed IR (run the 'cuda' pipeline, or "
            "end the pipeline with 'place-on-device')",
            op.loc if op.loc is not None else func.loc,
        )


def build_plan(
    func: FuncOp,
    kernel_params: dict[str, dict] | None = None,
    library_matmul: bool = True,
    names: NameAllocator | None = None,
) -> Plan:
    """The plan of a function already placed on the device (by the `place-on-device` pass).
    `kernel_params` maps a kernel's IR name (or "*", every kernel) to template parameters.
    Kernel symbols come from `names` (one allocator per translation unit; by default a fresh
    one), so kernels whose IR names sanitise alike still get distinct symbols.

    With `library_matmul`, a matmul kernel whose matmul cuBLAS can run becomes a cuBLAS GEMM
    into scratch memory followed by its epilogue as a generated elementwise kernel; otherwise
    (and in the standalone file) the generated matmul template runs it whole."""
    require_placed(func)
    refuse_zero_size(func)
    kernel_params = kernel_params or {}
    names = names if names is not None else module_names()
    body = func.body
    ret = body.last
    plan = Plan(func.sym_name, list(func.function_type.inputs), list(func.function_type.results))
    buf: dict[Value, Buffer] = {}
    first_use: dict[Buffer, int] = {}
    last_use: dict[Buffer, int] = {}

    def new(kind, t, **kw) -> Buffer:
        b = Buffer(kind, t.with_encoding(None), **kw)
        plan.buffers.append(b)
        return b

    def use(b: Buffer, step: int) -> None:
        first_use.setdefault(b, step)
        last_use[b] = step

    arg_index = {a: i for i, a in enumerate(body.args)}
    for op in body.ops:
        step = len(plan.steps)
        if op is ret:
            break
        if isinstance(op, CopyOp):
            src = op.operands[0]
            if src in arg_index:
                buf[op.results[0]] = new("input", src.type, index=arg_index[src])
            continue
        if op.name == "atomic.reshape":
            buf[op.results[0]] = buf[op.operands[0]]
            continue
        if op.name == "atomic.constant":
            t = op.results[0].type
            data = np.ascontiguousarray(np.broadcast_to(op.attr("value").array, t.shape)).astype(
                t.dtype
            )
            buf[op.results[0]] = new("const", t, data=data)
            continue
        ins = [buf[v] for v in op.operands]
        outs = [new("scratch", r.type, name=r.name_hint or "") for r in op.results]
        for r, b in zip(op.results, outs):
            buf[r] = b
        for b in ins + outs:
            use(b, step)
        if (
            isinstance(op, FusedOp)
            and op.attr("template") == "matmul"
            and library_matmul
            and cublas_can_run(matmul_of(op))
        ):
            mm = matmul_of(op)
            product = new("scratch", mm.results[0].type, name="matmul")
            use(product, step)
            args = {a: b for a, b in zip(op.body.args, ins)}
            plan.steps.append(_gemm(mm, [args[x] for x in mm.operands], product))
            params = kernel_params.get(op.attr("name"), kernel_params.get("*"))
            symbol = names.allocate(f"{op.attr('name')}_epilogue")
            kernel = generate_epilogue_kernel(op, params, symbol)
            plan.steps.append(Launch(kernel, ins + [product] + outs))
            for b in ins + [product] + outs:
                use(b, step + 1)
        elif isinstance(op, FusedOp):
            params = kernel_params.get(op.attr("name"), kernel_params.get("*"))
            kernel = generate_kernel(op, params, names.allocate(str(op.attr("name"))))
            plan.steps.append(Launch(kernel, ins + outs))
        elif isinstance(op, CallOp) and op.attr("callee") == "cublas.gemm":
            plan.steps.append(_gemm(op, ins, outs[0]))
        else:
            raise TgcError(f"the CUDA plan cannot run '{op.name}'", op.loc)

    for j, v in enumerate(ret.operands):
        copy = v.defining_op
        if not isinstance(copy, CopyOp):
            raise TgcError("a placed function returns values copied to the host", ret.loc)
        src = buf[copy.operands[0]]
        if src.kind == "scratch":
            src.kind, src.index = "output", j
            continue
        out = new("output", copy.results[0].type, index=j)
        plan.steps.append(DeviceCopy(src, out))
    _assign_offsets(plan, first_use, last_use)
    return plan


def _gemm(op: CallOp, ins: list[Buffer], out: Buffer) -> Gemm:
    a, b = op.operands
    ta, tb = bool(op.attr("transpose_a")), bool(op.attr("transpose_b"))
    shape = op.results[0].type.shape
    m, n = shape[-2], shape[-1]
    k = a.type.shape[-2] if ta else a.type.shape[-1]
    batch = 1
    for d in shape[:-2]:
        batch *= d
    stride_a = m * k if any(d != 1 for d in a.type.shape[:-2]) else 0
    stride_b = k * n if any(d != 1 for d in b.type.shape[:-2]) else 0
    return Gemm(
        op.attr("op"),
        op.results[0].type.element_type,
        m,
        n,
        k,
        batch,
        ta,
        tb,
        stride_a,
        stride_b,
        ins[0],
        ins[1],
        out,
        op.loc,
    )


def _assign_offsets(plan: Plan, first_use: dict, last_use: dict) -> None:
    """First fit in an arena: a buffer may reuse the bytes of buffers whose last read is over."""
    live: list[tuple[int, int, int]] = []  # (offset, end, last step)
    top = 0
    scratch = [b for b in plan.buffers if b.kind == "scratch" and b in first_use]
    for b in sorted(scratch, key=lambda b: first_use[b]):
        start = first_use[b]
        live = [x for x in live if x[2] >= start]
        size = _align(max(b.nbytes, 1))
        offset = 0
        for lo, hi, _ in sorted(live):
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        live.append((offset, offset + size, last_use[b]))
        top = max(top, offset + size)
    plan.scratch_bytes = top
