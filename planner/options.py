"""The options at each op: every way the planner may run it.

At an op (the *root* of the option), the options are, in this order:

- every match of a registered kernel on every backend (`planner.match.matches_at`): an op kernel
  covers the op alone, a graph kernel covers the ops of its reference graph that end at the root
  (`Option.ops`, block order, root last);
- a generated fused kernel over a region that `fuse` would form: a hook (`FUSED_OPTIONS`), empty
  until the CUDA backend fills it;
- the op's decomposition (`op.decompose(builder)`, hl ops), built once per op signature in a
  scratch function, lowered all the way and put in canonical form (`lower-hl,canonicalize,cse,
  dce`) and planned recursively as a nested block (`Decomposition`). All the way, because a
  fused kernel cannot span the edge of a nested decomposition: a layernorm decomposed one level
  holds `hl.mean`s, so its regions would stop at them, where the fixed cuda route (lower-hl,
  then fuse) makes the whole layernorm one kernel (measured on an H100, 2026-11-23: 0.131 ms
  planned one level against 0.095 ms for the one kernel, at 8192x4096). Nested hl ops lose
  their own kernels inside a decomposition; the op itself keeps them.

Kernels whose stated error (`max_rel_error`) exceeds the tolerance are not options. The copies a
kernel's operands need are not options either: they follow from placements, and are kernels
registered here (`copy.host_to_cuda`, `copy.cuda_to_host`, op `kernel.copy`, on the backend of
their destination) so that they are costed through the same `CostSource` as any kernel.

`BlockOptions` holds, for one block, the ops a plan must cover (the *live* ops: those the
terminator depends on, in block order), the options of each, the ops some option covers without
being its root (*interior*) or reads by value (a graph kernel's constants): the ops a plan may
leave unrun (*optional*), and the *regions*: the ops grouped so that no option spans two
groups (union of every multi-op option's ops). A plan is an exact cover of each region by
options, and regions are independent (see `planner.paths`).
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import cached_property
from operator import attrgetter

import numpy as np

from tgc.attributes import attribute_key
from tgc.builder import Builder
from tgc.builtin import FuncOp, ModuleOp, ReturnOp
from tgc.ir import Block, Operation, Value
from tgc.planner.kernel import BACKEND_SPACE, KERNELS, Kernel, register_kernel, registry_version
from tgc.planner.match import Match, matches_at

# -- copies ------------------------------------------------------------------------------------

# (source space, destination space) -> the copy kernel's name.
COPY_KERNELS: dict[tuple[str | None, str | None], str] = {}


def _host_copy(inputs: list, attrs: dict, result_types: list) -> list:
    """On the host a copy is an array copy; the executor moves values between spaces itself."""
    return [np.array(inputs[0], copy=True)]


def _copy_constraint(src: str | None, dst: str | None) -> Callable:
    def constraint(types) -> str | None:
        (operand, *_), (result, *_) = types
        if operand.encoding != src or result.encoding != dst:
            return f"copies from {src or 'host'} to {dst or 'host'} only"
        return None

    return constraint


def register_copy(name: str, src: str | None, dst: str | None, backend: str) -> Kernel:
    kernel = register_kernel(
        Kernel(
            name,
            backend,
            op="kernel.copy",
            run=_host_copy,
            constraints=_copy_constraint(src, dst),
            doc=f"copy a value from {src or 'host'} to {dst or 'host'} memory",
        )
    )
    COPY_KERNELS[(src, dst)] = name
    return kernel


register_copy("copy.host_to_cuda", None, "cuda", "cuda")
register_copy("copy.cuda_to_host", "cuda", None, "numpy")


def copy_kernel(src: str | None, dst: str | None) -> Kernel | None:
    """The kernel that copies from space `src` to `dst` (None when there is none)."""
    name = COPY_KERNELS.get((src, dst))
    return None if name is None else KERNELS.get(name)


def is_copy(kernel: Kernel) -> bool:
    return kernel.op == "kernel.copy"


# -- options -----------------------------------------------------------------------------------

KERNEL, FUSED, DECOMPOSE = "kernel", "fused", "decompose"

# Hook for generated fused kernels: functions (root op) -> matches of generated kernels rooted
# there (a Match whose kernel is the generated one). The CUDA backend registers one.
FUSED_OPTIONS: list[Callable[[Operation], list[Match]]] = []


@dataclass(frozen=True, eq=False)
class Option:
    """One way to run `root`: a kernel match (kind "kernel" or "fused") covering `ops`, or the
    root's decomposition (kind "decompose", covering the root alone)."""

    kind: str
    root: Operation
    ops: tuple[Operation, ...]
    inputs: tuple[Value, ...]  # program values read (kernel argument order; operands for decompose)
    outputs: tuple[Value, ...]  # program values produced
    match: Match | None = None
    decomposition: Decomposition | None = None

    @property
    def kernel(self) -> Kernel | None:
        return None if self.match is None else self.match.kernel

    @cached_property  # asked in the solver's inner loop
    def extra_outputs(self) -> tuple[Value, ...]:
        """Values of covered ops other than the root that the option also writes, for readers
        outside it (a generated region with several results); () for most options."""
        return tuple(v for v in self.outputs if v.defining_op is not self.root)

    @property
    def space(self) -> str | None:
        """The memory space of a kernel option's operands and results."""
        return self.match.kernel.space

    @property
    def label(self) -> str:
        if self.kind == DECOMPOSE:
            return f"decompose {self.root.name}"
        return self.match.kernel.name


