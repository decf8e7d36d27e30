"""The standalone `.cu` of `tgc-translate --emit=cuda`: each function planned for the GPU as the
GPU route plans it where nothing is measured, then written as C (codegen/standalone.py).

Planning (`plan_standalone`) is the route's (planner/route.py) with what needs no GPU and no
database: the arguments and results move to device memory (the caller's values live there);
`select-kernels` chooses among the route's device kernels but PyTorch's (a C file cannot call
it), constants made on the host and copied where they are read (`host_constants`), within the
route's tolerance by element type, costed by the default cost source
(`RooflineCostSource.gpu_defaults()`), and the plan is written as IR (`materialise`). The CUDA
backend's kernels are registered for the while, their regions made for the GPU `arch` names
(planner/backends/cuda_kernels.py, `planning_kernels`). Without `libraries` the plan takes
tgc's generated kernels alone (no cuBLAS, no cuBLASLt): a file that needs only the CUDA runtime,
and what a benchmark or a test of the templates runs.

Writing (`device_program`) walks the planned function's ops in order:

- the `kernel.call` of a generated kernel (callee `cuda.<template>`): the kernel of its region,
  generated with the template parameters the call names, launched;
- `cuda.cublas.gemm`: a cuBLAS GEMM; `cuda.cublas.gemm_padded` and `cuda.cublas.gemm_split`:
  two (the aligned columns, the rest), into rows padded to 16 bytes and then codegen/compact.py's
  kernel copying them into the compact result (as the planner's executor does: cudaMemcpy2D
  was slower, bench/results/design-evidence-2026-11-28.md), or into that result itself; `cuda.cublaslt.*`: a cuBLASLt GEMM with
  the bias (and the GELU or the residual) in its epilogue;
- `cuda.split_view`, `cuda.reshape_view`: views of the operand's memory, nothing run;
- `cuda.write_rows`: the operand copied into the result, then codegen/write_rows.py's kernel
  writing the rows there (the file never writes its caller's inputs);
- `numpy.atomic.constant` and the `kernel.copy` that takes its value to the device: a constant,
  its bytes in the file.

A result that is not memory a step writes (an argument, a view, a constant, a value returned
twice) is copied into the caller's output.

Refused, each with one error at its op: kernel ops in the input (the emitter plans the program
itself, so `-p` may not make kernels), tensors without elements (no CUDA kernel runs them), and
an op no CUDA kernel can run (select-kernels' error).
"""

from __future__ import annotations

import numpy as np

from tgc.builtin import FuncOp, ModuleOp
from tgc.codegen.compact import compact_rows_kernel
from tgc.codegen.kernels import SYMBOL_FORMS, generate_kernel, module_names
from tgc.codegen.names import NameAllocator
from tgc.codegen.write_rows import write_rows_kernel
from tgc.codegen.standalone import (
    Buffer,
    CublasGemm,
    CublasLt,
    DeviceCopy,
    DeviceProgram,
    Launch,
    write_file,
)
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import CallOp, CopyOp
from tgc.ir import Operation, Value
from tgc.opdef import FREE, MOVE
from tgc.planner import kernel_backends, load_backends
from tgc.planner.backends import TEMPLATES
from tgc.planner.backends import cuda_kernels as ck
from tgc.planner.cost import CachedCosts, RooflineCostSource
from tgc.planner.materialise import materialise
from tgc.planner.options import HOST_CONSTANT, PlanContext
from tgc.planner.kernel import KERNELS
from tgc.planner.route import (
    DEVICE,
    DEVICE_BACKENDS,
    is_library,
    move_signature_to_device,
    plan_tolerance,
)
from tgc.planner.select import plan_function, prepare
from tgc.runtime.cublaslt import EPILOGUES, WORKSPACE_BYTES
from tgc.types import TensorType

