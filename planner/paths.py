"""Every complete execution plan of a function, lazily; how many there are; what one costs.

A *plan* of a block chooses, for every live op, one option covering it (see `planner.options`):
the ops are covered exactly once, each either as the root of its option or inside a multi-op
option. A decomposition option carries a nested plan of its scratch block. Regions (groups of
ops no option spans across) are independent, so

    count_paths(block) = product over regions R of covers(R),
    covers(R) = sum over the options o rooted at R's last uncovered op (that overlap nothing
                covered) of nested(o) * covers(R with o's ops covered),

where nested(o) is the count of o's decomposition (1 for a kernel). The last uncovered op must be
the root of its option (an option's root is its last op, and every later op is covered), so each
cover is counted once. Counting is memoised per region and covered set, and per decomposition
signature: it never enumerates.

The cost of a plan (`plan_cost`) is that of the flat program it stands for (decompositions
inlined): the sum of its kernels' costs plus one copy per value and per other memory space
where some kernel (or the function's result type) reads it. A value is produced in the space of
its kernel; a function argument lives where its type's encoding says. A constant no chosen kernel
reads (a graph kernel reads constants by value) is not run and costs nothing.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass

from tgc.builtin import FuncOp
from tgc.ir import Block, Operation, Value
from tgc.planner.cost import CachedCosts, CostSource
from tgc.fixed import PARAM, VARIES, combine_states, is_param_argument
from tgc.planner.fixed import ONCE_WEIGHT
from tgc.planner.options import DECOMPOSE, BlockOptions, Option, PlanContext, copy_kernel


@dataclass(frozen=True, eq=False)
class Step:
    """One chosen option; `nested` is the plan of its decomposition."""

    option: Option
    nested: Plan | None = None


@dataclass(frozen=True, eq=False)
class Plan:
    """The chosen options of a block, in block order of their roots."""

    block: Block
    steps: tuple[Step, ...]

    def __str__(self) -> str:
        return format_plan(self)

    def key(self) -> tuple:
        """A structural identity (kernel names and covered ops) for comparing plans."""
        return tuple(
            (s.option.label, tuple(map(id, s.option.ops)), s.nested.key() if s.nested else ())
            for s in self.steps
        )

    def kernels(self) -> list[str]:
        """The kernel names of the flat plan, in order (decompositions inlined)."""
        out: list[str] = []
        for s in self.steps:
            out += s.nested.kernels() if s.nested is not None else [s.option.label]
        return out


# -- printing -----------------------------------------------------------------------------------


def value_names(plan: Plan) -> dict[Value, str]:
    """`%name` for source-named values, `%<n>` for the others, numbered in plan order (the
    block's arguments, then each step's results): independent of later changes to the IR."""
    names: dict[Value, str] = {}
    counter = 0
    values = list(plan.block.args) + [v for s in plan.steps for v in s.option.outputs]
    for v in values:
        if v.name_hint:
            names[v] = f"%{v.name_hint}"
        else:
            names[v] = f"%{counter}"
            counter += 1
    return names


def format_step(step: Step, names: dict[Value, str]) -> str:
    o = step.option
    if o.kind == DECOMPOSE:
        return f"decompose {o.root.name}[ {format_plan(step.nested)} ]"
    return f"{o.label}({', '.join(names.get(v, '%?') for v in o.inputs)})"


def format_plan(plan: Plan) -> str:
    names = value_names(plan)
    return " ; ".join(format_step(s, names) for s in plan.steps)


# -- counting and enumerating --------------------------------------------------------------------


def count_paths(func: FuncOp | Block, ctx: PlanContext | None = None) -> int:
    """The number of complete plans of `func` (see the module doc); never enumerates. Without
    `ctx`: every backend that loads, no tolerance."""
    ctx = ctx or default_context()
    return _Counter(ctx).block(_block(func))


def paths(func: FuncOp | Block, ctx: PlanContext | None = None) -> Iterator[Plan]:
    """Every complete plan of `func`, lazily, in a deterministic order."""
    ctx = ctx or default_context()
    yield from _block_plans(_block(func), ctx)


def default_context() -> PlanContext:
    """Every backend that loads here, no tolerance."""
    from tgc.planner import load_backends

    load_backends()
    return PlanContext()


def _block(func: FuncOp | Block) -> Block:
    return func.body if isinstance(func, FuncOp) else func


class _Counter:
    def __init__(self, ctx: PlanContext) -> None:
        self.ctx = ctx
        self.decompositions: dict[tuple, int] = {}

    def block(self, block: Block) -> int:
        bo = self.ctx.block_options(block)
        total = 1
        for region in bo.regions:
            total *= self.region(bo, region)
            if total == 0:
                return 0
        return total

    def nested(self, option: Option) -> int:
        if option.kind != DECOMPOSE:
            return 1
        key = option.decomposition.key
        if key not in self.decompositions:
            self.decompositions[key] = 0  # a cycle through itself counts nothing
            self.decompositions[key] = self.block(self.ctx.nested(option).block)
        return self.decompositions[key]

    def region(self, bo: BlockOptions, region: list[Operation]) -> int:
        index = {op: i for i, op in enumerate(region)}
        full = (1 << len(region)) - 1
        memo: dict[int, int] = {full: 1}

        def covers(mask: int) -> int:
            found = memo.get(mask)
            if found is not None:
                return found
            last = region[(full & ~mask).bit_length() - 1]
            total = 0
            for o in bo.options[last]:
                bits = _bits(o, index)
                if bits & mask:
                    continue
                n = self.nested(o)
                if n:
                    total += n * covers(mask | bits)
            memo[mask] = total
            return total

        return covers(0)


def _bits(option: Option, index: dict[Operation, int]) -> int:
    bits = 0
    for op in option.ops:
        bits |= 1 << index[op]
    return bits


def _block_plans(block: Block, ctx: PlanContext) -> Iterator[Plan]:
    bo = ctx.block_options(block)
    regions = bo.regions
    order = bo.position

    def product(i: int, steps: list[Step]) -> Iterator[Plan]:
        if i == len(regions):
            yield Plan(block, tuple(sorted(steps, key=lambda s: order[s.option.root])))
            return
        for part in _region_covers(bo, regions[i], ctx):
            yield from product(i + 1, steps + part)

    yield from product(0, [])


def _region_covers(bo: BlockOptions, region: list[Operation], ctx: PlanContext):
    index = {op: i for i, op in enumerate(region)}
    full = (1 << len(region)) - 1

    def covers(mask: int) -> Iterator[list[Step]]:
        if mask == full:
            yield []
            return
        last = region[(full & ~mask).bit_length() - 1]
        for o in bo.options[last]:
            bits = _bits(o, index)
            if bits & mask:
                continue
            for step in _steps(o, ctx):
                for rest in covers(mask | bits):
                    yield [step, *rest]

    yield from covers(0)


def _steps(option: Option, ctx: PlanContext) -> Iterator[Step]:
    if option.kind != DECOMPOSE:
        yield Step(option)
        return
    for nested in _block_plans(ctx.nested(option).block, ctx):
        yield Step(option, nested)


# -- the cost of a plan ----------------------------------------------------------------------------


@dataclass
class FlatKernel:
    """One kernel of the flat program: where it runs, what it reads and writes."""

    option: Option
    inputs: list[tuple]  # flat value keys
    outputs: list[tuple]
    types_in: list
    types_out: list


def flatten(plan: Plan) -> tuple[list[FlatKernel], dict[tuple, object]]:
    """The plan's kernels with decompositions inlined, and the flat key of each returned value.

    A flat value key is (instance path, program value): a decomposition used twice has two
    instances of its scratch values."""
    kernels: list[FlatKernel] = []
    env: dict[Value, tuple] = {a: ((), a) for a in plan.block.args}
    _flatten(plan, env, (), kernels)
    return kernels, env


def _flatten(plan: Plan, env: dict, prefix: tuple, out: list[FlatKernel]) -> None:
    for i, step in enumerate(plan.steps):
        o = step.option
        if o.kind == DECOMPOSE:
            scratch = step.nested.block
            inner = {a: env[v] for a, v in zip(scratch.args, o.root.operands)}
            _flatten(step.nested, inner, prefix + (i,), out)
            for r, v in zip(o.root.results, scratch.last.operands):
                env[r] = inner[v]
            continue
        outs = [(prefix, v) for v in o.outputs]
        for v, key in zip(o.outputs, outs):
            env[v] = key
        out.append(
            FlatKernel(
                o,
                [env[v] for v in o.inputs],
                outs,
                [v.type for v in o.inputs],
                [v.type for v in o.outputs],
            )
        )


def plan_cost(plan: Plan, costs: CostSource | CachedCosts) -> float:
    """The cost of `plan` (see the module doc); inf when a needed copy has no kernel. A kernel
    or copy computed once per set of parameters (planner/fixed.py) counts ONCE_WEIGHT of its
    time."""
    costs = costs if isinstance(costs, CachedCosts) else CachedCosts(costs)
    kernels, env = flatten(plan)
    space: dict[tuple, str | None] = {((), a): a.type.encoding for a in plan.block.args}
    types: dict[tuple, object] = {((), a): a.type for a in plan.block.args}
    parent = plan.block.region.parent if plan.block.region is not None else None
    is_func = isinstance(parent, FuncOp)
    state = {((), a): PARAM if is_param_argument(a) else VARIES for a in plan.block.args}
    for k in kernels:
        found = combine_states(state[key] for key in k.inputs)
        for key, t in zip(k.outputs, k.types_out):
            space[key] = k.option.space
            types[key] = t
            state[key] = found
    needs: dict[tuple, set] = {}
    for k in kernels:
        for key in k.inputs:
            needs.setdefault(key, set()).add(k.option.space)
    results = plan.block.last.operands
    declared = parent.function_type.results if is_func else None
    for i, v in enumerate(results):
        want = declared[i].encoding if declared is not None else v.type.encoding
        needs.setdefault(env[v], set()).add(want)
    total = 0.0
    # Seconds by kernel and types, and by copy: a model's equal layers run the same kernels on
    # the same types, asked once each rather than once a layer.
    seconds: dict[tuple, float] = {}
    for k in kernels:
        if not any(key in needs for key in k.outputs):
            continue  # a constant nobody reads
        kernel = k.option.kernel
        p = kernel.space
        ins = tuple(t.with_encoding(p) for t in k.types_in)
        outs = tuple(t.with_encoding(p) for t in k.types_out)
        found = seconds.get((kernel, ins, outs))
        if found is None:
            found = seconds[kernel, ins, outs] = costs.cost(kernel, ins, outs).seconds
        weight = ONCE_WEIGHT if k.outputs and state[k.outputs[0]] == PARAM else 1.0
        total += weight * found
    for key, spaces in needs.items():
        weight = ONCE_WEIGHT if state[key] == PARAM else 1.0
        for s in spaces - {space[key]}:
            t = types[key]
            asked = (space[key], s, t.with_encoding(None))  # (the copy's types carry spaces)
            found = seconds.get(asked)
            if found is None:
                found = seconds[asked] = copy_seconds(costs, space[key], s, t)
            total += weight * found
    return total


def copy_seconds(costs: CachedCosts, src, dst, t) -> float:
    kernel = copy_kernel(src, dst)
    if kernel is None:
        return math.inf
    return costs.cost(kernel, [t.with_encoding(src)], [t.with_encoding(dst)]).seconds