@dataclass(eq=False)
class Decomposition:
    """An op's decomposition built in a scratch function: argument i stands for operand i of
    the op, the returned values for its results. Shared by every op of the same signature."""

    key: tuple
    func: FuncOp


def signature_key(op: Operation) -> tuple:
    """What a decomposition depends on: op name, attributes (discardable ones excluded) and
    types (memory spaces excluded: the planner places values itself)."""
    attrs = tuple(sorted((k, attribute_key(v)) for k, v in op.attributes.items() if "." not in k))
    ins = tuple(v.type.with_encoding(None) for v in op.operands)
    outs = tuple(r.type.with_encoding(None) for r in op.results)
    return (op.name, attrs, ins, outs)


_DECOMPOSITIONS: dict[tuple, Decomposition | None] = {}
DECOMPOSITION_PIPELINE = "lower-hl,canonicalize,cse,dce"


def decomposition_of(op: Operation) -> Decomposition | None:
    """The op's decomposition in canonical form (cached per signature), or None for an op
    without one."""
    if not callable(getattr(op, "decompose", None)):
        return None
    key = signature_key(op)
    if key not in _DECOMPOSITIONS:
        _DECOMPOSITIONS[key] = _build_decomposition(op, key)
    return _DECOMPOSITIONS[key]


def _build_decomposition(op: Operation, key: tuple) -> Decomposition | None:
    from tgc.pass_manager import PassManager
    from tgc.verifier import verify

    _, _, ins, outs = key
    names = [d.name for d in type(op).operand_defs if d.kind == "single"]
    names = names if len(names) == len(ins) else [f"in{i}" for i in range(len(ins))]
    func = FuncOp.build("decomposition", list(ins), [], names, op.loc)
    module = ModuleOp.empty()
    module.body.append(func)
    attrs = {k: v for k, v in op.attributes.items() if "." not in k}
    proxy = type(op)(list(func.body.args), list(outs), attrs, loc=op.loc)
    try:
        results = proxy.decompose(Builder.at_end(func.body, op.loc))
    except NotImplementedError:
        return None
    finally:
        proxy.drop_operand_uses()
    func.body.append(ReturnOp(list(results), [], loc=op.loc))
    func.set_result_types(list(outs))
    verify(module)
    PassManager.from_text(DECOMPOSITION_PIPELINE).run(module)
    return Decomposition(key, func)


# -- the options of a block ------------------------------------------------------------------------

MatchFn = Callable[[Operation, list[Kernel] | None], list[Match]]

# A constant's value is known on the host whatever backends a plan is limited to. On device
# backends alone no kernel runs a constant that no generated kernel recomputes by value (one that
# is not a splat, such as GPT-2's position ids, or one read whole, by a GEMM or as a result), so
# such a plan fails (issue 22). `PlanContext(host_constants=True)` makes the numpy backend's
# constant kernel an option whatever the backends, and the host a space: the value is made
# there and copied to where it is read. Not the default: the host as one more space multiplies
# the placements the solver enumerates for every shared value (a GPT-2 block planned on the
# cuda family alone is then no longer solved exactly within the budget).
HOST_CONSTANT = "numpy.atomic.constant"


def _default_match(op: Operation, kernels: list[Kernel] | None) -> list[Match]:
    return matches_at(op, kernels)


