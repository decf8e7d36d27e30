"""What a converter sees of its node: inputs (as IR values or as numpy arrays known at import
time), attributes with defaults, a builder, and the error to raise.

A converter must read every input and attribute the node has (through the methods below) or say
it ignores one (`ignore_attr`): the importer refuses a node whose converter left an input or an
attribute unread, so a converter that does not know a feature fails loudly instead of computing
something else.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from onnx import AttributeProto

from tgc.attributes import DenseAttr
from tgc.builder import Builder
from tgc.diagnostics import TgcError, printable
from tgc.ir import Value
from tgc.types import TensorType

from .dtypes import element_type_of_array

if TYPE_CHECKING:
    from onnx import NodeProto

    from .graph import GraphImporter

REQUIRED = object()


class OnnxImportError(TgcError):
    """A diagnostic about the ONNX model (already worded with the node it is about). Names from
    the model are shown with their control characters escaped (tgc.diagnostics.printable)."""

    def __post_init__(self) -> None:
        self.message = printable(self.message)


class NodeContext:
    """One node being converted. `b` builds the node's ops (`ctx.b.atomic.add(x, y)`)."""

    def __init__(self, importer: GraphImporter, node: NodeProto, index: int, b: Builder) -> None:
        self._importer = importer
        self.node = node
        self.index = index
        self.b = b
        self.folding = False  # set by the importer when every input is known: ops are evaluated
        self.read_inputs: set[int] = set()
        self.read_attrs: set[str] = set()
        self._attrs = {a.name: a for a in node.attribute}

    # -- naming and errors ---------------------------------------------------------------------

    @property
    def op_type(self) -> str:
        return self.node.op_type

    @property
    def opset(self) -> int:
        """The model's version of the default ONNX domain (13 or later)."""
        return self._importer.opset

    def describe(self) -> str:
        """ "node 'name' (OpType)", or "node #3 (OpType)" for a node without a name."""
        who = f"'{self.node.name}'" if self.node.name else f"#{self.index}"
        return f"node {who} ({self.node.op_type})"

    def error(self, message: str) -> OnnxImportError:
        """The error to raise: `raise ctx.error("mode 'reflect' is not supported")`."""
        return OnnxImportError(f"{self.describe()}: {message}", self._importer.loc)

    # -- inputs --------------------------------------------------------------------------------

    @property
    def num_inputs(self) -> int:
        """The number of input slots, absent optional ones (empty names) included."""
        return len(self.node.input)

    def has_input(self, i: int) -> bool:
        """Whether optional input `i` is given."""
        return i < len(self.node.input) and self.node.input[i] != ""

    def input_name(self, i: int) -> str:
        return self.node.input[i] if i < len(self.node.input) else ""

    def input(self, i: int) -> Value:
        """Input `i` as an IR value (a constant input becomes an `atomic.constant`)."""
        name = self._required_name(i)
        self.read_inputs.add(i)
        return self._importer.value(name, self)

    def optional_input(self, i: int) -> Value | None:
        """Input `i` as an IR value, or None when the optional input is absent."""
        return self.input(i) if self.has_input(i) else None

    def inputs(self) -> list[Value]:
        """Every given input as an IR value (absent optional ones skipped), for variadic ops."""
        return [self.input(i) for i in range(self.num_inputs) if self.has_input(i)]

    def input_type(self, i: int) -> TensorType:
        """The tgc type of input `i`, without turning a constant input into an op."""
        name = self._required_name(i)
        self.read_inputs.add(i)
        return self._importer.type_of(name, self)

    def static(self, i: int) -> np.ndarray | None:
        """Input `i` as a numpy array when its value is known at import time (an initializer, a
        Constant, or computed from those), else None. Parameters (`weights_as_args`) and absent
        inputs are None."""
        if not self.has_input(i):
            return None
        self.read_inputs.add(i)
        return self._importer.static_value(self.node.input[i])

    def require_static(self, i: int, what: str = "") -> np.ndarray:
        """Input `i` as a numpy array; an error when it is only known when the model runs (tgc
        tensors have static shapes, so shapes, axes, pads... must be constants)."""
        name = self._required_name(i)
        self.read_inputs.add(i)
        found = self._importer.static_value(name, include_params=True)
        if found is None:
            label = what or f"input #{i}"
            raise self.error(
                f"{label} ('{name}') must be a constant (an initializer or computed from "
                "constants): tgc tensors have static shapes"
            )
        return found

    def _required_name(self, i: int) -> str:
        if not self.has_input(i):
            raise self.error(f"input #{i} is required but not given")
        return self.node.input[i]

    # -- attributes ----------------------------------------------------------------------------

    def has_attr(self, name: str) -> bool:
        return name in self._attrs

    def attr(self, name: str, default=REQUIRED):
        """The attribute as a Python value: int, float, str, list of those, or a numpy array for
        a tensor. Without a default it is required. Reading it marks it as handled."""
        self.read_attrs.add(name)
        proto = self._attrs.get(name)
        if proto is None:
            if default is REQUIRED:
                raise self.error(f"attribute '{name}' is required")
            return default
        return self._attr_value(proto)

    def ignore_attr(self, *names: str) -> None:
        """Mark attributes as handled without reading them (they do not change the result)."""
        self.read_attrs.update(names)

    def _attr_value(self, proto: AttributeProto):
        kind = proto.type
        if kind == AttributeProto.INT:
            return int(proto.i)
        if kind == AttributeProto.FLOAT:
            return float(proto.f)
        if kind == AttributeProto.STRING:
            return proto.s.decode("utf-8", errors="replace")
        if kind == AttributeProto.INTS:
            return [int(v) for v in proto.ints]
        if kind == AttributeProto.FLOATS:
            return [float(v) for v in proto.floats]
        if kind == AttributeProto.STRINGS:
            return [s.decode("utf-8", errors="replace") for s in proto.strings]
        if kind == AttributeProto.TENSOR:
            return self._importer.tensor_array(proto.t, f"attribute '{proto.name}'", self)
        kind_name = AttributeProto.AttributeType.Name(kind).lower()
        raise self.error(f"attribute '{proto.name}' of kind {kind_name} is not supported")

    # -- outputs -------------------------------------------------------------------------------

    @property
    def num_outputs(self) -> int:
        return len(self.node.output)

    def has_output(self, i: int) -> bool:
        """Whether output `i` is wanted (optional outputs have an empty name when not)."""
        return i < len(self.node.output) and self.node.output[i] != ""

    # -- building ------------------------------------------------------------------------------

    def constant(self, array, element_type: str | None = None) -> Value:
        """An `atomic.constant` holding `array` (of its own dtype, or cast to `element_type`)."""
        array = np.asarray(array)
        if element_type is None:
            element_type = element_type_of_array(array)
            if element_type is None:
                raise self.error(f"a constant of dtype {array.dtype} has no tgc element type")
        t = TensorType.get(array.shape, element_type)
        array = array.astype(t.dtype, copy=False)
        return self.b.atomic.constant(value=DenseAttr(array, t), result_type=t)

    def scalar(self, value, like: Value) -> Value:
        """`value` as a rank-0 constant of `like`'s element type (it broadcasts against it)."""
        t = TensorType.get((), like.type.element_type)
        return self.b.atomic.constant(value=DenseAttr.splat(value, t), result_type=t)
