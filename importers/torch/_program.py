"""The walker: an ExportedProgram's graph, node by node, into one tgc function.

Placeholders become the function's arguments (parameters and buffers first, marked `tgc.param`,
then the user inputs) or constants; each live `call_function` node is folded when its value is
known while importing (factories such as `full` and `arange`, lifted constants), or lowered by
its entry in `_registry.LOWERINGS`; the output node's values are returned. Every node's ops carry
its source line (the last frame of its stack trace outside PyTorch itself).
"""

from __future__ import annotations

import contextlib
import logging
import operator
import os
import re
from pathlib import Path
from typing import Any

import torch
from torch.export.graph_signature import InputKind, OutputKind

import tgc.dialects  # noqa: F401  (registers the ops the builder makes)
from tgc.builder import FunctionBuilder
from tgc.builtin import PARAM_ATTR, ModuleOp
from tgc.diagnostics import UNKNOWN_LOC, Location, TgcError
from tgc.importers._weights import WeightFiles
from tgc.importers.torch import (  # noqa: F401  (registration)
    ops_conv,
    ops_elementwise,
    ops_nn,
    ops_rounding,
    ops_shape,
)
from tgc.importers.torch._context import (
    TORCH_DTYPES,
    Cx,
    Static,
    describe,
    element_type,
    to_numpy,
)
from tgc.importers.torch._registry import (
    ASSERT_OPS,
    LIKE_OPS,
    LOWERINGS,
    NONDETERMINISTIC_OPS,
)
from tgc.ir import Value
from tgc.types import TensorType

_TORCH_DIR = os.path.dirname(torch.__file__)
_FRAME = re.compile(r'File "([^"]+)", line (\d+)')


def _kept_whole() -> list:
    """The composite ops that map to one hl op: run_decompositions leaves them as they are."""
    aten = torch.ops.aten
    names = [
        ("linear", "default"),
        ("layer_norm", "default"),
        ("rms_norm", "default"),
        ("scaled_dot_product_attention", "default"),
        ("softmax", "int"),
        ("log_softmax", "int"),
        ("silu", "default"),
        ("matmul", "default"),
        ("dropout", "default"),
    ]
    return [getattr(getattr(aten, op), overload) for op, overload in names if hasattr(aten, op)]


def to_core_aten(ep: torch.export.ExportedProgram) -> torch.export.ExportedProgram:
    """`ep` in PyTorch's core aten opset, but for the ops that map to one hl op (a PyTorch
    older than 2.6 has no default table to take them from: everything is decomposed there)."""
    table = None
    if hasattr(torch.export, "default_decompositions"):
        table = torch.export.default_decompositions()
        for op in _kept_whole():
            table.pop(op, None)
    try:
        return ep.run_decompositions(table)
    except Exception as e:  # PyTorch's own failure (a custom op without a meta kernel, ...)
        first_line = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise TgcError(
            f"PyTorch could not decompose the program to core aten ops: {first_line} "
            "(import it with decompose=False to take its ops as they are)"
        ) from None


def load_program(path: Path) -> torch.export.ExportedProgram:
    """The ExportedProgram saved at `path` by torch.export.save; a bad file is one TgcError."""
    if path.is_dir():
        raise TgcError(f"cannot read '{path}': it is a directory")
    if not path.is_file():
        raise TgcError(f"cannot read '{path}': no such file")
    logged: list[logging.LogRecord] = []
    try:
        with _logs_kept("torch.export", logged):
            return torch.export.load(path)
    except Exception as e:  # torch raises many kinds for a corrupt or foreign file
        why = _first_line(e)
        causes = [r.exc_info[1] for r in logged if r.exc_info and r.exc_info[1] is not None]
        if "warnings above" in why and causes:  # the real reason is in what it logged
            why = _first_line(causes[-1])
        raise TgcError(
            f"cannot read '{path}' as a program saved by torch.export.save: {why}"
        ) from None


def _first_line(e: BaseException) -> str:
    return (str(e).strip().splitlines() or [type(e).__name__])[0]


class _Keep(logging.Handler):
    def __init__(self, records: list) -> None:
        super().__init__()
        self.records = records

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


@contextlib.contextmanager
def _logs_kept(name: str, records: list):
    """The records of logger `name` kept in `records` instead of printed, for a while:
    torch.export.load logs the traceback of its first attempt at a corrupt file before it tries
    the older format and raises, and the error is reported as one line."""
    logger = logging.getLogger(name)
    handlers, propagate = logger.handlers, logger.propagate
    logger.handlers, logger.propagate = [_Keep(records)], False
    try:
        yield
    finally:
        logger.handlers, logger.propagate = handlers, propagate


