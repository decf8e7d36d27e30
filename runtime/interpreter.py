"""The numpy interpreter: runs a verified function op by op on each op's `reference`.

This is tgc's definition of what a program means; every pass and every kernel is checked
against it. The evaluation itself (precisions "native" and "f64", 16-bit floats computed in f32,
ops whose meaning is a region, out-of-memory errors) is `tgc.evaluate`; this module adds what
running a function needs: checking its inputs, choosing it in a module, drawing random inputs.

Floats follow IEEE 754: overflow gives inf, 0/0 gives NaN, and no numpy warning is printed (the
values themselves say what happened; tgc-run reports them). A tensor too large for this machine's
memory is one located error that says how many bytes were asked for.
"""

from __future__ import annotations

import math
from functools import partial

import numpy as np

from tgc.builtin import FuncOp, ModuleOp
from tgc.diagnostics import TgcError
from tgc.dialects.atomic import gather_index_bound
from tgc.evaluate import PRECISIONS, allocating, evaluate_block, storage_dtype
from tgc.ir import Value
from tgc.types import TensorType


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
        out.append(_stored(value, arg.type, f"input {name} of @{func.sym_name}", precision, func))
    return out


def _stored(value: np.ndarray, t: TensorType, what: str, precision: str, func: FuncOp):
    dtype = storage_dtype(t, precision)
    return allocating(lambda: value.astype(dtype, copy=False), [t], what, precision, func.loc)


def run_function(
    func: FuncOp, inputs: list[np.ndarray], precision: str = "native"
) -> list[np.ndarray]:
    """Run `func` on numpy inputs (checked against the argument types)."""
    if precision not in PRECISIONS:
        raise ValueError(f"precision must be one of {PRECISIONS}")
    with np.errstate(all="ignore"):  # IEEE results (inf, NaN) are the meaning, not a warning
        return evaluate_block(func.body, check_inputs(func, inputs, precision), precision)


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
    """Seeded random inputs, the same for every pipeline (they depend on the function only).

    Floats are drawn from N(0, 1), except weights: an argument used as the right-hand operand of
    a contraction (`hl.linear`'s w, `atomic.matmul`'s b) is drawn from N(0, 1/fan_in), fan_in
    its contracted dimension (the largest, if it feeds several), as models initialise weights, so
    that a layer's output stays about as large as its input instead of growing by sqrt(fan_in)
    per layer. Integer inputs used as gather indices stay in range of the gathered axis; other
    integers are in [0, 4); i1 is uniform.
    """
    rng = np.random.default_rng(seed)
    out = []
    for i, arg in enumerate(func.body.args):
        what = f"argument %{arg.name_hint or i} of @{func.sym_name}"
        out.append(allocating(partial(_draw, rng, arg), [arg.type], what, "native", func.loc))
    return out


def _draw(rng: np.random.Generator, arg: Value) -> np.ndarray:
    t = arg.type
    if t.is_float:
        # f32 directly (no float64 temporary the size of the tensor); f64 in f64.
        draw = np.float64 if t.dtype == np.float64 else np.float32
        values = rng.standard_normal(t.shape, dtype=draw)
        fan_in = contraction_fan_in(arg)
        if fan_in:
            values *= draw(1 / math.sqrt(fan_in))
        return values.astype(t.dtype, copy=False)
    if t.element_type == "i1":
        return rng.random(t.shape) < 0.5
    high = gather_index_bound(arg) or 4
    return rng.integers(0, high, size=t.shape).astype(t.dtype)


def contraction_fan_in(arg: Value) -> int | None:
    """The largest dimension `arg` is contracted over as a weight (the right-hand operand of
    `hl.linear` or `atomic.matmul`), if it is one; None otherwise."""
    fans = []
    for op, index in arg.uses:
        if index != 1:
            continue
        shape = arg.type.shape
        if op.name == "hl.linear":
            fans.append(shape[0])
        elif op.name == "atomic.matmul":
            fans.append(shape[-1] if op.attr("transpose_b") else shape[-2])
    return max(fans, default=0) or None
