"""CUDA source for one `kernel.fused` region: pick its template, fill it with plain data.

`generate_kernel(op)` returns a `KernelSource`: the kernel's C symbol, its source (without the
prelude, which `prelude()` gives once per translation unit), its parameters in order (inputs
then outputs, all device pointers: every shape is a compile-time constant), its launch
configuration, and the template parameters it was made with (`params` overrides them: block
size, vector width, rows per block, tile sizes, so a profiler can search them).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import jinja2

from tgc.codegen.cuda_ops import (
    COMPUTE_CTYPE,
    REDUCE_CODE,
    STORAGE_CTYPE,
    literal,
    load_expression,
    store_value,
    type_class,
)
from tgc.codegen.emitter import Emitter, broadcast_coords, canon, delinearize, linear_offset
from tgc.codegen.names import NameAllocator, c_identifier, display_name, identifiers_in
from tgc.diagnostics import Location, TgcError
from tgc.dialects.kernel import FusedOp
from tgc.ir import Value
from tgc.opdef import REDUCTION
from tgc.types import ELEMENT_BYTES

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


def _params_decl(
    op: FusedOp, extra: tuple[Value, ...] = ()
) -> tuple[list[str], dict[Value, str], list[str]]:
    decls, ptrs, outs = [], {}, []
    for i, arg in enumerate(list(op.body.args) + list(extra)):
        decls.append(f"const {STORAGE_CTYPE[arg.type.element_type]}* __restrict__ in{i}")
        ptrs[arg] = f"in{i}"
    for j, r in enumerate(op.results):
        decls.append(f"{STORAGE_CTYPE[r.type.element_type]}* __restrict__ out{j}")
        outs.append(f"out{j}")
    return decls, ptrs, outs


def _idx_type(op: FusedOp) -> str:
    sizes = [v.type.num_elements for v in op.operands] + [r.type.num_elements for r in op.results]
    for inner in op.body.ops:
        sizes += [r.type.num_elements for r in inner.results]
    return "long long" if max(sizes, default=0) > INT32_LIMIT else "int"


def generate_kernel(
    op: FusedOp, params: dict | None = None, name: str | None = None
) -> KernelSource:
    """The kernel of `op`, its C symbol `name` (by default the sanitised IR name: pass one from
    a `NameAllocator` where several kernels share a translation unit)."""
    template = op.attr("template")
    params = dict(params or {})
    symbol = name or c_identifier(str(op.attr("name")))
    try:
        if template == "row_reduction" or (template == "generic" and _reductions(op)):
            return _row_reduction(op, params, symbol)
        if template == "matmul":
            return _matmul(op, params, symbol)
        if template == "attention":
            from tgc.codegen.attention import generate_attention

            return generate_attention(op, params, render, symbol, KernelSource)
        return _elementwise(op, params, symbol)
    except TgcError as e:
        if e.loc is None:
            e.loc = op.loc
        raise


def matmul_of(op: FusedOp):
    """The atomic.matmul of a matmul kernel."""
    found = [inner for inner in op.body.ops if inner.name == "atomic.matmul"]
    if len(found) != 1:
        raise TgcError(
            f"matmul kernel '{kernel_label(op)}' needs exactly one atomic.matmul", op.loc
        )
    return found[0]


def generate_epilogue_kernel(
    op: FusedOp, params: dict | None = None, name: str | None = None
) -> KernelSource:
    """The epilogue of a matmul kernel alone, as an elementwise kernel that reads the matmul's
    result as one more input (after the region's inputs): for a library matmul (cuBLAS) followed
    by the generated epilogue. `name` is its C symbol, as for `generate_kernel`."""
    params = dict(params or {})
    symbol = name or c_identifier(f"{op.attr('name')}_epilogue")
    try:
        return _elementwise(op, params, symbol, extra=(matmul_of(op).results[0],))
    except TgcError as e:
        if e.loc is None:
            e.loc = op.loc
        raise


def _reductions(op: FusedOp):
    return [inner for inner in op.body.ops if inner.has_trait(REDUCTION)]


def _yields(op: FusedOp) -> list[Value]:
    return list(op.body.last.operands)


# -- elementwise ------------------------------------------------------------------------------------


def _elementwise(
    op: FusedOp, params: dict, symbol: str, extra: tuple[Value, ...] = ()
) -> KernelSource:
    decls, ptrs, outs = _params_decl(op, extra)
    args = list(op.body.args) + list(extra)
    yields = _yields(op)
    space = op.results[0].type.shape
    for r in op.results:
        if r.type.shape != space:
            raise TgcError(
                f"elementwise kernel '{kernel_label(op)}' yields values of several shapes"
            )
    numel = math.prod(space)
    block_size = int(params.setdefault("block_size", 256))
    coords = delinearize("i", space)

    def body(vector: bool, identity_args: set[Value]) -> tuple[str, set[Value]]:
        em = Emitter(ptrs)
        used: set[Value] = set()
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
                return em.define(arg, load_expression(ptrs[arg], "i", arg.type.element_type))

            em.hooks[arg] = hook
        for j, (y, r) in enumerate(zip(yields, op.results)):
            val = store_value(em.value(y, coords), r.type.element_type)
            target = f"o{j}.v[l]" if vector else f"{outs[j]}[i]"
            em.emit(f"{target} = {val};")
        return em.take(8 if vector else 4), used

    scalar_body, identity = body(False, set())
    widest = max(
        [ELEMENT_BYTES[a.type.element_type] for a in identity]
        + [ELEMENT_BYTES[r.type.element_type] for r in op.results]
    )
    vec = int(params.setdefault("vector_width", max(1, 16 // widest)))
    stream = "true" if params.setdefault("streaming", False) else "false"
    vec_inputs = [
        {"ctype": STORAGE_CTYPE[a.type.element_type], "reg": f"a{i}", "ptr": ptrs[a]}
        for i, a in enumerate(args)
        if a in identity
    ]
    vec_body = body(True, identity)[0] if vec > 1 else ""
    outputs = [
        {"ctype": STORAGE_CTYPE[r.type.element_type], "reg": f"o{j}", "ptr": outs[j]}
        for j, r in enumerate(op.results)
    ]
    source = render(
        "elementwise.cu.j2",
        name=symbol,
        params=decls,
        idx_t=_idx_type(op),
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
    work = max(1, numel // vec if vec > 1 else numel)
    blocks = max(1, math.ceil(work / block_size))
    max_blocks = int(params.setdefault("max_blocks", 0))
    if max_blocks:
        blocks = min(blocks, max_blocks)
    return KernelSource(
        symbol,
        source,
        "elementwise",
        len(args),
        len(op.results),
        (blocks, 1, 1),
        (block_size, 1, 1),
        params,
        op.loc,
        op.attr("name"),
    )


# -- row reduction ----------------------------------------------------------------------------------


def _row_reduction(op: FusedOp, params: dict, symbol: str) -> KernelSource:
    decls, ptrs, outs = _params_decl(op)
    reductions = _reductions(op)
    first = reductions[0]
    full = first.operands[0].type.shape
    red_axes = sorted(first.axes())
    row_axes = [d for d in range(len(full)) if d not in red_axes]
    for r in reductions:
        if r.operands[0].type.shape != full or sorted(r.axes()) != red_axes:
            raise TgcError(f"kernel '{kernel_label(op)}' reduces over different rows", r.loc)
    suffix = red_axes == list(range(len(full) - len(red_axes), len(full)))
    row_shape = tuple(full[d] for d in row_axes)
    col_shape = tuple(full[d] for d in red_axes)
    nrows, ncols = math.prod(row_shape), math.prod(col_shape)
    row_coords = delinearize("r", row_shape)
    col_coords = delinearize("c", col_shape)
    coords = [""] * len(full)
    for d, c in zip(row_axes, row_coords):
        coords[d] = c
    for d, c in zip(red_axes, col_coords):
        coords[d] = c
    full_coords = canon(full, tuple(coords))

    def scalar_coords(shape):
        if shape == row_shape:
            return row_coords
        return tuple(full_coords[d] if d in row_axes else "0" for d in range(len(full)))

    yields = _yields(op)
    full_args = [a for a in op.body.args if a.type.shape == full] if suffix else []
    full_yields = [j for j, y in enumerate(yields) if y.type.shape == full]
    row_yields = [j for j in range(len(yields)) if j not in full_yields]
    for j in row_yields:
        if math.prod(yields[j].type.shape) != nrows:
            raise TgcError(
                f"kernel '{kernel_label(op)}' yields a value that is neither a row "
                f"nor one value per row",
                op.loc,
            )

    widest = max(
        [ELEMENT_BYTES[a.type.element_type] for a in full_args]
        + [ELEMENT_BYTES[yields[j].type.element_type] for j in full_yields]
        + [1]
    )
    vec = max(1, 16 // widest) if suffix and ncols % max(1, 16 // widest) == 0 else 1
    vec = int(params.setdefault("vector_width", vec))
    warp_max = int(params.setdefault("warp_per_row_max", 1024))
    warp_per_row = ncols <= warp_max
    if warp_per_row:
        block_size = int(params.setdefault("block_size", 128))
        tpr = 32
    else:
        guess = 1 << max(6, math.ceil(math.log2(max(1, math.ceil(ncols / vec / 4)))))
        block_size = int(params.setdefault("block_size", min(1024, guess)))
        tpr = block_size
    chunks = math.ceil(ncols / (tpr * vec))
    cache_limit = int(params.setdefault("register_cache_limit", 64))
    cached_args = full_args if chunks * vec * len(full_args) <= cache_limit else []
    unroll = chunks if chunks * vec <= 64 else 4

    em = Emitter(ptrs)
    cache_regs = {a: f"x{op.body.args.index(a)}" for a in cached_args}
    for a in full_args:

        def hook(c, a=a):
            if c != full_coords:
                return None
            if a in cache_regs:
                return f"{cache_regs[a]}[k * {vec} + l]"
            return em.define(a, load_expression(ptrs[a], f"r * {ncols} + c", a.type.element_type))

        em.hooks[a] = hook
    for a in op.body.args:
        if a.type.shape == col_shape and suffix and a not in em.hooks:
            em.hooks[a] = lambda c, a=a: (
                em.define(a, load_expression(ptrs[a], "c", a.type.element_type))
                if c == canon(col_shape, col_coords)
                else None
            )

    # Measured on an H100 (bench/results): two passes over register-cached rows beat the merged
    # single pass (its per-element exp and branch, or Welford's division, cost more than the
    # second block reduction saves), so merging is a template option, off by default.
    merge = params.setdefault("merge_passes", False)
    online, moments = _merged_pairs(op, reductions) if merge else ({}, {})
    partner = {**{s: m for m, s in online.items()}, **{s2: s1 for s1, (s2, _) in moments.items()}}
    # level of a value: how many passes over the row must finish before it is known (a merged
    # reduction is known after the same pass as its partner).
    level: dict[Value, int] = {a: 0 for a in op.body.args}
    for inner in op.body.ops:
        base = max((level.get(x, 0) for x in inner.operands), default=0)
        for r in inner.results:
            if inner.has_trait(REDUCTION):
                level[r] = level[partner[r]] if r in partner else base + 1
            else:
                level[r] = base
    smem, seen_smem = [], {}
    done: set[Value] = set()
    kept: dict[Value, str] = {}
    keep_operands = params.setdefault("keep_in_registers", True)
    keep_shape = tuple(1 if d in red_axes else full[d] for d in range(len(full)))
    scalar_shapes = (row_shape, keep_shape)
    finished = [0]  # passes completed so far

    def emit_ready_scalars():
        """Values with one element per row are computed once per row, as soon as known."""
        for inner in op.body.ops:
            if inner.has_trait(REDUCTION) or inner is op.body.last:
                continue
            for r in inner.results:
                if (
                    r.type.shape in scalar_shapes
                    and r.type.shape != full
                    and r not in done
                    and level[r] <= finished[0]
                ):
                    em.value(r, scalar_coords(r.type.shape))
                    done.add(r)

    def shared(ctype: str, size: int, kind: str) -> str:
        key = (ctype, size, kind)
        if key not in seen_smem:
            seen_smem[key] = f"smem_{len(seen_smem)}"
            smem.append({"ctype": ctype, "name": seen_smem[key], "size": size})
        return seen_smem[key]

    emit_ready_scalars()
    before = em.take(2)
    passes = []
    max_level = max(level[r.results[0]] for r in reductions)
    for lv in range(max_level):
        group = [
            r for r in reductions if level[r.results[0]] == lv + 1 and r.results[0] not in partner
        ]
        pass_decls, combines, hooks, what = [], [], {}, []
        em.push()
        for red in group:
            elem = red.results[0].type.element_type
            ctype = COMPUTE_CTYPE[elem]
            val = em.value(red.operands[0], full_coords)
            result = red.results[0]
            if result in online:
                m, sm = em.fresh("max"), em.fresh("sum")
                pass_decls += [
                    f"{ctype} {m} = ({ctype}) -INFINITY;",
                    f"{ctype} {sm} = ({ctype}) 0;",
                ]
                em.emit(f"tgc_online_add({m}, {sm}, {val});")
                combines.append(
                    f"tgc_warp_online({m}, {sm});"
                    if warp_per_row
                    else f"tgc_block_online<{tpr}>({m}, {sm}, {shared(ctype, 64, 'online')});"
                )
                hooks[result] = m
                hooks[online[result]] = sm
                what.append("online max and sum of exp")
                continue
            if result in moments:
                n, mean, m2 = em.fresh("n"), em.fresh("mean"), em.fresh("m2")
                pass_decls += [f"{ctype} {n} = 0, {mean} = 0, {m2} = 0;"]
                em.emit(f"tgc_moments_add({n}, {mean}, {m2}, {val});")
                combines.append(
                    f"tgc_warp_moments({n}, {mean}, {m2});"
                    if warp_per_row
                    else f"tgc_block_moments<{tpr}>({n}, {mean}, {m2}, {shared(ctype, 96, 'moments')});"
                )
                total = em.fresh("sum")
                combines.append(f"const {ctype} {total} = {mean} * {n};")
                hooks[result] = total
                second, centre = moments[result]
                hooks[second] = _centred_square_sum(em, n, mean, m2, centre, scalar_coords, ctype)
                what.append("sum and centred sum of squares in one pass")
                continue
            operand = red.operands[0]
            if (
                keep_operands
                and cached_args
                and len(operand.users()) > 1
                and operand not in kept
                and operand not in em.hooks
                and operand not in ptrs
            ):
                # Other ops read this operand later (softmax's exp): keep it in registers.
                reg = f"t{len(kept)}"
                kept[operand] = reg
                em.emit(f"{reg}[k * {vec} + l] = {val};")
            functor, identities = REDUCE_CODE[red.name]
            identity = identities.get(type_class(elem)) or _int_identity(red.name, elem)
            name = em.fresh("acc")
            pass_decls.append(f"{ctype} {name} = {identity};")
            em.emit(f"{name} = {functor}()({name}, {val});")
            if warp_per_row:
                combines.append(f"{name} = tgc_warp_reduce({name}, {functor}());")
            else:
                combines.append(
                    f"{name} = tgc_block_reduce<{tpr}>({name}, {functor}(), ({ctype}) "
                    f"{identity}, {shared(ctype, 32, 'reduce')});"
                )
            hooks[result] = name
            what.append(red.name.split(".")[1])
        body = em.take(8)
        em.pop()
        for v, reg in kept.items():
            if v not in em.hooks:
                em.hooks[v] = lambda c, reg=reg: (
                    f"{reg}[k * {vec} + l]" if c == full_coords else None
                )
        for v, h in hooks.items():
            em.hooks[v] = h if callable(h) else (lambda c, n=h: n)
        finished[0] += 1
        emit_ready_scalars()
        passes.append(
            {
                "what": ", ".join(what),
                "decls": pass_decls,
                "combines": combines,
                "body": body,
                "after": em.take(2),
            }
        )

    em.push()
    out_infos = []
    for j in full_yields:
        y = yields[j]
        val = store_value(em.value(y, full_coords), op.results[j].type.element_type)
        em.emit(f"o{j}.v[l] = {val};")
        out_infos.append(
            {
                "storage": STORAGE_CTYPE[op.results[j].type.element_type],
                "reg": f"o{j}",
                "ptr": outs[j],
            }
        )
    output_body = em.take(8)
    em.pop()
    for j in row_yields:
        y = yields[j]
        val = store_value(em.value(y, scalar_coords(y.type.shape)), op.results[j].type.element_type)
        em.emit(f"{outs[j]}[r] = {val};")
    row_output_body = em.take(4)

    cached = [
        {
            "ctype": COMPUTE_CTYPE[a.type.element_type],
            "storage": STORAGE_CTYPE[a.type.element_type],
            "reg": cache_regs[a],
            "ptr": ptrs[a],
            "convert": "tgc_cvt(w.v[l])" if a.type.element_type in ("f16", "bf16") else "w.v[l]",
        }
        for a in cached_args
    ]
    if not suffix and full_yields:
        raise TgcError(f"kernel '{kernel_label(op)}' writes full rows of a non-suffix reduction")
    source = render(
        "row_reduction.cu.j2",
        name=symbol,
        params=decls,
        idx_t=_idx_type(op),
        nrows=nrows,
        ncols=ncols,
        warp_per_row=warp_per_row,
        block_size=block_size,
        tpr=tpr,
        chunks=chunks,
        vec=vec,
        unroll=unroll,
        cached=cached,
        smem=smem,
        before=before,
        stream="true" if params.setdefault("streaming", False) else "false",
        kept=[{"ctype": COMPUTE_CTYPE[v.type.element_type], "reg": r} for v, r in kept.items()],
        passes=passes,
        full_outputs=out_infos,
        output_body=output_body,
        row_outputs=bool(row_yields),
        row_output_body=row_output_body,
    )
    rows_per_block = block_size // 32 if warp_per_row else 1
    params["rows_per_block"] = rows_per_block
    grid = (max(1, math.ceil(nrows / rows_per_block)), 1, 1)
    return KernelSource(
        symbol,
        source,
        "row_reduction",
        len(op.operands),
        len(op.results),
        grid,
        (block_size, 1, 1),
        params,
        op.loc,
        op.attr("name"),
    )


def _strip_unit_views(v: Value) -> Value:
    from tgc.passes.fuse import is_unit_reshape

    while v.defining_op is not None and (
        v.defining_op.name == "atomic.broadcast" or is_unit_reshape(v.defining_op)
    ):
        v = v.defining_op.operands[0]
    return v


def _merged_pairs(op: FusedOp, reductions) -> tuple[dict, dict]:
    """Reductions that can share one pass over the row with the reduction they depend on:
    - online softmax: max(x) and sum(exp(x - max(x))) -> {max result: sum result};
    - moments: s = sum(x) and sum((x - m)^2) with m known from s -> {s result: (second, m)}."""
    online, moments, used = {}, {}, set()
    results = {r.results[0]: r for r in reductions}
    for red in reductions:
        if red.name != "atomic.reduce_sum" or not red.results[0].type.is_float:
            continue
        inner = red.operands[0].defining_op
        if inner is not None and inner.name == "atomic.exp":
            sub = inner.operands[0].defining_op
            if sub is not None and sub.name == "atomic.sub":
                mx = results.get(_strip_unit_views(sub.operands[1]))
                if (
                    mx is not None
                    and mx.name == "atomic.reduce_max"
                    and mx.operands[0] is sub.operands[0]
                    and mx not in used
                    and red not in used
                ):
                    online[mx.results[0]] = red.results[0]
                    used |= {mx, red}
            continue
        if (
            inner is not None
            and inner.name == "atomic.mul"
            and inner.operands[0] is inner.operands[1]
        ):
            sub = inner.operands[0].defining_op
            if sub is None or sub.name != "atomic.sub":
                continue
            x, centre = sub.operands[0], _strip_unit_views(sub.operands[1])
            first = next(
                (
                    r
                    for r in reductions
                    if r.name == "atomic.reduce_sum"
                    and r.operands[0] is x
                    and r is not red
                    and r not in used
                ),
                None,
            )
            if first is None or red in used or not _depends_only_on(centre, first, op):
                continue
            moments[first.results[0]] = (red.results[0], centre)
            used |= {first, red}
    return online, moments


def _depends_only_on(v: Value, reduction, op: FusedOp) -> bool:
    """True when the per-row value `v` is computed from `reduction`'s result and constants."""
    stack, seen = [v], set()
    found = False
    while stack:
        x = stack.pop()
        if x in seen:
            continue
        seen.add(x)
        if x is reduction.results[0]:
            found = True
            continue
        d = x.defining_op
        if d is None or d.has_trait(REDUCTION) or d.name == "atomic.matmul":
            return False
        stack.extend(d.operands)
    return found


def _centred_square_sum(
    em: Emitter, n: str, mean: str, m2: str, centre: Value, scalar_coords, ctype: str
):
    """sum((x - c)^2) = m2 + n (mean - c)^2, emitted when first needed (c is known by then)."""

    def hook(coords):
        c = em.value(centre, scalar_coords(centre.type.shape))
        d = em.fresh("d")
        em.emit(f"const {ctype} {d} = {mean} - {c};")
        return em.define(centre, f"{m2} + {n} * {d} * {d}")

    return hook


def _int_identity(name: str, elem: str) -> str:
    bits = {"i8": 8, "i32": 32, "i64": 64}.get(elem, 32)
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if name == "atomic.reduce_max":
        return f"({low + 1}LL - 1)" if bits == 64 else str(low)
    return f"{high}LL" if bits == 64 else str(high)


# -- matmul with epilogue ---------------------------------------------------------------------------


def _matmul(op: FusedOp, params: dict, symbol: str) -> KernelSource:
    decls, ptrs, outs = _params_decl(op)
    mm = matmul_of(op)
    a, b = mm.operands
    for x in (a, b):
        if x not in ptrs:
            raise TgcError("matmul operands must be kernel inputs", mm.loc)
    ta, tb = mm.attr("transpose_a"), mm.attr("transpose_b")
    out = mm.results[0].type.shape
    m, n = out[-2], out[-1]
    k = a.type.shape[-2] if ta else a.type.shape[-1]
    batch_shape = out[:-2]
    batch = math.prod(batch_shape)
    bcoords = delinearize("z", batch_shape)
    a_batch = broadcast_coords(a.type.shape[:-2], batch_shape, bcoords)
    b_batch = broadcast_coords(b.type.shape[:-2], batch_shape, bcoords)
    a_off = linear_offset(a.type.shape, a_batch + ("0", "0"))
    b_off = linear_offset(b.type.shape, b_batch + ("0", "0"))
    sam, sak = (1, m) if ta else (k, 1)
    sbk, sbn = (1, k) if tb else (n, 1)

    def load(x: Value, first: str, s1: int, second: str, s2: int, base: str) -> str:
        offset = f"{base} + {first} * {s1} + {second} * {s2}"
        return load_expression(ptrs[x], offset, x.type.element_type)

    bm = int(params.setdefault("block_m", 64))
    bn = int(params.setdefault("block_n", 64))
    bk = int(params.setdefault("block_k", 16))
    tm = int(params.setdefault("thread_m", 4))
    tn = int(params.setdefault("thread_n", 4))
    threads = (bm // tm) * (bn // tn)

    em = Emitter(ptrs)
    em.hooks[mm.results[0]] = lambda c: "mm_val"
    coords = bcoords + ("m", "n")
    for j, (y, r) in enumerate(zip(_yields(op), op.results)):
        if r.type.shape != out:
            raise TgcError(f"matmul kernel '{kernel_label(op)}' yields a value of another shape")
        val = store_value(em.value(y, coords), r.type.element_type)
        em.emit(f"{outs[j]}[{linear_offset(out, coords)}] = {val};")
    epilogue = em.take(8)
    acc_t = COMPUTE_CTYPE[mm.results[0].type.element_type]
    source = render(
        "matmul.cu.j2",
        name=symbol,
        params=decls,
        idx_t=_idx_type(op),
        acc_t=acc_t,
        m=m,
        n=n,
        k=k,
        batch=batch,
        bm=bm,
        bn=bn,
        bk=bk,
        tm=tm,
        tn=tn,
        threads=threads,
        a_batch_offset=a_off,
        b_batch_offset=b_off,
        a_k_contiguous=not ta,
        b_n_contiguous=not tb,
        a_load=load(a, "m", sam, "kx", sak, "a_base"),
        b_load=load(b, "kx", sbk, "n", sbn, "b_base"),
        epilogue=epilogue,
    )
    grid = (math.ceil(n / bn), math.ceil(m / bm), batch)
    return KernelSource(
        symbol,
        source,
        "matmul",
        len(op.operands),
        len(op.results),
        grid,
        (threads, 1, 1),
        params,
        op.loc,
        op.attr("name"),
    )


__all__ = [
    "KernelSource",
    "c_identifier",
    "generate_epilogue_kernel",
    "generate_kernel",
    "literal",
    "module_names",
    "prelude",
]
