"""The row-reduction template: reductions over the same axes of one shape, each row handled by a
warp or a block, with the ops before them as their prologue and the ops after as their epilogue
(outputs of the full shape or with one value per row).
"""

from __future__ import annotations

import math

from tgc.codegen.cuda_ops import (
    COMPUTE_CTYPE,
    REDUCE_CODE,
    STORAGE_CTYPE,
    load_expression,
    store_value,
    type_class,
)
from tgc.codegen.emitter import Emitter, canon, delinearize
from tgc.codegen.render import (
    KernelSource,
    idx_type,
    kernel_label,
    params_decl,
    render,
    yields_of,
)
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.ir import Operation, Value
from tgc.opdef import REDUCTION
from tgc.types import ELEMENT_BYTES


def reductions_of(op: FusedOp) -> list[Operation]:
    """The reductions of the region, in program order."""
    return [inner for inner in op.body.ops if inner.has_trait(REDUCTION)]


def generate_row_reduction(op: FusedOp, params: dict, symbol: str) -> KernelSource:
    """The row-reduction kernel of `op`."""
    decls, ptrs, outs = params_decl(op)
    reductions = reductions_of(op)
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

    yields = yields_of(op)
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
        idx_t=idx_type(op),
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