# The route's device kernels but PyTorch's: a standalone program cannot call it.
FILE_BACKENDS = DEVICE_BACKENDS - kernel_backends(("torch",))
# The callees of generated kernels (their regions are their code).
GENERATED = frozenset(t.name for t in ck.TEMPLATE_OF_KIND.values())


def emit_standalone_cuda(
    module: ModuleOp,
    source_name: str = "<module>",
    arch: str | None = None,
    libraries: bool = True,
) -> str:
    """The .cu of `module` (module doc), its kernels for a GPU of `arch` (nvcc's name,
    "sm_90"; None: any sm_80 or later), with cuBLAS and cuBLASLt among its kernels unless
    `libraries` is false. The functions are planned in place. Where a kernel needs its
    architecture's own features (sm_90a's wgmma), the header says how to build."""
    for func in module.funcs:
        refuse_unplannable(func)
    names = module_names()
    # Host functions first: `tgc_run_<f>` is the file's interface, so a kernel moves aside.
    entries = [
        names.allocate(f.sym_name, "tgc_run_", ["{}_scratch_bytes", "tgc_main_{}"])
        for f in module.funcs
    ]
    programs = []
    with ck.planning_kernels(arch):
        for func in module.funcs:
            plan_standalone(func, libraries)
            programs.append(device_program(func, names, arch))
    return write_file(programs, entries, names, source_name)


def refuse_unplannable(func: FuncOp) -> None:
    """One located error for a function the emitter cannot plan (module doc)."""
    for op in func.body.ops:
        if op.name.startswith("kernel."):
            raise TgcError(
                f"'{op.name}' is a kernel already: tgc-translate --emit=cuda plans the program "
                "for the GPU itself, so -p may not make kernels (leave out 'fuse' and "
                "'select-kernels')",
                op.loc if op.loc is not None else func.loc,
            )
        empty = next(
            (v.type for v in [*op.operands, *op.results] if v.type.num_elements == 0), None
        )
        if empty is not None:
            raise TgcError(
                f"zero-size tensors are not supported on the cuda backend ({empty})",
                op.loc if op.loc is not None else func.loc,
            )


def plan_standalone(func: FuncOp, libraries: bool = True) -> None:
    """Plan `func` in place as the standalone file runs it (module doc; without `libraries`, on
    the generated kernels alone), with the kernels of the CUDA backend registered
    (`planning_kernels`)."""
    load_backends(("numpy",))  # its constant kernel makes constants on the host
    move_signature_to_device(func)
    prepare(func)
    pool = None if libraries else [k for k in KERNELS.values() if not is_library(k)]
    ctx = PlanContext(pool, plan_tolerance(func), backends=FILE_BACKENDS, host_constants=True)
    costs = CachedCosts(RooflineCostSource.gpu_defaults())
    materialise(func, plan_function(func, ctx, costs), costs)


def set_template_params(func: FuncOp, params: dict) -> None:
    """Make every generated kernel of planned `func` with template parameters `params` and the
    template's defaults for the rest, in place of the planner's choices: what a benchmark or a
    test of one template's parameters runs."""
    for op in func.body.ops:
        if op.attributes.get("callee") in GENERATED:
            for key in [k for k in op.attributes if k.startswith("param.")]:
                del op.attributes[key]
            op.attributes.update({f"param.{k}": v for k, v in params.items()})


def device_program(func: FuncOp, names: NameAllocator, arch: str | None) -> DeviceProgram:
    """The buffers and steps of a planned function (module doc); kernel symbols from `names`."""
    return _ProgramWriter(func, names, arch).write()


def kernel_name(func: FuncOp, call: CallOp) -> str:
    """`<function>_<ops>`: up to three kinds of op the kernel computes (where it does no
    arithmetic, those that move data: a transpose, a broadcast; else its template)."""
    ops = [op for op in call.body.ops if op is not call.body.last]
    arithmetic = [op for op in ops if not op.has_trait(MOVE) and not op.has_trait(FREE)]
    kinds: list[str] = []
    for op in arithmetic or [op for op in ops if op.has_trait(MOVE)]:
        short = op.name.split(".", 1)[1]
        if short not in kinds:
            kinds.append(short)
    summary = "_".join(kinds[:3]) or TEMPLATES[call.attr("callee")].name.split(".", 1)[1]
    return f"{func.sym_name}_{summary}"


