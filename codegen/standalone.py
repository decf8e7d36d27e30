"""One standalone .cu: every kernel, an `extern "C"` host function per function that runs it on
device pointers (scratch memory and stream included), and a `main()` under
`#ifdef TGC_STANDALONE_MAIN` that runs each function on seeded random inputs and prints
checksums.

What a function runs comes as a `DeviceProgram` (planner/standalone.py makes it from the
function as the planner plans it): buffers, and steps in order over them. A buffer is one of
the caller's inputs or outputs, a constant (its bytes are in the file and copied into scratch
memory on each call), an intermediate in one scratch arena, or a view at a byte offset into any
of those. A step is a generated kernel (`Launch`), a cuBLAS GEMM (`CublasGemm`), a cuBLASLt GEMM
with an epilogue (`CublasLt`) or a copy between buffers (`DeviceCopy`). Here the
arena is laid out (an intermediate takes bytes when it is first touched and gives them back
after its last read) and the C is written.

The file needs the CUDA runtime, and cuBLAS (cuBLASLt) where a step calls it; its header says
how to build and link it. Where the toolkit has no cuBLAS headers (nvcc alone), the file
declares the entry points it calls with the C ABI that runtime/cublas.py and
runtime/cublaslt.py call through ctypes, so it compiles wherever nvcc does.

Every C symbol comes from one `NameAllocator` for the file (kernels, host functions, constants,
the main() helpers), and IR text reaches the file only through `codegen/names.py` (comments and
the name printf shows), so any function or kernel name gives a file that compiles.

`standalone_inputs(func, seed)` gives, in numpy, the exact inputs that main() generates, so a
run on the GPU can be compared with the standalone program's checksums.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tgc.builtin import FuncOp
from tgc.codegen.cuda_ops import STORAGE_CTYPE
from tgc.codegen.names import NameAllocator, c_string_literal, comment_text
from tgc.codegen.render import KernelSource, TensorMap, prelude, render
from tgc.dialects.atomic import gather_index_bound
from tgc.dialects.kernel import CopyOp
from tgc.ir import Value
from tgc.types import TensorType

ALIGNMENT = 256  # bytes: where each buffer of the scratch memory starts (as cudaMalloc's)
# The CUDA runtime's name of each element type cuBLAS takes (library_types.h).
CUDA_DATA_TYPE = {
    "f32": "CUDA_R_32F",
    "f64": "CUDA_R_64F",
    "f16": "CUDA_R_16F",
    "bf16": "CUDA_R_16BF",
}


@dataclass(eq=False)
class Buffer:
    """Device memory: the caller's input or output `index`, a constant (`data`, its bytes), or
    scratch memory (`offset` bytes into it, set by the layout; constants live there too). A view
    is `view_offset` bytes into `base`, a buffer that is no view itself."""

    kind: str  # "input" | "output" | "scratch" | "const" | "view"
    type: TensorType
    index: int = 0
    data: bytes = b""
    offset: int = 0
    base: Buffer | None = None
    view_offset: int = 0

    @property
    def nbytes(self) -> int:
        return self.type.nbytes

    @property
    def root(self) -> Buffer:
        """The buffer whose memory this one is: its base, or itself."""
        return self.base if self.base is not None else self

    def view(self, t: TensorType, byte_offset: int = 0) -> Buffer:
        """This buffer's memory from `byte_offset` on, read as `t`."""
        return Buffer("view", t, base=self.root, view_offset=self.view_offset + byte_offset)


@dataclass
class Launch:
    """A generated kernel on its arguments: the inputs, then the outputs."""

    kernel: KernelSource
    args: list[Buffer]

    def reads(self) -> list[Buffer]:
        return self.args[: len(self.args) - self.kernel.num_outputs]

    def writes(self) -> list[Buffer]:
        return self.args[len(self.args) - self.kernel.num_outputs :]


@dataclass
class CublasGemm:
    """c = op(a) @ op(b) by cuBLAS: `gemm` has the shape (runtime/cublas.py's `Gemm`: dtype,
    m, n, k, batch, transposes, strides); `ldc` elements from one row of c to the next."""

    gemm: object
    a: Buffer
    b: Buffer
    c: Buffer
    ldc: int

    def reads(self) -> list[Buffer]:
        return [self.a, self.b]

    def writes(self) -> list[Buffer]:
        return [self.c]


