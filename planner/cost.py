"""Costs: how long a kernel takes on given types, and how sure we are.

Every number the planner compares comes through one interface, a `CostSource`:

    cost(kernel, operand_types, result_types, params) -> Cost(seconds, source, rel_uncertainty)

where `source` says where the number came from: "measured" (a timing of this kernel on these
shapes on this device), "estimated" (derived from other measurements) or "roofline" (a model
with no measurement at all). Types carry the memory space of the values (their encoding), so a
copy kernel (`kernel.copy`) is costed through the same call. The selection never knows where a
number came from; the measurement database (next issue) plugs in behind the same interface.

This module ships two sources:

- `RooflineCostSource(devices, links)`: launch overhead + max(bytes / bandwidth, flops / peak)
  per backend, and latency + bytes / bandwidth for a copy between two spaces. Flops and bytes
  come from the op (see `op_flops`); bytes are the operands plus the results. The numbers in
  `DEVICES` and `LINKS` are placeholders until measurements exist (docs/planner.md, "Costs").
- `DictCostSource(table)`: fixed costs by kernel name (optionally by name and types), for tests.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from functools import cache
from typing import Protocol

from tgc.builder import Builder
from tgc.builtin import FuncOp
from tgc.cuda_target import CONV_OPS
from tgc.ir import Operation
from tgc.opdef import FREE, MOVE, OPS, REDUCTION
from tgc.planner.kernel import Kernel, canonical_references
from tgc.types import TensorType

SOURCES = ("measured", "estimated", "roofline")


@dataclass(frozen=True)
class Cost:
    """A kernel's time in seconds, where the number came from, and its relative uncertainty
    (0.5: the true time is within a factor 1 +- 0.5 of `seconds`, as far as the source knows)."""

    seconds: float
    source: str
    rel_uncertainty: float = 0.0

    def __post_init__(self) -> None:
        if self.source not in SOURCES:
            raise ValueError(f"cost source must be one of {SOURCES}, not {self.source!r}")
        if not self.seconds >= 0:
            raise ValueError(f"a cost is a non-negative number of seconds, not {self.seconds}")


class CostSource(Protocol):
    def cost(
        self,
        kernel: Kernel,
        operand_types: Sequence[TensorType],
        result_types: Sequence[TensorType],
        params: Mapping,
    ) -> Cost: ...


# -- the roofline model -------------------------------------------------------------------------


@dataclass(frozen=True)
class Device:
    """What a backend's kernels run on: memory bandwidth (bytes/s), peak fp32 rate (flop/s),
    the fixed cost of one call (launch, dispatch), in seconds, and the peak rate of its matrix
    units on 16-bit operands (flop/s; 0: it has none, 16-bit products run at `peak_flops`)."""

    bandwidth: float
    peak_flops: float
    launch: float
    matrix_flops: float = 0.0


@dataclass(frozen=True)
class Link:
    """A path between two memory spaces: bandwidth (bytes/s) and latency per copy (s)."""

    bandwidth: float
    latency: float


# Placeholders until the profiler measures them (docs/planner.md has the table and its reasons):
# numpy on one CPU core; an H100 for cuda; torch adds its dispatch overhead.
DEVICES: dict[str, Device] = {
    "numpy": Device(bandwidth=10e9, peak_flops=5e9, launch=2e-6),
    "torch-cpu": Device(bandwidth=10e9, peak_flops=20e9, launch=10e-6),
    "cuda": Device(bandwidth=3e12, peak_flops=50e12, launch=5e-6),
    "torch-cuda": Device(bandwidth=3e12, peak_flops=50e12, launch=10e-6),
}
LINKS: dict[tuple[str | None, str | None], Link] = {
    (None, "cuda"): Link(bandwidth=25e9, latency=10e-6),  # PCIe 4 x16, pageable memory
    ("cuda", None): Link(bandwidth=25e9, latency=10e-6),
}
# The GPU route's default cost source (planner/route.py): an H100's HBM3, fp32 and bf16 matrix
# rates, and how close each family of kernels comes to them (docs/planner.md, "The GPU
# route"): what the fixed CUDA route knew, that cuBLAS runs a plain matmul faster than a
# generated one and that a generated kernel launches for less than a PyTorch call.
GPU_DEVICES: dict[str, Device] = {
    "numpy": DEVICES["numpy"],
    "torch-cpu": DEVICES["torch-cpu"],
    "cuda": Device(bandwidth=3e12, peak_flops=50e12, launch=5e-6, matrix_flops=790e12),
    "torch-cuda": Device(bandwidth=3e12, peak_flops=50e12, launch=10e-6, matrix_flops=790e12),
}
# kernel name (a generated family's template name) -> the share of the device's rate it reaches
# on products (attention and matmuls); every other kernel: 1.
GPU_EFFICIENCY: dict[str, float] = {
    "cuda.cublas.gemm": 0.8,
    **{
        f"cuda.cublaslt.{form}{layout}": 0.8
        for form in ("linear", "linear_gelu", "linear_residual", "matmul_residual")
        for layout in ("", "_wt")
    },
    "torch-cuda.atomic.matmul": 0.8,
    "torch-cuda.hl.linear": 0.8,
    "cuda.matmul": 0.3,
    # the implicit-GEMM convolution measured 16-40 TFLOP/s on ResNet-50 and UNet layers (an
    # H200: bench/results/conv-NVIDIA-H200-2026-11-28.md)
    "cuda.conv": 0.04,
    "cuda.attention": 0.45,
    "torch-cuda.hl.attention": 0.45,
}
# The ops whose work runs on matrix units where the operands are 16-bit (so does the work of a
# kernel named in an efficiency table: those are products).
MATRIX_OPS = frozenset({"atomic.matmul", "hl.linear", "hl.attention", *CONV_OPS})


def is_product(kernel, efficiency: Mapping[str, float] = GPU_EFFICIENCY) -> bool:
    """Whether the kernel's work is a matrix product (a matmul, a linear layer, attention):
    its op is one, or the efficiency table names it."""
    return kernel.op in MATRIX_OPS or kernel.name in efficiency


ROOFLINE_UNCERTAINTY = 1.0  # a roofline estimate is good to a factor of about two
# A kernel whose results are views of its operands (`Kernel.view`) launches nothing and moves
# nothing: what it costs is the executor's host work of making the views, about a microsecond.
VIEW_SECONDS = 1e-6


class RooflineCostSource:
    """Launch + max(bytes / bandwidth, flops / peak) on the kernel's backend; a copy costs
    latency + bytes / bandwidth of the link between the two spaces, a view kernel
    `VIEW_SECONDS` (see the module doc)."""

    def __init__(
        self,
        devices: Mapping[str, Device] | None = None,
        links: Mapping[tuple[str | None, str | None], Link] | None = None,
        efficiency: Mapping[str, float] | None = None,
    ) -> None:
        self.devices = dict(DEVICES if devices is None else devices)
        self.links = dict(LINKS if links is None else links)
        self.efficiency = dict(efficiency or {})

    @classmethod
    def gpu_defaults(cls) -> RooflineCostSource:
        """The GPU route's default cost source (GPU_DEVICES, GPU_EFFICIENCY)."""
        return cls(GPU_DEVICES, efficiency=GPU_EFFICIENCY)

    def _rate(self, kernel, device: Device, operand_types) -> float:
        """The flop/s `kernel` reaches: the matrix units' for a product of 16-bit operands,
        else the fp32 peak, times the kernel's efficiency."""
        narrow = any(t.element_type in ("f16", "bf16") for t in operand_types)
        product = is_product(kernel, self.efficiency)
        rate = device.matrix_flops if product and narrow and device.matrix_flops else 0.0
        return (rate or device.peak_flops) * self.efficiency.get(kernel.name, 1.0)

    def cost(self, kernel, operand_types, result_types, params) -> Cost:
        moved = sum(t.nbytes for t in operand_types) + sum(t.nbytes for t in result_types)
        if kernel.op == "kernel.copy":
            src, dst = operand_types[0].encoding, result_types[0].encoding
            link = self.links.get((src, dst))
            if link is None:
                raise LookupError(f"no link from {src or 'host'} to {dst or 'host'} is described")
            seconds = link.latency + result_types[0].nbytes / link.bandwidth
            return Cost(seconds, "roofline", ROOFLINE_UNCERTAINTY)
        if kernel.view:  # no launch, no bytes: the host's work of making the views
            return Cost(VIEW_SECONDS, "roofline", ROOFLINE_UNCERTAINTY)
        device = self.devices.get(kernel.backend)
        if device is None:
            raise LookupError(f"no device is described for backend '{kernel.backend}'")
        flops = kernel_flops(kernel, tuple(operand_types), tuple(result_types))
        rate = self._rate(kernel, device, operand_types)
        seconds = device.launch + max(moved / device.bandwidth, flops / rate)
        return Cost(seconds, "roofline", ROOFLINE_UNCERTAINTY)


