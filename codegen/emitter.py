"""The expression emitter: C statements that compute a region's values at given coordinates.

Every value of a fused region is a function of its coordinates. `Emitter.value(v, coords)`
returns a C variable (or literal) holding `v` at `coords` (C expressions, one per dim), emitting
the statements that compute it on first use; a value is computed once per scope and coordinate
tuple. Views (ops with the VIEW trait) only transform coordinates, through their index map in
`VIEW_INDEX_MAPS`, so a view of a kernel input becomes index arithmetic on its load. Templates
decide where the statements go (scopes) and may supply values themselves through hooks (vector
registers, reductions, the matmul accumulator).
"""

from __future__ import annotations

from collections.abc import Callable

from tgc.codegen.cuda_ops import COMPUTE_CTYPE, expression, has_code, literal, load_expression
from tgc.diagnostics import TgcError
from tgc.ir import Operation, Value
from tgc.types import contiguous_strides

Coords = tuple[str, ...]
Hook = Callable[[Coords], "str | None"]


def canon(shape: tuple[int, ...], coords: Coords) -> Coords:
    """Coordinates with the ones of unit dims replaced by "0" (one spelling per position)."""
    return tuple("0" if d == 1 else c for d, c in zip(shape, coords))


def linear_offset(shape: tuple[int, ...], coords: Coords) -> str:
    """sum(coord * stride) for a contiguous tensor of `shape`."""
    terms = []
    for c, s in zip(canon(shape, coords), contiguous_strides(shape)):
        if c == "0":
            continue
        terms.append(c if s == 1 else f"{c} * {s}")
    return " + ".join(terms) if terms else "0"


def delinearize(index: str, shape: tuple[int, ...]) -> Coords:
    """Coordinates of the linear position `index` (a C expression, < numel) in `shape`."""
    strides = contiguous_strides(shape)
    out = []
    for i, (d, s) in enumerate(zip(shape, strides)):
        if d == 1:
            out.append("0")
            continue
        c = index if s == 1 else f"({index} / {s})"
        if i > 0 and any(e != 1 for e in shape[:i]):
            c = f"({c} % {d})"
        out.append(c)
    return tuple(out)


def broadcast_coords(operand: tuple[int, ...], result: tuple[int, ...], coords: Coords) -> Coords:
    """Coordinates in `operand` that numpy broadcasting reads for `coords` in `result`."""
    tail = coords[len(result) - len(operand) :] if operand else ()
    return canon(operand, tail)


class Emitter:
    def __init__(self, arg_ptrs: dict[Value, str]) -> None:
        self.arg_ptrs = arg_ptrs
        self.hooks: dict[Value, Hook] = {}
        self.scopes: list[dict[tuple[Value, Coords], str]] = [{}]
        self.lines: list[str] = []
        self.counter = 0

    # -- scopes and output --------------------------------------------------------------------

    def push(self) -> None:
        self.scopes.append({})

    def pop(self) -> None:
        self.scopes.pop()

    def take(self, indent: int) -> str:
        """The statements emitted since the last take, indented by `indent` spaces."""
        text = "\n".join(" " * indent + line for line in self.lines)
        self.lines = []
        return text

    def emit(self, line: str) -> None:
        self.lines.append(line)

    def fresh(self, prefix: str = "v") -> str:
        self.counter += 1
        return f"{prefix}{self.counter}"

    def remember(self, v: Value, coords: Coords, name: str) -> None:
        self.scopes[-1][(v, canon(v.type.shape, coords))] = name

    def lookup(self, v: Value, coords: Coords) -> str | None:
        key = (v, canon(v.type.shape, coords))
        for scope in reversed(self.scopes):
            if key in scope:
                return scope[key]
        return None

    # -- values -------------------------------------------------------------------------------

    def define(self, v: Value, expr: str) -> str:
        name = self.fresh()
        self.emit(f"const {COMPUTE_CTYPE[v.type.element_type]} {name} = {expr};")
        return name

    def load(self, arg: Value, coords: Coords) -> str:
        t = arg.type
        return load_expression(self.arg_ptrs[arg], linear_offset(t.shape, coords), t.element_type)

    def value(self, v: Value, coords: Coords) -> str:
        """The C name of `v` at `coords`, emitting what computes it on first use.

        Iterative: each value is computed by a generator (`_steps`) that yields the (operand,
        coordinates) it needs and is sent back their names, and this loop runs those generators
        on an explicit stack, so a chain of 10,000 elementwise ops needs no Python recursion.
        The statements come out in the order a recursive walk would emit them."""
        stack: list = []
        gen = self._steps(v, coords)
        sent: str | None = None
        while True:
            try:
                request = gen.send(sent)
            except StopIteration as done:
                if not stack:
                    return done.value
                gen, sent = stack.pop(), done.value
                continue
            stack.append(gen)
            gen, sent = self._steps(*request), None

    def _steps(self, v: Value, coords: Coords):
        coords = canon(v.type.shape, coords)
        found = self.lookup(v, coords)
        if found is not None:
            return found
        hook = self.hooks.get(v)
        name = hook(coords) if hook is not None else None
        if name is None:
            if v in self.arg_ptrs or v.defining_op is None:
                name = self.define(v, self.load(v, coords))
            else:
                name = yield from self._compute(v, coords)
        self.remember(v, coords, name)
        return name

    def _compute(self, v: Value, coords: Coords):
        """A generator: yields (operand, coords) for each operand value it needs (sent back its
        name) and returns the name of `v` at `coords`."""
        op = v.defining_op
        shape = v.type.shape
        name = op.name
        if name == "atomic.constant":
            splat = op.attr("value").splat_value()
            if splat is None:
                raise TgcError("a non-splat constant cannot be inlined into a kernel", op.loc)
            return literal(splat, v.type.element_type)
        if name == "atomic.iota":
            axis = op.attr("axis") % len(shape)
            return f"(({COMPUTE_CTYPE[v.type.element_type]}) {coords[axis]})"
        index_map = VIEW_INDEX_MAPS.get(name)
        if index_map is not None:
            return (yield (op.operands[0], index_map(self, op, v, coords)))
        if name == "atomic.concat":
            return (yield from self._concat(op, v, coords))
        if name == "atomic.gather":
            return (yield from self._gather(op, v, coords))
        power = _small_power(op)
        if power is not None:  # x**2, x**3: products, not powf (GPT-2's GELU cubes x)
            base = yield (
                op.operands[0],
                broadcast_coords(op.operands[0].type.shape, shape, coords),
            )
            return self.define(v, "(" + " * ".join([base] * power) + ")")
        if has_code(op):
            operands = []
            for x in op.operands:
                operands.append((yield (x, broadcast_coords(x.type.shape, shape, coords))))
            return self.define(v, expression(op, operands, [x.type for x in op.operands]))
        raise TgcError(f"'{name}' cannot be generated inside this kernel", op.loc)

    def reshape_coords(self, op, coords: Coords) -> Coords:
        src, dst = op.operands[0].type.shape, op.results[0].type.shape
        if [d for d in src if d != 1] == [d for d in dst if d != 1]:
            it = iter(c for c, d in zip(coords, dst) if d != 1)
            return tuple("0" if d == 1 else next(it) for d in src)
        flat = self.fresh("l")
        self.emit(f"const idx_t {flat} = {linear_offset(dst, coords)};")
        return delinearize(flat, src)

    def _concat(self, op, v: Value, coords: Coords):
        """Each piece is computed only in its own branch (its loads stay in bounds)."""
        axis = op.attr("axis") % len(coords)
        name = self.fresh()
        self.emit(f"{COMPUTE_CTYPE[v.type.element_type]} {name};")
        start = 0
        for i, x in enumerate(op.operands):
            size = x.type.shape[axis]
            inner = tuple(_affine(c, 1, -start) if d == axis else c for d, c in enumerate(coords))
            last = i == len(op.operands) - 1
            keyword = "if" if i == 0 else "else if"
            self.emit("else {" if last else f"{keyword} ({coords[axis]} < {start + size}) {{")
            self.push()
            piece = yield (x, inner)
            self.emit(f"{name} = {piece};")
            self.pop()
            self.emit("}")
            start += size
        return name

    def _gather(self, op, v: Value, coords: Coords):
        table, indices = op.operands
        axis = op.attr("axis") % table.type.rank
        k = indices.type.rank
        index = yield (indices, coords[axis : axis + k])
        inner = coords[:axis] + (f"((idx_t) {index})",) + coords[axis + k :]
        return (yield (table, inner))


