"""Kernels: everything that runs, declared in one place, and the registry that collects them.

A kernel is either
- an *op kernel*: it runs one op of a given name with whatever attributes the program gives it
  (`op = "atomic.add"`); its reference graph is that op, or
- a *graph kernel*: it computes a small reference graph written as a `.tg` function
  (`reference = "func.func @tanh(%x: tensor<8xf32>) -> ... { ... }"`), matched against the
  program's subgraphs after both are put in canonical form (see `planner.match`). The types in
  the reference text only make it parse; shapes and dtypes are bound from the program, and
  `constraints` says which ones the kernel accepts.

Every kernel states its backend (whose memory space its operands and results live in, see
`BACKEND_SPACE`), its tunable parameters (name -> domain, the first value is the default) and
its error bound: the largest relative error against the float64 reference that it may have
(`max_rel_error`), so that `select-kernels{tolerance=...}` can refuse an approximate kernel.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# The memory space of each backend's operands and results: None is host memory. Two backends
# in the same space hand values over without a copy (numpy <-> torch CPU, PyCUDA <-> torch CUDA).
BACKEND_SPACE: dict[str, str | None] = {
    "numpy": None,
    "torch-cpu": None,
    "cuda": "cuda",
    "torch-cuda": "cuda",
}


def no_constraint(types) -> str | None:
    """Accepts every binding; a constraint returns why a binding is refused, or None."""
    return None


@dataclass(frozen=True, eq=False)
class Kernel:
    name: str  # unique, "<backend>.<what>", e.g. "numpy.tanh", "cuda.elementwise"
    backend: str  # a key of BACKEND_SPACE
    op: str | None = None  # op kernel: the op it runs
    reference: str | None = None  # graph kernel: the .tg function it computes
    run: Callable | None = None  # how to run it (the backend's calling convention)
    constraints: Callable = no_constraint  # (operand and result types) -> reason refused | None
    params: dict[str, tuple] = field(default_factory=dict)  # name -> domain, first = default
    max_rel_error: float = 0.0  # stated bound on the relative error against float64
    doc: str = ""

    def __post_init__(self) -> None:
        if (self.op is None) == (self.reference is None):
            raise TypeError(f"kernel {self.name}: give exactly one of `op` and `reference`")
        if self.backend not in BACKEND_SPACE:
            raise TypeError(f"kernel {self.name}: unknown backend '{self.backend}'")

    @property
    def space(self) -> str | None:
        return BACKEND_SPACE[self.backend]

    @property
    def default_params(self) -> dict:
        return {k: domain[0] for k, domain in self.params.items()}


KERNELS: dict[str, Kernel] = {}


def register_kernel(kernel: Kernel) -> Kernel:
    if kernel.name in KERNELS:
        raise TypeError(f"kernel '{kernel.name}' is registered twice")
    KERNELS[kernel.name] = kernel
    return kernel


def kernels_for_op(op_name: str) -> list[Kernel]:
    return [k for k in KERNELS.values() if k.op == op_name]


def graph_kernels() -> list[Kernel]:
    return [k for k in KERNELS.values() if k.reference is not None]