@dataclass
class CublasLt:
    """out = epilogue(x @ w [+ bias] [+ residual]) by cuBLASLt: `gemm` has the shape
    (runtime/cublaslt.py's `LtGemm`: dtype, m, n, k), `epilogue` is cuBLASLt's enumerator of
    its epilogue; `workspace` is scratch memory the library may use."""

    gemm: object
    epilogue: int
    x: Buffer
    w: Buffer
    bias: Buffer | None
    residual: Buffer | None
    out: Buffer
    workspace: Buffer

    def reads(self) -> list[Buffer]:
        return [b for b in (self.x, self.w, self.bias, self.residual) if b is not None]

    def writes(self) -> list[Buffer]:
        return [self.out, self.workspace]


@dataclass
class DeviceCopy:
    src: Buffer
    dst: Buffer

    def reads(self) -> list[Buffer]:
        return [self.src]

    def writes(self) -> list[Buffer]:
        return [self.dst]


Step = Launch | CublasGemm | CublasLt | DeviceCopy


@dataclass
class DeviceProgram:
    """What one function runs: its signature (host types), buffers and steps (module doc)."""

    func: FuncOp
    inputs: list[TensorType]
    outputs: list[TensorType]
    buffers: list[Buffer] = field(default_factory=list)
    steps: list[Step] = field(default_factory=list)

    def buffer(self, kind: str, t: TensorType, **fields) -> Buffer:
        b = Buffer(kind, t.with_encoding(None), **fields)
        self.buffers.append(b)
        return b

    @property
    def kernels(self) -> list[KernelSource]:
        return [s.kernel for s in self.steps if isinstance(s, Launch)]


# -- the layout of scratch memory --------------------------------------------------------------


