"""A graph captured by Dynamo, at the shapes of one call, as a tgc module.

`torch.export` traces the GraphModule again at the call's arguments (non-strict: the graph is
already plain torch code), PyTorch's decompositions bring it to the core aten opset and
functionalise it (an in-place update of an input becomes an output holding the new value), and
the torch importer makes the module (importers/torch). What the caller needs to run it and to
write the updates back is kept beside it (`Lowered`).

Why torch.export rather than AOTAutograd's `aot_module_simplified`: the importer, its op table
and its tests are for ExportedPrograms, and export's graph signature says which output updates
which input; AOTAutograd would hand over a graph whose mutations its own runtime wrappers write
back, and trace a backward graph whenever a parameter requires grad.
"""

from __future__ import annotations

import time
import warnings
from collections import OrderedDict
from dataclasses import dataclass

import numpy as np
import torch
from torch.export import ExportedProgram
from torch.export.graph_signature import InputKind, OutputKind, TensorArgument
from torch.utils import _pytree as pytree

from tgc.builtin import DONATED_ATTR, PARAM_ATTR, ModuleOp
from tgc.fixed import VARIES, fixed_state
from tgc.ir import BlockArgument
from tgc.opdef import VIEW, lookup
from tgc.planner.kernel import KERNELS
from tgc.dynamo import tally
from tgc.diagnostics import TgcError
from tgc.importers.torch import core_aten_program, import_exported_program, parameter_values


@dataclass
class Lowered:
    """The module of one graph at one call's shapes, and how its function's arguments and
    results relate to the graph's: the function takes `own` (the graph module's own parameters
    and buffers, as numpy arrays) then, for each entry of `inputs`, that graph argument; result
    i is written back to graph argument `writes[i]` where that is not None, and the others are
    the graph's outputs, in the structure `out_spec` rebuilds."""

    module: ModuleOp
    own: list[np.ndarray]
    inputs: list[int]
    writes: list[int | None]
    out_spec: pytree.TreeSpec
    seconds: float = 0.0  # spent exporting and importing the graph

    @property
    def func(self):
        return self.module.funcs[0]

    @property
    def updated(self) -> list[int]:
        """The graph arguments the function updates in place, in order."""
        return sorted({w for w in self.writes if w is not None})

    def arguments(self, own: list, args: list, params, param_slots: set[int], others) -> list:
        """The function's arguments for graph arguments `args`: `own` first (in the runner's
        representation), then each graph input, a parameter through `params` (a ParamViews,
        kept between calls), any other through `others` (`view(slot, tensor)` too)."""
        values = list(own)
        for slot, index in enumerate(self.inputs, start=len(values)):
            views = params if slot in param_slots else others
            values.append(views.view(slot, args[index]))
        return values

    def hand_back(self, results: list, args: list, tensor_of):
        """The graph's outputs from the function's `results`: the results that update no
        argument made tensors by `tensor_of(i, value)` and put in the graph's output structure,
        then each update copied into its graph argument, unless the function wrote it there
        itself (its argument was donated: tgc/donation.py). Outputs first: one may be a view of an
        argument that an update then writes (a cache position that is the step's counter,
        reshaped), and its copy must hold the value the graph read."""
        outputs = [
            tensor_of(i, value)
            for i, (value, write) in enumerate(zip(results, self.writes))
            if write is None
        ]
        for i, (value, write) in enumerate(zip(results, self.writes)):
            if write is None:
                continue
            new = tensor_of(i, value)
            if _same_memory(new, args[write]):  # updated in place (a donated cache's rows)
                continue
            with torch.no_grad():  # the graph's own update, made by tgc: not for autograd
                args[write].copy_(new)
            tally.wrote(args[write].numel() * args[write].element_size())
        return pytree.tree_unflatten(outputs, self.out_spec)


def _same_memory(a: torch.Tensor, b: torch.Tensor) -> bool:
    return (
        a.device == b.device
        and a.data_ptr() == b.data_ptr()
        and a.shape == b.shape
        and a.stride() == b.stride()
        and a.dtype == b.dtype
    )


def kept_results(func) -> set[int]:
    """The results of `func` (planned or about to be) that are an argument, a view of one, or
    a value the plan keeps between calls (computed from parameters and constants alone):
    handed to the user as copies, so that writing to one changes neither an input nor the next
    call's result, and an input updated later (a cache position that is a view of the counter
    the graph advances) does not change it."""
    memo: dict = {}
    kept = set()
    for i, value in enumerate(func.body.last.operands):
        if isinstance(_viewed(value), BlockArgument) or fixed_state(value, memo) != VARIES:
            kept.add(i)
    return kept


def _viewed(value):
    """The value whose memory `value` may share: through view ops (a reshape, a transpose, a
    slice), and through planned kernels of such ops, which may return views (numpy's do, and
    the GPU's split and reshape views); else `value` itself."""
    while (op := value.defining_op) is not None and op.operands:
        name = op.name
        if name == "kernel.call":
            kernel = KERNELS.get(op.attr("callee"))
            name = kernel.op if kernel is not None else None
        op_class = lookup(name) if name else None
        if op_class is None or VIEW not in op_class.traits:
            return value
        value = op.operands[0]
    return value


