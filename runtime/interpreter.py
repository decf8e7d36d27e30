"""The numpy interpreter: runs a verified function op by op on each op's `reference`.

This is tgc's definition of what a program means; every pass and every kernel is checked
against it. Two precisions:
- "native": each result is stored in its declared element type (f16/bf16 are computed in f32
  and rounded, as the GPU kernels do);
- "f64": every float is computed and kept in float64 (the reference for equivalence checks).
"""

from __future__ import annotations

import numpy as np

from tgc.builtin import FuncOp, ModuleOp, ReturnOp
from tgc.diagnostics import TgcError
from tgc.ir import Block, Value
from tgc.types import TensorType

PRECISIONS = ("native", "f64")
_WIDENED = {np.dtype(np.float16), np.dtype("bfloat16")}


def storage_dtype(t: TensorType, precision: str) -> np.dtype:
    if precision == "f64" and t.is_float:
        return np.dtype(np.float64)
    return t.dtype


def _compute_view(a: np.ndarray) -> np.ndarray:
    """16-bit floats are widened to f32 before an op computes on them."""
    return a.astype(np.float32) if a.dtype in _WIDENED else a


def run_block(block: Block, args: list[np.ndarray], precision: str = "native") -> list[np.ndarray]:
    """Interpret `block` with its arguments bound to `args`; returns the terminator's operands."""
    env: dict[Value, np.ndarray] = dict(zip(block.args, args))
    for op in block.ops:
        inputs = [env[v] for v in op.operands]
        if op is block.last and (isinstance(op, ReturnOp) or op.has_trait("terminator")):
            return inputs
        raw = op.reference(*[_compute_view(a) for a in inputs], **_region_kwargs(op, precision))
        outs = raw if isinstance(raw, tuple) else (raw,)
        for result, value in zip(op.results, outs):
            value = np.asarray(value)
            if value.shape != result.type.shape:
                raise TgcError(
                    f"internal error: '{op.name}' reference produced shape {value.shape}, "
                    f"declared {result.type}",
                    op.loc,
                )
            env[result] = value.astype(storage_dtype(result.type, precision), copy=False)
    raise TgcError("block has no terminator", block.last.loc if block.last else None)


def _region_kwargs(op, precision: str) -> dict:
    """Ops with regions (kernel.fused) interpret their body with the same precision."""
    return {"precision": precision} if op.regions else {}


def check_inputs(func: FuncOp, inputs: list[np.ndarray], precision: str) -> list[np.ndarray]:
    args = func.body.args
    if len(inputs) != len(args):
        raise TgcError(f"@{func.sym_name} takes {len(args)} input(s), got {len(inputs)}", func.loc)
    out = []
    for i, (arg, value) in enumerate(zip(args, inputs)):
        value = np.asarray(value)
        name = f"%{arg.name_hint}" if arg.name_hint else f"#{i}"
        if value.shape != arg.type.shape:
            raise TgcError(
                f"input {name} of @{func.sym_name} has shape {value.shape}, expected {arg.type}"
            )
        if value.dtype != arg.type.dtype and not (precision == "f64" and arg.type.is_float):
            raise TgcError(
                f"input {name} of @{func.sym_name} has dtype {value.dtype}, expected "
                f"{arg.type.element_type} ({arg.type.dtype})"
            )
        out.append(value.astype(storage_dtype(arg.type, precision), copy=False))
    return out


def run_function(func: FuncOp, inputs: list[np.ndarray], precision: str = "native") -> list[np.ndarray]:
    """Run `func` on numpy inputs (checked against the argument types)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}")
    return run_block(func.body, check_inputs(func, inputs, precision), precision)


def select_function(module: ModuleOp, name: str | None) -> FuncOp:
    funcs = module.funcs
    if name is not None:
        func = module.func(name)
        if func is None:
            listed = ", ".join("@" + f.sym_name for f in funcs) or "none"
            raise TgcError(f"no function named '@{name}' (the module has: {listed})")
        return func
    if len(funcs) != 1:
        listed = ", ".join("@" + f.sym_name for f in funcs) or "none"
        raise TgcError(f"the module has {len(funcs)} functions ({listed}): choose one with --func")
    return funcs[0]


def random_inputs(func: FuncOp, seed: int) -> list[np.ndarray]:
    """Seeded random inputs: floats ~ N(0, 1); integer inputs used as gather indices stay in
    range of the gathered axis; other integers in [0, 4); i1 uniform."""
    rng = np.random.default_rng(seed)
    out = []
    for arg in func.body.args:
        t = arg.type
        if t.is_float:
            out.append(rng.standard_normal(t.shape).astype(t.dtype))
        elif t.element_type == "i1":
            out.append(rng.random(t.shape) < 0.5)
        else:
            high = index_bound(arg) or 4
            out.append(rng.integers(0, high, size=t.shape).astype(t.dtype))
    return out


def index_bound(arg: Value) -> int | None:
    """The smallest table axis an integer argument indexes through atomic.gather, if any."""
    bounds = []
    for op, index in arg.uses:
        if op.name == "atomic.gather" and index == 1:
            table = op.operands[0].type
            bounds.append(table.shape[op.attr("axis") % table.rank])
    return min(bounds) if bounds else None
