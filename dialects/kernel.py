"""The `kernel` dialect: what runs.

- `kernel.fused`: an isolated region of lower ops compiled into one generated kernel. Its block
  arguments are the kernel's inputs (one per operand, same types); `kernel.yield` gives the
  outputs. `template` names the codegen skeleton ("elementwise", "row_reduction", "matmul",
  "attention", "conv");
  `name` is the kernel's symbol (sanitised again before it reaches C++).
- `kernel.call`: a library kernel (cuBLAS, a numpy function) named by `callee`. Its meaning is
  either the op named by `op` (its numpy reference defines the call's result) or, for a kernel
  that computes a whole subgraph, an isolated region holding that subgraph (like
  `kernel.fused`'s, ending in `kernel.yield`): exactly one of the two. Planner annotations are
  discardable attributes (`plan.backend`, `plan.seconds`, `plan.source`), not op attributes.
- `kernel.copy`: moves a value between memory spaces (the encoding of the result type).
- `kernel.yield`: the terminator of a `kernel.fused` or `kernel.call` region.

A value in device memory has the encoding "cuda"; the verifier rejects a kernel whose operands
live in different memory spaces from each other, and a copy that does not change the space
(which memory a callee works in is the planner's to check: planner/executor.py).
"""

from __future__ import annotations

from tgc.diagnostics import VerifyError
from tgc.evaluate import evaluate_block
from tgc.ir import Operation
from tgc.opdef import (
    ISOLATED,
    MOVE,
    PURE,
    STR,
    TERMINATOR,
    Attr,
    Operand,
    VariadicOperand,
    attrs,
    enum,
    lookup,
    register,
    verify_op,
)

# The dialects whose ops a `kernel.call` may stand for: ops with a numpy meaning and no region.
TARGET_DIALECTS = ("atomic", "hl")

TEMPLATES = ("elementwise", "row_reduction", "matmul", "attention", "conv", "generic")


def _one_memory_space(op: Operation) -> str | None:
    spaces = {v.type.encoding for v in op.operands} | {r.type.encoding for r in op.results}
    if len(spaces) > 1:
        listed = ", ".join(sorted(str(s or "host") for s in spaces))
        raise VerifyError(f"reads or writes values in different memory spaces ({listed})")
    return spaces.pop() if spaces else None


def _verify_body(op: Operation) -> None:
    """A kernel region: one block whose arguments are typed like the operands, ending in a
    `kernel.yield` of the result types."""
    region = op.regions[0]
    if len(region.blocks) != 1:
        raise VerifyError("expects a region of one block")
    block = region.block
    if [a.type for a in block.args] != [v.type for v in op.operands]:
        raise VerifyError("block arguments must match the operand types")
    term = block.last
    if not isinstance(term, YieldOp):
        raise VerifyError("region must end with 'kernel.yield'")
    if [v.type for v in term.operands] != [r.type for r in op.results]:
        raise VerifyError("'kernel.yield' operand types must match the result types", term.loc)


@register
class FusedOp(Operation):
    """A region of lower ops that runs as one generated kernel.

    %y = kernel.fused %a, %b {name = "k0", template = "elementwise"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32> {
    ^bb0(%p: tensor<4xf32>, %q: tensor<4xf32>):
      %s = atomic.add %p, %q : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
      kernel.yield %s : tensor<4xf32>
    }
    """

    name = "kernel.fused"
    operand_defs = (VariadicOperand("inputs"),)
    attr_defs = attrs(Attr("name", STR), Attr("template", enum(*TEMPLATES), default="generic"))
    traits = frozenset({PURE, ISOLATED})
    num_results = None
    num_regions = 1

    @property
    def body(self):
        return self.regions[0].block

    def verify_(self):
        _one_memory_space(self)
        _verify_body(self)

    def reference(self, *inputs, precision: str = "native"):
        outs = evaluate_block(self.body, list(inputs), precision)
        return tuple(outs) if len(outs) != 1 else outs[0]


@register
class YieldOp(Operation):
    """Ends a `kernel.fused` (or `kernel.call`) region with its outputs.
    `kernel.yield %s : tensor<4xf32>`"""

    name = "kernel.yield"
    operand_defs = (VariadicOperand("values"),)
    traits = frozenset({TERMINATOR})
    num_results = 0

    def verify_(self):
        if not isinstance(self.parent_op, (FusedOp, CallOp)):
            raise VerifyError("must be inside 'kernel.fused' or 'kernel.call'")


