"""An execution plan: the buffers and the ordered steps that run a placed function on a GPU.

Both the PyCUDA executor and the standalone .cu emitter run the same plan, so what the
standalone file computes is what the runtime computes. Buffers are the function's inputs and
outputs (given by the caller), constants (uploaded once), and intermediates, which share one
scratch arena: an intermediate gets an offset when it is first written and gives its bytes back
after its last read (a reshape is the same buffer under another shape).

The prologue (`Plan.prologue`, from `prologue_steps`): the steps whose inputs are all fixed, that
is parameter inputs (arguments marked `{tgc.param}`), constants, or outputs of earlier prologue
steps. Every step is a pure function of the buffers it reads, so such a step computes the same
bytes on every call with the same parameters: an executor may run it once (the PyCUDA runtime
does; the standalone file runs every step on every call). A prologue step's output that a later
step reads keeps its arena bytes for the whole plan, so the prologue's results survive every
later call. The prologue is a schedule of the same placed IR, not a compiler step: no pass makes
it and the IR does not change.
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
from tgc.cuda_target import cublas_can_run
from tgc.diagnostics import Location, TgcError
from tgc.dialects.kernel import CallOp, CopyOp, FusedOp
from tgc.ir import Operation, Value
from tgc.passes.cuda_support import contiguous_slice_offset
from tgc.passes.place_on_device import unplaced_op
from tgc.types import ELEMENT_BYTES, TensorType

ALIGNMENT = 256


@dataclass(eq=False)
class Buffer:
    kind: str  # "input" | "output" | "scratch" | "const" | "view"
    type: TensorType
    index: int = 0  # input or output position
    offset: int = 0  # scratch: offset in the arena
    data: np.ndarray | None = None  # const: the host value
    name: str = ""
    # A view ("view", or an "output" the function returns as a view) is `view_offset` bytes
    # into `base`, a buffer that is not a view itself: it has no memory of its own.
    base: Buffer | None = None
    view_offset: int = 0

    @property
    def nbytes(self) -> int:
        return self.type.nbytes

    @property
    def root(self) -> Buffer:
        """The buffer whose memory this one is: its base, or itself."""
        return self.base if self.base is not None else self


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


def step_reads(step: Step) -> list[Buffer]:
    """The buffers a step reads."""
    if isinstance(step, Launch):
        return step.args[: len(step.args) - step.kernel.num_outputs]
    if isinstance(step, Gemm):
        return [step.a, step.b]
    return [step.src]


def step_writes(step: Step) -> list[Buffer]:
    """The buffers a step writes."""
    if isinstance(step, Launch):
        return step.args[len(step.args) - step.kernel.num_outputs :]
    if isinstance(step, Gemm):
        return [step.c]
    return [step.dst]


@dataclass
class Plan:
    func_name: str
    inputs: list[TensorType]
    outputs: list[TensorType]
    buffers: list[Buffer] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)
    scratch_bytes: int = 0
    params: list[int] = field(default_factory=list)  # input positions marked {tgc.param}
    prologue: list[int] = field(default_factory=list)  # steps run once per set of parameters

    @property
    def kernels(self) -> list[KernelSource]:
        return [s.kernel for s in self.steps if isinstance(s, Launch)]

    @property
    def constants(self) -> list[Buffer]:
        return [b for b in self.buffers if b.kind == "const"]

    @property
    def per_call(self) -> list[int]:
        """The steps every call runs: all but the prologue, in order."""
        once = set(self.prologue)
        return [i for i in range(len(self.steps)) if i not in once]


def prologue_steps(plan: Plan) -> list[int]:
    """The positions of the steps whose inputs are all fixed: parameter inputs (`plan.params`),
    constants, or outputs of earlier such steps (see the module docstring). A step that reads
    nothing (a kernel filling an iota) is fixed too."""
    params = set(plan.params)
    fixed = {
        id(b)
        for b in plan.buffers
        if b.kind == "const" or (b.kind == "input" and b.index in params)
    }
    found = []
    for i, step in enumerate(plan.steps):
        if all(id(b.root) in fixed for b in step_reads(step)):
            found.append(i)
            fixed.update(id(b.root) for b in step_writes(step))
    return found


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
    returned_views: bool = True,
    arch: str | None = None,
) -> Plan:
    """The plan of a function already placed on the device (by the `place-on-device` pass).
    `kernel_params` maps a kernel's IR name (or "*", every kernel) to template parameters.
    `arch` (nvcc's name of the GPU the plan is for, "sm_90") is every kernel's template
    parameter `arch` unless its parameters give one: generators choose their defaults for it
    (on sm_90 the attention kernel is the wgmma one). None: kernels for any sm_80 or later.
    Kernel symbols come from `names` (one allocator per translation unit; by default a fresh
    one), so kernels whose IR names sanitise alike still get distinct symbols.

    With `library_matmul`, a matmul kernel whose matmul cuBLAS can run becomes a cuBLAS GEMM
    into scratch memory followed by its epilogue as a generated elementwise kernel; otherwise
    (and in the standalone file) the generated matmul template runs it whole.

    A slice that is one contiguous range of its operand (`contiguous_slice_offset`) is a view
    into the operand's buffer. With `returned_views`, a function result that is such a view is
    an output at that place in its base's memory, which then stays live to the end of a call;
    without (the standalone file, whose caller owns each output's memory) it is copied out."""
    require_placed(func)
    refuse_zero_size(func)
    kernel_params = kernel_params or {}
    if arch is not None:
        kernel_params = {key: {"arch": arch, **value} for key, value in kernel_params.items()}
        kernel_params.setdefault("*", {"arch": arch})
    names = names if names is not None else module_names()
    body = func.body
    ret = body.last
    plan = Plan(func.sym_name, list(func.function_type.inputs), list(func.function_type.results))
    plan.params = [i for i in range(len(plan.inputs)) if func.is_param(i)]
    buf: dict[Value, Buffer] = {}
    first_use: dict[Buffer, int] = {}
    last_use: dict[Buffer, int] = {}

    def new(kind, t, **kw) -> Buffer:
        b = Buffer(kind, t.with_encoding(None), **kw)
        plan.buffers.append(b)
        return b

    def use(b: Buffer, step: int) -> None:
        first_use.setdefault(b.root, step)
        last_use[b.root] = step

    def view(of: Buffer, t, element_offset: int) -> Buffer:
        b = Buffer("view", t.with_encoding(None), name=of.name)
        b.base, b.view_offset = (
            of.root,
            of.view_offset + element_offset * ELEMENT_BYTES[t.element_type],
        )
        plan.buffers.append(b)
        return b

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
        start = contiguous_slice_offset(op)
        if start is not None:
            buf[op.results[0]] = view(buf[op.operands[0]], op.results[0].type, start)
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
        if src.kind == "view" and returned_views:
            out = new("output", copy.results[0].type, index=j)
            out.base, out.view_offset = src.base, src.view_offset
            last_use[src.base] = len(plan.steps)  # the result is read after the last step
            continue
        out = new("output", copy.results[0].type, index=j)
        plan.steps.append(DeviceCopy(src, out))
    plan.prologue = prologue_steps(plan)
    _keep_prologue_results(plan, first_use, last_use)
    _assign_offsets(plan, first_use, last_use)
    return plan


def _keep_prologue_results(plan: Plan, first_use: dict, last_use: dict) -> None:
    """A scratch buffer that a prologue step writes and a per-call step reads is live for the
    whole plan, so no other buffer takes its bytes: the prologue runs once, its results are read
    on every call."""
    once = set(plan.prologue)
    written = {id(b.root) for i in plan.prologue for b in step_writes(plan.steps[i])}
    end = len(plan.steps)
    for i, step in enumerate(plan.steps):
        if i in once:
            continue
        for b in (r.root for r in step_reads(step)):  # a view reads its base's bytes
            if id(b) in written and b.kind == "scratch":
                first_use[b], last_use[b] = 0, end


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
