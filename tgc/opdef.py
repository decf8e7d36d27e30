"""The op definition API and the op registry.

An op is one class that states, in one place, everything tgc knows about it:

    @register
    class SoftmaxOp(Operation):
        '''Softmax along `axis`.

            %y = hl.softmax %x {axis = -1} : (tensor<4x16xf32>) -> tensor<4x16xf32>
        '''
        name = "hl.softmax"
        operand_defs = (Operand("x"),)
        attr_defs = attrs(Attr("axis", INT, default=-1))
        traits = frozenset({PURE})

        def infer(self):            # result types from operand types and attributes
            ...
        def verify_(self):          # extra checks; raise VerifyError("...")
            ...
        def reference(self, x):     # numpy meaning: the definition of the op
            ...
        def decompose(self, b):     # hl ops: lower ops computing the same thing
            ...

The generic checks (operand count, known/required/well-typed attributes, declared result types
against `infer`) live in `verify_op` so no op repeats them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

from tgc.attributes import DenseAttr, FunctionTypeAttr, SymbolRef
from tgc.diagnostics import UNKNOWN_LOC, Location, VerifyError
from tgc.ir import Operation, Region, Value
from tgc.types import TensorType

# -- traits ---------------------------------------------------------------------------------------

PURE = "pure"  # no side effects: CSE and DCE may merge or remove it
ELEMENTWISE = "elementwise"  # result[i] depends only on operands[i] (after broadcasting)
BROADCASTING = "broadcasting"  # operands broadcast to the result shape (numpy rules)
COMMUTATIVE = "commutative"
ASSOCIATIVE = "associative"
TERMINATOR = "terminator"
ISOLATED = "isolated_from_above"  # regions may not use values defined outside
# What passes and codegen ask about an op's kind (never a list of op names; test_registry checks
# that each codegen table has an entry for every op with the trait it serves):
VIEW = "view"  # each result element is an element of operand 0 found by an index map; no math
REDUCTION = "reduction"  # combines operand 0 along `axes` with one associative operator
MOVE = "move"  # no arithmetic: results are made of operand elements or of coordinates (0 flops)
FREE = "free"  # costs nothing when it runs: an alias read in place, or data known beforehand


# -- memory spaces ---------------------------------------------------------------------------------

# The encodings a tensor type may carry: none (host memory, where numpy runs) or "cuda" (device
# memory). Anything else would pass parsing and fail far away, so the verifier rejects it at the op
# or function that declares it.
MEMORY_SPACES = (None, "cuda")


def check_memory_space(t: TensorType, what: str) -> None:
    """Raise VerifyError when `t`'s encoding names no known memory space; `what` names `t`."""
    if t.encoding not in MEMORY_SPACES:
        raise VerifyError(
            f'{what} {t} is in unknown memory space "{t.encoding}" (known: host, written without '
            f'an encoding, and "cuda")'
        )


# -- operand and attribute declarations -----------------------------------------------------------


@dataclass(frozen=True)
class OperandDef:
    name: str
    kind: str = "single"  # "single" | "optional" | "variadic"


def Operand(name: str) -> OperandDef:
    return OperandDef(name)


def OptionalOperand(name: str) -> OperandDef:
    return OperandDef(name, "optional")


def VariadicOperand(name: str) -> OperandDef:
    return OperandDef(name, "variadic")


@dataclass(frozen=True)
class AttrKind:
    """A kind of attribute value: a name for messages and a membership test."""

    description: str
    accepts: Callable[[object], bool]


def _is_int(v) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


INT = AttrKind("an integer", _is_int)
FLOAT = AttrKind("a float", lambda v: isinstance(v, float) or _is_int(v))
BOOL = AttrKind("a boolean", lambda v: isinstance(v, bool))
STR = AttrKind("a string", lambda v: isinstance(v, str))
INTS = AttrKind("an array of integers", lambda v: isinstance(v, tuple) and all(map(_is_int, v)))
DENSE = AttrKind("a dense constant", lambda v: isinstance(v, DenseAttr))
TYPE = AttrKind("a type", lambda v: isinstance(v, TensorType))
SYMBOL = AttrKind("a symbol reference", lambda v: isinstance(v, SymbolRef))
FUNCTION_TYPE = AttrKind("a function type", lambda v: isinstance(v, FunctionTypeAttr))
ANY = AttrKind("any attribute", lambda v: True)


def enum(*choices: str) -> AttrKind:
    listed = " | ".join(f'"{c}"' for c in choices)
    return AttrKind(f"one of {listed}", lambda v: isinstance(v, str) and v in choices)


REQUIRED = object()


@dataclass(frozen=True)
class AttrDef:
    name: str
    kind: AttrKind
    default: object = REQUIRED

    @property
    def required(self) -> bool:
        return self.default is REQUIRED


def Attr(name: str, kind: AttrKind, default: object = REQUIRED) -> AttrDef:
    return AttrDef(name, kind, default)


def attrs(*defs: AttrDef) -> dict[str, AttrDef]:
    return {d.name: d for d in defs}


# -- the registry ----------------------------------------------------------------------------------

OPS: dict[str, type[Operation]] = {}