def parameter_arrays(ep: torch.export.ExportedProgram) -> list:
    """The values of the parameters and buffers, in the order of the function's arguments."""
    out = []
    for spec in ep.graph_signature.input_specs:
        if spec.kind in (InputKind.PARAMETER, InputKind.BUFFER):
            out.append(to_numpy(_state_tensor(ep, spec)))
    return out


def _state_tensor(ep: torch.export.ExportedProgram, spec) -> torch.Tensor:
    if spec.target in ep.state_dict:
        return ep.state_dict[spec.target]
    return ep.constants[spec.target]  # non-persistent buffers and lifted constants


def import_program(
    ep: torch.export.ExportedProgram,
    *,
    params_as_args: bool,
    name: str,
    decompose: bool,
    weights: WeightFiles,
    mutations: bool = False,
) -> ModuleOp:
    if not isinstance(ep, torch.export.ExportedProgram):
        raise TgcError(f"expected a torch.export.ExportedProgram, got {type(ep).__name__}")
    if decompose:
        ep = to_core_aten(ep)
    return _Importer(ep, params_as_args, weights, mutations).run(name)


def node_location(node: torch.fx.Node) -> Location:
    """The line of the model's source that made `node`: the last frame of its stack trace that
    is not PyTorch's own code (an nn.Linear call, not torch/nn/modules/linear.py)."""
    frames = _FRAME.findall(node.meta.get("stack_trace") or "")
    if not frames:
        return UNKNOWN_LOC
    outside = [f for f in frames if not f[0].startswith(_TORCH_DIR)]
    file, line = (outside or frames)[-1]
    return Location(file, int(line), 1)


def expected_types(node: torch.fx.Node) -> list[TensorType | None]:
    """The types PyTorch says the node's results have (None for a non-tensor result)."""
    val = node.meta.get("val")
    vals = val if isinstance(val, (tuple, list)) else [val]
    loc = node_location(node)
    out = []
    for i, v in enumerate(vals):
        if not isinstance(v, torch.Tensor):
            if isinstance(v, (torch.SymInt, torch.SymFloat, torch.SymBool)):
                raise _symbolic_error(node, loc)
            out.append(None)
            continue
        if any(not isinstance(d, int) for d in v.shape):
            raise _symbolic_error(node, loc)
        what = describe(node) + (f" result {i}" if len(vals) > 1 else "")
        out.append(TensorType.get(tuple(v.shape), element_type(v.dtype, what, loc)))
    return out


def _symbolic_error(node: torch.fx.Node, loc: Location) -> TgcError:
    return TgcError(
        f"{describe(node)} has a symbolic shape: tgc compiles static shapes only "
        "(export without dynamic_shapes)",
        loc,
    )


def _live_nodes(graph: torch.fx.Graph) -> set[torch.fx.Node]:
    """The nodes the outputs depend on (dead ones are not imported)."""
    output = next(n for n in reversed(graph.nodes) if n.op == "output")
    live, stack = set(), [output]
    while stack:
        node = stack.pop()
        if node not in live:
            live.add(node)
            stack.extend(node.all_input_nodes)
    return live


