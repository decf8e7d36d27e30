"""What every kernel template shares: the Jinja environment, the prelude, the names a
translation unit may not take, `KernelSource`, and a region's parameter list and index type.

A template family (elementwise.py, row_reduction.py, matmul.py, attention.py) turns one
`kernel.fused` region into plain data and renders its `.cu.j2` skeleton with `render`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import jinja2

from tgc.codegen.cuda_ops import STORAGE_CTYPE
from tgc.codegen.names import NameAllocator, display_name, identifiers_in
from tgc.diagnostics import Location, TgcError
from tgc.dialects.kernel import FusedOp
from tgc.ir import Value

TEMPLATE_DIR = Path(__file__).resolve().parent
INT32_LIMIT = 2**31 - 1


@lru_cache(maxsize=1)
def environment() -> jinja2.Environment:
    return jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(TEMPLATE_DIR)),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )


def render(template: str, **data) -> str:
    return environment().get_template(template).render(**data)


def prelude(origin: str = "tgc") -> str:
    return render("prelude.cu.j2", origin=origin)


@lru_cache(maxsize=1)
def _template_identifiers() -> frozenset[str]:
    """The names the fixed text of the prelude and the standalone file declare (tgc_max,
    TgcVec, tgc_hash, ...), with some harmless extras (Jinja keywords)."""
    found: set[str] = set()
    for template in ("prelude.cu.j2", "standalone.cu.j2"):
        found |= identifiers_in((TEMPLATE_DIR / template).read_text())
    return frozenset(found)


def module_names() -> NameAllocator:
    """A fresh allocator for the symbols of one translation unit: nothing it gives out can be a
    name the prelude or the standalone file's own code already uses."""
    return NameAllocator(_template_identifiers())


def kernel_label(op: FusedOp) -> str:
    """The IR name of a kernel as diagnostics show it (one line, printable)."""
    return display_name(str(op.attr("name")))


def is_gpu_arch(arch: object) -> bool:
    """Whether `arch` names a GPU as nvcc does ("sm_90"): the template parameter `arch` and
    tgc-translate's --arch both take one."""
    return isinstance(arch, str) and re.fullmatch(r"sm_\d+", arch) is not None


@dataclass(frozen=True)
class TensorMap:
    """A TMA tensor map (Hopper's bulk tensor copies) that a kernel takes by value, before its
    pointers: the tile box `box` of input `operand`, seen as a tensor of `dims` elements of
    `elem` (innermost first) whose dims after the first lie `strides` bytes apart, copied into
    shared memory with 128-byte swizzling, what lies outside read as zeros. The launcher makes
    it from the operand's address (runtime/tensor_map.py), `offset` bytes on (a view that starts
    inside its buffer)."""

    operand: int
    elem: str
    dims: tuple[int, ...]
    strides: tuple[int, ...]
    box: tuple[int, ...]
    offset: int = 0

    # The driver's enums (cuda.h): CUtensorMapDataType by element type, then the swizzle
    # (128 bytes), L2 promotion (256 bytes) and out-of-bounds fill (zeros) every map takes.
    DATA_TYPE = {"f16": 6, "f32": 7, "bf16": 9}
    SWIZZLE_128B, L2_PROMOTION_256B, OOB_FILL_ZEROS = 3, 3, 0
    BYTES = 128

    @property
    def data_type(self) -> int:
        return self.DATA_TYPE[self.elem]


@dataclass
class KernelSource:
    name: str  # the C symbol
    source: str
    template: str
    num_inputs: int
    num_outputs: int
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    params: dict = field(default_factory=dict)
    loc: Location | None = None
    ir_name: str = ""
    shared_bytes: int = 0  # dynamic shared memory per block (the attention template)
    # The architecture whose own features (sm_90a's wgmma) the kernel needs, or "": it is
    # compiled for that target, and runs on that GPU only.
    arch_features: str = ""
    tensor_maps: tuple[TensorMap, ...] = ()  # its first parameters (TensorMap)
    # It calls tgc_wait_for_predecessors() (the prelude) before it reads anything an earlier
    # kernel wrote or writes anything: on sm_90 it is launched as a programmatic dependent
    # and may start while the kernel before it runs (runtime/driver_kernel.py).
    dependent_launch: bool = False

    @property
    def label(self) -> str:
        """How a diagnostic names the kernel: `kernel 'IR name' (C symbol)`, on one line
        whatever characters the IR name holds."""
        return f"kernel '{display_name(self.ir_name or self.name)}' ({self.name})"

    def nvcc_target(self, arch: str) -> list[str]:
        """nvcc's target options for this kernel on a GPU of `arch` ("sm_90"): `-arch=sm_90`,
        or for a kernel that needs its architecture's own features the -gencode form (which,
        unlike `-arch=sm_90a`, does not also run a plain sm_90 pass that rejects them); a
        located TgcError on another GPU."""
        if not self.arch_features:
            return [f"-arch={arch}"]
        if self.arch_features.rstrip("a") != arch:
            raise TgcError(
                f"kernel '{display_name(self.ir_name or self.name)}' needs a {self.arch_features} GPU "
                f"(this one is {arch})",
                self.loc,
            )
        return [f"-gencode=arch=compute_{self.arch_features[3:]},code={self.arch_features}"]


def params_decl(op: FusedOp) -> tuple[list[str], dict[Value, str], list[str]]:
    """The kernel's C parameters (inputs `in<i>`, then outputs `out<j>`), the pointer naming
    each input value, and the output pointers."""
    decls, ptrs, outs = [], {}, []
    for i, arg in enumerate(op.body.args):
        decls.append(f"const {STORAGE_CTYPE[arg.type.element_type]}* __restrict__ in{i}")
        ptrs[arg] = f"in{i}"
    for j, r in enumerate(op.results):
        decls.append(f"{STORAGE_CTYPE[r.type.element_type]}* __restrict__ out{j}")
        outs.append(f"out{j}")
    return decls, ptrs, outs


def idx_type(op: FusedOp) -> str:
    """The C type of indices: int unless some tensor of the region has more elements."""
    sizes = [v.type.num_elements for v in op.operands] + [r.type.num_elements for r in op.results]
    for inner in op.body.ops:
        sizes += [r.type.num_elements for r in inner.results]
    return "long long" if max(sizes, default=0) > INT32_LIMIT else "int"


def yields_of(op: FusedOp) -> list[Value]:
    """The values the region yields, one per kernel output."""
    return list(op.body.last.operands)