SMALL_POWERS = (2, 3)  # exponents computed as products: one or two roundings, within powf's


def _small_power(op: Operation) -> int | None:
    """The exponent of a float `atomic.pow` whose exponent is a splat constant 2 or 3, else
    None. CUDA's powf is a general routine (logarithm, exponential, special cases) several times
    the cost of the multiplications, and no more exact than they are."""
    if op.name != "atomic.pow" or not op.results[0].type.is_float:
        return None
    exponent = op.operands[1].defining_op
    if exponent is None or exponent.name != "atomic.constant":
        return None
    splat = exponent.attr("value").splat_value()
    if splat is None or float(splat) not in SMALL_POWERS:
        return None
    return int(splat)


# -- the index map of each view op ------------------------------------------------------------------
#
# A view's value at `coords` is its operand's value at the coordinates its index map gives (C
# expressions). One entry per op with the VIEW trait; test_registry requires it.

IndexMap = Callable[[Emitter, Operation, Value, Coords], Coords]


def _broadcast_map(em: Emitter, op: Operation, v: Value, coords: Coords) -> Coords:
    return broadcast_coords(op.operands[0].type.shape, v.type.shape, coords)


def _transpose_map(em: Emitter, op: Operation, v: Value, coords: Coords) -> Coords:
    perm = op.attr("perm")
    inner = [""] * len(perm)
    for i, p in enumerate(perm):
        inner[p] = coords[i]
    return tuple(inner)


def _reshape_map(em: Emitter, op: Operation, v: Value, coords: Coords) -> Coords:
    return em.reshape_coords(op, coords)


def _slice_map(em: Emitter, op: Operation, v: Value, coords: Coords) -> Coords:
    return tuple(
        _affine(c, step, start) for c, start, step in zip(coords, op.attr("start"), op.attr("step"))
    )


def _split_map(em: Emitter, op: Operation, v: Value, coords: Coords) -> Coords:
    axis = op.attr("axis") % len(v.type.shape)
    offset = sum(op.attr("sizes")[: v.index])
    return tuple(_affine(c, 1, offset) if d == axis else c for d, c in enumerate(coords))


VIEW_INDEX_MAPS: dict[str, IndexMap] = {
    "atomic.broadcast": _broadcast_map,
    "atomic.transpose": _transpose_map,
    "atomic.reshape": _reshape_map,
    "atomic.slice": _slice_map,
    "atomic.split": _split_map,
}


def _affine(c: str, scale: int, offset: int) -> str:
    text = c if scale == 1 else f"{c} * {scale}"
    if offset == 0:
        return text if scale == 1 else f"({text})"
    sign = "+" if offset > 0 else "-"
    if c == "0":
        return str(offset)
    return f"({text} {sign} {abs(offset)})"
