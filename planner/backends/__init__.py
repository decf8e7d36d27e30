"""Backends: how the executor runs each backend's kernels and moves values between spaces.

A backend module (`numpy.py`; `cuda.py` and `torch.py` to come) registers its kernels in
`planner.kernel.KERNELS` and one `Backend` here. Values live in memory spaces (`None` = host,
`"cuda"`), each with one representation the executor keeps between kernels (`Space`): numpy
arrays on the host. A backend whose own representation differs from its space's (torch tensors
on the host) converts on the way in and out (`adopt`, `release`: zero-copy where it can, e.g.
`torch.from_numpy`, DLPack). `kernel.copy` goes through the host: `to_host` of the source space,
`from_host` of the destination (a space may later register a direct path).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from tgc.types import TensorType


def _same(value):
    return value


def _run_kernel(kernel, inputs: list, attrs: dict, result_types: list[TensorType]) -> list:
    return kernel.run(inputs, attrs, result_types)


@dataclass(frozen=True)
class Backend:
    """How the executor calls one backend's kernels.

    `call(kernel, inputs, attrs, result_types) -> outputs` runs a kernel on values in the
    backend's own representation (default: `kernel.run(inputs, attrs, result_types)`)."""

    name: str  # a key of planner.kernel.BACKEND_SPACE
    call: Callable[..., list] = _run_kernel
    adopt: Callable = _same  # the space's representation -> the backend's
    release: Callable = _same  # the backend's representation -> the space's


@dataclass(frozen=True)
class Space:
    """A memory space's value representation, seen from the host."""

    name: str | None
    to_host: Callable[[object], np.ndarray]
    from_host: Callable[[np.ndarray, TensorType], object]


BACKENDS: dict[str, Backend] = {}
SPACES: dict[str | None, Space] = {None: Space(None, np.asarray, lambda array, type: array)}


def register_backend(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def register_space(space: Space) -> Space:
    SPACES[space.name] = space
    return space
