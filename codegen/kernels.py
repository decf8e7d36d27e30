"""CUDA source for one `kernel.fused` region: pick its template, fill it with plain data.

`generate_kernel(op)` returns a `KernelSource`: the kernel's C symbol, its source (without the
prelude, which `prelude()` gives once per translation unit), its parameters in order (inputs
then outputs, all device pointers: every shape is a compile-time constant), its launch
configuration, and the template parameters it was made with (`params` overrides them: block
size, vector width, rows per block, tile sizes, so a profiler can search them).

One module per template family, each a generator in `GENERATORS`: elementwise.py,
row_reduction.py (with row_layout.py, row_passes.py, row_body.py), matmul.py, attention.py,
conv.py.
What they share (the Jinja environment, the prelude, `KernelSource`) is in render.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from tgc.codegen.attention import generate_attention
from tgc.codegen.attention_decode import GLOBALS as DECODE_GLOBALS
from tgc.codegen.conv import generate_conv
from tgc.codegen.cuda_ops import literal
from tgc.codegen.elementwise import generate_elementwise
from tgc.codegen.matmul import generate_matmul
from tgc.codegen.names import c_identifier
from tgc.codegen.render import KernelSource, module_names, prelude, render
from tgc.codegen.row_reduction import generate_row_reduction, reductions_of
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp

Generator = Callable[[FusedOp, dict, str], KernelSource]

# The other symbols a kernel may define from its own (format strings): a translation unit's
# NameAllocator reserves them with every kernel symbol it hands out.
SYMBOL_FORMS: tuple[str, ...] = tuple(DECODE_GLOBALS.values())

# template name -> generator(op, params, symbol); "generic" regions pick one by their ops.
GENERATORS: dict[str, Generator] = {
    "elementwise": generate_elementwise,
    "row_reduction": generate_row_reduction,
    "matmul": generate_matmul,
    "attention": generate_attention,
    "conv": generate_conv,
}


def template_of(op: FusedOp) -> str:
    """The template that generates `op`: its `template` attribute, or for "generic" a row
    reduction when the region reduces and elementwise otherwise."""
    template = op.attr("template")
    if template == "generic":
        return "row_reduction" if reductions_of(op) else "elementwise"
    return template


def generate_kernel(
    op: FusedOp, params: dict | None = None, name: str | None = None
) -> KernelSource:
    """The kernel of `op`, its C symbol `name` (by default the sanitised IR name: pass one from
    a `NameAllocator` where several kernels share a translation unit)."""
    symbol = name or c_identifier(str(op.attr("name")))
    with _located_at(op):
        return GENERATORS[template_of(op)](op, dict(params or {}), symbol)


@contextmanager
def _located_at(op: FusedOp) -> Iterator[None]:
    """A TgcError without a location gets the kernel's."""
    try:
        yield
    except TgcError as e:
        if e.loc is None:
            e.loc = op.loc
        raise


__all__ = [
    "GENERATORS",
    "SYMBOL_FORMS",
    "KernelSource",
    "c_identifier",
    "generate_kernel",
    "literal",
    "module_names",
    "prelude",
    "render",
    "template_of",
]
