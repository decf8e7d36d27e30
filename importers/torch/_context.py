"""What a lowering sees of one aten node: its arguments bound by name, the types PyTorch says its
results have, and a builder placed at the end of the function, at the node's source line.

A lowering is `fn(cx: Cx) -> Value | tuple[Value | None, ...]`; it reads `cx.arg("name")` (names
are those of the aten schema: `self`, `other`, `dim`, ...), builds ops with `cx.b`, and raises
`cx.error(...)` for what tgc cannot express.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from tgc.attributes import DenseAttr
from tgc.builder import Builder
from tgc.diagnostics import Location, TgcError
from tgc.ir import Value
from tgc.types import NUMPY_DTYPES, TensorType

ELEMENT_TYPES: dict[torch.dtype, str] = {
    torch.float16: "f16",
    torch.bfloat16: "bf16",
    torch.float32: "f32",
    torch.float64: "f64",
    torch.bool: "i1",
    torch.int8: "i8",
    torch.int32: "i32",
    torch.int64: "i64",
}
TORCH_DTYPES = {name: dtype for dtype, name in ELEMENT_TYPES.items()}


@dataclass(frozen=True)
class Static:
    """A tensor whose value is known when importing (made by factory ops such as `full` and
    `arange`, or a constant lifted by torch.export): folded in PyTorch, and a constant in the
    module only where a computed value reads it."""

    node: torch.fx.Node
    tensor: torch.Tensor


def describe(node: torch.fx.Node) -> str:
    """`node 'add_1' (aten.add.Tensor)`: how messages name a node; `... in module 'h.0.mlp'
    (MLP)` when a submodule made it (its source line may be PyTorch's own)."""
    text = f"node '{node.name}' ({target_name(node)})"
    stack = node.meta.get("nn_module_stack") or {}
    if stack:
        path, cls = list(stack.values())[-1]
        if path:
            name = cls.rsplit(".", 1)[-1] if isinstance(cls, str) else getattr(cls, "__name__", "")
            text += f" in module '{path}' ({name})"
    return text


def target_name(node: torch.fx.Node) -> str:
    target = node.target
    if isinstance(target, torch._ops.OpOverload):
        return str(target)  # aten.add.Tensor
    return getattr(target, "__name__", str(target))


def element_type(dtype: torch.dtype, what: str, loc: Location | None) -> str:
    """tgc's name for a torch dtype; a dtype tgc has no type for is an error naming `what`."""
    found = ELEMENT_TYPES.get(dtype)
    if found is None:
        known = ", ".join(str(d).removeprefix("torch.") for d in ELEMENT_TYPES)
        raise TgcError(f"{what} has dtype {dtype}, which tgc has no type for (it has {known})", loc)
    return found


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    """A CPU copy of `tensor` as numpy (bfloat16 through its bits, as ml_dtypes' bfloat16)."""
    t = tensor.detach().to("cpu").contiguous()
    if t.dtype == torch.bfloat16:
        return t.view(torch.int16).numpy().view(NUMPY_DTYPES["bf16"]).copy()
    return t.numpy().copy()


class Cx:
    """The lowering context of one node (see the module docstring)."""

    def __init__(
        self,
        node: torch.fx.Node,
        b: Builder,
        args: dict[str, Any],
        out: list[TensorType | None],
        materialize,
    ) -> None:
        self.node = node
        self.b = b
        self.args = args
        self.outs = out  # one type per tensor result (None where PyTorch has no tensor)
        # (Static, element type or None) -> Value: a constant, made once per node and type
        self._materialize = materialize

    # -- what the node is ---------------------------------------------------------------------

    @property
    def overload(self) -> str:
        """The aten overload name: 'Tensor' for aten.add.Tensor, 'default', ..."""
        return getattr(self.node.target, "_overloadname", "")

    @property
    def out(self) -> TensorType:
        """The type of the node's only tensor result."""
        return self.outs[0]

    def used_outputs(self) -> set[int]:
        """The indices of the results of a multi-result node that the program reads."""
        return {user.args[1] for user in self.node.users if _is_getitem(user)}

    def error(self, what: str) -> TgcError:
        return TgcError(f"{describe(self.node)}: {what}", self.b.loc)

    # -- arguments ----------------------------------------------------------------------------

    def arg(self, name: str) -> Any:
        """The argument `name` as bound: a Value, a Static, a Python scalar or list, None..."""
        return self.args[name]

    def value(self, name_or_arg, element_type: str | None = None) -> Value:
        """An argument (or any bound value) as a Value, cast to `element_type` if given; a
        Python number becomes a rank-0 constant of `element_type` (which it then needs)."""
        x = self.args[name_or_arg] if isinstance(name_or_arg, str) else name_or_arg
        if isinstance(x, Static):  # made a constant of the type asked for (no cast op)
            x = self._materialize(x, element_type)
        if isinstance(x, Value):
            return x if element_type is None else self.cast(x, element_type)
        if isinstance(x, (bool, int, float)):
            if element_type is None:
                raise self.error(f"cannot tell the type of the scalar {x!r}")
            return self.scalar(x, element_type)
        raise self.error(f"expected a tensor, got {type(x).__name__} {x!r}")

    def scalar(self, value: float | int | bool, element_type: str) -> Value:
        """`value` as a rank-0 constant (it broadcasts against any operand)."""
        t = TensorType.get((), element_type)
        return self.b.atomic.constant(value=DenseAttr.splat(value, t), result_type=t)

    def constant(self, array: np.ndarray, element_type: str) -> Value:
        t = TensorType.get(tuple(array.shape), element_type)
        return self.b.atomic.constant(value=DenseAttr(array, t), result_type=t)

    def cast(self, x: Value, element_type: str) -> Value:
        if x.type.element_type == element_type:
            return x
        return self.b.atomic.cast(x, result_type=x.type.with_element_type(element_type))

    def reshape(self, x: Value, shape) -> Value:
        shape = tuple(shape)
        if x.type.shape == shape:
            return x
        return self.b.atomic.reshape(x, result_type=x.type.with_shape(shape))

    def broadcast(self, x: Value, shape) -> Value:
        shape = tuple(shape)
        if x.type.shape == shape:
            return x
        return self.b.atomic.broadcast(x, result_type=x.type.with_shape(shape))

    def rank_of(self, name: str) -> int:
        x = self.args[name]
        return x.tensor.dim() if isinstance(x, Static) else x.type.rank

    def dtype_of(self, x) -> torch.dtype | None:
        """The torch dtype of a bound tensor value (None for a Python scalar)."""
        if isinstance(x, Static):
            return x.tensor.dtype
        if isinstance(x, Value):
            return TORCH_DTYPES[x.type.element_type]
        return None

    def promoted(self, *names: str) -> str:
        """The element type PyTorch computes an elementwise op of these arguments in (its type
        promotion: a rank-0 tensor or a Python number only raises the category)."""
        operands = []
        for name in names:
            x = self.args[name]
            dtype = self.dtype_of(x)
            if dtype is None:
                operands.append(x)
            else:
                rank = self.rank_of(name)
                operands.append(torch.empty((1,) * rank, dtype=dtype))
        result = operands[0]
        for other in operands[1:]:
            result = torch.empty(
                (1,) * max(_rank(result), _rank(other)), dtype=torch.result_type(result, other)
            )
        if not isinstance(result, torch.Tensor):
            raise self.error("an elementwise op of Python numbers only")
        return element_type(result.dtype, describe(self.node), self.b.loc)

    def axis(self, dim: int, rank: int) -> int:
        """`dim` counted from 0 (PyTorch lets a rank-0 tensor use dims 0 and -1)."""
        size = max(rank, 1)
        if not -size <= dim < size:
            raise self.error(f"dim {dim} is out of range for rank {rank}")
        return dim % size


def _rank(x) -> int:
    return x.dim() if isinstance(x, torch.Tensor) else 0


def _is_getitem(node: torch.fx.Node) -> bool:
    import operator

    return node.op == "call_function" and node.target is operator.getitem