class PlanContext:
    """What planning depends on besides the program: the kernels considered (None: every
    registered one), the kernel backends they may run on (`Kernel.backend`; None: any; generated
    kernels included), the error tolerance, and how matches are found (tests inject their own).
    Caches the options of each block it has seen."""

    def __init__(
        self,
        kernels: list[Kernel] | None = None,
        tolerance: float = math.inf,
        match: MatchFn = _default_match,
        decompose: bool = True,
        backends: Iterable[str] | None = None,
        generated: bool = True,
        host_constants: bool = False,
    ) -> None:
        self.kernels = kernels
        self.host_constants = host_constants  # HOST_CONSTANT whatever the backends (above)
        self.generated = generated  # whether the fused-kernel hook's regions are options
        self.tolerance = tolerance
        self.match = match
        self.decompose = decompose
        self.backends = None if backends is None else frozenset(backends)
        self._blocks: dict[Block, BlockOptions] = {}
        self._building: set[tuple] = set()

    def options_are_local(self) -> bool:
        """Whether the options at an op are the registered kernels' matches there (and its
        decomposition) alone: no injected matcher and no fused-kernel provider, so how far an
        option reaches is known from the kernels' reference graphs (what block reuse needs)."""
        return self.match is _default_match and not (self.generated and FUSED_OPTIONS)

    def allows(self, kernel: Kernel) -> bool:
        """Whether `kernel` may be an option: on an allowed backend, within the tolerance."""
        return self._on_allowed_backend(kernel) and kernel.max_rel_error <= self.tolerance

    def _on_allowed_backend(self, kernel: Kernel) -> bool:
        if self.backends is None or kernel.backend in self.backends:
            return True
        return self.host_constants and kernel.name == HOST_CONSTANT

    def spaces(self) -> set[str | None]:
        """The memory spaces of the kernels considered (copies excluded)."""
        pool = KERNELS.values() if self.kernels is None else self.kernels
        return {
            BACKEND_SPACE[k.backend] for k in pool if not is_copy(k) and self._on_allowed_backend(k)
        }

    def options_at(self, op: Operation) -> list[Option]:
        # Matched against every kernel, then filtered: the registry's index serves the match.
        matches = [m for m in self.match(op, self.kernels) if not is_copy(m.kernel)]
        matches = [m for m in matches if self.allows(m.kernel)]
        matches.sort(key=lambda m: (len(m.ops), m.kernel.name))
        out = [Option(KERNEL, op, m.ops, m.inputs, m.outputs, m) for m in matches]
        for provider in FUSED_OPTIONS if self.generated else ():
            for m in provider(op):
                if self.allows(m.kernel):
                    out.append(Option(FUSED, op, m.ops, m.inputs, m.outputs, m))
        decomposition = self.decomposition(op)
        if decomposition is not None:
            out.append(
                Option(
                    DECOMPOSE, op, (op,), tuple(op.operands), tuple(op.results), None, decomposition
                )
            )
        return out

    def decomposition(self, op: Operation) -> Decomposition | None:
        if not self.decompose or len(op.results) != 1:
            return None
        found = decomposition_of(op)
        if found is None or found.key in self._building:
            return None  # never plan a decomposition inside itself
        return found

    def block_options(self, block: Block) -> BlockOptions:
        found = self._blocks.get(block)
        if found is None:
            found = _shared_options(block, self)
            self._blocks[block] = found
        return found

    def share_key(self) -> tuple | None:
        """What the options of a block depend on besides the block (see `_shared_options`),
        or None where they may depend on more: a kernel pool or matcher a caller passed in."""
        if self.kernels is not None or self.match is not _default_match:
            return None
        # `generated` is not in it: the options without generated kernels are those with
        # them, less the fused ones (`options_at`), so either serves a context without
        return (
            self.tolerance,
            self.decompose,
            self.backends,
            self.host_constants,
            frozenset(self._building),
            tuple(FUSED_OPTIONS),
            registry_version(),
        )

    def forget(self, block: Block) -> None:
        """Drop the options of a block that changed."""
        self._blocks.pop(block, None)

    def nested(self, option: Option) -> BlockOptions:
        """The options of a decomposition's scratch block."""
        decomposition = option.decomposition
        self._building.add(decomposition.key)
        try:
            return self.block_options(decomposition.func.body)
        finally:
            self._building.discard(decomposition.key)


def live_ops(block: Block) -> list[Operation]:
    """The ops the block's terminator depends on, in block order (dead ops are not planned)."""
    terminator = block.last
    live: set[Operation] = set()
    stack = [v.defining_op for v in terminator.operands]
    while stack:
        op = stack.pop()
        if op is None or op in live or op.block is not block:
            continue
        live.add(op)
        stack += [v.defining_op for v in op.operands]
    return [op for op in block.ops if op in live]


