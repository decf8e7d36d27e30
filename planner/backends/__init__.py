"""Backends: how the executor runs each backend's kernels and moves values between spaces.

A backend module (`numpy.py`, `torch.py`, `cuda.py`) registers its kernels in
`planner.kernel.KERNELS` and one `Backend` here per backend it provides. Values live in memory
spaces (`None` = host, `"cuda"`), each with one representation the executor keeps between
kernels (`Space`): numpy arrays on the host; on the device, any object exposing
`__cuda_array_interface__` (a PyCUDA buffer of the cuda backend, a torch CUDA tensor). A backend
whose own representation differs from its space's (torch tensors on the host) converts on the
way in and out (`adopt`, `release`: zero-copy where it can, `torch.from_numpy`,
`__cuda_array_interface__`). `kernel.copy` goes through the host: `to_host` of the source space,
`from_host` of the destination.

Every kernel's `run` takes and returns host numpy arrays (`run(inputs, attrs, result_types)`,
see planner/backends/numpy.py), whatever its backend: so any kernel can be checked against its
reference the same way. The executor calls `Backend.call` instead, on values in the backend's
own representation (numpy's is `run` itself; torch's runs on tensors, with no conversion).

*Generated kernels* (`Template`): a family of kernels made per call, such as the CUDA
templates. A call of one names the family (`callee = "cuda.elementwise"`) and holds the code it
stands for in its region; the backend's `run_region(op, inputs)` generates, compiles (cached) and
runs it. The planner offers them through the fused-kernel hook (`planner.options.FUSED_OPTIONS`),
never by matching, so they are not in `KERNELS`.
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
    backend's own representation (default: `kernel.run(inputs, attrs, result_types)`);
    `run_region(op, inputs) -> outputs` runs a generated kernel: `op` is the `kernel.call`
    naming a `Template` (or a `kernel.fused`) whose region it computes (None: the backend has
    no generated kernels). `prepare(kernel, op) -> run(values) -> outputs`, where a backend has
    it, does once what every call of `op` would (compile its region, work out a GEMM's shape),
    so that a plan run many times (`PlannedFunction`) spends on the host only what the launch
    needs; it takes and returns values in the space's representation, as a run does (None for
    a kernel it has nothing to prepare for). `compile_regions(ops)`, where a backend has it,
    compiles the generated kernels of many such `op`s at once (nvcc runs in parallel): the
    executor and the profiler hand it every region they are about to run, so that a plan or a
    batch of measurements waits for one round of compiles, not for one compile after another;
    a later `run_region` or `prepare` of each op finds its kernel compiled."""

    name: str  # a key of planner.kernel.BACKEND_SPACE
    call: Callable[..., list] = _run_kernel
    adopt: Callable = _same  # the space's representation -> the backend's
    release: Callable = _same  # the backend's representation -> the space's
    run_region: Callable[..., list] | None = None
    prepare: Callable[..., Callable[[list], list] | None] | None = None
    compile_regions: Callable[[list], None] | None = None


@dataclass(frozen=True)
class Space:
    """A memory space's value representation, seen from the host.

    `time_queued(call, runs, first) -> (device_seconds, host_seconds)`, where a space has it:
    the time of the work each of `runs` calls of `call` queues in the space, measured there, and
    the host's time for each call (`first`: one synchronised call's seconds; see
    runtime/cuda_timing.py). The profiler times a kernel of such a
    space by it; elsewhere by the host's clock around each synchronised call."""

    name: str | None
    to_host: Callable[[object], np.ndarray]
    from_host: Callable[[np.ndarray, TensorType], object]
    time_queued: Callable[..., tuple[np.ndarray, np.ndarray]] | None = None


@dataclass(frozen=True)
class Template:
    """A family of generated kernels (see the module doc): `name` is the callee a call writes,
    `backend` runs it, `max_rel_error` bounds every kernel of the family (as a Kernel's does);
    `parts`: its kernels of different shapes can run as the parts of one launch, so small
    independent calls of it are merged (planner/horizontal.py)."""

    name: str
    backend: str
    max_rel_error: float = 0.0
    doc: str = ""
    parts: bool = False


BACKENDS: dict[str, Backend] = {}
SPACES: dict[str | None, Space] = {None: Space(None, np.asarray, lambda array, type: array)}
TEMPLATES: dict[str, Template] = {}


def register_backend(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def register_space(space: Space) -> Space:
    SPACES[space.name] = space
    return space


def register_template(template: Template) -> Template:
    TEMPLATES[template.name] = template
    return template
