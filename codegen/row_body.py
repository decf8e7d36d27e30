"""The C statements of a row-reduction kernel: the per-row values known before the first pass,
each pass over the row (its accumulators, per-column body and combine across threads), and the
outputs. `RowBody.emit` returns them as plain data (`RowText`) for row_reduction.cu.j2.

Inside a pass, column c of row r is element l of chunk k of the thread; a full input cached in
registers is read as `x<i>[k * vec + l]`. Values with one element per row are computed once per
row, right after the pass that makes them known.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from tgc.codegen.cuda_ops import (
    COMPUTE_CTYPE,
    REDUCE_CODE,
    STORAGE_CTYPE,
    load_expression,
    store_value,
    type_class,
)
from tgc.codegen.emitter import Emitter, canon
from tgc.codegen.render import yields_of
from tgc.codegen.row_layout import RowLaunch, RowLayout
from tgc.codegen.row_passes import PassPlan
from tgc.dialects.kernel import FusedOp
from tgc.ir import Operation, Value
from tgc.opdef import REDUCTION


@dataclass
class RowText:
    """The template data the body gives (see row_reduction.cu.j2)."""

    before: str  # per-row values known before any pass
    passes: list[dict]  # what, decls, body, combines, after (per-row values known after it)
    full_outputs: list[dict]  # storage, reg, ptr of each full-row output
    output_body: str  # stores of the full-row outputs at column c
    row_output_body: str  # stores of the per-row outputs (thread 0 of the row)
    smem: list[dict]  # shared scratch of the block combines: ctype, name, size
    kept: list[dict]  # registers keeping a reduction operand that later ops read: ctype, reg
    cached: list[dict]  # full inputs cached in registers: ctype, storage, reg, ptr, convert


@dataclass
class _PassParts:
    """What the reductions of one pass add: accumulator declarations, combines, the hook (a
    C name, or a function of the coordinates) giving each result, and a description."""

    decls: list[str] = field(default_factory=list)
    combines: list[str] = field(default_factory=list)
    hooks: dict = field(default_factory=dict)
    what: list[str] = field(default_factory=list)


class RowBody:
    """One use: `RowBody(...).emit(outs)`."""

    def __init__(
        self,
        op: FusedOp,
        layout: RowLayout,
        launch: RowLaunch,
        plan: PassPlan,
        ptrs: dict[Value, str],
        keep_operands: bool,
    ) -> None:
        self.op, self.layout, self.launch, self.plan = op, layout, launch, plan
        self.ptrs = ptrs
        self.keep_operands = keep_operands
        self.em = Emitter(ptrs)
        self.cache_regs = {a: f"x{i}" for i, a in enumerate(launch.cached_args)}
        self.smem: list[dict] = []
        self.smem_names: dict[tuple, str] = {}
        self.kept: dict[Value, str] = {}  # reduction operand -> its register array
        self.done: set[Value] = set()  # per-row values already computed
        self.finished = 0  # passes completed so far

    def emit(self, outs: list[str]) -> RowText:
        self._hook_inputs()
        self._emit_ready_scalars()
        before = self.em.take(2)
        passes = [self._pass(group) for group in self.plan.groups]
        full_outputs, output_body = self._full_outputs(outs)
        row_output_body = self._row_outputs(outs)
        return RowText(
            before=before,
            passes=passes,
            full_outputs=full_outputs,
            output_body=output_body,
            row_output_body=row_output_body,
            smem=self.smem,
            kept=[
                {"ctype": COMPUTE_CTYPE[v.type.element_type], "reg": r}
                for v, r in self.kept.items()
            ],
            cached=self._cached_inputs(),
        )

    # -- inputs and per-row values ---------------------------------------------------------------

    def _hook_inputs(self) -> None:
        """Full inputs read at (r, c) from their register cache or memory; inputs of the
        reduced axes' shape (suffix only) read at c."""
        em, layout, vec = self.em, self.layout, self.launch.vec
        for a in layout.full_args:

            def hook(c, a=a):
                if c != layout.full_coords:
                    return None
                if a in self.cache_regs:
                    return f"{self.cache_regs[a]}[k * {vec} + l]"
                offset = f"r * {layout.ncols} + c"
                return em.define(a, load_expression(self.ptrs[a], offset, a.type.element_type))

            em.hooks[a] = hook
        col_coords = canon(layout.col_shape, layout.col_coords)
        for a in self.op.body.args:
            if a.type.shape == layout.col_shape and layout.suffix and a not in em.hooks:
                em.hooks[a] = lambda c, a=a: (
                    em.define(a, load_expression(self.ptrs[a], "c", a.type.element_type))
                    if c == col_coords
                    else None
                )

    def _emit_ready_scalars(self) -> None:
        """Values with one element per row are computed once per row, as soon as known."""
        layout = self.layout
        scalar_shapes = (layout.row_shape, layout.keep_shape)
        for inner in self.op.body.ops:
            if inner.has_trait(REDUCTION) or inner is self.op.body.last:
                continue
            for r in inner.results:
                if (
                    r.type.shape in scalar_shapes
                    and r.type.shape != layout.full
                    and r not in self.done
                    and self.plan.level[r] <= self.finished
                ):
                    self.em.value(r, layout.scalar_coords(r.type.shape))
                    self.done.add(r)

    def _cached_inputs(self) -> list[dict]:
        return [
            {
                "ctype": COMPUTE_CTYPE[a.type.element_type],
                "storage": STORAGE_CTYPE[a.type.element_type],
                "reg": self.cache_regs[a],
                "ptr": self.ptrs[a],
                "convert": (
                    "tgc_cvt(w.v[l])" if a.type.element_type in ("f16", "bf16") else "w.v[l]"
                ),
            }
            for a in self.launch.cached_args
        ]

    # -- passes over the row ---------------------------------------------------------------------

    def _pass(self, group: list[Operation]) -> dict:
        """One pass computing the reductions of `group` (with their merged partners)."""
        em, parts = self.em, _PassParts()
        em.push()
        for red in group:
            val = em.value(red.operands[0], self.layout.full_coords)
            if red.results[0] in self.plan.online:
                self._online(red, val, parts)
            elif red.results[0] in self.plan.moments:
                self._moments(red, val, parts)
            else:
                self._plain(red, val, parts)
        body = em.take(8)
        em.pop()
        self._publish(parts.hooks)
        self.finished += 1
        self._emit_ready_scalars()
        return {
            "what": ", ".join(parts.what),
            "decls": parts.decls,
            "combines": parts.combines,
            "body": body,
            "after": em.take(2),
        }

    def _publish(self, hooks: dict) -> None:
        """After a pass: kept operands read from their registers, results from the accumulators."""
        em, vec, full_coords = self.em, self.launch.vec, self.layout.full_coords
        for v, reg in self.kept.items():
            if v not in em.hooks:
                em.hooks[v] = lambda c, reg=reg: (
                    f"{reg}[k * {vec} + l]" if c == full_coords else None
                )
        for v, h in hooks.items():
            em.hooks[v] = h if callable(h) else (lambda c, n=h: n)

    def _combine(self, warp: str, block: str, ctype: str, size: int, kind: str) -> str:
        """The combine across the threads of a row: `warp`, or `block` with its shared scratch
        in place of {smem} and the threads per row in place of {tpr}."""
        if self.launch.warp_per_row:
            return warp
        return block.format(tpr=self.launch.tpr, smem=self._shared(ctype, size, kind))

    def _shared(self, ctype: str, size: int, kind: str) -> str:
        key = (ctype, size, kind)
        if key not in self.smem_names:
            self.smem_names[key] = f"smem_{len(self.smem_names)}"
            self.smem.append({"ctype": ctype, "name": self.smem_names[key], "size": size})
        return self.smem_names[key]

    def _online(self, red: Operation, val: str, parts: _PassParts) -> None:
        """max(x) and sum(exp(x - max(x))) in one pass (online softmax)."""
        em, result = self.em, red.results[0]
        ctype = COMPUTE_CTYPE[result.type.element_type]
        m, sm = em.fresh("max"), em.fresh("sum")
        parts.decls += [f"{ctype} {m} = ({ctype}) -INFINITY;", f"{ctype} {sm} = ({ctype}) 0;"]
        em.emit(f"tgc_online_add({m}, {sm}, {val});")
        parts.combines.append(
            self._combine(
                f"tgc_warp_online({m}, {sm});",
                f"tgc_block_online<{{tpr}}>({m}, {sm}, {{smem}});",
                ctype,
                64,
                "online",
            )
        )
        parts.hooks[result] = m
        parts.hooks[self.plan.online[result]] = sm
        parts.what.append("online max and sum of exp")

    def _moments(self, red: Operation, val: str, parts: _PassParts) -> None:
        """sum(x) and sum((x - m)^2) in one pass (Welford's count, mean and M2)."""
        em, result = self.em, red.results[0]
        ctype = COMPUTE_CTYPE[result.type.element_type]
        n, mean, m2 = em.fresh("n"), em.fresh("mean"), em.fresh("m2")
        parts.decls += [f"{ctype} {n} = 0, {mean} = 0, {m2} = 0;"]
        em.emit(f"tgc_moments_add({n}, {mean}, {m2}, {val});")
        parts.combines.append(
            self._combine(
                f"tgc_warp_moments({n}, {mean}, {m2});",
                f"tgc_block_moments<{{tpr}}>({n}, {mean}, {m2}, {{smem}});",
                ctype,
                96,
                "moments",
            )
        )
        total = em.fresh("sum")
        parts.combines.append(f"const {ctype} {total} = {mean} * {n};")
        parts.hooks[result] = total
        second, centre = self.plan.moments[result]
        parts.hooks[second] = self._centred_square_sum(n, mean, m2, centre, ctype)
        parts.what.append("sum and centred sum of squares in one pass")

    def _centred_square_sum(self, n: str, mean: str, m2: str, centre: Value, ctype: str):
        """sum((x - c)^2) = m2 + n (mean - c)^2, emitted when first needed (c is known by then)."""
        em = self.em

        def hook(coords):
            c = em.value(centre, self.layout.scalar_coords(centre.type.shape))
            d = em.fresh("d")
            em.emit(f"const {ctype} {d} = {mean} - {c};")
            return em.define(centre, f"{m2} + {n} * {d} * {d}")

        return hook

    def _plain(self, red: Operation, val: str, parts: _PassParts) -> None:
        """A sum, max or min with its own accumulator."""
        em, result = self.em, red.results[0]
        elem = result.type.element_type
        ctype = COMPUTE_CTYPE[elem]
        if self._keeps(red.operands[0]):
            # Other ops read this operand later (softmax's exp): keep it in registers.
            reg = f"t{len(self.kept)}"
            self.kept[red.operands[0]] = reg
            em.emit(f"{reg}[k * {self.launch.vec} + l] = {val};")
        functor, identities = REDUCE_CODE[red.name]
        identity = identities.get(type_class(elem)) or _int_identity(red.name, elem)
        name = em.fresh("acc")
        parts.decls.append(f"{ctype} {name} = {identity};")
        em.emit(f"{name} = {functor}()({name}, {val});")
        parts.combines.append(
            self._combine(
                f"{name} = tgc_warp_reduce({name}, {functor}());",
                f"{name} = tgc_block_reduce<{{tpr}}>({name}, {functor}(), ({ctype}) "
                f"{identity}, {{smem}});",
                ctype,
                32,
                "reduce",
            )
        )
        parts.hooks[result] = name
        parts.what.append(red.name.split(".")[1])

    def _keeps(self, operand: Value) -> bool:
        """Whether a reduction's operand, which other ops read too, is kept in registers."""
        return bool(
            self.keep_operands
            and self.launch.cached_args
            and len(operand.users()) > 1
            and operand not in self.kept
            and operand not in self.em.hooks
            and operand not in self.ptrs
        )

    # -- outputs -----------------------------------------------------------------------------

    def _full_outputs(self, outs: list[str]) -> tuple[list[dict], str]:
        """Full-row outputs: element l of vector register o<j>, stored by the template."""
        em, op, layout = self.em, self.op, self.layout
        yields = yields_of(op)
        em.push()
        self._hook_reshaped_rows()
        infos = []
        for j in self.layout.full_yields:
            element_type = op.results[j].type.element_type
            coords = layout.full_coords_of(yields[j].type.shape)
            val = store_value(em.value(yields[j], coords), element_type)
            em.emit(f"o{j}.v[l] = {val};")
            infos.append({"storage": STORAGE_CTYPE[element_type], "reg": f"o{j}", "ptr": outs[j]})
        body = em.take(8)
        em.pop()
        return infos, body

    def _hook_reshaped_rows(self) -> None:
        """A reshape of the full rows to other dims, read at (r, c) in its shape, is the rows
        at (r, c): so its values come from the registers that hold the row (the index
        arithmetic of the reshape, which would get there too, would load them again)."""
        em, layout = self.em, self.layout
        for inner in self.op.body.ops:
            if inner.name != "atomic.reshape" or inner.operands[0].type.shape != layout.full:
                continue
            (result,), operand = inner.results, inner.operands[0]
            at = layout.full_coords_of(result.type.shape)
            em.hooks[result] = lambda c, at=at, operand=operand: (
                em.value(operand, layout.full_coords) if c == at else None
            )

    def _row_outputs(self, outs: list[str]) -> str:
        """Per-row outputs, stored at r."""
        em, op = self.em, self.op
        yields = yields_of(op)
        for j in self.layout.row_yields:
            y = yields[j]
            coords = self.layout.scalar_coords(y.type.shape)
            val = store_value(em.value(y, coords), op.results[j].type.element_type)
            em.emit(f"{outs[j]}[r] = {val};")
        return em.take(4)


def _int_identity(name: str, elem: str) -> str:
    """The identity of an integer max or min of `elem` (a C literal)."""
    bits = {"i8": 8, "i32": 32, "i64": 64}.get(elem, 32)
    low, high = -(2 ** (bits - 1)), 2 ** (bits - 1) - 1
    if name == "atomic.reduce_max":
        return f"({low + 1}LL - 1)" if bits == 64 else str(low)
    return f"{high}LL" if bits == 64 else str(high)