class BlockOptions:
    """The live ops of a block, their options, interior-able ops and regions (module doc)."""

    def __init__(self, block: Block, ctx: PlanContext) -> None:
        self.block = block
        self.ops = live_ops(block)
        self.position = {op: i for i, op in enumerate(self.ops)}
        self.options: dict[Operation, list[Option]] = {}
        for op in self.ops:
            found = ctx.options_at(op)
            self.options[op] = [o for o in found if all(x in self.position for x in o.ops)]
        self._derive()

    def _derive(self) -> None:
        """The interior-able and optional ops and the regions, from the options."""
        self.interior = {x for opts in self.options.values() for o in opts for x in o.ops[:-1]}
        # Ops a plan may leave out: covered inside another op's option, or constants that a
        # graph kernel reads by value (run only if some other chosen kernel reads them).
        self.optional = self.interior | {
            c for opts in self.options.values() for o in opts if o.match for c in o.match.constants
        }
        self.regions = self._regions()

    def _regions(self) -> list[list[Operation]]:
        parent = {op: op for op in self.ops}

        def find(op: Operation) -> Operation:
            while parent[op] is not op:
                parent[op] = parent[parent[op]]
                op = parent[op]
            return op

        for opts in self.options.values():
            for o in opts:
                for x in o.ops[:-1]:
                    parent[find(x)] = find(o.root)
        groups: dict[Operation, list[Operation]] = {}
        for op in self.ops:
            groups.setdefault(find(op), []).append(op)
        return list(groups.values())


# -- options shared between copies of a block --------------------------------------------------------
#
# The GPU route (planner/route.py) finds the options of one function three times a compile: for
# the instances first use would measure (planner/profile.py walks them), for the plan and for the
# plan of the default costs, each on its own copy of the function (planning changes the function
# it plans); and a second compile in one process (bench/real_models.py) again. Matching every op
# against the kernels and asking the fused-kernel hook at every op is most of planning's work (on
# a 12-layer GPT-2 about 0.3 s each time, on a 2-core machine). The options of an op depend on the
# block's ops, attributes, types and wiring, the registered kernels and the context (`share_key`)
# and on nothing else, so a block that copies one seen before op for op (a clone, a function
# imported again) gets that block's options mapped onto its own ops and values: found once.

SHARE_OPTIONS = True  # tests turn it off to check that plans do not change
_SHARED_LIMIT = 256  # blocks remembered (a model's function and its decompositions' blocks)
_SHARED: OrderedDict[tuple, list[tuple[_Shape, _Template]]] = OrderedDict()

_RESULTS, _OPERANDS, _REGIONS = attrgetter("results"), attrgetter("operands"), attrgetter("regions")
_ATTRIBUTES, _TYPE = attrgetter("attributes"), attrgetter("type")


class _Shape:
    """A block flattened into lists that compare at C speed: its ops' classes, attributes,
    result types and operand counts, each operand as the index of the result it reads (an
    argument i as -1 - i), the argument types and the function's attributes. Two blocks of equal
    shapes are copies op for op. `ops` and `results` are this block's, to map options onto."""

    def __init__(self, block: Block) -> None:
        self.ops = ops = list(block.ops)
        result_lists = list(map(_RESULTS, ops))
        operand_lists = list(map(_OPERANDS, ops))
        self.results = results = [r for rs in result_lists for r in rs]
        index: dict[Value, int] = dict(zip(results, range(len(results))))
        index.update(zip(block.args, range(-1, -len(block.args) - 1, -1)))
        wires = list(map(index.get, (v for vs in operand_lists for v in vs)))
        # A value from outside the block or an op with regions: uses this flattening misses.
        self.shareable = None not in wires and not any(map(_REGIONS, ops))
        parent = block.region.parent if block.region is not None else None
        attributes = getattr(parent, "attributes", None) or {}
        self.key = (tuple(map(type, ops)), tuple(map(_TYPE, block.args)))
        self.body = (
            wires,
            list(map(len, operand_lists)),
            list(map(len, result_lists)),
            list(map(_TYPE, results)),
            list(map(_ATTRIBUTES, ops)),
            {k: v for k, v in attributes.items() if k != "sym_name"},
        )

    def value_refs(self, block: Block) -> dict[Value, int]:
        refs: dict[Value, int] = dict(zip(self.results, range(len(self.results))))
        refs.update(zip(block.args, range(-1, -len(block.args) - 1, -1)))
        return refs


@dataclass(eq=False)
class _Template:
    """A block's options by position: the live ops and the ops an option covers as indices
    into the block's ops, values as `_Shape` references; `fused`: found with the fused-kernel
    hook's options."""

    live: list[int]
    options: list[list[tuple]]
    fused: bool


