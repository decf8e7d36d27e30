"""The numpy interpreter: runs a verified function op by op on each op's `reference`.

This is tgc's definition of what a program means; every pass and every kernel is checked
against it. Two precisions:
- "native": each result is stored in its declared element type (f16/bf16 are computed in f32
  and rounded, as the GPU kernels do);
- "f64": every float is computed and kept in float64 (the reference for equivalence checks).

Floats follow IEEE 754: overflow gives inf, 0/0 gives NaN, and no numpy warning is printed (the
values themselves say what happened; tgc-run reports them). A tensor too large for this machine's
memory is one located error that says how many bytes were asked for.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import numpy as np

from tgc.builtin import FuncOp, ModuleOp, ReturnOp
from tgc.diagnostics import Location, TgcError
from tgc.dialects.atomic import gather_index_bound
from tgc.dialects.kernel import CallOp
from tgc.ir import Block, Operation, Value
from tgc.types import TensorType

T = TypeVar("T")

PRECISIONS = ("native", "f64")
_WIDENED = {np.dtype(np.float16), np.dtype("bfloat16")}


def storage_dtype(t: TensorType, precision: str) -> np.dtype:
    if precision == "f64" and t.is_float:
        return np.dtype(np.float64)
    return t.dtype


def _compute_view(a: np.ndarray) -> np.ndarray:
    """16-bit floats are widened to f32 before an op computes on them."""
    return a.astype(np.float32) if a.dtype in _WIDENED else a


def format_bytes(n: int) -> str:
    """`n` bytes in words: '80000000000000 bytes (72.8 TiB)'."""
    size, unit = float(n), "bytes"
    for name in ("KiB", "MiB", "GiB", "TiB", "PiB", "EiB"):
        if size < 1024:
            break
        size, unit = size / 1024, name
    return f"{n} bytes" if unit == "bytes" else f"{n} bytes ({size:.1f} {unit})"


def nbytes(types: list[TensorType], precision: str) -> int:
    """The bytes that values of `types` take when stored at `precision`."""
    return sum(math.prod(t.shape) * storage_dtype(t, precision).itemsize for t in types)


def allocating(
    make: Callable[[], T],
    types: list[TensorType],
    what: str,
    precision: str,
    loc: Location | None = None,
) -> T:
    """`make()`, with running out of memory turned into one located error naming the size.

    Sizes no address can hold are refused before numpy sees them (it would say 'array is too
    big' or 'maximum supported dimension')."""
    size = nbytes(types, precision)
    listed = ", ".join(map(str, types))
    message = f"cannot allocate {format_bytes(size)} for {what} ({listed}): out of memory"
    if size > sys.maxsize:
        raise TgcError(message, loc)
    try:
        return make()
    except MemoryError:
        raise TgcError(message, loc) from None


def run_block(block: Block, args: list[np.ndarray], precision: str = "native") -> list[np.ndarray]:
    """Interpret `block` with its arguments bound to `args`; returns the terminator's operands."""
    env: dict[Value, np.ndarray] = dict(zip(block.args, args))
    for op in block.ops:
        inputs = [env[v] for v in op.operands]
        if op is block.last and (isinstance(op, ReturnOp) or op.has_trait("terminator")):
            return inputs
        types = [r.type for r in op.results]
        what = f"the result of '{op.name}'"
        outs = allocating(partial(_run_op, op, inputs, precision), types, what, precision, op.loc)
        env.update(zip(op.results, outs))
    raise TgcError("block has no terminator", block.last.loc if block.last else None)


def _run_op(op: Operation, inputs: list[np.ndarray], precision: str) -> list[np.ndarray]:
    """The op's values, each checked against its declared shape and stored at `precision`."""
    raw = _evaluate(op, [_compute_view(a) for a in inputs], precision)
    outs = []
    for result, value in zip(op.results, raw if isinstance(raw, tuple) else (raw,)):
        value = np.asarray(value)
        if value.shape != result.type.shape:
            raise TgcError(
                f"internal error: '{op.name}' reference produced shape {value.shape}, "
                f"declared {result.type}",
                op.loc,
            )
        outs.append(value.astype(storage_dtype(result.type, precision), copy=False))
    return outs


def _evaluate(op, inputs: list[np.ndarray], precision: str):
    """An op's numpy meaning; a `kernel.call` holding its subgraph means its region."""
    if isinstance(op, CallOp) and op.regions:
        return tuple(run_block(op.body, inputs, precision))
    return op.reference(*inputs, **_region_kwargs(op, precision))


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
