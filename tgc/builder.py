"""Build IR from Python: one method per registered op, result types inferred.

    from tgc.builder import FunctionBuilder
    fb = FunctionBuilder("mlp", [tensor("8x768xf32"), tensor("768x3072xf32")], ["x", "w"])
    x, w = fb.args
    h = fb.atomic.matmul(x, w)
    y = fb.hl.gelu(h, approximate="tanh")
    module = fb.ret(y)           # a verified builtin.module holding @mlp

`b.<dialect>.<op>(*operands, **attributes)` returns the op's result (or a tuple of results for
multi-result ops). Ops whose result type cannot be inferred (reshape, broadcast, cast, constant,
iota) take it as `result_type=`. Passes use the same builder through `Builder.before(op)`.
"""

from __future__ import annotations

from tgc.builtin import FuncOp, ModuleOp, ReturnOp
from tgc.diagnostics import UNKNOWN_LOC, Location
from tgc.ir import Block, Operation, Value
from tgc.opdef import OPS, create
from tgc.types import TensorType, parse_type


def tensor(spec: str) -> TensorType:
    """`tensor("4x16xf32")` -> tensor<4x16xf32>."""
    return parse_type(f"tensor<{spec}>")


class _DialectNamespace:
    def __init__(self, builder: Builder, dialect: str) -> None:
        self._builder = builder
        self._dialect = dialect

    def __getattr__(self, op: str):
        name = f"{self._dialect}.{op}"
        if name not in OPS:
            loaded = any(known.startswith(self._dialect + ".") for known in OPS)
            why = "" if loaded else f" (no dialect '{self._dialect}' is loaded: tgc.load_all())"
            raise AttributeError(f"no op named '{name}'{why}")

        def build(*operands: Value, result_type=None, result_types=None, **attributes):
            if result_type is not None:
                result_types = [result_type]
            built = self._builder.create(name, list(operands), attributes, result_types)
            if len(built.results) == 1:
                return built.results[0]
            return tuple(built.results)

        build.__name__ = op
        build.__doc__ = OPS[name].__doc__
        return build


class Builder:
    """Creates ops at an insertion point: the end of a block, or before an op."""

    def __init__(
        self,
        block: Block,
        before: Operation | None = None,
        loc: Location = UNKNOWN_LOC,
        on_insert=None,
    ):
        self.block = block
        self.before = before
        self.loc = loc
        self.on_insert = on_insert  # called with each new op (the rewriter's worklist listens)

    @classmethod
    def before_op(cls, op: Operation) -> Builder:
        """Insert before `op`; new ops take `op`'s location (rewrites keep source locations)."""
        assert op.block is not None
        return cls(op.block, op, op.loc)

    @classmethod
    def at_end(cls, block: Block, loc: Location = UNKNOWN_LOC) -> Builder:
        return cls(block, None, loc)

    def insert(self, op: Operation) -> Operation:
        if self.before is None:
            self.block.append(op)
        else:
            self.block.insert_before(op, self.before)
        if self.on_insert is not None:
            self.on_insert(op)
        return op

    def create(
        self,
        op_name: str,
        operands: list[Value],
        attributes: dict | None = None,
        result_types: list[TensorType] | None = None,
        regions=None,
    ) -> Operation:
        op = create(OPS[op_name], operands, attributes, result_types, regions, self.loc)
        return self.insert(op)

    def __getattr__(self, dialect: str) -> _DialectNamespace:
        if dialect.startswith("_"):
            raise AttributeError(dialect)
        return _DialectNamespace(self, dialect)


class FunctionBuilder(Builder):
    """Builds one function in a fresh module; `ret(...)` finishes it and returns the module."""

    def __init__(self, name: str, arg_types: list[TensorType], arg_names: list[str] | None = None):
        self.func = FuncOp.build(name, arg_types, [], arg_names)
        self.module = ModuleOp.empty()
        self.module.body.append(self.func)
        super().__init__(self.func.body)

    @property
    def args(self) -> list[Value]:
        return list(self.func.body.args)

    def ret(self, *values: Value) -> ModuleOp:
        from tgc.verifier import verify

        self.insert(ReturnOp(list(values), [], loc=self.loc))
        self.func.set_result_types([v.type for v in values])
        verify(self.module)
        return self.module
