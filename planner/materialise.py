"""Writing a plan as IR (the last step of `select-kernels`, planner/select.py): every planned op
becomes a `kernel.call`, a decomposition the calls of its own plan, and a `kernel.copy` moves a
value wherever a kernel reads it in another memory space; each is annotated with
`plan.backend`, `plan.seconds` and `plan.source` (and the `param.<name>` it runs with).
"""

from __future__ import annotations

from tgc.builtin import FuncOp
from tgc.dialects.kernel import CallOp, CopyOp, YieldOp
from tgc.ir import Block, Operation, Region, Value
from tgc.opdef import create
from tgc.planner.chain import Selection
from tgc.planner.cost import CachedCosts
from tgc.planner.options import DECOMPOSE, Option, copy_kernel
from tgc.planner.paths import Plan


def materialise(func: FuncOp, selection: Selection, costs: CachedCosts) -> None:
    """Replace the body of `func` by the calls and copies of `selection.plan`."""
    block = func.body
    ret = block.last
    old = [op for op in block.ops if op is not ret]
    writer = _Writer(block, ret, costs)
    env: dict[Value, Value] = {a: a for a in block.args}
    writer.plan(selection.plan, env)
    declared = func.function_type.results
    ret.set_operands([writer.in_space(env[v], t.encoding) for v, t in zip(ret.operands, declared)])
    for op in reversed(old):
        op.erase()


class _Writer:
    def __init__(self, block: Block, before: Operation, costs: CachedCosts) -> None:
        self.block = block
        self.before = before
        self.costs = costs
        self.copies: dict[tuple[Value, str | None], Value] = {}

    def insert(self, op: Operation) -> Operation:
        self.block.insert_before(op, self.before)
        return op

    def plan(self, plan: Plan, env: dict[Value, Value]) -> None:
        for step in plan.steps:
            o = step.option
            if o.kind == DECOMPOSE:
                scratch = step.nested.block
                inner = {a: env[v] for a, v in zip(scratch.args, o.root.operands)}
                self.plan(step.nested, inner)
                for r, v in zip(o.root.results, scratch.last.operands):
                    env[r] = inner[v]
                    if inner[v].name_hint is None and v.defining_op is not None:
                        inner[v].name_hint = r.name_hint
                continue
            call = self.call(o, [self.in_space(env[u], o.space) for u in o.inputs])
            for r, new in zip(o.outputs, call.results):
                env[r] = new
                new.name_hint = r.name_hint

    def annotations(self, kernel, operand_types, result_types) -> dict:
        cost = self.costs.cost(kernel, operand_types, result_types)
        params = self.costs.params(kernel, operand_types, result_types)
        return {
            "plan.backend": kernel.backend,
            # An estimate: four significant digits say all it knows, and read as written.
            "plan.seconds": float(f"{cost.seconds:.4g}"),
            "plan.source": cost.source,
            **kernel.param_attributes(params),  # the choices the kernel runs with
        }

    def call(self, o: Option, operands: list[Value]) -> Operation:
        kernel, p, root = o.kernel, o.space, o.root
        result_types = [v.type.with_encoding(p) for v in o.outputs]
        attrs = {"callee": kernel.name}
        attrs.update(self.annotations(kernel, [v.type for v in operands], result_types))
        regions = None
        if kernel.op is not None:
            attrs["op"] = kernel.op
            attrs.update({k: v for k, v in root.attributes.items() if "." not in k})
        else:
            regions = [self.region(o, operands, p)]
        return self.insert(create(CallOp, operands, attrs, result_types, regions, root.loc))

    def region(self, o: Option, operands: list[Value], space) -> Region:
        """The covered subgraph, cloned into an isolated region (constants read by value
        included), its values in the kernel's memory space."""
        body = Block([v.type for v in operands])
        inner: dict[Value, Value] = {}
        for program_value, arg in zip(o.inputs, body.args):
            inner.setdefault(program_value, arg)
        for op in [*o.match.constants, *o.ops]:
            clone = type(op)(
                [inner[v] for v in op.operands],
                [r.type.with_encoding(space) for r in op.results],
                dict(op.attributes),
                loc=op.loc,
            )
            body.append(clone)
            inner.update(zip(op.results, clone.results))
        body.append(YieldOp([inner[v] for v in o.outputs], [], loc=o.root.loc))
        return Region([body])

    def in_space(self, v: Value, space) -> Value:
        if v.type.encoding == space:
            return v
        found = self.copies.get((v, space))
        if found is None:
            kernel = copy_kernel(v.type.encoding, space)
            t = v.type.with_encoding(space)
            attrs = self.annotations(kernel, [v.type], [t])
            copy = self.insert(create(CopyOp, [v], attrs, [t], None, self.before.loc))
            found = copy.results[0]
            self.copies[(v, space)] = found
        return found