class _ProgramWriter:
    """Walks a planned function once, giving each value the buffer that holds it."""

    def __init__(self, func: FuncOp, names: NameAllocator, arch: str | None) -> None:
        ftype = func.function_type
        self.func, self.names, self.arch = func, names, arch
        self.program = DeviceProgram(
            func,
            [t.with_encoding(None) for t in ftype.inputs],
            [t.with_encoding(None) for t in ftype.results],
        )
        self.buffers: dict[Value, Buffer] = {
            a: self.program.buffer("input", a.type, index=i) for i, a in enumerate(func.body.args)
        }
        self.host: dict[Value, bytes] = {}  # host constants, until copied to the device
        self.workspace: Buffer | None = None  # cuBLASLt's, one for the function
        self.library = {
            ck.CUBLAS_GEMM: self.gemm,
            ck.CUBLAS_GEMM_PADDED: self.split_gemm,
            ck.CUBLAS_GEMM_SPLIT: self.split_gemm,
            ck.SPLIT_VIEW: self.split_view,
            ck.RESHAPE_VIEW: self.reshape_view,
            ck.WRITE_ROWS: self.write_rows,
            **{name: self.lt_gemm for name in ck.LT_KERNELS},
        }

    def write(self) -> DeviceProgram:
        body = self.func.body
        for op in body.ops:
            if op is body.last:
                break
            if isinstance(op, CopyOp):
                self.copy(op)
            elif op.attr("callee") == HOST_CONSTANT:
                self.host[op.results[0]] = _constant_bytes(op)
            elif op.attr("callee") in TEMPLATES:
                self.launch(op)
            elif op.attr("callee") in self.library:
                self.library[op.attr("callee")](op)
            else:
                raise TgcError(
                    f"the standalone file has no code for kernel '{op.attr('callee')}'", op.loc
                )
        self.return_values(body.last)
        return self.program

    def scratch(self, v: Value) -> Buffer:
        """A new intermediate holding `v`."""
        self.buffers[v] = self.program.buffer("scratch", v.type)
        return self.buffers[v]

    def operands(self, op: Operation) -> list[Buffer]:
        return [self.buffers[v] for v in op.operands]

    def copy(self, op: CopyOp) -> None:
        data = self.host.get(op.operands[0])
        if data is None or op.results[0].type.encoding != DEVICE:
            raise TgcError("the standalone file copies only constants to the device", op.loc)
        self.buffers[op.results[0]] = self.program.buffer("const", op.results[0].type, data=data)

    def launch(self, call: CallOp) -> None:
        kind = TEMPLATES[call.attr("callee")].name.split(".", 1)[1]
        name = kernel_name(self.func, call)
        fused = ck.fused_from_block(call.body, [r.type for r in call.results], kind, name, call.loc)
        params = {**({"arch": self.arch} if self.arch else {}), **ck.call_params(call)}
        kernel = generate_kernel(fused, params, self.names.allocate(name, forms=SYMBOL_FORMS))
        outs = [self.scratch(r) for r in call.results]
        self.program.steps.append(Launch(kernel, self.operands(call) + outs))

    def gemm(self, call: CallOp) -> None:
        g = ck.gemm_of([v.type for v in call.operands], call.results[0].type, call.op_attributes())
        a, b = self.operands(call)
        self.program.steps.append(CublasGemm(g, a, b, self.scratch(call.results[0]), g.n))

    def split_gemm(self, call: CallOp) -> None:
        """cuda.cublas.gemm_padded and cuda.cublas.gemm_split: their parts (aligned columns,
        the rest), into padded rows then copied compact, or into the output itself."""
        t = call.results[0].type
        g = ck.gemm_of([v.type for v in call.operands], t, call.op_attributes())
        item = t.dtype.itemsize
        ld = ck.split_ld(call.attr("callee"), g, item)
        rows = g.batch * g.m
        out = self.scratch(call.results[0])
        padded = ld != g.n
        c = (
            self.program.buffer("scratch", TensorType.get((rows, ld), t.element_type))
            if padded
            else out
        )
        a, b = self.operands(call)
        for part, into_b, into_c in ck.padded_gemm_parts(g, item):
            b_part = b.view(b.type, into_b * item) if into_b else b
            c_part = c.view(c.type, into_c * item) if into_c else c
            self.program.steps.append(CublasGemm(part, a, b_part, c_part, ld))
        if padded:
            name = self.names.allocate(f"compact_rows_{rows}x{g.n}_ld{ld}_{t.element_type}")
            kernel = compact_rows_kernel(rows, g.n, ld, t.element_type, name)
            self.program.steps.append(Launch(kernel, [c, out]))

    def lt_gemm(self, call: CallOp) -> None:
        name = call.attr("callee")
        g = ck.lt_gemm(name, [v.type for v in call.operands], call.results[0].type)
        x, w, bias, residual = ck.lt_operands(name, self.operands(call))
        if self.workspace is None:
            self.workspace = self.program.buffer(
                "scratch", TensorType.get((WORKSPACE_BYTES,), "i8")
            )
        out = self.scratch(call.results[0])
        step = CublasLt(
            g,
            EPILOGUES[g.epilogue],
            x,
            w,
            bias,
            residual,
            out,
            self.workspace,
        )
        self.program.steps.append(step)

    def split_view(self, call: CallOp) -> None:
        (x,) = self.operands(call)
        t = call.operands[0].type
        sizes = tuple(call.attr("sizes"))
        pieces = ck.split_view_pieces(t.shape, t.dtype.itemsize, call.attr("axis"), sizes)
        for r, (offset, _) in zip(call.results, pieces):
            self.buffers[r] = x.view(r.type.with_encoding(None), offset)

    def reshape_view(self, call: CallOp) -> None:
        (x,) = self.operands(call)
        self.buffers[call.results[0]] = x.view(call.results[0].type.with_encoding(None))

    def write_rows(self, call: CallOp) -> None:
        """x copied into the result, then codegen/write_rows.py's kernel writing the rows there:
        the file's inputs are the caller's, never written."""
        x, indices, values = self.operands(call)
        t, it = (v.type.with_encoding(None) for v in call.operands[:2])
        name = self.names.allocate(f"{self.func.sym_name}_write_rows", forms=SYMBOL_FORMS)
        kernel = write_rows_kernel(t, it, call.op_attributes().get("axis", 0), name)
        out = self.scratch(call.results[0])
        self.program.steps.append(DeviceCopy(x, out))
        self.program.steps.append(Launch(kernel, [values, indices, out]))

    def return_values(self, ret: Operation) -> None:
        """A value a step writes and the function returns once is written into the caller's
        output itself; any other result is copied there."""
        for j, v in enumerate(ret.operands):
            src = self.buffers[v]
            if src.kind == "scratch":
                src.kind, src.index = "output", j
                continue
            out = self.program.buffer("output", v.type, index=j)
            self.program.steps.append(DeviceCopy(src, out))


def _constant_bytes(call: CallOp) -> bytes:
    t = call.results[0].type
    value = np.broadcast_to(call.attr("value").array, t.shape)
    return np.ascontiguousarray(value).astype(t.dtype).tobytes()


__all__ = [
    "FILE_BACKENDS",
    "emit_standalone_cuda",
    "plan_standalone",
    "refuse_unplannable",
    "set_template_params",
]