# -- flops --------------------------------------------------------------------------------------


def kernel_flops(kernel: Kernel, operand_types: tuple, result_types: tuple) -> float:
    """Floating-point operations of one call: the op's count for an op kernel; for a graph
    kernel the sum over its reference ops (the largest over its alternatives), scaled from the
    reference's shapes to the program's by the number of result elements (exact for
    elementwise formulas)."""
    if kernel.op is not None:
        return op_flops(kernel.op, operand_types, result_types)
    per_element = _reference_flops_per_element(kernel)
    return per_element * sum(t.num_elements for t in result_types)


def op_flops(name: str, operand_types: tuple, result_types: tuple) -> float:
    """1 per result element for an elementwise op, 2*M*N*K for a matmul, 1 per input element
    for a reduction, 0 for data movement; an hl op counts its decomposition."""
    results = sum(t.num_elements for t in result_types)
    cls = OPS.get(name)
    traits = cls.traits if cls is not None else frozenset()
    if traits & {MOVE, FREE}:  # moves or reinterprets data, computes nothing
        return 0.0
    if REDUCTION in traits:
        return float(operand_types[0].num_elements)
    if name == "atomic.matmul":
        return 2.0 * results * operand_types[0].shape[-1]
    if name in CONV_OPS:  # a multiply-add per output element and weight of its group
        w = operand_types[1]
        return 2.0 * results * w.num_elements / w.shape[0]
    if cls is not None and callable(getattr(cls, "decompose", None)):
        found = _decomposed_flops(name, operand_types, result_types)
        if found is not None:
            return found
    return float(results)  # elementwise, and the default for an op not described above