def register(cls: type[Operation]) -> type[Operation]:
    """Add an op class to the registry; names are unique and definitions self-consistent."""
    if not cls.name or "." not in cls.name:
        raise TypeError(f"{cls.__name__}: op name must be 'dialect.op', got {cls.name!r}")
    if cls.name in OPS and OPS[cls.name] is not cls:
        raise TypeError(
            f"op '{cls.name}' is registered twice ({OPS[cls.name].__name__}, {cls.__name__})"
        )
    kinds = [d.kind for d in cls.operand_defs]
    if sum(k != "single" for k in kinds) > 1:
        raise TypeError(f"{cls.name}: at most one optional or variadic operand group")
    if not cls.__doc__:
        raise TypeError(f"{cls.name}: an op class needs a docstring with its syntax")
    OPS[cls.name] = cls
    return cls


def lookup(name: str) -> type[Operation] | None:
    return OPS.get(name)


def dialect_ops(dialect: str) -> list[type[Operation]]:
    return [cls for name, cls in OPS.items() if name.split(".", 1)[0] == dialect]


# -- operand groups --------------------------------------------------------------------------------


def operand_group_bounds(cls: type[Operation]) -> tuple[int, int | None]:
    """(min, max) operand counts accepted by `cls`; max None means unbounded."""
    fixed = sum(d.kind == "single" for d in cls.operand_defs)
    kinds = {d.kind for d in cls.operand_defs}
    if "variadic" in kinds:
        return fixed, None
    if "optional" in kinds:
        return fixed, fixed + 1
    return fixed, fixed


# -- creation and verification ---------------------------------------------------------------------


def create(
    cls: type[Operation],
    operands: list[Value],
    attributes: dict | None = None,
    result_types: list[TensorType] | None = None,
    regions: list[Region] | None = None,
    loc: Location = UNKNOWN_LOC,
) -> Operation:
    """Make an op; result types come from `infer` unless given. Raises VerifyError."""
    # Python lists are accepted for array attributes (`axes=[1]`); the IR holds tuples.
    attributes = {
        k: tuple(v) if isinstance(v, list) else v
        for k, v in (attributes or {}).items()
        if v is not None
    }
    if result_types is None:
        probe = cls(operands, [], attributes, None, loc)
        probe.drop_operand_uses()
        check_signature(probe)
        inferred = probe.infer()
        if inferred is None:
            raise VerifyError(f"'{cls.name}' op needs explicit result types", loc)
        result_types = inferred
    return cls(operands, result_types, attributes, regions, loc)


def check_signature(op: Operation) -> None:
    """Operand count and attribute checks shared by every op."""
    lo, hi = operand_group_bounds(type(op))
    n = len(op.operands)
    if n < lo or (hi is not None and n > hi):
        if lo == hi:
            want = f"{lo}"
        elif hi is None:
            want = f"at least {lo}"
        else:
            want = f"{lo} or {hi}"
        plural = "" if want == "1" else "s"
        raise VerifyError(f"'{op.name}' op expected {want} operand{plural}, but got {n}", op.loc)
    for key, value in op.attributes.items():
        attr_def = op.attr_defs.get(key)
        if attr_def is None and (op.accepts_extra_attributes or "." in key):
            continue  # `dialect.name` keys are discardable attributes, allowed on any op (MLIR)
        if attr_def is None:
            known = ", ".join(sorted(op.attr_defs)) or "none"
            raise VerifyError(f"'{op.name}' op unknown attribute '{key}' (known: {known})", op.loc)
        if not attr_def.kind.accepts(value):
            raise VerifyError(
                f"'{op.name}' op attribute '{key}' must be {attr_def.kind.description}", op.loc
            )
    for attr_def in op.attr_defs.values():
        if attr_def.required and attr_def.name not in op.attributes:
            raise VerifyError(f"'{op.name}' op requires attribute '{attr_def.name}'", op.loc)
    if len(op.regions) != op.num_regions:
        raise VerifyError(
            f"'{op.name}' op expected {op.num_regions} region(s), but got {len(op.regions)}", op.loc
        )


def verify_op(op: Operation) -> None:
    """All checks for one op (not its nested ops). Raises VerifyError at the op's location."""
    check_signature(op)
    if op.num_results is not None and len(op.results) != op.num_results:
        raise VerifyError(
            f"'{op.name}' op expected {op.num_results} result(s), but got {len(op.results)}", op.loc
        )
    for i, r in enumerate(op.results):
        try:
            what = "result type" if len(op.results) == 1 else f"result #{i} type"
            check_memory_space(r.type, what)
        except VerifyError as e:
            raise _located(op, e) from None
    try:
        inferred = op.infer()
    except VerifyError as e:
        raise _located(op, e) from None
    if inferred is not None:
        declared = [r.type for r in op.results]
        if len(inferred) != len(declared):
            raise VerifyError(
                f"'{op.name}' op expected {len(inferred)} result(s), but got {len(declared)}",
                op.loc,
            )
        for i, (want, got) in enumerate(zip(inferred, declared)):
            if want is not got and want != got:
                which = "result type" if len(declared) == 1 else f"result #{i} type"
                raise VerifyError(
                    f"'{op.name}' op {which} {got} does not match the inferred type {want}", op.loc
                )
    try:
        op.verify_()
    except VerifyError as e:
        raise _located(op, e) from None


_OP_PREFIX = re.compile(r"'[\w.]+' op ")


def _located(op: Operation, e: VerifyError) -> VerifyError:
    """Prefix an op verifier's message with the op name and give it the op's location."""
    message = e.message
    if not _OP_PREFIX.match(message):
        message = f"'{op.name}' op {message}"
    return VerifyError(message, e.loc if e.loc not in (None, UNKNOWN_LOC) else op.loc, e.notes)
