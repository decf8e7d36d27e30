"""The structural ops every module uses: `builtin.module`, `func.func` and `func.return`.

These two are the only ops with a special textual form (see tgc.parser); in the generic form they
are ordinary ops with a region.
"""

from __future__ import annotations

from tgc.attributes import UNIT, DictAttr, FunctionTypeAttr
from tgc.diagnostics import UNKNOWN_LOC, Location, VerifyError
from tgc.ir import Block, Operation, Region
from tgc.opdef import (
    FUNCTION_TYPE,
    ISOLATED,
    STR,
    TERMINATOR,
    Attr,
    AttrKind,
    VariadicOperand,
    attrs,
    check_memory_space,
    register,
)
from tgc.types import TensorType

# The argument attribute that marks a parameter (a weight fixed between calls).
PARAM_ATTR = "tgc.param"
# The argument attribute that gives the argument's memory to the function: the caller takes a
# result as the argument's new value and reads the old one no more (tgc/donation.py).
DONATED_ATTR = "tgc.donated"

ARG_ATTRS = AttrKind(
    "an array of dictionaries",
    lambda v: isinstance(v, tuple) and all(isinstance(d, DictAttr) for d in v),
)


def _well_formed_arg_attrs(value, num_args: int) -> bool:
    return (
        isinstance(value, tuple)
        and len(value) == num_args
        and all(isinstance(d, DictAttr) for d in value)
    )


@register
class ModuleOp(Operation):
    """The top-level container of functions.

    module @name { func.func ... }
    """

    name = "builtin.module"
    attr_defs = attrs(Attr("sym_name", STR, default=None))
    traits = frozenset({ISOLATED})
    num_results = 0
    num_regions = 1

    @classmethod
    def empty(cls, loc: Location = UNKNOWN_LOC) -> ModuleOp:
        return cls([], [], {}, [Region([Block()])], loc)

    @property
    def body(self) -> Block:
        return self.regions[0].block

    @property
    def funcs(self) -> list[FuncOp]:
        return [op for op in self.body.ops if isinstance(op, FuncOp)]

    def func(self, name: str) -> FuncOp | None:
        for f in self.funcs:
            if f.sym_name == name:
                return f
        return None

    def verify_(self) -> None:
        if len(self.regions[0].blocks) != 1:
            raise VerifyError("expects one block")
        seen: set[str] = set()
        for op in self.body.ops:
            if not isinstance(op, FuncOp):
                raise VerifyError(
                    f"'builtin.module' may only hold 'func.func', not '{op.name}'", op.loc
                )
            if op.sym_name in seen:
                raise VerifyError(f"redefinition of symbol '@{op.sym_name}'", op.loc)
            seen.add(op.sym_name)