class _Importer:
    def __init__(
        self,
        ep: torch.export.ExportedProgram,
        params_as_args: bool,
        weights: WeightFiles,
        mutations: bool = False,
    ) -> None:
        self.ep = ep
        self.params_as_args = params_as_args
        self.mutations = mutations  # in-place updates of inputs and buffers become results
        self.weights = weights  # large constants: inline or in .npy files
        self.graph = ep.graph_module.graph
        self.specs = {spec.arg.name: spec for spec in ep.graph_signature.input_specs}
        self.env: dict[torch.fx.Node, Any] = {}
        self.constants: dict[tuple, Value] = {}  # (Static node, element type) -> constant
        self.fb: FunctionBuilder | None = None

    def run(self, name: str) -> ModuleOp:
        self._check_outputs()
        live = _live_nodes(self.graph)
        placeholders = [n for n in self.graph.nodes if n.op == "placeholder"]
        args, params = self._arguments(placeholders, live)
        self.fb = FunctionBuilder(name, [t for _, _, t in args], [n for _, n, _ in args])
        for (node, _, _), value in zip(args, self.fb.args):
            self.env[node] = value
        for index, (node, _, _) in enumerate(args):
            if node in params:
                self.fb.func.set_arg_attr(index, PARAM_ATTR)
        for node in self.graph.nodes:
            if node in live and node.op == "placeholder" and node not in self.env:
                self._placeholder_value(node)
            elif node in live and node.op == "call_function":
                self._node(node)
        output = next(n for n in reversed(self.graph.nodes) if n.op == "output")
        self.fb.loc = UNKNOWN_LOC
        results = [self._result(r) for r in _flat(output.args[0])]
        return self.fb.ret(*results)

    # -- signature ----------------------------------------------------------------------------

    def _check_outputs(self) -> None:
        # A functionalised update's new value is an output like the others: a caller that asked
        # for them (mutations=True) writes it back where the program wrote it.
        allowed = {OutputKind.USER_OUTPUT}
        if self.mutations:
            allowed |= {OutputKind.USER_INPUT_MUTATION, OutputKind.BUFFER_MUTATION}
        for spec in self.ep.graph_signature.output_specs:
            if spec.kind in allowed:
                continue
            what = spec.kind.name.lower().replace("_", " ")
            target = f" '{spec.target}'" if spec.target else ""
            raise TgcError(
                f"the program has a {what}{target}: tgc functions have no state to update "
                "(export a forward pass that mutates no buffer or input)"
            )

    def _arguments(self, placeholders, live):
        """(node, name, type) of each function argument, and the placeholders that are
        parameters; other placeholders (constants, unused non-tensor inputs) are left out."""
        args, params = [], set()
        for node in placeholders:
            spec = self.specs[node.name]
            kind = spec.kind
            if kind in (InputKind.PARAMETER, InputKind.BUFFER):
                if self.params_as_args:
                    args.append((node, spec.target, self._placeholder_type(node, spec.target)))
                    params.add(node)
            elif kind == InputKind.USER_INPUT:
                if isinstance(node.meta.get("val"), torch.Tensor):
                    args.append((node, node.name, self._placeholder_type(node, node.name)))
                elif node in live:
                    raise TgcError(
                        f"input '{node.name}' is not a tensor ({node.meta.get('val')!r}): tgc "
                        "functions take tensors only"
                    )
            elif kind != InputKind.CONSTANT_TENSOR:
                raise TgcError(
                    f"input '{node.name}' is a {kind.name.lower()}, which tgc has no use for"
                )
        return args, params

    def _placeholder_type(self, node: torch.fx.Node, name: str) -> TensorType:
        val = node.meta["val"]
        if any(not isinstance(d, int) for d in val.shape):
            shape = ", ".join(str(d) for d in val.shape)
            raise TgcError(
                f"input '{name}' has a symbolic shape [{shape}]: tgc compiles static shapes only "
                "(export without dynamic_shapes)"
            )
        return TensorType.get(tuple(val.shape), element_type(val.dtype, f"input '{name}'", None))

    def _placeholder_value(self, node: torch.fx.Node) -> None:
        """A placeholder that is no argument: a lifted constant (static, folds) or, with
        params_as_args=False, a parameter or buffer made a constant."""
        spec = self.specs[node.name]
        tensor = _state_tensor(self.ep, spec)
        if spec.kind == InputKind.CONSTANT_TENSOR:
            self.env[node] = Static(node, tensor)
            return
        t = self._placeholder_type(node, spec.target)
        self.fb.loc = node_location(node)
        self.env[node] = self._constant(to_numpy(tensor), t.element_type, spec.target)

    # -- nodes --------------------------------------------------------------------------------

    def _cx(self, node: torch.fx.Node, args: dict, outs: list) -> Cx:
        self.fb.loc = node_location(node)
        return Cx(node, self.fb, args, outs, self._materialize)

    def _node(self, node: torch.fx.Node) -> None:
        self.fb.loc = node_location(node)
        if node.target is operator.getitem:
            self.env[node] = self._getitem(node)
            return
        if not isinstance(node.target, torch._ops.OpOverload) or node.target.namespace != "aten":
            raise TgcError(
                f"{describe(node)}: not an aten op; tgc imports programs of aten ops only",
                self.fb.loc,
            )
        op = node.target._opname
        if op in ASSERT_OPS:
            return
        if op in NONDETERMINISTIC_OPS:
            raise TgcError(
                f"{describe(node)}: makes random or uninitialised values, which a tgc function "
                "cannot (dropout in training mode? export model.eval())",
                self.fb.loc,
            )
        args = _bind(node, self.env)
        if _is_static(args) or op in LIKE_OPS:
            self.env[node] = self._fold(node, args)
            return
        outs = expected_types(node)
        lower = LOWERINGS.get(op)
        if lower is None:
            raise TgcError(f"{describe(node)}: no lowering to tgc for aten.{op}", self.fb.loc)
        cx = self._cx(node, args, outs)
        try:
            produced = lower(cx)
        except TgcError as e:
            if e.message.startswith(describe(node)):
                raise
            raise TgcError(f"{describe(node)}: {e.message}", e.loc or self.fb.loc) from None
        self.env[node] = self._checked(node, produced, outs)

    def _getitem(self, node: torch.fx.Node):
        source, index = node.args
        produced = self.env[source]
        if isinstance(produced, Static):
            return Static(node, produced.tensor[index])
        item = produced[index]
        if item is None:
            raise TgcError(
                f"{describe(source)}: result {index} is read but tgc does not compute it",
                node_location(source),
            )
        if isinstance(item, Value) and item.name_hint is None:
            item.name_hint = node.name
        return item

    def _checked(self, node: torch.fx.Node, produced, outs: list):
        """The lowering's results, each of the type PyTorch says it has."""
        values = produced if isinstance(produced, tuple) else (produced,)
        for i, (value, want) in enumerate(zip(values, outs)):
            if value is None or want is None:
                continue
            if value.type != want:
                which = f" result {i}" if len(outs) > 1 else ""
                raise TgcError(
                    f"{describe(node)}{which}: imported as {value.type} but PyTorch computes "
                    f"{want} (an importer bug: please report it)",
                    self.fb.loc,
                )
        if isinstance(produced, Value) and produced.name_hint is None:
            produced.name_hint = node.name
        return produced

    def _fold(self, node: torch.fx.Node, args: dict) -> Static:
        """Run the node in PyTorch on the values known now (on the CPU)."""

        def real(x):
            if isinstance(x, Static):
                return x.tensor
            if isinstance(x, Value):  # a _like op's input: only its shape and dtype matter
                return torch.zeros(x.type.shape, dtype=_torch_dtype(x.type))
            if isinstance(x, torch.device):
                return torch.device("cpu")
            if isinstance(x, (list, tuple)):
                return type(x)(real(v) for v in x)
            return x

        kwargs = {k: real(v) for k, v in args.items()}
        if "device" in kwargs:
            kwargs["device"] = torch.device("cpu")
        try:
            value = node.target(**kwargs)
        except Exception as e:
            raise TgcError(
                f"{describe(node)}: cannot evaluate it while importing: {e}", self.fb.loc
            ) from None
        if isinstance(value, (tuple, list)):
            return Static(node, tuple(value))
        if not isinstance(value, torch.Tensor):
            raise TgcError(f"{describe(node)}: its value is not a tensor", self.fb.loc)
        return Static(node, value)

    def _materialize(self, static: Static, elem: str | None = None) -> Value:
        """A Static as a constant (of element type `elem` if given), made once per node and
        type."""
        key = (static.node, elem)
        found = self.constants.get(key)
        if found is not None:
            return found
        tensor = static.tensor
        if elem is None:
            elem = element_type(tensor.dtype, describe(static.node), node_location(static.node))
        else:
            tensor = tensor.to(TORCH_DTYPES[elem])
        value = self._constant(to_numpy(tensor), elem, static.node.name)
        self.constants[key] = value
        return value

    def _constant(self, array, elem: str, name: str) -> Value:
        """An `atomic.constant` named `name`, inline or in a weights file (importers/_weights)."""
        t = TensorType.get(tuple(array.shape), elem)
        value = self.fb.atomic.constant(
            value=self.weights.dense_attr(array, t, name), result_type=t
        )
        value.name_hint = name
        return value

    def _result(self, r) -> Value:
        if not isinstance(r, torch.fx.Node):
            raise TgcError(f"the program returns {r!r}, not a tensor: tgc functions return tensors")
        value = self.env.get(r)
        if isinstance(value, Static):
            return self._materialize(value)
        if not isinstance(value, Value):
            raise TgcError(f"the program returns {describe(r)}, which is not one tensor")
        return value


