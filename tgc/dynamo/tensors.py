"""Torch tensors to numpy arrays and back on the CPU, sharing memory wherever numpy can.

A CPU tensor is read through `Tensor.numpy()`, a view of the same memory with the same strides
(bfloat16, which numpy has no type for, through its bits as ml_dtypes' bfloat16). A result goes
back through `torch.from_numpy`, the same memory again, except where the array is one torch
must not take: read-only (a broadcast view, a constant of the module), with a negative stride,
or a value the plan keeps between calls (the caller says which): those are copied, so that a
tensor handed to the user can be written without changing tgc's state.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from tgc.types import NUMPY_DTYPES

_BF16 = np.dtype(NUMPY_DTYPES["bf16"])


def as_array(tensor: torch.Tensor) -> np.ndarray:
    """The memory of a CPU tensor as a numpy array (no copy). Autograd is not followed: the
    compiled graph runs for inference."""
    t = tensor.detach()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(_BF16)
    return t.numpy()


def as_tensor(array: np.ndarray, copy: bool = False) -> torch.Tensor:
    """A numpy result as a CPU tensor: its memory where torch can own a view of it, else (or
    with `copy`) a copy."""
    array = np.asarray(array)
    if copy or not array.flags.writeable or any(s < 0 for s in array.strides):
        array = np.array(array, copy=True)
    if array.dtype == _BF16:
        return torch.from_numpy(array.view(np.int16)).view(torch.bfloat16)
    return torch.from_numpy(array)


class ParamViews:
    """The views the executor is given of the graph's parameter tensors (numpy arrays on the
    CPU, detached tensors on the GPU: `convert`), made again only when a tensor changed.

    The executor runs a plan's once steps (packing weights, planner/fixed.py) when a parameter
    value is another object than the previous call's; a fresh view per call would run them on
    every call. A view is kept while its tensor is the same object at the same version (PyTorch
    counts in-place writes in `_version`), so an updated weight is seen and packed again. An
    inference tensor (made under torch.inference_mode()) has no version: it gets a new view on
    every call."""

    def __init__(self, convert: Callable[[torch.Tensor], object] = as_array) -> None:
        self.convert = convert
        self._kept: dict[int, tuple[torch.Tensor, int, object]] = {}

    def view(self, slot: int, tensor: torch.Tensor):
        if tensor.is_inference():
            # an inference tensor counts no versions: an update cannot be seen, so a new view
            # every call (the once steps rerun: slower, never stale)
            return self.convert(tensor)
        kept = self._kept.get(slot)
        version = tensor._version
        if kept is not None and kept[0] is tensor and kept[1] == version:
            return kept[2]
        value = self.convert(tensor)
        self._kept[slot] = (tensor, version, value)
        return value