@register
class FuncOp(Operation):
    """A function: typed arguments, one block, ended by `func.return`.

    func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> { func.return %x : tensor<4xf32> }
    """

    name = "func.func"
    attr_defs = attrs(
        Attr("sym_name", STR),
        Attr("function_type", FUNCTION_TYPE),
        # One dictionary per argument, as in MLIR; printed inline: `%w: tensor<..> {tgc.param}`.
        Attr("arg_attrs", ARG_ATTRS, default=None),
    )
    traits = frozenset({ISOLATED})
    num_results = 0
    num_regions = 1

    @classmethod
    def build(
        cls,
        name: str,
        arg_types: list[TensorType],
        result_types: list[TensorType],
        arg_names=None,
        loc: Location = UNKNOWN_LOC,
    ) -> FuncOp:
        block = Block(list(arg_types), arg_names)
        ftype = FunctionTypeAttr(tuple(arg_types), tuple(result_types))
        return cls([], [], {"sym_name": name, "function_type": ftype}, [Region([block])], loc)

    @property
    def sym_name(self) -> str:
        return self.attributes["sym_name"]

    @property
    def function_type(self) -> FunctionTypeAttr:
        return self.attributes["function_type"]

    @property
    def body(self) -> Block:
        return self.regions[0].block

    @property
    def args(self):
        return self.body.args

    def has_well_formed_arg_attrs(self) -> bool:
        """No `arg_attrs`, or one dictionary per argument (what the verifier requires)."""
        found = self.attributes.get("arg_attrs")
        return found is None or _well_formed_arg_attrs(found, len(self.function_type.inputs))

    def arg_attrs(self, index: int) -> dict:
        """The attributes of argument `index` (an empty dict when it has none, or when its entry
        of `arg_attrs` is malformed, which the verifier reports)."""
        found = self.attributes.get("arg_attrs")
        # Only this entry is checked, in O(1): the verifier asks for all of them, once per verify.
        if not (
            isinstance(found, tuple)
            and len(found) == len(self.function_type.inputs)
            and isinstance(found[index], DictAttr)
        ):
            return {}
        return found[index].as_dict()

    def set_arg_attr(self, index: int, key: str, value=UNIT) -> None:
        """Give argument `index` the attribute `key` (a unit attribute unless a value is given)."""
        n = len(self.function_type.inputs)
        per_arg = [self.arg_attrs(i) for i in range(n)]
        per_arg[index][key] = value
        self.attributes["arg_attrs"] = tuple(DictAttr(a) for a in per_arg)

    def is_param(self, index: int) -> bool:
        """Whether argument `index` is a parameter: a weight that does not change between calls,
        so a plan may pack or pre-transform it once (`%w: tensor<..> {tgc.param}`)."""
        return PARAM_ATTR in self.arg_attrs(index)

    def is_donated(self, index: int) -> bool:
        """Whether argument `index`'s memory is the function's to overwrite
        (`%cache: tensor<..> {tgc.donated}`, tgc/donation.py)."""
        return DONATED_ATTR in self.arg_attrs(index)

    def set_result_types(self, types: list[TensorType]) -> None:
        self.attributes["function_type"] = FunctionTypeAttr(self.function_type.inputs, tuple(types))

    def verify_(self) -> None:
        region = self.regions[0]
        if len(region.blocks) != 1:
            raise VerifyError("expects a body of one block")
        block = region.block
        ftype = self.function_type
        for i, t in enumerate(ftype.inputs):
            check_memory_space(t, f"argument #{i} type")
        if not self.has_well_formed_arg_attrs():
            raise VerifyError(
                f"'arg_attrs' must hold one dictionary per argument ({len(ftype.inputs)})"
            )
        for i in range(len(ftype.inputs)):
            for unit in (PARAM_ATTR, DONATED_ATTR):
                if self.arg_attrs(i).get(unit, UNIT) is not UNIT:
                    raise VerifyError(f"'{unit}' of argument #{i} takes no value")
            if self.is_param(i) and self.is_donated(i):
                raise VerifyError(
                    f"argument #{i} is a parameter (fixed between calls) and donated (overwritten)"
                )
        for i, t in enumerate(ftype.results):
            check_memory_space(t, f"result #{i} type")
        arg_types = tuple(a.type for a in block.args)
        if arg_types != ftype.inputs:
            raise VerifyError("entry block arguments do not match the function type")
        ret = block.last
        if not isinstance(ret, ReturnOp):
            raise VerifyError("must end with 'func.return'", ret.loc if ret else self.loc)
        got = tuple(v.type for v in ret.operands)
        if got != ftype.results:
            want = ", ".join(map(str, ftype.results)) or "nothing"
            have = ", ".join(map(str, got)) or "nothing"
            raise VerifyError(
                f"'func.return' op returns ({have}) but @{self.sym_name} is declared to return "
                f"({want})",
                ret.loc,
            )


@register
class ReturnOp(Operation):
    """Return values from a function.

    func.return %x : tensor<4xf32>
    """

    name = "func.return"
    operand_defs = (VariadicOperand("values"),)
    traits = frozenset({TERMINATOR})
    num_results = 0

    def verify_(self) -> None:
        if not isinstance(self.parent_op, FuncOp):
            raise VerifyError("must be inside 'func.func'")
        if self.next is not None:
            raise VerifyError("must be the last operation of its block")
