"""A graph that writes rows into a tensor in place (a static KV cache's `index_copy_`), split
at those writes so that each is made on the tensor itself, not by copying a whole new value.

tgc's functions have no state: exported and functionalised, `cache.index_copy_(2, pos, k)`
becomes a new cache value (index_put, importers/torch/ops_shape.py) that the backend copies
into the cache after the call, the whole [B, H, S_max, D] buffer per layer per token, and the
attention that reads the updated cache reads that new value. Here Dynamo's graph is cut at
each run of row writes (torch.fx's split_module, nodes kept in order): the pieces between are
compiled by tgc as any graph is (graph.CompiledGraph: per shape, with its fallback and its
tally line), and the writes run as PyTorch's own `index_copy_` / `index_put_` on the caller's
tensor, writing only the rows given. The piece after a write reads the tensor, now updated,
as an input (on the CPU a view of the same memory: nothing is copied). What is copied is
counted in the tally (`Coverage.bytes_written`): the rows a write writes, and every update a
compiled piece writes back whole (a counter's `add_`, any other in-place update).

Dynamo hands the backend graphs whose in-place writes read and return the written tensor
through its placeholder (the write's own result is unused), so later nodes depend on the
write only through the tensor's memory: the pieces run in the graph's order, which keeps it.
"""

from __future__ import annotations

import math

import torch
from torch.fx.passes.split_module import split_module

from tgc.dynamo import tally
from tgc.dynamo.graph import CompiledGraph, shape_key
from tgc.dynamo.options import BackendOptions

# In-place row writes that the split leaves to PyTorch (method and function forms).
ROW_WRITES = frozenset({"index_copy_", "index_put_"})


def is_row_write(node: torch.fx.Node) -> bool:
    return _op_name(node) in ROW_WRITES


# Ops that give a view of their first argument: a write into the view writes the argument.
VIEWS = frozenset(
    "view reshape transpose permute select narrow slice unsqueeze squeeze expand as_strided "
    "getitem __getitem__ t unflatten flatten".split()
)


def _op_name(node: torch.fx.Node) -> str:
    if node.op == "call_method":
        return node.target
    if node.op == "call_function":
        return getattr(node.target, "__name__", "").split(".")[0]
    return ""


def written_placeholders(gm: torch.fx.GraphModule) -> set[str]:
    """The names of the placeholders `gm` writes in place (an op whose name ends in `_`, or
    item assignment), directly or through views of them."""
    written = set()
    for node in gm.graph.nodes:
        name = _op_name(node)
        if not (name == "setitem" or name.endswith("_") and not name.startswith("_")):
            continue
        target = node.args[0] if node.args else None
        while isinstance(target, torch.fx.Node) and _op_name(target) in VIEWS:
            target = target.args[0]
        if isinstance(target, torch.fx.Node) and target.op == "placeholder":
            written.add(target.name)
    return written


def _sdpa_mask(node: torch.fx.Node) -> torch.fx.Node | None:
    """The attn_mask node of a scaled_dot_product_attention call, where it is one."""
    if (
        node.op != "call_function"
        or node.target is not torch.nn.functional.scaled_dot_product_attention
    ):
        return None
    mask = node.kwargs.get("attn_mask", node.args[3] if len(node.args) > 3 else None)
    return mask if isinstance(mask, torch.fx.Node) else None


def _dtype(node) -> torch.dtype | None:
    value = node.meta.get("example_value") if isinstance(node, torch.fx.Node) else None
    return value.dtype if isinstance(value, torch.Tensor) else None


def share_additive_masks(gm: torch.fx.GraphModule) -> int:
    """A boolean attention mask that several attention calls read (one a layer: Hugging Face's
    decoders make the mask once) made additive once, right after it is made, in the queries'
    type (0 where True, -inf where False: what each call would make of it), and each call
    given that instead. Split at the cache writes, each layer's piece made the additive mask
    again from the booleans, a kernel a layer. The number of masks so shared."""
    readers: dict[tuple, list[torch.fx.Node]] = {}
    for node in gm.graph.nodes:
        mask = _sdpa_mask(node)
        dtype = _dtype(node.args[0]) if node.args else None
        if mask is not None and _dtype(mask) == torch.bool and dtype is not None:
            readers.setdefault((mask, dtype), []).append(node)
    shared = 0
    last_input = [n for n in gm.graph.nodes if n.op == "placeholder"][-1:]
    for (mask, dtype), calls in readers.items():
        if len(calls) < 2:
            continue
        # after the mask is made; a mask the graph is given, after the graph's inputs
        with gm.graph.inserting_after(last_input[0] if mask.op == "placeholder" else mask):
            where = gm.graph.call_function(torch.where, (mask, 0.0, -math.inf))
        with gm.graph.inserting_after(where):
            additive = gm.graph.call_method("to", (where, dtype))
        for call in calls:
            if "attn_mask" in call.kwargs:
                call.kwargs = {**call.kwargs, "attn_mask": additive}
            else:
                call.args = (*call.args[:3], additive, *call.args[4:])
        shared += 1
    if shared:
        gm.recompile()
    return shared


