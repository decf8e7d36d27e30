"""The walker: an ONNX graph, node by node, into one tgc function.

Values are kept by ONNX name, either as IR values or, when they are known at import time
(initializers, Constant nodes, anything computed only from those), as numpy arrays. A node whose
inputs are all known is folded: its converter builds its ops in a scratch block, the ops are
evaluated on their numpy meaning, and its outputs become known arrays too. So Shape, Gather,
Concat, Cast... on shapes fold away, and the ops that need a shape or axes find a constant. A
known array becomes an `atomic.constant` only where an op reads it as a value.

Graph inputs become function arguments (in order), graph outputs the results. With
`weights_as_args`, float initializers of more than one element become arguments marked
`{tgc.param}` (added after the inputs, in the order the graph first reads them); integer and
scalar initializers (shapes, axes, indices, epsilons) stay constants.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

import numpy as np
from onnx import ModelProto, TensorProto, ValueInfoProto, numpy_helper
from onnx.external_data_helper import uses_external_data

from tgc.attributes import DenseAttr, FunctionTypeAttr
from tgc.builder import Builder
from tgc.builtin import PARAM_ATTR, FuncOp, ModuleOp, ReturnOp
from tgc.diagnostics import Location, TgcError
from tgc.evaluate import evaluate_op
from tgc.importers._weights import DEFAULT_INLINE_LIMIT, WeightFiles
from tgc.ir import Block, Region, Value
from tgc.opdef import verify_op
from tgc.types import FLOAT_TYPES, MAX_RANK, TensorType
from tgc.verifier import verify

from .context import NodeContext, OnnxImportError
from .dtypes import SUPPORTED_WORDS, element_type, element_type_of_array, onnx_type_name
from .registry import CONVERTERS, DEFAULT_DOMAINS

MIN_OPSET = 13

_INVALID_NAME_CHARS = re.compile(r"[^A-Za-z0-9_$.\-]")


class FileLocation(Location):
    """A location naming only a file (an ONNX model has no lines): 'model.onnx: error: ...'."""

    __slots__ = ()

    def __str__(self) -> str:
        return self.file


def _newest_opset() -> int:
    from onnx.defs import onnx_opset_version

    return onnx_opset_version()


def sanitize_name(name: str) -> str | None:
    """An ONNX value name as a .tg value name (`%name`): other characters become '_'."""
    if not name:
        return None
    return _INVALID_NAME_CHARS.sub("_", name)


@dataclass
class ImportOptions:
    weights_as_args: bool = False
    inline_limit: int = DEFAULT_INLINE_LIMIT
    weights_dir: str | None = None  # large constants go to <weights_dir>/<name>.npy; None: inline
    name: str | None = None
    input_shapes: dict[str, tuple[int, ...]] = field(default_factory=dict)


@dataclass
class ImportResult:
    module: ModuleOp
    # Arrays of file-backed constants, by the path the module refers to them with (relative to
    # the .tg file): the tool writes them.
    files: dict[str, np.ndarray] = field(default_factory=dict)


class GraphImporter:
    def __init__(self, model: ModelProto, source: str, options: ImportOptions) -> None:
        self.model = model
        self.graph = model.graph
        self.source = source
        self.options = options
        self.loc = FileLocation(source, 0, 0)
        self.opset = self._default_opset()
        self.values: dict[str, Value] = {}  # ONNX name -> IR value (in the function body)
        self.statics: dict[str, np.ndarray] = {}  # ONNX name -> value known at import time
        self.params: dict[str, np.ndarray] = {}  # initializers that become parameter arguments
        self.defaults: dict[str, np.ndarray] = {}  # initializers of graph inputs (kept inputs)
        self.block = Block()
        self.param_args: list[Value] = []
        self.weights = WeightFiles(options.weights_dir, options.inline_limit)

    def error(self, message: str) -> OnnxImportError:
        return OnnxImportError(message, self.loc)

    # -- the whole graph -----------------------------------------------------------------------

    def run(self) -> ImportResult:
        self._check_graph()
        self._read_initializers()
        self._add_inputs()
        b = Builder.at_end(self.block, self.loc)
        for index, node in enumerate(self.graph.node):
            self._convert(node, index, b)
        results = [self._output(out) for out in self.graph.output]
        return ImportResult(self._finish(results), self.weights.files)

    def _default_opset(self) -> int:
        versions = [o.version for o in self.model.opset_import if o.domain in DEFAULT_DOMAINS]
        if not versions:
            raise self.error("the model imports no version of the default ONNX operator set")
        version = max(versions)
        newest = _newest_opset()
        if version > newest:
            raise self.error(
                f"the model uses ONNX opset {version}; tgc-import reads opsets {MIN_OPSET} to "
                f"{newest} (the newest the installed onnx package defines)"
            )
        if version < MIN_OPSET:
            raise self.error(
                f"the model uses ONNX opset {version}; tgc-import reads opset {MIN_OPSET} and "
                "later (onnx.version_converter.convert_version can upgrade it)"
            )
        return version

    def _check_graph(self) -> None:
        if not self.graph.output:
            raise self.error("the graph has no outputs")
        if self.graph.sparse_initializer:
            name = self.graph.sparse_initializer[0].values.name
            raise self.error(f"sparse initializer '{name}' is not supported")

    def _read_initializers(self) -> None:
        used = {name for node in self.graph.node for name in node.input}
        used |= {out.name for out in self.graph.output}
        inputs = {i.name for i in self.graph.input}
        for tensor in self.graph.initializer:
            array = self.tensor_array(tensor, f"initializer '{tensor.name}'")
            if tensor.name in inputs:
                # ONNX: an initializer named like a graph input is that input's default value.
                # The input stays an argument (a tgc function has no defaults); its value is
                # not imported. Only its type must agree with the input's.
                self.defaults[tensor.name] = array
                continue
            if self.options.weights_as_args and _is_weight(array) and tensor.name in used:
                self.params[tensor.name] = array
            else:
                self.statics[tensor.name] = array

    def _add_inputs(self) -> None:
        real = list(self.graph.input)
        known = {i.name for i in real}
        for name in self.options.input_shapes:
            if name not in known:
                listed = ", ".join(f"'{n}'" for n in known) or "none"
                raise self.error(
                    f"an input shape is given for '{name}', which is not a graph input "
                    f"(inputs: {listed})"
                )
        for info in real:
            arg = self.block.add_arg(self._input_type(info), sanitize_name(info.name))
            self.values[info.name] = arg
            default = self.defaults.get(info.name)
            if default is not None:
                self._check_default(info.name, arg.type, default)
                if self.options.weights_as_args and _is_weight(default):
                    self.param_args.append(arg)

    def _check_default(self, name: str, declared: TensorType, default: np.ndarray) -> None:
        elem = element_type_of_array(default)
        if elem != declared.element_type or tuple(default.shape) != declared.shape:
            shape = "x".join(map(str, default.shape)) or "scalar"
            raise self.error(
                f"graph input '{name}' is declared {declared}, but its initializer (its "
                f"default value) is {shape} {default.dtype}"
            )

    def _input_type(self, info: ValueInfoProto) -> TensorType:
        what = f"graph input '{info.name}'"
        if not info.type.HasField("tensor_type"):
            kind = info.type.WhichOneof("value") or "no type"
            raise self.error(f"{what} is a {kind.replace('_type', '')}, not a tensor")
        tensor_type = info.type.tensor_type
        elem = self._element_type(tensor_type.elem_type, what)
        given = self.options.input_shapes.get(info.name)
        # onnx.checker has made sure that a graph input has a shape (a rank).
        if len(tensor_type.shape.dim) > MAX_RANK:
            raise self.error(
                f"{what} has rank {len(tensor_type.shape.dim)}; tgc tensors have at most "
                f"{MAX_RANK} dims"
            )
        dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
        negative = [d for d in dims if d is not None and d < 0]
        if negative:
            raise self.error(f"{what} has a negative dim {negative[0]}")
        symbols = [d.dim_param or "?" for d in tensor_type.shape.dim]
        if given is not None:
            return TensorType.get(self._given_shape(info.name, dims, tuple(given)), elem)
        if any(d is None for d in dims):
            spelled = ", ".join(str(d) if d is not None else s for d, s in zip(dims, symbols))
            raise self.error(
                f"{what} has a dynamic shape [{spelled}]; tgc tensors are static: give the shape "
                f"with --input-shape {info.name}=DIMS (e.g. "
                f"{'x'.join(str(d) if d is not None else '1' for d in dims) or '1'})"
            )
        return TensorType.get(tuple(dims), elem)

    def _given_shape(self, name: str, dims: list, given: tuple[int, ...]) -> tuple[int, ...]:
        if len(given) != len(dims):
            raise self.error(
                f"the shape given for input '{name}' has rank {len(given)}, the model's has "
                f"rank {len(dims)}"
            )
        for axis, (declared, size) in enumerate(zip(dims, given)):
            if declared is not None and declared != size:
                raise self.error(
                    f"the shape given for input '{name}' has {size} at dim {axis}, the model "
                    f"fixes it to {declared}"
                )
        return given

    def _element_type(self, data_type: int, what: str) -> str:
        elem = element_type(data_type)
        if elem is None:
            raise self.error(
                f"{what} has element type {onnx_type_name(data_type)}, which tgc does not "
                f"support (supported: {SUPPORTED_WORDS})"
            )
        return elem

    def _output(self, info: ValueInfoProto) -> Value:
        if info.name not in self.values and info.name not in self.statics:
            if info.name not in self.params:
                raise self.error(f"graph output '{info.name}' is not computed by any node")
        value = self.value(info.name, None)
        self._check_declared(info, value.type)
        return value

    def _check_declared(self, info: ValueInfoProto, got: TensorType) -> None:
        """A graph output's declared element type and fixed dims must be what tgc computed."""
        if not info.type.HasField("tensor_type"):
            return
        tensor_type = info.type.tensor_type
        declared_elem = element_type(tensor_type.elem_type) if tensor_type.elem_type else None
        mismatch = declared_elem is not None and declared_elem != got.element_type
        if tensor_type.HasField("shape"):
            dims = [d.dim_value if d.HasField("dim_value") else None for d in tensor_type.shape.dim]
            mismatch |= len(dims) != got.rank or any(
                d is not None and d != g for d, g in zip(dims, got.shape)
            )
        if mismatch:
            raise self.error(
                f"graph output '{info.name}' is {got} here, but the model declares "
                f"{_describe_declared(tensor_type)}"
            )

    def _finish(self, results: list[Value]) -> ModuleOp:
        b = Builder.at_end(self.block, self.loc)
        b.insert(ReturnOp(results, [], loc=self.loc))
        arg_types = tuple(a.type for a in self.block.args)
        ftype = FunctionTypeAttr(arg_types, tuple(v.type for v in results))
        name = self.options.name or _function_name(self.graph.name)
        attributes = {"sym_name": name, "function_type": ftype}
        func = FuncOp([], [], attributes, [Region([self.block])], self.loc)
        for arg in self.param_args:
            func.set_arg_attr(arg.index, PARAM_ATTR)
        module = ModuleOp.empty(self.loc)
        module.body.append(func)
        try:
            verify(module)
        except TgcError as e:  # a converter built something wrong: still no traceback
            raise self.error(f"the imported module does not verify: {e.message}") from None
        return module

    # -- nodes ---------------------------------------------------------------------------------

    def _convert(self, node, index: int, b: Builder) -> None:
        ctx = NodeContext(self, node, index, b)
        if node.domain not in DEFAULT_DOMAINS:
            raise ctx.error(f"operator domain '{node.domain}' is not supported")
        fn = CONVERTERS.get(node.op_type)
        if fn is None:
            raise ctx.error(
                f"op type '{node.op_type}' is not supported (docs/onnx.md lists those that are)"
            )
        given = [name for name in node.input if name]
        if given and all(self.static_value(name) is not None for name in given):
            ctx.folding = True
            ctx.b = Builder.at_end(Block(), self.loc)
        try:
            outputs = fn(ctx)
            self._check_all_read(ctx)
            outputs = self._as_output_list(ctx, outputs)
            if ctx.folding:
                outputs = self._fold(ctx, outputs)
        except OnnxImportError:
            raise
        except TgcError as e:  # a verifier or type inference refused what the node asks
            raise ctx.error(e.message) from None
        self._bind_outputs(ctx, outputs)

    def _check_all_read(self, ctx: NodeContext) -> None:
        for i, name in enumerate(ctx.node.input):
            if name and i not in ctx.read_inputs:
                raise ctx.error(f"input #{i} ('{name}') is not supported")
        for attr in ctx.node.attribute:
            if attr.name not in ctx.read_attrs:
                raise ctx.error(f"attribute '{attr.name}' is not supported")

    def _as_output_list(self, ctx: NodeContext, outputs) -> list:
        if outputs is None or isinstance(outputs, (Value, np.ndarray, np.generic)):
            outputs = [outputs]
        outputs = list(outputs)
        for i in range(ctx.num_outputs):
            produced = i < len(outputs) and outputs[i] is not None
            if ctx.has_output(i) and not produced:
                raise ctx.error(f"output #{i} ('{ctx.node.output[i]}') is not supported")
        return outputs

    def _fold(self, ctx: NodeContext, outputs: list) -> list:
        """Evaluate the ops a converter built in its scratch block (all inputs were known)."""
        env: dict[Value, np.ndarray] = {}
        for op in ctx.b.block.ops:
            verify_op(op)
            inputs = [env[v] for v in op.operands]
            env.update(zip(op.results, evaluate_op(op, inputs, "native")))
        return [env[v] if isinstance(v, Value) else v for v in outputs]

    def _bind_outputs(self, ctx: NodeContext, outputs: list) -> None:
        for i, name in enumerate(ctx.node.output):
            if not name or i >= len(outputs) or outputs[i] is None:
                continue
            out = outputs[i]
            if isinstance(out, Value):
                if out.name_hint is None and out.defining_op is not None:
                    out.name_hint = sanitize_name(name)
                self.values[name] = out
            else:
                self.statics[name] = np.asarray(out)

    # -- values --------------------------------------------------------------------------------

    def static_value(self, name: str, include_params: bool = False) -> np.ndarray | None:
        found = self.statics.get(name)
        if found is None and include_params:
            found = self.params.get(name)
        return found

    def value(self, name: str, ctx: NodeContext | None) -> Value:
        """The IR value of ONNX value `name`: made a constant (or a parameter) on first use."""
        if ctx is not None and ctx.folding:
            return self._constant(ctx.b, self.statics[name], name, ctx, inline=True)
        found = self.values.get(name)
        if found is not None:
            return found
        if name in self.params:
            array = self.params[name]
            arg = self.block.add_arg(self._array_type(array, name, ctx), sanitize_name(name))
            self.param_args.append(arg)
            self.values[name] = arg
            return arg
        if name not in self.statics:
            raise self.error(f"value '{name}' is used before it is defined")
        b = Builder.at_end(self.block, self.loc) if ctx is None else ctx.b
        made = self._constant(b, self.statics[name], name, ctx, inline=False)
        self.values[name] = made
        return made

    def type_of(self, name: str, ctx: NodeContext) -> TensorType:
        array = self.static_value(name, include_params=True)
        if array is not None:
            return self._array_type(array, name, ctx)
        if name not in self.values:
            raise self.error(f"value '{name}' is used before it is defined")
        return self.values[name].type

    def _array_type(self, array: np.ndarray, name: str, ctx: NodeContext | None) -> TensorType:
        elem = element_type_of_array(array)
        if elem is None:
            message = f"value '{name}' has dtype {array.dtype}, which tgc does not support"
            raise ctx.error(message) if ctx is not None else self.error(message)
        return TensorType.get(array.shape, elem)

    def _constant(self, b: Builder, array, name: str, ctx, inline: bool) -> Value:
        t = self._array_type(array, name, ctx)
        attr = self._dense_attr(array, t, name, inline)
        made = b.atomic.constant(value=attr, result_type=t)
        made.name_hint = sanitize_name(name)
        return made

    def _dense_attr(self, array: np.ndarray, t: TensorType, name: str, inline: bool) -> DenseAttr:
        """Small constants and splats inline; large ones in a .npy file beside the output when a
        folder for them is given (`weights_dir`; importers/_weights.py names the files)."""
        if inline:
            return DenseAttr(array, t)
        return self.weights.dense_attr(array, t, name)

    def tensor_array(self, tensor: TensorProto, what: str, ctx=None) -> np.ndarray:
        """A TensorProto's value; its element type must be one tgc has."""
        if element_type(tensor.data_type) is None:
            message = (
                f"{what} has element type {onnx_type_name(tensor.data_type)}, which tgc does "
                f"not support (supported: {SUPPORTED_WORDS})"
            )
            raise ctx.error(message) if ctx is not None else self.error(message)
        if uses_external_data(tensor):  # only a model read from its path has loaded them
            message = (
                f"{what} keeps its data in an external file: import the model from its path, "
                "so that the file is found beside it"
            )
            raise ctx.error(message) if ctx is not None else self.error(message)
        try:
            return numpy_helper.to_array(tensor)
        except Exception as e:  # malformed data (wrong length, missing external file)
            message = f"{what} could not be read: {_first_line(e)}"
            raise ctx.error(message) if ctx is not None else self.error(message) from None


def _is_weight(array: np.ndarray) -> bool:
    """Float tensors of more than one element: what a training run would change."""
    return array.size > 1 and element_type_of_array(array) in FLOAT_TYPES


def _function_name(graph_name: str) -> str:
    cleaned = re.sub(r"[^A-Za-z0-9_]", "_", graph_name)
    if not cleaned or cleaned[0].isdigit():
        return "main"
    return cleaned


def _describe_declared(tensor_type) -> str:
    elem = onnx_type_name(tensor_type.elem_type)
    if not tensor_type.HasField("shape"):
        return f"{elem} of unknown rank"
    dims = [
        str(d.dim_value) if d.HasField("dim_value") else (d.dim_param or "?")
        for d in tensor_type.shape.dim
    ]
    return f"{elem} [{'x'.join(dims)}]"


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__