def static_inputs(gm: torch.fx.GraphModule, args: list) -> set[int]:
    """The graph arguments that are a model's parameters or buffers: Dynamo marks them static
    (as AOTAutograd reads it, `_dynamo_static_input_type`); an nn.Parameter is one anyway."""
    found = set()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for i, (node, arg) in enumerate(zip(placeholders, args)):
        marked = (node.meta.get("tensor_dict") or {}).get("_dynamo_static_input_type")
        if marked or isinstance(arg, torch.nn.Parameter):
            found.add(i)
    return found


# Core-aten programs by the structure of the graph they were exported from and its arguments'
# shapes (`_structure`): a model's repeated blocks are graphs alike but for their parameters
# where Dynamo breaks the graph between them. Exporting and decomposing took 0.85 s a graph,
# 29 of the 32 s tgc spent compiling a 16-layer Llama's prefill and decode step on a 2-core
# CPU when each was cut into a graph per layer; with this, once per kind of graph.
_EXPORTED: OrderedDict[tuple, ExportedProgram] = OrderedDict()
MAX_EXPORTED = 64


def exported(gm: torch.fx.GraphModule, args: list) -> ExportedProgram:
    """`gm` exported at `args` and brought to core aten (module doc), or the program of a graph
    of the same structure at the same argument shapes exported before. A graph reading tensors
    of its own (get_attr: constants, a module's buffers) or calling submodules is exported for
    itself: two such graphs alike in structure may hold other values."""
    key = _structure(gm, args)
    found = _EXPORTED.get(key) if key is not None else None
    if found is not None:
        _EXPORTED.move_to_end(key)
        return found
    with warnings.catch_warnings():
        # PyTorch's own deprecation inside run_decompositions (its pytree's LeafSpec), printed
        # on every compile: noise for the user, who can do nothing about it
        warnings.filterwarnings("ignore", message=".*LeafSpec", category=FutureWarning)
        ep = core_aten_program(torch.export.export(gm, tuple(args), strict=False))
    if key is not None:
        _EXPORTED[key] = ep
        if len(_EXPORTED) > MAX_EXPORTED:
            _EXPORTED.popitem(last=False)
    return ep


def _structure(gm: torch.fx.GraphModule, args: list) -> tuple | None:
    """What an export of `gm` at `args` depends on, node names aside: each node's kind, target
    and arguments (other nodes by position), and each argument's shape, strides, dtype and
    device (or value). None for a graph that reads tensors of its own or calls submodules."""
    index: dict[torch.fx.Node, int] = {}
    nodes = []

    def by_position(value):
        return ("node", index[value]) if isinstance(value, torch.fx.Node) else value

    for node in gm.graph.nodes:
        if node.op in ("get_attr", "call_module"):
            return None
        index[node] = len(index)
        # the target itself, not its name: two functions of one name may differ (closures)
        target = "" if node.op == "placeholder" else node.target
        try:
            hash(target)
        except TypeError:
            return None
        arguments = pytree.tree_map(by_position, (node.args, node.kwargs))
        nodes.append((node.op, target, repr(arguments)))
    values = tuple(
        (tuple(a.shape), a.stride(), a.dtype, a.device, a.requires_grad)
        if isinstance(a, torch.Tensor)
        else (type(a), a)
        for a in args
    )
    return (tuple(nodes), values)


def lower_graph(gm: torch.fx.GraphModule, args: list, statics: set[int]) -> Lowered:
    """`gm` exported at `args` and imported; the graph arguments in `statics` that the graph
    does not update become `{tgc.param}` arguments, and those it updates `{tgc.donated}` ones
    (tgc/donation.py: a KV cache's rows are written into the cache itself). Raises TgcError
    (the importer's, naming the node) or PyTorch's own exception where export fails."""
    start = time.perf_counter()
    ep = exported(gm, args)
    signature = ep.graph_signature
    position: dict[str, int] = {}  # user input name -> graph argument
    inputs: list[int] = []
    for spec in signature.input_specs:
        if spec.kind != InputKind.USER_INPUT:
            continue
        position[spec.arg.name] = len(position)
        if isinstance(spec.arg, TensorArgument):
            inputs.append(position[spec.arg.name])
    writes: list[int | None] = []
    for spec in signature.output_specs:
        if spec.kind == OutputKind.BUFFER_MUTATION:
            raise TgcError(
                f"the graph updates its own buffer '{spec.target}', which the tgc backend does "
                "not write back"
            )
        mutated = spec.kind == OutputKind.USER_INPUT_MUTATION
        writes.append(position[spec.target] if mutated else None)
    module = import_exported_program(ep, decompose=False, mutations=True)
    own = parameter_values(ep)
    func = module.funcs[0]
    if len(func.body.args) != len(own) + len(inputs):
        raise TgcError(
            f"the imported function takes {len(func.body.args)} arguments where the graph "
            f"gives {len(own)} + {len(inputs)} (a tgc bug: please report it)"
        )
    updated = {i for i in writes if i is not None}
    for slot, index in enumerate(inputs, start=len(own)):
        if index in updated:  # its new value is a result, written back: the old one is free
            func.set_arg_attr(slot, DONATED_ATTR)
        elif index in statics:
            func.set_arg_attr(slot, PARAM_ATTR)
    seconds = time.perf_counter() - start
    return Lowered(module, own, inputs, writes, ep.call_spec.out_spec, seconds)