@register
class CallOp(Operation):
    """A library kernel: the meaning of the op named `op`, or of the subgraph in its region.

    %c = kernel.call %a, %b {callee = "cuda.cublas.gemm", op = "atomic.matmul"} : (tensor<4x8xf32, "cuda">, tensor<8x2xf32, "cuda">) -> tensor<4x2xf32, "cuda">
    With `op`, the call's other attributes are the attributes of `op`. Without it, one isolated
    region holds the subgraph the kernel computes (block arguments = the operands, ending in
    `kernel.yield`), and the call takes no other attributes. Keys with a dialect prefix
    (`plan.backend`, `plan.seconds`, `plan.source`) are annotations, never op attributes.
    """

    name = "kernel.call"
    operand_defs = (VariadicOperand("inputs"),)
    attr_defs = attrs(Attr("callee", STR), Attr("op", STR, default=None))
    traits = frozenset({PURE, ISOLATED})
    num_results = None
    accepts_extra_attributes = True

    @property
    def num_regions(self) -> int:
        """0 with `op`, 1 without it (so a second region is reported by the generic check)."""
        return min(len(self.regions), 1)

    @property
    def body(self):
        return self.regions[0].block

    def target(self) -> type[Operation]:
        cls = lookup(self.attr("op"))
        if cls is None:
            raise VerifyError(f"'op' names no registered op: '{self.attr('op')}'")
        if cls.name.split(".", 1)[0] not in TARGET_DIALECTS:
            raise VerifyError(
                f"'op' must name an atomic or hl op (one with a numpy meaning), not '{cls.name}'"
            )
        return cls

    def as_target(self) -> Operation:
        """The op the call stands for, on the call's operands, result types and op attributes
        (detached: it holds no uses of the operands)."""
        proxy = self.target()(
            list(self.operands),
            [r.type for r in self.results],
            self.op_attributes(),
            None,
            self.loc,
        )
        proxy.drop_operand_uses()
        return proxy

    def verify_target(self) -> None:
        """The call is the op it names: that op's own verifier checks operands, attributes and
        result types (so a call that could not run never verifies)."""
        proxy = self.as_target()
        try:
            verify_op(proxy)
        except VerifyError as e:
            prefix = f"'{proxy.name}' op "
            message = e.message.removeprefix(prefix)
            raise VerifyError(f"as '{proxy.name}': {message}") from None

    def op_attributes(self) -> dict:
        """The attributes forwarded to `op`: all but `callee`, `op` and `dialect.name` keys."""
        return {
            k: v for k, v in self.attributes.items() if k not in ("callee", "op") and "." not in k
        }

    def verify_(self):
        _one_memory_space(self)
        if self.regions and self.attr("op") is not None:
            raise VerifyError("takes either an 'op' attribute or a region, not both")
        if self.regions:
            _verify_body(self)
            if self.op_attributes():
                extra = ", ".join(sorted(self.op_attributes()))
                raise VerifyError(f"with a region takes no op attributes (got {extra})")
        elif self.attr("op") is None:
            raise VerifyError("needs an 'op' attribute or a region holding its subgraph")
        else:
            self.verify_target()

    def reference(self, *inputs, precision: str = "native"):
        if self.regions:  # the subgraph the library kernel computes
            return tuple(evaluate_block(self.body, list(inputs), precision))
        return self.as_target().reference(*inputs)


@register
class CopyOp(Operation):
    """Move a value to the memory space of the result type.

    %d = kernel.copy %x : (tensor<4xf32>) -> tensor<4xf32, "cuda">
    """

    name = "kernel.copy"
    operand_defs = (Operand("x"),)
    traits = frozenset({PURE, MOVE})

    def verify_(self):
        x, out = self.operands[0].type, self.results[0].type
        if x.with_encoding(None) is not out.with_encoding(None):
            raise VerifyError(f"may only change the memory space: {x} to {out}")
        if x.encoding == out.encoding:
            raise VerifyError(f"copies within one memory space ({x.encoding or 'host'})")

    def reference(self, x):
        return x.copy()