def has_row_writes(gm: torch.fx.GraphModule) -> bool:
    return any(is_row_write(n) for n in gm.graph.nodes)


class RowWrites:
    """A piece made of row writes only, run by PyTorch on the caller's tensors; the bytes each
    write writes are counted in the tally. The first call at a set of shapes runs node by node
    (torch.fx's Interpreter), counting the bytes; later calls run the GraphModule's own Python
    code and count the same bytes again: the interpreter cost 0.37 ms a piece per token, 16
    pieces a decode step of a 1.1 B Llama (cProfile on an H200, bench/generate.py --profile)."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        self.module = module
        self.bytes: dict[tuple, int] = {}  # bytes a call writes, by shape_key

    def __call__(self, *args):
        key = shape_key(args)
        nbytes = self.bytes.get(key)
        if nbytes is not None:
            tally.wrote(nbytes)
            return self.module(*args)
        counter = _CountingWrites(self.module)
        out = counter.run(*args)
        self.bytes[key] = counter.bytes
        tally.wrote(counter.bytes)
        return out


class _CountingWrites(torch.fx.Interpreter):
    """Runs a row-write piece node by node, adding up the bytes its writes write."""

    def __init__(self, module: torch.fx.GraphModule) -> None:
        super().__init__(module)
        self.bytes = 0

    def call_method(self, target, args, kwargs):
        self.bytes += _row_bytes(target, args, kwargs)
        return super().call_method(target, args, kwargs)

    def call_function(self, target, args, kwargs):
        if getattr(target, "__name__", "").split(".")[0] in ROW_WRITES:
            self.bytes += _row_bytes(target.__name__.split(".")[0], args, kwargs)
        return super().call_function(target, args, kwargs)


def _row_bytes(name: str, args, kwargs) -> int:
    """The bytes an index_copy_(self, dim, index, source) or index_put_(self, indices,
    values) writes: the elements of the rows given, not the tensor's."""
    target = args[0]
    if name == "index_copy_":
        source = args[3] if len(args) > 3 else kwargs["source"]
        return source.numel() * target.element_size()
    indices = args[1] if len(args) > 1 else kwargs["indices"]
    given = [(d, i) for d, i in enumerate(indices) if i is not None]
    if not given:
        return target.numel() * target.element_size()
    rows = math.prod(torch.broadcast_shapes(*(i.shape for _, i in given)))
    indexed = math.prod(target.shape[d] for d, _ in given)
    return rows * (target.numel() // max(indexed, 1)) * target.element_size()


class SplitGraph:
    """Dynamo's graph as pieces compiled by tgc and the row writes between them (module doc):
    called as the graph is, it runs the pieces in order."""

    def __init__(self, gm: torch.fx.GraphModule, options: BackendOptions, name: str) -> None:
        share_additive_masks(gm)
        part: dict[torch.fx.Node, int] = {}
        current, writing = 0, False
        for node in gm.graph.nodes:
            if node.op in ("placeholder", "output"):
                continue
            write = is_row_write(node)
            if write != writing:
                current += 1
                writing = write
            part[node] = current
        writes = {part[n] for n in part if is_row_write(n)}
        self.split = split_module(gm, gm, lambda n: part[n], keep_original_order=True)
        marks = {
            n.name: n.meta["tensor_dict"]
            for n in gm.graph.nodes
            if n.op == "placeholder" and "tensor_dict" in n.meta
        }
        # Dynamo marks a StaticCache's tensors static as it marks the weights (transformers
        # calls mark_static_address on them), and split_module copies the marks into the
        # pieces; but a tensor the graph writes is state, not a parameter. Taken for one, the
        # cache changed on every call, so the piece reading it ran all of its plan's once steps
        # again on every call, the weights' packing among them (bench/results/decode_step-*).
        written = written_placeholders(gm)
        pieces = [n for n in self.split.graph.nodes if n.op == "call_module"]
        for count, node in enumerate(pieces, start=1):
            sub = getattr(self.split, node.target)
            index = int(node.target.rsplit("_", 1)[1])
            if index in writes:
                piece = RowWrites(sub)
            else:
                for p in sub.graph.nodes:  # the parameters' static marks, for static_inputs
                    if p.op != "placeholder":
                        continue
                    if p.name in written:
                        p.meta.pop("tensor_dict", None)
                    elif p.name in marks:
                        p.meta["tensor_dict"] = marks[p.name]
                piece = CompiledGraph(sub, options, f"{name} piece {count} of {len(pieces)}")
            delattr(self.split, node.target)
            setattr(self.split, node.target, piece)
        self.pieces = pieces

    def __call__(self, *args):
        return self.split(*args)
