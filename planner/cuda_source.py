"""Kernels users write in CUDA C++ (docs/kernels.md, "A CUDA kernel from source").

A plugin (planner/plugins.py) makes one with `cuda_source_kernel`: a Jinja template of CUDA
source, the name of its `__global__` function, a launch shape, and the reference graph every
kernel has. For each instance the planner meets, the template is rendered with the instance's
shapes, element types and the op's numeric attributes, compiled by nvcc through the caches tgc's
own kernels use (runtime/cuda_compile.py: once per distinct source, on disk across runs) and
launched on the cuda backend's stream, so a plan that calls it is captured into a CUDA graph as
any other. Like every plugin kernel it is checked in float64 against its reference, at several
sizes, before the planner may choose it, and the profiler measures it as it measures tgc's.

What the template sees:

- `inputs`, `outputs`: one entry per operand and result, each with `shape` (a tuple of ints),
  `size` (its element count), `rank`, `ctype` (the C type tgc stores the element type in:
  `float`, `__nv_bfloat16`, `__half`, `double`, `int`, ...) and `dtype` (`f32`, `bf16`, ...);
- `attrs`: the op's attributes that are numbers, booleans or lists of them (nothing else reaches
  the source: no IR name or string is ever pasted into it);
- `entry`: the function's name, a C identifier.

The function takes the input pointers, then the output pointers, in order, as tgc's generated
kernels do; tgc's prelude (bf16 and f16 conversions, `tgc_to_f32`) comes before the template.
`launch(inputs, outputs, attrs)` gives `(grid, block)` or `(grid, block, shared_bytes)`, each
of grid and block one to three ints, from the same entries the template sees.

Rendering needs no GPU (`render`, `kernel_source`): a plugin's source can be compiled by nvcc
on a machine without one, as the tests do.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from types import MappingProxyType

import jinja2

from tgc.codegen.cuda_ops import STORAGE_CTYPE
from tgc.codegen.render import KernelSource, environment
from tgc.diagnostics import TgcError
from tgc.planner.kernel import Kernel
from tgc.types import ELEMENT_TYPE_OF_DTYPE, TensorType

_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


@dataclass(frozen=True)
class Entry:
    """An operand or result as the template and `launch` see it."""

    shape: tuple[int, ...]
    dtype: str

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def ctype(self) -> str:
        return STORAGE_CTYPE[self.dtype]


@dataclass(frozen=True)
class CudaSource:
    """A user's CUDA kernel (module doc): `template` rendered per instance, `entry` its
    function, `launch` its grid and block."""

    name: str  # the tgc kernel's name, for messages
    template: str
    entry: str
    launch: Callable
    # (inputs, outputs, attributes) -> its launcher (planner/backends/cuda.py): rendered and
    # compiled once per instance, not per call
    _runs: dict = field(default_factory=dict, compare=False, repr=False)

    def __post_init__(self) -> None:
        if not isinstance(self.entry, str) or not _IDENTIFIER.match(self.entry):
            raise TgcError(f"CUDA kernel '{self.name}': entry {self.entry!a} is not a C identifier")
        try:
            environment().from_string(self.template)
        except jinja2.TemplateSyntaxError as e:
            raise TgcError(
                f"CUDA kernel '{self.name}': its template line {e.lineno}: {e.message}"
            ) from None

    def render(self, inputs: Sequence[Entry], outputs: Sequence[Entry], attrs: dict) -> str:
        data = {"inputs": list(inputs), "outputs": list(outputs), "entry": self.entry}
        data["attrs"] = MappingProxyType(numeric_attrs(attrs))
        try:
            return environment().from_string(self.template).render(**data)
        except jinja2.TemplateError as e:
            raise TgcError(f"CUDA kernel '{self.name}': its template: {e}") from None

    def kernel_source(
        self, inputs: Sequence[Entry], outputs: Sequence[Entry], attrs: dict
    ) -> KernelSource:
        """The source and launch shape of one instance, as tgc's own kernels have them."""
        grid, block, shared = self._launch(inputs, outputs, attrs)
        return KernelSource(
            name=self.entry,
            source=self.render(inputs, outputs, attrs),
            template=self.name,
            num_inputs=len(inputs),
            num_outputs=len(outputs),
            grid=grid,
            block=block,
            ir_name=self.name,
            shared_bytes=shared,
        )

    def _launch(self, inputs, outputs, attrs) -> tuple[tuple, tuple, int]:
        got = self.launch(list(inputs), list(outputs), numeric_attrs(attrs))
        if not isinstance(got, tuple) or len(got) not in (2, 3):
            raise TgcError(
                f"CUDA kernel '{self.name}': launch returned {got!a}, not (grid, block) or "
                f"(grid, block, shared bytes)"
            )
        grid, block = (_dim3(self.name, what, v) for what, v in zip(("grid", "block"), got))
        shared = got[2] if len(got) == 3 else 0
        if not isinstance(shared, int) or isinstance(shared, bool) or shared < 0:
            raise TgcError(f"CUDA kernel '{self.name}': shared bytes {shared!a} is not an int >= 0")
        return grid, block, shared

    def run(self, values: list, attrs: dict, result_types: list[TensorType]) -> list:
        """The kernel's `run` on the cuda backend: device buffers in, device buffers out."""
        from tgc.planner.backends import cuda

        arrays = [cuda.DeviceArray.of(v) for v in values]
        inputs = tuple(Entry(a.shape, ELEMENT_TYPE_OF_DTYPE[a.dtype]) for a in arrays)
        outputs = tuple(entries(result_types))
        key = (inputs, outputs, repr(sorted(numeric_attrs(attrs).items())))
        run = self._runs.get(key)
        if run is None:
            source = self.kernel_source(inputs, outputs, attrs)
            (function,) = cuda.load_kernels([source])
            run = self._runs[key] = cuda.launcher(source, function, result_types)
        return run(arrays)


def _dim3(name: str, what: str, value) -> tuple[int, int, int]:
    dims = value if isinstance(value, tuple) else (value,)
    if not 1 <= len(dims) <= 3 or not all(
        isinstance(d, int) and not isinstance(d, bool) and d >= 1 for d in dims
    ):
        raise TgcError(f"CUDA kernel '{name}': launch {what} {value!a} is not 1-3 ints >= 1")
    return (*dims, *(1,) * (3 - len(dims)))


def numeric_attrs(attrs: dict) -> dict:
    """The attributes a template may see: numbers, booleans and lists of them."""

    def numeric(v) -> bool:
        if isinstance(v, (list, tuple)):
            return all(numeric(x) for x in v)
        return isinstance(v, (int, float, bool))

    return {k: v for k, v in attrs.items() if numeric(v)}


def entries(types: Sequence[TensorType]) -> list[Entry]:
    return [Entry(t.shape, t.element_type) for t in types]


def cuda_source_kernel(
    name: str,
    *,
    template: str,
    entry: str,
    launch: Callable,
    reference,
    op: str | None = None,
    max_rel_error: float = 0.0,
    shape_constants: bool = False,
    doc: str = "",
) -> Kernel:
    """A `Kernel` on the cuda backend whose `run` renders, compiles and launches `template`
    (module doc); the other arguments are `Kernel`'s."""
    source = CudaSource(name, template, entry, launch)
    return Kernel(
        name,
        "cuda",
        op=op,
        reference=reference,
        run=source.run,
        max_rel_error=max_rel_error,
        shape_constants=shape_constants,
        doc=doc or f"user CUDA kernel {entry}",
    )
