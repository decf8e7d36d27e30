"""Op evaluation: a block run op by op on each op's numpy `reference`.

This is what a program means; the interpreter (runtime/interpreter.py), the rule checker
(passes/rules_check.py) and the ops whose meaning is a region (`kernel.fused`) all evaluate
through `evaluate_block`. Two precisions:
- "native": each result is stored in its declared element type (f16/bf16 are computed in f32
  and rounded, as the GPU kernels do);
- "f64": every float is computed and kept in float64 (the reference for equivalence checks).

An op with regions receives the precision as a keyword (`reference(*inputs, precision=...)`)
and evaluates its own regions with `evaluate_block`: the evaluator knows no op and no dialect.

Floats follow IEEE 754 (overflow gives inf, 0/0 gives NaN); callers decide whether numpy warns
(`np.errstate`). A tensor too large for this machine's memory is one located error that says how
many bytes were asked for.
"""

from __future__ import annotations

import math
import sys
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import numpy as np

from tgc.diagnostics import Location, TgcError
from tgc.ir import Block, Operation
from tgc.opdef import TERMINATOR
from tgc.types import NUMPY_DTYPES, TensorType

T = TypeVar("T")

PRECISIONS = ("native", "f64")
# Stored in 16 bits, computed in f32 (as the GPU kernels do).
WIDENED_DTYPES = frozenset({NUMPY_DTYPES["f16"], NUMPY_DTYPES["bf16"]})


def storage_dtype(t: TensorType, precision: str) -> np.dtype:
    """The dtype a value of type `t` is kept in at `precision`."""
    if precision == "f64" and t.is_float:
        return np.dtype(np.float64)
    return t.dtype


def widened(a: np.ndarray) -> np.ndarray:
    """`a` as an op computes on it: 16-bit floats widened to f32, anything else as it is."""
    return a.astype(np.float32) if a.dtype in WIDENED_DTYPES else a


# -- memory ----------------------------------------------------------------------------------------


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


def block_values(block: Block) -> list[TensorType]:
    """The types of the values `evaluate_block` holds at its end: every argument and every op's
    results (it keeps each value until the block returns)."""
    types = [a.type for a in block.args]
    return types + [
        r.type for op in block.ops for r in op.results if isinstance(r.type, TensorType)
    ]


def available_memory() -> int | None:
    """The bytes this machine can still give a process (Linux's MemAvailable), None where unknown."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


# -- evaluation ------------------------------------------------------------------------------------


def evaluate_block(
    block: Block, args: list[np.ndarray], precision: str = "native"
) -> list[np.ndarray]:
    """Evaluate `block` with its arguments bound to `args`; returns the terminator's operands."""
    env = dict(zip(block.args, args))
    for op in block.ops:
        inputs = [env[v] for v in op.operands]
        if op is block.last and op.has_trait(TERMINATOR):
            return inputs
        types = [r.type for r in op.results]
        what = f"the result of '{op.name}'"
        run = partial(evaluate_op, op, inputs, precision)
        env.update(zip(op.results, allocating(run, types, what, precision, op.loc)))
    raise TgcError("block has no terminator", block.last.loc if block.last else None)


def evaluate_op(op: Operation, inputs: list[np.ndarray], precision: str) -> list[np.ndarray]:
    """The op's values, each checked against its declared shape and stored at `precision`."""
    widened_inputs = [widened(a) for a in inputs]
    # An op with regions evaluates them itself, at the same precision.
    kwargs = {"precision": precision} if op.regions else {}
    raw = op.reference(*widened_inputs, **kwargs)
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
