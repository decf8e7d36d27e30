"""The `atomic` dialect: the primitives every model decomposes into.

Each op is one class: signature, traits, type inference, verifier and numpy meaning. Op families
share a base (`UnaryOp`, `BinaryOp`, `ReduceOp`); most ops only set a name and a numpy function.
The ops live in three modules by what they do, imported here in this order (the order they
register in): atomic_elementwise.py (unary and binary arithmetic, cmp, where, cast),
atomic_reduce.py (reductions and matmul), atomic_shape.py (views, concat, split, gather,
constant, iota). Import the ops from this module.
"""

from __future__ import annotations

from tgc.dialects.atomic_elementwise import (
    AbsOp,
    AddOp,
    BinaryOp,
    CastOp,
    CmpOp,
    CosOp,
    DivOp,
    ErfOp,
    ExpOp,
    LogOp,
    MaxOp,
    MinOp,
    MulOp,
    NegOp,
    PowOp,
    RecipOp,
    RsqrtOp,
    SinOp,
    SqrtOp,
    SubOp,
    UnaryOp,
    WhereOp,
    _erf,
)
from tgc.dialects.atomic_reduce import MatmulOp, ReduceMaxOp, ReduceMinOp, ReduceOp, ReduceSumOp
from tgc.dialects.atomic_shape import (
    BroadcastOp,
    ConcatOp,
    ConstantOp,
    GatherOp,
    IotaOp,
    ReshapeOp,
    SliceOp,
    SplitOp,
    TransposeOp,
    WriteRowsOp,
    gather_index_bound,
)

__all__ = [
    "AbsOp",
    "AddOp",
    "BinaryOp",
    "BroadcastOp",
    "CastOp",
    "CmpOp",
    "ConcatOp",
    "ConstantOp",
    "CosOp",
    "DivOp",
    "ErfOp",
    "ExpOp",
    "GatherOp",
    "IotaOp",
    "LogOp",
    "MatmulOp",
    "MaxOp",
    "MinOp",
    "MulOp",
    "NegOp",
    "PowOp",
    "RecipOp",
    "ReduceMaxOp",
    "ReduceMinOp",
    "ReduceOp",
    "ReduceSumOp",
    "ReshapeOp",
    "RsqrtOp",
    "SinOp",
    "SliceOp",
    "SplitOp",
    "SqrtOp",
    "SubOp",
    "TransposeOp",
    "UnaryOp",
    "WhereOp",
    "WriteRowsOp",
    "_erf",  # hl.gelu's numpy meaning
    "gather_index_bound",
]