def _bind(node: torch.fx.Node, env: dict) -> dict[str, Any]:
    """The node's arguments by schema name (defaults filled in), fx nodes replaced by what
    they were imported as."""
    schema = node.target._schema
    positional = [a for a in schema.arguments if not a.kwarg_only]
    bound = {a.name: v for a, v in zip(positional, node.args)}
    bound.update(node.kwargs)
    for a in schema.arguments:
        if a.name not in bound and a.has_default_value():
            bound[a.name] = a.default_value
    return {k: _substitute(v, env) for k, v in bound.items()}


def _substitute(x, env: dict):
    if isinstance(x, torch.fx.Node):
        return env[x]
    if isinstance(x, (list, tuple)):
        return type(x)(_substitute(v, env) for v in x)
    return x


def _is_static(args: dict) -> bool:
    """Whether no argument is a value computed when the function runs."""

    def dynamic(x) -> bool:
        if isinstance(x, Value):
            return True
        if isinstance(x, (list, tuple)):
            return any(dynamic(v) for v in x)
        return False

    return not any(dynamic(v) for v in args.values())


def _torch_dtype(t: TensorType) -> torch.dtype:
    return TORCH_DTYPES[t.element_type]


def _flat(x) -> list:
    if isinstance(x, (list, tuple)):
        return [v for item in x for v in _flat(item)]
    return [x]