def _align(n: int) -> int:
    return (n + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def lay_out(program: DeviceProgram) -> int:
    """Give every intermediate its offset in scratch memory, first fit: an intermediate may take
    the bytes of those whose last read is over. Constants follow, each for the whole call.
    Returns the bytes of scratch memory the function needs."""
    first: dict[Buffer, int] = {}
    last: dict[Buffer, int] = {}
    for i, step in enumerate(program.steps):
        for b in (x.root for x in [*step.reads(), *step.writes()]):
            first.setdefault(b, i)
            last[b] = i
    live: list[tuple[int, int, int]] = []  # (offset, end, last step)
    top = 0
    scratch = [b for b in program.buffers if b.kind == "scratch" and b in first]
    for b in sorted(scratch, key=lambda b: first[b]):
        live = [x for x in live if x[2] >= first[b]]
        size = _align(max(b.nbytes, 1))
        offset = 0
        for lo, hi, _ in sorted(live):
            if offset + size <= lo:
                break
            offset = max(offset, hi)
        b.offset = offset
        live.append((offset, offset + size, last[b]))
        top = max(top, offset + size)
    for b in program.buffers:
        if b.kind == "const":
            b.offset = top
            top += _align(max(len(b.data), 1))
    return top


# -- C ---------------------------------------------------------------------------------------------


def _pointer(b: Buffer) -> str:
    ctype = STORAGE_CTYPE[b.type.element_type]
    if b.base is not None:  # a view: bytes into its base's memory
        return f"({ctype}*) ((char*) {_pointer(b.base)} + {b.view_offset})"
    if b.kind == "input":
        return f"(const {ctype}*) inputs[{b.index}]"
    if b.kind == "output":
        return f"({ctype}*) outputs[{b.index}]"
    return f"({ctype}*) (s + {b.offset})"


def _checked(call: str) -> str:
    return f"err = {call}; if (err != cudaSuccess) return err;"


def _tensor_map_code(i: int, spec: TensorMap, operand: Buffer) -> str:
    """The call making tensor map `i` of a launch (tgc_tensor_map, standalone.cu.j2), its dims,
    strides and box in arrays of their own."""
    rank = len(spec.dims)
    address = _pointer(operand)
    if spec.offset:
        address = f"(const char*) {address} + {spec.offset}"

    def array(ctype: str, name: str, values) -> str:
        return f"const {ctype} {name}{i}[{len(values)}] = {{{', '.join(map(str, values))}}};"

    numbers = [
        spec.data_type,
        address,
        rank,
        f"tgc_dims{i}",
        f"tgc_strides{i}",
        f"tgc_box{i}",
        spec.SWIZZLE_128B,
        spec.L2_PROMOTION_256B,
        spec.OOB_FILL_ZEROS,
    ]
    return "\n  ".join(
        [
            array("unsigned long long", "tgc_dims", spec.dims),
            array("unsigned long long", "tgc_strides", spec.strides or (0,)),
            array("unsigned int", "tgc_box", spec.box),
            _checked(f"tgc_tensor_map(&tgc_maps[{i}], {', '.join(map(str, numbers))})"),
        ]
    )


def _step_code(step: Step) -> str:
    if isinstance(step, Launch):
        k = step.kernel
        args = ", ".join(_pointer(b) for b in step.args)
        grid = ", ".join(map(str, k.grid))
        block = ", ".join(map(str, k.block))
        maps = [
            _tensor_map_code(i, spec, step.args[spec.operand])
            for i, spec in enumerate(k.tensor_maps)
        ]
        if maps:
            args = ", ".join([f"tgc_maps[{i}]" for i in range(len(maps))] + [args])
        launch = f"{k.name}<<<dim3({grid}), dim3({block}), {k.shared_bytes}, stream>>>({args});"
        if k.shared_bytes > 48 * 1024:
            attribute = _checked(
                f"cudaFuncSetAttribute({k.name}, cudaFuncAttributeMaxDynamicSharedMemorySize, "
                f"{k.shared_bytes})"
            )
            launch = f"{attribute}\n  {launch}"
        if maps:
            lines = [f"TgcTensorMap tgc_maps[{len(maps)}];", *maps, launch]
            return "{\n  " + "\n  ".join(lines) + "\n  }"
        return launch
    if isinstance(step, CublasGemm):
        g = step.gemm
        return _checked(
            f"tgc_gemm({CUDA_DATA_TYPE[g.dtype]}, {int(g.transpose_a)}, {int(g.transpose_b)}, "
            f"{g.m}, {g.n}, {g.k}, {_pointer(step.a)}, {g.stride_a}, {_pointer(step.b)}, "
            f"{g.stride_b}, {_pointer(step.c)}, {step.ldc}, {g.batch}, stream)"
        )
    if isinstance(step, CublasLt):
        g = step.gemm
        bias, residual = (
            _pointer(b) if b is not None else "NULL" for b in (step.bias, step.residual)
        )
        return _checked(
            f"tgc_lt_matmul({CUDA_DATA_TYPE[g.dtype]}, {g.m}, {g.n}, {g.k}, {step.epilogue}, "
            f"{int(g.transpose_b)}, "
            f"{_pointer(step.x)}, {_pointer(step.w)}, {bias}, {residual}, "
            f"{_pointer(step.out)}, {_pointer(step.workspace)}, {step.workspace.nbytes}, stream)"
        )
    if isinstance(step, DeviceCopy):
        return _checked(
            f"cudaMemcpyAsync({_pointer(step.dst)}, {_pointer(step.src)}, {step.dst.nbytes}, "
            "cudaMemcpyDeviceToDevice, stream)"
        )
    raise TypeError(step)


def write_file(
    programs: list[DeviceProgram], entries: list[str], names: NameAllocator, source_name: str
) -> str:
    """The .cu of `programs`, the host function of each named `entries[i]` (from `names`, the
    file's allocator, as the kernels' symbols are)."""
    kernels = [k for p in programs for k in p.kernels]
    features = {k.arch_features for k in kernels if k.arch_features}
    steps = [s for p in programs for s in p.steps]
    return render(
        "standalone.cu.j2",
        source_name=comment_text(source_name),
        target=sorted(features)[0] if features else None,
        cublas=any(isinstance(s, CublasGemm) for s in steps),
        cublaslt=any(isinstance(s, CublasLt) for s in steps),
        tensor_maps=any(k.tensor_maps for k in kernels),
        prelude=prelude("standalone"),
        kernels=[k.source for k in kernels],
        funcs=[
            _function_data(p, seed * 1000, entry, names)
            for seed, (p, entry) in enumerate(zip(programs, entries))
        ],
    )


def _function_data(program: DeviceProgram, seed: int, name: str, names: NameAllocator) -> dict:
    scratch_bytes = lay_out(program)
    constants = [
        {
            "symbol": names.derive(name, f"_const{i}"),
            "nbytes": max(len(b.data), 1),
            "offset": b.offset,
            "bytes": ", ".join(str(x) for x in b.data) or "0",
        }
        for i, b in enumerate(b for b in program.buffers if b.kind == "const")
    ]
    steps = [_step_code(s) for s in program.steps]
    func = program.func
    signature = ", ".join(map(str, program.inputs)) + " -> " + ", ".join(map(str, program.outputs))
    return {
        "comment_name": comment_text(func.sym_name),
        "printed_name": c_string_literal("@" + comment_text(func.sym_name)),
        "name": name,
        "main": f"tgc_main_{name}",
        "signature": comment_text(signature, limit=4000),
        "num_inputs": len(program.inputs),
        "num_outputs": len(program.outputs),
        "scratch_bytes": scratch_bytes,
        "constants": constants,
        "steps": steps,
        "seed": seed,
        "uses_scratch": bool(constants) or any("(s + " in step for step in steps),
        "inputs": [_input_data(t, index_bound(a)) for t, a in zip(program.inputs, func.body.args)],
        "outputs": [_output_data(t) for t in program.outputs],
    }


def index_bound(arg: Value) -> int | None:
    """`gather_index_bound` of a function argument, planned or not: a kernel reads the argument
    as a block argument of its region."""
    bounds = []
    pending = [arg]
    while pending:
        v = pending.pop()
        bound = gather_index_bound(v)
        if bound is not None:
            bounds.append(bound)
        for op, position in v.uses:
            if isinstance(op, CopyOp):
                pending.append(op.results[0])
            elif op.regions and len(op.regions[0].block.args) == len(op.operands):
                pending.append(op.regions[0].block.args[position])
    return min(bounds, default=None)


def _input_data(t: TensorType, bound: int | None) -> dict:
    e = t.element_type
    if t.is_float:
        init = "tgc_uniform((unsigned int) i, seed)"
        if e == "bf16":
            init = f"__float2bfloat16_rn({init})"
        elif e == "f16":
            init = f"__float2half_rn({init})"
    elif e == "i1":
        init = "(tgc_hash((unsigned int) i, seed) & 1u) != 0"
    else:
        init = f"({STORAGE_CTYPE[e]}) (tgc_hash((unsigned int) i, seed) % {bound or 4}u)"
    return {"ctype": STORAGE_CTYPE[e], "nbytes": t.nbytes, "numel": t.num_elements, "init": init}


def _output_data(t: TensorType) -> dict:
    e = t.element_type
    to_float = {
        "bf16": "__bfloat162float(h[i])",
        "f16": "__half2float(h[i])",
        "i1": "(h[i] ? 1.0 : 0.0)",
    }.get(e, "h[i]")
    return {
        "ctype": STORAGE_CTYPE[e],
        "nbytes": t.nbytes,
        "numel": t.num_elements,
        "to_float": to_float,
    }


def _hash(i: np.ndarray, seed: int) -> np.ndarray:
    m = np.uint64(0xFFFFFFFF)
    h = (i * np.uint64(2654435761) + np.uint64(((seed + 1) * 2246822519) & 0xFFFFFFFF)) & m
    h ^= h >> np.uint64(16)
    h = (h * np.uint64(0x85EBCA6B)) & m
    h ^= h >> np.uint64(13)
    h = (h * np.uint64(0xC2B2AE35)) & m
    h ^= h >> np.uint64(16)
    return h


def standalone_inputs(func: FuncOp, seed: int) -> list[np.ndarray]:
    """The inputs main() generates for `func` (its seed is 1000 x the function's position)."""
    out = []
    for k, arg in enumerate(func.body.args):
        t = arg.type
        i = np.arange(t.num_elements, dtype=np.uint64) & np.uint64(0xFFFFFFFF)
        h = _hash(i, seed + k)
        if t.is_float:
            u = (h >> np.uint64(8)).astype(np.float32) * np.float32(2.0 / 16777216.0) - np.float32(
                1.0
            )
            out.append(u.astype(t.dtype).reshape(t.shape))
        elif t.element_type == "i1":
            out.append(((h & np.uint64(1)) != 0).reshape(t.shape))
        else:
            bound = index_bound(arg) or 4
            out.append((h % np.uint64(bound)).astype(t.dtype).reshape(t.shape))
    return out


def checksums(results: list[np.ndarray]) -> list[tuple[float, float]]:
    """(sum, sum of |x|) in float64, as main() prints them."""
    out = []
    for r in results:
        x = np.asarray(r).astype(np.float64)
        out.append((float(x.sum()), float(np.abs(x).sum())))
    return out


__all__ = [
    "Buffer",
    "CublasGemm",
    "CublasLt",
    "DeviceCopy",
    "DeviceProgram",
    "Launch",
    "checksums",
    "lay_out",
    "standalone_inputs",
    "write_file",
]
