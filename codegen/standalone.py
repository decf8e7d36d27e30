"""One standalone .cu for a module: every kernel, an `extern "C"` host function per function that
runs it on device pointers (scratch memory and stream included), and a `main()` under
`#ifdef TGC_STANDALONE_MAIN` that runs each function on seeded random inputs and prints
checksums. Only the CUDA runtime is needed: matmuls use the generated template (no cuBLAS).

Every C symbol comes from one `NameAllocator` for the file (kernels, host functions, constants,
the main() helpers), and IR text reaches the file only through `codegen/names.py` (comments and
the name printf shows), so any function or kernel name gives a file that compiles.

The module must be placed IR (the `cuda-standalone` pipeline's output, which `tgc-translate
--emit=cuda` runs first): this file reads it and runs no pass.

`standalone_inputs(func, seed)` gives, in numpy, the exact inputs that main() generates, so a
run through the PyCUDA executor can be compared with the standalone program's checksums.
"""

from __future__ import annotations

import numpy as np

from tgc.builtin import FuncOp, ModuleOp
from tgc.codegen.cuda_ops import STORAGE_CTYPE
from tgc.codegen.kernels import module_names, prelude, render
from tgc.codegen.names import NameAllocator, c_string_literal, comment_text
from tgc.codegen.plan import (
    Buffer,
    DeviceCopy,
    Gemm,
    Launch,
    Plan,
    build_plan,
    refuse_zero_size,
    require_placed,
)
from tgc.diagnostics import TgcError
from tgc.dialects.atomic import gather_index_bound
from tgc.dialects.kernel import CopyOp
from tgc.ir import Value
from tgc.types import TensorType


def emit_standalone_cuda(
    module: ModuleOp, source_name: str = "<module>", arch: str | None = None
) -> str:
    """The .cu of a placed module (matmuls as generated kernels: no cuBLAS call may be left),
    its kernels for a GPU of `arch` (build_plan's; None: any sm_80 or later). Where a kernel
    needs its architecture's own features (sm_90a's wgmma), the header says how to build it."""
    for func in module.funcs:
        require_placed(func)
        refuse_zero_size(func)
    names = module_names()
    # Host functions first: `tgc_run_<f>` is the file's interface, so a kernel moves aside.
    entries = [
        names.allocate(f.sym_name, "tgc_run_", ["{}_scratch_bytes", "tgc_main_{}"])
        for f in module.funcs
    ]
    kernels: list[str] = []
    features: set[str] = set()
    funcs = []
    for seed, (func, entry) in enumerate(zip(module.funcs, entries)):
        # The caller owns each output's memory: a returned view is copied into it.
        plan = build_plan(func, library_matmul=False, names=names, returned_views=False, arch=arch)
        kernels += [k.source for k in plan.kernels]
        features |= {k.arch_features for k in plan.kernels if k.arch_features}
        funcs.append(_function_data(func, plan, seed * 1000, entry, names))
    return render(
        "standalone.cu.j2",
        source_name=comment_text(source_name),
        target=sorted(features)[0] if features else None,
        prelude=prelude("standalone"),
        kernels=kernels,
        funcs=funcs,
    )


def _function_data(func: FuncOp, plan: Plan, seed: int, name: str, names: NameAllocator) -> dict:
    const_base = plan.scratch_bytes
    constants, offset = [], const_base
    for i, b in enumerate(plan.constants):
        raw = np.ascontiguousarray(b.data).tobytes()
        b.offset = offset
        constants.append(
            {
                "symbol": names.derive(name, f"_const{i}"),
                "nbytes": max(len(raw), 1),
                "offset": offset,
                "bytes": ", ".join(str(x) for x in raw) or "0",
            }
        )
        offset += (len(raw) + 255) // 256 * 256
    steps = [_step_code(s) for s in plan.steps]
    signature = ", ".join(map(str, plan.inputs)) + " -> " + ", ".join(map(str, plan.outputs))
    args = func.body.args
    return {
        "comment_name": comment_text(func.sym_name),
        "printed_name": c_string_literal("@" + comment_text(func.sym_name)),
        "name": name,
        "main": f"tgc_main_{name}",
        "signature": comment_text(signature, limit=4000),
        "num_inputs": len(plan.inputs),
        "num_outputs": len(plan.outputs),
        "scratch_bytes": offset,
        "constants": constants,
        "steps": steps,
        "seed": seed,
        "uses_scratch": bool(constants) or any("(s + " in step for step in steps),
        "inputs": [_input_data(t, index_bound(a)) for t, a in zip(plan.inputs, args)],
        "outputs": [_output_data(t) for t in plan.outputs],
    }


def index_bound(arg: Value) -> int | None:
    """`gather_index_bound` of a function argument, placed or not: placement copies the argument
    to the device and a kernel reads the copy as a block argument of its region."""
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


def _pointer(b: Buffer) -> str:
    ctype = STORAGE_CTYPE[b.type.element_type]
    if b.base is not None:  # a view: bytes into its base's memory
        return f"({ctype}*) ((char*) {_pointer(b.base)} + {b.view_offset})"
    if b.kind == "input":
        return f"(const {ctype}*) inputs[{b.index}]"
    if b.kind == "output":
        return f"({ctype}*) outputs[{b.index}]"
    return f"({ctype}*) (s + {b.offset})"


def _step_code(step) -> str:
    if isinstance(step, Launch):
        k = step.kernel
        args = ", ".join(_pointer(b) for b in step.args)
        grid = ", ".join(map(str, k.grid))
        block = ", ".join(map(str, k.block))
        launch = f"{k.name}<<<dim3({grid}), dim3({block}), {k.shared_bytes}, stream>>>({args});"
        if k.shared_bytes > 48 * 1024:
            return (
                f"err = cudaFuncSetAttribute({k.name}, cudaFuncAttributeMaxDynamicSharedMemorySize, "
                f"{k.shared_bytes}); if (err != cudaSuccess) return err;\n  {launch}"
            )
        return launch
    if isinstance(step, DeviceCopy):
        return (
            f"err = cudaMemcpyAsync({_pointer(step.dst)}, {_pointer(step.src)}, "
            f"{step.dst.nbytes}, cudaMemcpyDeviceToDevice, stream); if (err != cudaSuccess) return err;"
        )
    if isinstance(step, Gemm):
        raise TgcError(
            "the standalone file has no cuBLAS: matmuls must use the generated kernel (place "
            "with 'cuda-standalone' or 'place-on-device{library-gemm=false}')",
            step.loc,
        )
    raise TypeError(step)


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


__all__ = ["checksums", "emit_standalone_cuda", "standalone_inputs"]