@cache
def _decomposed_flops(name: str, operand_types: tuple, result_types: tuple) -> float | None:
    """The flops of an hl op's decomposition at default attributes (None when the op cannot be
    built without attributes the cost interface does not carry, e.g. `hl.mean`'s axes)."""
    cls = OPS[name]
    func = FuncOp.build("flops", list(operand_types), [])
    try:
        op = cls(list(func.body.args), list(result_types), {})
        emitted: list[Operation] = []
        b = Builder(func.body, None, on_insert=emitted.append)
        op.decompose(b)
        op.drop_operand_uses()
    except Exception:  # noqa: BLE001  (a missing attribute fails in the op's own code: no estimate)
        return None
    return sum(_op_instance_flops(e) for e in emitted)  # nested hl ops count their decomposition


def _op_instance_flops(op: Operation) -> float:
    return op_flops(op.name, tuple(v.type for v in op.operands), tuple(r.type for r in op.results))


@cache
def _reference_flops_per_element(kernel: Kernel) -> float:
    """The largest over the kernel's reference alternatives: the work of a kernel does not
    depend on which of its equivalent formulas the program was written in."""
    return max(_flops_per_element(ref) for ref in canonical_references(kernel))


def _flops_per_element(ref: FuncOp) -> float:
    total = sum(_op_instance_flops(op) for op in ref.body.ops if op is not ref.body.last)
    outputs = sum(v.type.num_elements for v in ref.body.last.operands)
    return total / max(outputs, 1)


# -- a fixed table, for tests --------------------------------------------------------------------


class DictCostSource:
    """Costs from a table: key `kernel name`, or `(kernel name, operand types, result types)`
    (tuples of TensorType, encodings included) for a per-shape entry, which wins. A value is a
    `Cost` or a number of seconds ("measured", no uncertainty). A missing kernel asks `fallback`,
    or raises LookupError."""

    def __init__(self, table: Mapping, fallback: CostSource | None = None) -> None:
        self.table = {
            k: v if isinstance(v, Cost) else Cost(float(v), "measured") for k, v in table.items()
        }
        self.fallback = fallback

    def cost(self, kernel, operand_types, result_types, params) -> Cost:
        key = (kernel.name, tuple(operand_types), tuple(result_types))
        found = self.table.get(key) or self.table.get(kernel.name)
        if found is not None:
            return found
        if self.fallback is not None:
            return self.fallback.cost(kernel, operand_types, result_types, params)
        raise LookupError(f"no cost for kernel '{kernel.name}' in the table")


class CachedCosts:
    """Memoises a CostSource per (kernel, types, params): the planner asks the same question
    once per op signature, not once per op. Asked without parameters, it costs the kernel
    with those it would run with (`params`)."""

    def __init__(self, source: CostSource) -> None:
        self.source = source
        self._memo: dict[tuple, Cost] = {}
        self._params: dict[tuple, dict] = {}

    def params(self, kernel, operand_types, result_types) -> dict:
        """The parameters a kernel runs with on these types: the source's best measured ones
        where it knows them (`tuned_params`, the measurement database), else the defaults."""
        if not kernel.params:
            return {}
        key = (kernel.name, tuple(operand_types), tuple(result_types))
        found = self._params.get(key)
        if found is None:
            tuned = getattr(self.source, "tuned_params", None)
            found = tuned(kernel, *key[1:]) if tuned else None
            found = kernel.default_params if found is None else found
            self._params[key] = found
        return found

    def cost(self, kernel, operand_types, result_types, params=None) -> Cost:
        if params is None:
            params = self.params(kernel, operand_types, result_types)
        key = (
            kernel.name,
            tuple(operand_types),
            tuple(result_types),
            tuple(sorted(params.items())),
        )
        found = self._memo.get(key)
        if found is None:
            found = self.source.cost(kernel, tuple(operand_types), tuple(result_types), params)
            self._memo[key] = found
        return found