def forget_shared_options() -> None:
    """Find every block's options anew: for a caller that changed what they depend on outside
    the registry and the context (a benchmark's variant setting a module's constant, such as
    the rows up to which a product's halves are offered as its epilogue)."""
    _SHARED.clear()


def _shared_options(block: Block, ctx: PlanContext) -> BlockOptions:
    """The options of `block`: mapped from a block of the same shape seen before in a context
    of the same `share_key`, else found (and kept for the next copy)."""
    key = ctx.share_key() if SHARE_OPTIONS else None
    if key is None:
        return BlockOptions(block, ctx)
    shape = _Shape(block)
    if not shape.shareable:
        return BlockOptions(block, ctx)
    slot = (key, shape.key)
    fused = ctx.generated and bool(FUSED_OPTIONS)
    for seen, template in _SHARED.get(slot, ()):
        if seen.body == shape.body and (template.fused or not fused):
            _SHARED.move_to_end(slot)
            return _instantiate(template, block, shape, template.fused and not fused)
    found = BlockOptions(block, ctx)
    template = _template(found, block, shape, fused)
    if template is not None:
        # The shape is kept without the block's ops and values (the template names them by
        # position), and with copies of their attribute dicts: the block may be planned and
        # rewritten afterwards.
        shape.ops = shape.results = ()
        shape.body[4][:] = map(dict, shape.body[4])
        _SHARED.setdefault(slot, []).append((shape, template))
        _SHARED.move_to_end(slot)
        while len(_SHARED) > _SHARED_LIMIT:
            _SHARED.popitem(last=False)
    return found


def _template(bo: BlockOptions, block: Block, shape: _Shape, fused: bool) -> _Template | None:
    """`bo` by position (None when an option reaches an op or value outside the block)."""
    at = dict(zip(shape.ops, range(len(shape.ops))))
    refs = shape.value_refs(block)
    try:
        options = []
        for op in bo.ops:
            row = []
            for o in bo.options[op]:
                m = o.match
                match = None
                if m is not None:
                    match = (
                        m.kernel,
                        at[m.root],
                        tuple(at[x] for x in m.ops),
                        tuple(refs[v] for v in m.inputs),
                        tuple(refs[v] for v in m.outputs),
                        tuple(at[c] for c in m.constants),
                        m.reference,
                    )
                row.append(
                    (
                        o.kind,
                        at[o.root],
                        tuple(at[x] for x in o.ops),
                        tuple(refs[v] for v in o.inputs),
                        tuple(refs[v] for v in o.outputs),
                        match,
                        o.decomposition,
                    )
                )
            options.append(row)
        return _Template([at[op] for op in bo.ops], options, fused)
    except KeyError:
        return None


_new = object.__new__


def _instantiate(t: _Template, block: Block, shape: _Shape, drop_fused: bool) -> BlockOptions:
    """The options of `t` on `block`, a copy of the block `t` was made from (`drop_fused`:
    less the fused-kernel hook's, for a context without generated kernels). Options and matches
    are made as their frozen dataclasses' `__init__` would, without its per-field
    `object.__setattr__` (a few thousand options a function)."""
    ops, results, args = shape.ops, shape.results, block.args

    def value(r: int) -> Value:
        return results[r] if r >= 0 else args[-1 - r]

    bo = _new(BlockOptions)
    bo.block = block
    bo.ops = [ops[i] for i in t.live]
    bo.position = {op: i for i, op in enumerate(bo.ops)}
    bo.options = {}
    for op, row in zip(bo.ops, t.options):
        made = []
        for kind, root, covered, inputs, outputs, m, decomposition in row:
            if drop_fused and kind == FUSED:
                continue
            covered = tuple(ops[i] for i in covered)
            inputs = tuple(map(value, inputs))
            outputs = tuple(map(value, outputs))
            match = None
            if m is not None:
                kernel, m_root, m_ops, m_inputs, m_outputs, constants, reference = m
                match = _new(Match)
                match.__dict__.update(
                    kernel=kernel,
                    root=ops[m_root],
                    ops=tuple(ops[i] for i in m_ops),
                    inputs=tuple(map(value, m_inputs)),
                    outputs=tuple(map(value, m_outputs)),
                    constants=tuple(ops[i] for i in constants),
                    reference=reference,
                )
            option = _new(Option)
            option.__dict__.update(
                kind=kind,
                root=ops[root],
                ops=covered,
                inputs=inputs,
                outputs=outputs,
                match=match,
                decomposition=decomposition,
            )
            made.append(option)
        bo.options[op] = made
    bo._derive()
    return bo
