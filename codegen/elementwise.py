"""The elementwise template: every output has one shape and each thread computes whole output
positions; inputs read at the output position itself (identity inputs) move as vectors.

Where the output's last dim is a multiple of the vector width, a vector step's lanes share
every coordinate but the last (`lane_coords`), and an input read at the lanes' consecutive
elements through views that only shift the last coordinate (a slice or split of it, as a
SwiGLU reads the two halves of its packed gate and up projections) is loaded once per step as a
vector too, where its address is aligned (else element by element), before the lanes compute.
Reads in a concat's branches stay per lane: a branch's loads are in bounds only for its lanes.

Template parameters: `block_size`, `vector_width` (elements per thread and step; 1 is scalar
only), `streaming` (evict-first vector loads and stores), `max_blocks` (0: one thread per work
item; otherwise at most that many blocks, whose threads stride over the rest).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

from tgc.codegen.cuda_ops import STORAGE_CTYPE, load_expression, store_value
from tgc.codegen.emitter import Coords, Emitter, canon, delinearize, linear_offset
from tgc.codegen.render import KernelSource, idx_type, kernel_label, params_decl, render, yields_of
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp, YieldOp
from tgc.ir import Block, Region, Value, clone_body
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
    """The elementwise kernel of `op`; where its outputs have several shapes, one launch of a
    part for each shape (`_generate_parts`)."""
    if len({r.type.shape for r in op.results}) > 1:
        return _generate_parts(op, params, symbol)
    return _generate_one(op, params, symbol)


def _generate_one(op: FusedOp, params: dict, symbol: str, part: bool = False) -> KernelSource:
    """The kernel of `op`, whose outputs have one shape; with `part`, as a device function of
    the blocks it is given (`_generate_parts`)."""
    decls, ptrs, outs = params_decl(op)
    space = _output_space(op)
    region = _Region(op, list(op.body.args), ptrs, outs, space, delinearize("i", space))
    numel = math.prod(space)
    block_size = int(params.setdefault("block_size", 256))
    scalar_body, identity = _body(region, False, set())
    vec = int(params.setdefault("vector_width", _vector_width(op, identity)))
    stream = "true" if params.setdefault("streaming", False) else "false"
    lanes = vec > 1 and bool(space) and space[-1] % vec == 0
    hoisted: list[str] | None = None
    if lanes:
        region = replace(region, coords=lane_coords(space))
        hoisted = [f"const idx_t {LANE_BASE} = {delinearize('base', space)[-1]};"]
    vec_inputs = [
        {"ctype": STORAGE_CTYPE[a.type.element_type], "reg": f"a{i}", "ptr": ptrs[a]}
        for i, a in enumerate(region.args)
        if a in identity
    ]
    vec_body = _body(region, True, identity, vec, hoisted)[0] if vec > 1 else ""
    if lanes:
        lane = f"const idx_t {LANE} = {LANE_BASE} + l;"
        vec_body = f"        {lane}\n        (void) {LANE};\n" + vec_body
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
        vec_hoisted="\n".join(
            " " * 6 + line for entry in hoisted or [] for line in entry.splitlines()
        ),
        scalar_body=scalar_body,
        stream=stream,
        part=part,
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


def _generate_parts(op: FusedOp, params: dict, symbol: str) -> KernelSource:
    """Independent elementwise kernels as one launch (planner/horizontal.py merges a decoding
    step's small siblings so): for each shape of the outputs, the kernel of those outputs
    (every input passed, the unread ones ignored) as a device function of a share of the
    blocks, the launch's blocks dealt out to the parts in order; all in blocks of one size."""
    shapes: dict[tuple[int, ...], list[int]] = {}
    for j, r in enumerate(op.results):
        shapes.setdefault(r.type.shape, []).append(j)
    decls, _, outs = params_decl(op)
    inputs = [f"in{i}" for i in range(len(op.body.args))]
    # one block size and streaming hint for all; each part its own vector width
    params.setdefault("block_size", 256)
    params.setdefault("streaming", False)
    shared = {k: params[k] for k in ("block_size", "streaming")}
    parts, calls, first = [], [], 0
    for n, indices in enumerate(shapes.values()):
        kernel = _generate_one(_part(op, indices), dict(shared), f"{symbol}_part{n}", part=True)
        blocks = kernel.grid[0]
        pointers = ", ".join(inputs + [outs[j] for j in indices])
        parts.append(kernel.source)
        calls.append((first, blocks, f"{kernel.name}(blockIdx.x - {first}, {blocks}, {pointers});"))
        first += blocks
    source = render(
        "elementwise_parts.cu.j2",
        name=symbol,
        params=decls,
        parts=parts,
        calls=calls,
        block_size=int(params["block_size"]),
    )
    return KernelSource(
        symbol,
        source,
        "elementwise",
        len(op.body.args),
        len(op.results),
        (first, 1, 1),
        (int(params["block_size"]), 1, 1),
        params,
        op.loc,
        op.attr("name"),
    )


def _part(op: FusedOp, indices: list[int]) -> FusedOp:
    """A detached copy of `op` that yields only its outputs `indices` (what they read of the
    region comes along; code generation reads no more)."""
    body = Block([a.type for a in op.body.args])
    yields = clone_body(op.body, body, dict(zip(op.body.args, body.args)))
    body.append(YieldOp([yields[j] for j in indices], [], loc=op.body.last.loc))
    return FusedOp(
        [Value(a.type) for a in op.body.args],
        [op.results[j].type for j in indices],
        dict(op.attributes),
        [Region([body])],
        op.loc,
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


LANE = "lc"  # a vector step's last coordinate at lane l (`lane_coords`)
LANE_BASE = "lc0"  # the same at lane 0


def lane_coords(space: tuple[int, ...]) -> Coords:
    """The coordinates of lane l of the vector step at `base` where every step lies in one row
    (the last dim a multiple of the width): the row from `base`, the last one `LANE`."""
    return delinearize("base", space)[:-1] + (LANE,)


def _lane_offset(shape: tuple[int, ...], coords: Coords) -> str | None:
    """The element offset of lane 0's read where the lanes read consecutive elements of an
    input of `shape` at `coords`: the last coordinate `LANE` shifted by constants (views that
    move along it), the others lane-free expressions of `base`. Else None."""
    if not shape:
        return None  # a 0-d input: one element for every lane
    coords = canon(shape, coords)
    last, shift = coords[-1], 0
    while last != LANE:
        found = re.fullmatch(r"\((.*) ([+-]) (\d+)\)", last)
        if found is None:
            return None
        last, shift = (
            found.group(1),
            shift + int(found.group(3)) * (1 if found.group(2) == "+" else -1),
        )
    if any(set(re.findall(r"[A-Za-z_]\w*", c)) - {"base"} for c in coords[:-1]):
        return None
    return linear_offset(shape, coords[:-1] + (f"({LANE_BASE} + {shift})",))


def _body(
    region: _Region,
    vector: bool,
    identity_args: set[Value],
    vec: int = 1,
    hoisted: list[str] | None = None,
) -> tuple[str, set[Value]]:
    """The statements computing every output at position i (element l of a vector step when
    `vector`, with `identity_args` read from their vector registers), and the inputs read at
    the output position itself. With `hoisted` (lanes within one row), the vector loads of the
    other inputs that the lanes read consecutively are appended to it."""
    em = Emitter(region.ptrs)
    used: set[Value] = set()
    space, coords, args = region.space, region.coords, region.args
    for arg in args:
        lanes = _lane_hook(em, region, arg, vec, hoisted) if hoisted is not None else None
        if arg.type.shape != space:
            if lanes is not None:
                em.hooks[arg] = lanes
            continue

        def hook(c, arg=arg, lanes=lanes):
            if c != canon(space, coords):
                return lanes(c) if lanes is not None else None
            used.add(arg)
            if vector and arg in identity_args:
                return em.define(arg, _lane_value(f"a{args.index(arg)}", arg))
            return em.define(arg, load_expression(region.ptrs[arg], "i", arg.type.element_type))

        em.hooks[arg] = hook
    for j, (y, r) in enumerate(zip(yields_of(region.op), region.op.results)):
        val = store_value(em.value(y, coords), r.type.element_type)
        target = f"o{j}.v[l]" if vector else f"{region.outs[j]}[i]"
        em.emit(f"{target} = {val};")
    return em.take(8 if vector else 4), used


def _lane_value(register: str, arg: Value) -> str:
    value = f"{register}.v[l]"
    return f"tgc_cvt({value})" if arg.type.element_type in ("f16", "bf16") else value


def _lane_hook(em: Emitter, region: _Region, arg: Value, vec: int, hoisted: list[str]):
    """The hook reading `arg` from a vector loaded before the lanes (module doc), where the
    lanes read consecutive elements of it outside any branch; None (a load per lane) else."""

    def hook(c: Coords) -> str | None:
        offset = _lane_offset(arg.type.shape, c)
        if offset is None or len(em.scopes) > 1 or arg.type.element_type not in ELEMENT_BYTES:
            return None
        ctype = STORAGE_CTYPE[arg.type.element_type]
        width = ELEMENT_BYTES[arg.type.element_type] * vec
        reg, at = f"h{len(hoisted)}", f"{region.ptrs[arg]} + ({offset})"
        hoisted.append(
            f"TgcVec<{ctype}, {vec}> {reg};\n"
            f"if (reinterpret_cast<uintptr_t>({at}) % {width} == 0) "
            f"{reg} = *reinterpret_cast<const TgcVec<{ctype}, {vec}>*>({at});\n"
            f"else for (int k = 0; k < {vec}; ++k) {reg}.v[k] = ({at})[k];"
        )
        return em.define(arg, _lane_value(reg, arg))

    return hook


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
