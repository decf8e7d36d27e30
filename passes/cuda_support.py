"""Where an `atomic.slice` is one contiguous range of its operand: the fact `place-on-device`
leaves such a slice unwrapped with and the CUDA plan (codegen/plan.py) makes it a view with.
The CUDA capabilities the passes share with code generation are in tgc/cuda_target.py, the
strided views in tgc/views.py.
"""

from __future__ import annotations

from tgc.ir import Operation
from tgc.types import contiguous_strides


def contiguous_slice_offset(op: Operation) -> int | None:
    """The element offset of the range an `atomic.slice` takes, where that range is contiguous
    in its row-major operand: unit steps, some axis `a` before which the slice is one index
    wide, and after which it takes every index. None otherwise."""
    if op.name != "atomic.slice":
        return None
    shape = op.operands[0].type.shape
    start, stop, step = op.attr("start"), op.attr("stop"), op.attr("step")
    if any(s != 1 for s in step):
        return None
    wide = [i for i in range(len(shape)) if stop[i] - start[i] != 1]
    first = wide[0] if wide else len(shape)
    if any(start[i] != 0 or stop[i] != shape[i] for i in range(first + 1, len(shape))):
        return None
    strides = contiguous_strides(shape)
    return sum(start[i] * strides[i] for i in range(len(shape)))


__all__ = ["contiguous_slice_offset"]
