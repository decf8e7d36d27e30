"""The elementwise template: every output has one shape and each thread computes whole output
positions; inputs read at the output position itself (identity inputs) move as vectors.

Template parameters: `block_size`, `vector_width` (elements per thread and step; 1 is scalar
only), `streaming` (evict-first vector loads and stores), `max_blocks` (0: one thread per work
item; otherwise at most that many blocks, whose threads stride over the rest).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from tgc.codegen.cuda_ops import STORAGE_CTYPE, load_expression, store_value
from tgc.codegen.emitter import Coords, Emitter, canon, delinearize
from tgc.codegen.render import KernelSource, idx_type, kernel_label, params_decl, render, yields_of
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.ir import Value
from tgc.types import ELEMENT_BYTES


@dataclass(frozen=True)
class _Region:
    """What the body of an elementwise kernel reads and writes."""

    op: FusedOp
    args: list[Value]  # the region's inputs
    ptrs: dict[Value, str]
    outs: list[str]
    space: tuple[int, ...]  # the shape of every output
    coords: Coords  # the output position of linear index i


def generate_elementwise(op: FusedOp, params: dict, symbol: str) -> KernelSource:
    """The elementwise kernel of `op`."""
    decls, ptrs, outs = params_decl(op)
    space = _output_space(op)
    region = _Region(op, list(op.body.args), ptrs, outs, space, delinearize("i", space))
    numel = math.prod(space)
    block_size = int(params.setdefault("block_size", 256))
    scalar_body, identity = _body(region, False, set())
    vec = int(params.setdefault("vector_width", _vector_width(op, identity)))
    stream = "true" if params.setdefault("streaming", False) else "false"
    vec_inputs = [
        {"ctype": STORAGE_CTYPE[a.type.element_type], "reg": f"a{i}", "ptr": ptrs[a]}
        for i, a in enumerate(region.args)
        if a in identity
    ]
    vec_body = _body(region, True, identity)[0] if vec > 1 else ""
    outputs = [
        {"ctype": STORAGE_CTYPE[r.type.element_type], "reg": f"o{j}", "ptr": outs[j]}
        for j, r in enumerate(op.results)
    ]
    source = render(
        "elementwise.cu.j2",
        name=symbol,
        params=decls,
        idx_t=idx_type(op),
        numel=numel,
        space="x".join(map(str, space)) or "scalar",
        block_size=block_size,
        vec=vec,
        vec_ptrs=[v["ptr"] for v in vec_inputs] + [o["ptr"] for o in outputs],
        vec_inputs=vec_inputs,
        outputs=outputs,
        vec_body=vec_body,
        scalar_body=scalar_body,
        stream=stream,
    )
    blocks = _grid_blocks(numel, vec, block_size, params)
    return KernelSource(
        symbol,
        source,
        "elementwise",
        len(region.args),
        len(op.results),
        (blocks, 1, 1),
        (block_size, 1, 1),
        params,
        op.loc,
        op.attr("name"),
    )


def _output_space(op: FusedOp) -> tuple[int, ...]:
    """The one shape of the kernel's outputs."""
    space = op.results[0].type.shape
    for r in op.results:
        if r.type.shape != space:
            raise TgcError(
                f"elementwise kernel '{kernel_label(op)}' yields values of several shapes"
            )
    return space


def _body(region: _Region, vector: bool, identity_args: set[Value]) -> tuple[str, set[Value]]:
    """The statements computing every output at position i (element l of a vector step when
    `vector`, with `identity_args` read from their vector registers), and the inputs read at
    the output position itself."""
    em = Emitter(region.ptrs)
    used: set[Value] = set()
    space, coords, args = region.space, region.coords, region.args
    for arg in args:
        if arg.type.shape != space:
            continue

        def hook(c, arg=arg):
            if c != canon(space, coords):
                return None
            used.add(arg)
            if vector and arg in identity_args:
                reg = f"a{args.index(arg)}.v[l]"
                if arg.type.element_type in ("f16", "bf16"):
                    reg = f"tgc_cvt({reg})"
                return em.define(arg, reg)
            return em.define(arg, load_expression(region.ptrs[arg], "i", arg.type.element_type))

        em.hooks[arg] = hook
    for j, (y, r) in enumerate(zip(yields_of(region.op), region.op.results)):
        val = store_value(em.value(y, coords), r.type.element_type)
        target = f"o{j}.v[l]" if vector else f"{region.outs[j]}[i]"
        em.emit(f"{target} = {val};")
    return em.take(8 if vector else 4), used


def _vector_width(op: FusedOp, identity: set[Value]) -> int:
    """Elements per 16-byte access of the widest vector-moved value."""
    widest = max(
        [ELEMENT_BYTES[a.type.element_type] for a in identity]
        + [ELEMENT_BYTES[r.type.element_type] for r in op.results]
    )
    return max(1, 16 // widest)


def _grid_blocks(numel: int, vec: int, block_size: int, params: dict) -> int:
    """Blocks of the launch: one thread per work item, capped by `max_blocks` when set."""
    work = max(1, numel // vec if vec > 1 else numel)
    blocks = max(1, math.ceil(work / block_size))
    max_blocks = int(params.setdefault("max_blocks", 0))
    if max_blocks:
        blocks = min(blocks, max_blocks)
    return blocks
