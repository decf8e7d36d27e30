"""The CUDA backend's kernels as the planner sees them: options at each op, and the pure pieces
the executor needs. Nothing here needs a GPU or PyCUDA (planner/backends/cuda.py adds the device
where there is one; tests register this part with a stand-in device).

Kernels:

- the generated templates (`Template`s, the code generator's skeletons): "cuda.elementwise",
  "cuda.row_reduction", "cuda.matmul" (with its epilogue), "cuda.attention", "cuda.conv" (an
  implicit-GEMM convolution with its epilogue: codegen/conv.py). An option of one
  is a *region*: one op a template runs alone, or a group of ops
  that `fuse` would form into one kernel (with and without matmul epilogues). Regions are
  offered through the fused-kernel hook (`planner.options.FUSED_OPTIONS`, `cuda_options`);
  select-kernels writes each as a `kernel.call {callee = "cuda.<template>"}` whose region holds
  the ops (and the splat constants, iotas and views of inputs it recomputes by value), which
  the executor turns into a `kernel.fused` (`fused_from_call`), generates and compiles.
- "cuda.cublas.gemm": an op kernel for the `atomic.matmul`s cuBLAS can run (each operand
  batched like the result or not at all; f32, f64, f16, bf16), matched like any op kernel;
  "cuda.cublas.gemm_padded" the same product for a result whose rows are not 16-byte
  multiples (a language model's head over a vocabulary such as GPT-2's 50257): cuBLAS's fast
  kernels need N itself aligned, so it runs as a GEMM over the aligned columns and one over the
  few left, both into rows padded to 16 bytes, then copied compact (`padded_gemm_parts`);
  "cuda.cublas.gemm_split" the same two GEMMs written straight into the compact result (no
  copy, but rows that are not 16-byte aligned for cuBLAS to write): measurements decide.
- "cuda.cublaslt.linear", "cuda.cublaslt.linear_gelu", "cuda.cublaslt.linear_residual": graph
  kernels for a linear layer (`hl.linear` as written or lowered: matmul, then the bias added)
  that cuBLASLt runs as one GEMM with the bias, the tanh GELU (f16/bf16 only) or a residual
  (read as the GEMM's C) in its epilogue, as PyTorch's addmm does (runtime/cublaslt.py).
- "cuda.split_view": an op kernel for the `atomic.split`s whose pieces are contiguous ranges of
  the operand (every dim before the split axis is 1, each piece starting 16-byte aligned): each
  piece is a view of the operand's buffer at its byte offset, nothing launched or copied
  (`Kernel.view`: the roofline prices it as the host's work of making the views).
  "cuda.reshape_view": `atomic.reshape` as a view of its operand's buffer (every device value is
  contiguous), so that a piece reshaped (a stacked matmul's `[1, t, n]` piece read as `[t, n]`)
  reaches a GEMM without a copy kernel.
- "cuda.write_rows": `atomic.write_rows` (a KV cache's update) as codegen/write_rows.py's kernel,
  writing the rows into the operand's own memory where tgc/donation.py says it is free to take,
  else into a copy of it (what the profiler times, having no program around the call: so its
  measured cost is the copy's, an overestimate of the in-place write that decides nothing, the op
  having no other kernel on the device).

Why 16-byte aligned pieces: every allocation is (256 bytes), and the generated row reductions
load 16-byte vectors without checking the address (the elementwise, matmul and attention
templates check it and take plain loads; cuBLASLt refuses an unaligned operand).

A region is offered only where its code generates (the generator is run once per distinct
region, at planning time) and where it is self-contained: the root has one result, and the
other ops' values are read by no op outside it, or only by ops after the root, in which case
the region writes them too (a kernel with several results, as fuse makes them). Each distinct region is one
`Kernel` (not registered: the hook makes it): the template's name, the region as its reference
text (so the roofline counts its flops), a one-value parameter `region` (its structural
digest, so a cost table tells regions of one template apart) and the template parameters
tuning searches (`TUNABLE`: block sizes, tiles, streaming hints; the generator's own choice
for the region first), refused where the region's code does not generate with them. A call
carries the chosen ones as `param.<name>`, and the executor generates the kernel with them.

Error bounds (`max_rel_error`, as planner/kernel.py defines them, for f32/f64):
elementwise 2e-6 (CUDA's expf, tanhf, erff, powf are within 2-4 ulp of correctly rounded and
nvcc contracts a*b+c into one rounding: a few f32 ulp over a chain); row reductions, matmul,
attention and cuBLAS 1e-5 (another summation order: a tree per row, tiles, an online softmax).
"""

from __future__ import annotations

import hashlib
import math
from collections import OrderedDict
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace
from types import SimpleNamespace

import numpy as np

from tgc.attributes import attribute_key
from tgc.builtin import FuncOp, ReturnOp
from tgc.codegen.cuda_ops import REDUCE_CODE, has_code
from tgc.codegen.emitter import VIEW_INDEX_MAPS
from tgc.codegen.kernels import SYMBOL_FORMS, generate_kernel, module_names
from tgc.codegen.matmul_gemv import GEMV_MAX_ROWS
from tgc.codegen.names import c_identifier
from tgc.cuda_target import CONV_OPS, GEMM_TYPES, attention_supported, conv_misfit, cublas_can_run
from tgc.diagnostics import TgcError
from tgc.dialects.atomic import WriteRowsOp
from tgc.dialects.kernel import CallOp, FusedOp, YieldOp
from tgc.ir import Block, Operation, Region, Value
from tgc.opdef import VIEW
from tgc.passes import fuse
from tgc.passes.fuse import is_free, reads_whole
from tgc.planner import options as planner_options
from tgc.planner.backends import (
    BACKENDS,
    SPACES,
    TEMPLATES,
    Backend,
    Space,
    Template,
    register_backend,
    register_space,
    register_template,
)
from tgc.planner.backends.numpy import op_kernel_run
from tgc.planner.kernel import KERNELS, Kernel, Lowered, canonical_references, register_kernel
from tgc.planner.match import Match
from tgc.printer import print_op
from tgc.runtime.cublas import Gemm
from tgc.runtime.cublaslt import LtGemm
from tgc.types import TensorType

ELEMENTWISE_ERROR, SUMS_ERROR = 2e-6, 1e-5

TEMPLATE_OF_KIND: dict[str, Template] = {
    kind: Template(
        f"cuda.{kind}",
        "cuda",
        error,
        f"the generated {kind} kernel of a region",
        parts=kind == "elementwise",  # (codegen/elementwise.py `_generate_parts`)
    )
    for kind, error in (
        ("elementwise", ELEMENTWISE_ERROR),
        ("row_reduction", SUMS_ERROR),
        ("matmul", SUMS_ERROR),
        ("attention", SUMS_ERROR),
        ("conv", SUMS_ERROR),
    )
}
CUBLAS_GEMM = "cuda.cublas.gemm"
CUBLAS_GEMM_PADDED = "cuda.cublas.gemm_padded"
CUBLAS_GEMM_SPLIT = "cuda.cublas.gemm_split"
# The GEMMs run as `padded_gemm_parts`: into padded rows then copied compact, or straight into
# the compact result
SPLIT_GEMMS = (CUBLAS_GEMM_PADDED, CUBLAS_GEMM_SPLIT)
GEMM_ROW_ALIGNMENT = 16  # bytes: where cuBLAS's tensor-core kernels want each row to start
SPLIT_VIEW = "cuda.split_view"
RESHAPE_VIEW = "cuda.reshape_view"
WRITE_ROWS = "cuda.write_rows"
VIEW_ALIGNMENT = 16  # bytes: where a view may start (module doc)

# Ops the elementwise template computes besides those with C code and the views.
ELEMENTWISE_EXTRA = ("atomic.iota", "atomic.concat", "atomic.gather")


# -- which template runs one op ----------------------------------------------------------------


def _has_elements(op: Operation) -> bool:
    """The CUDA backend does not run tensors without elements (a kernel over an empty row would
    declare zero-sized arrays)."""
    values = [*op.operands, *op.results]
    return all(v.type.num_elements > 0 for v in values)


def single_op_kind(op: Operation) -> str | None:
    """The template that runs `op` alone, or None (no CUDA kernel runs it by itself)."""
    if op.regions or len(op.results) != 1 or not _has_elements(op):
        return None
    if op.name == "atomic.matmul":
        return "matmul"
    if op.name == "hl.attention":
        return "attention" if attention_supported(op) else None
    if op.name in CONV_OPS:
        return "conv" if conv_misfit(op) is None else None
    if op.name in REDUCE_CODE:  # reduced axes anywhere: the template reads rows through strides
        return "row_reduction"
    if has_code(op) or op.name in VIEW_INDEX_MAPS or op.name in ELEMENTWISE_EXTRA:
        return "elementwise"
    return None


# -- regions -------------------------------------------------------------------------------------


@dataclass(eq=False)
class KernelRegion:
    """Ops one generated kernel computes: `ops` covered (block order, the root last), `inputs`
    (its arguments, in order), `by_value`: ops outside it that it recomputes from its inputs
    (splat constants, iotas, small expressions of those, views of inputs), in block order, and
    `outputs`: the values it writes (the root's result last; before it, values of covered ops
    that ops after the root read)."""

    kind: str
    ops: list[Operation]
    inputs: list[Value]
    by_value: list[Operation]
    outputs: list[Value]

    @property
    def root(self) -> Operation:
        return self.ops[-1]


def _recomputable(op: Operation) -> bool:
    return is_free(op) or (op.has_trait(VIEW) and not op.regions)


def region_of(kind: str, ops: list[Operation], several: bool = False) -> KernelRegion | None:
    """The region of `ops` (block order), or None when it is not self-contained: the last op
    has several results, or a value of another op is read outside it. With `several`, such a
    value becomes one more output of the region where every op reading it outside comes after
    the last (fuse's kernel that writes a residual sum and the layernorm of it)."""
    root = ops[-1]
    members = set(ops)
    if len(root.results) != 1:
        return None
    extra: list[Value] = []
    order: dict[Operation, int] | None = None
    for op in ops[:-1]:
        for r in op.results:
            outside = [u for u in r.users() if u not in members]
            if not outside:
                continue
            if not several:
                return None
            order = order or {x: i for i, x in enumerate(root.block.ops)}
            if any(order.get(u, -1) <= order[root] for u in outside):
                return None
            extra.append(r)
    inputs: list[Value] = []
    by_value: list[Operation] = []
    taken: set[Operation] = set()

    def need(v: Value, whole: bool) -> None:
        d = v.defining_op
        if d is not None and d in members:
            return
        if not whole and d is not None and d.block is root.block and _recomputable(d):
            if d not in taken:
                taken.add(d)
                for x in d.operands:
                    need(x, False)
                by_value.append(d)
            return
        if v not in inputs:
            inputs.append(v)

    for op in ops:
        for v in op.operands:
            need(v, reads_whole(op, v))  # matmul operands; attention's unless strided views
    return KernelRegion(kind, list(ops), inputs, by_value, [*extra, root.results[0]])


def _attrs_key(op: Operation) -> tuple:
    return tuple(sorted((k, attribute_key(v)) for k, v in op.attributes.items() if "." not in k))


def region_key(region: KernelRegion) -> tuple:
    """Structural identity: template, input types and each op (name, attributes, operands as
    input or earlier op result, result types); value names and memory spaces left out."""
    index: dict[Value, tuple] = {v: ("in", i) for i, v in enumerate(region.inputs)}
    parts: list = [region.kind, tuple(v.type.with_encoding(None) for v in region.inputs)]
    for n, op in enumerate([*region.by_value, *region.ops]):
        operands = tuple(index[v] for v in op.operands)
        results = tuple(r.type.with_encoding(None) for r in op.results)
        parts.append((op.name, _attrs_key(op), operands, results))
        for j, r in enumerate(op.results):
            index[r] = (n, j)
    if len(region.outputs) > 1:  # (one output is the root's: the key it always had)
        parts.append(("out", tuple(index[v] for v in region.outputs)))
    return tuple(parts)


def region_function(region: KernelRegion) -> FuncOp:
    """The region as a function of its inputs returning its outputs (host types)."""
    func = FuncOp.build("region", [v.type.with_encoding(None) for v in region.inputs], [])
    env: dict[Value, Value] = dict(zip(region.inputs, func.body.args))
    for op in [*region.by_value, *region.ops]:
        clone = type(op)(
            [env[v] for v in op.operands],
            [r.type.with_encoding(None) for r in op.results],
            dict(op.attributes),
            loc=op.loc,
        )
        func.body.append(clone)
        env.update(zip(op.results, clone.results))
    outs = [env[v] for v in region.outputs]
    func.body.append(ReturnOp(outs, [], loc=region.root.loc))
    func.set_result_types([v.type for v in outs])
    return func


def fused_from_block(
    block: Block, result_types: list[TensorType], template: str, name: str, loc
) -> FusedOp:
    """A detached `kernel.fused` (operands: fresh values of the block's argument types) whose
    region is a copy of `block`, its terminator made a `kernel.yield`: what codegen reads."""
    body = Block([a.type for a in block.args])
    env: dict[Value, Value] = dict(zip(block.args, body.args))
    for op in block.ops:
        operands = [env[v] for v in op.operands]
        if op is block.last:
            body.append(YieldOp(operands, [], loc=op.loc))
            break
        clone = type(op)(operands, [r.type for r in op.results], dict(op.attributes), loc=op.loc)
        body.append(clone)
        env.update(zip(op.results, clone.results))
    placeholders = [Value(a.type) for a in block.args]
    attrs = {"name": name, "template": template}
    return FusedOp(placeholders, list(result_types), attrs, [Region([body])], loc)


def fused_from_call(call: CallOp) -> FusedOp:
    """The `kernel.fused` a generated-kernel call stands for (its template from the callee)."""
    template = TEMPLATES[call.attr("callee")]
    kind = template.name.split(".", 1)[1]
    name = c_identifier(f"{kind}_{call.results[0].name_hint or 'k'}")
    return fused_from_block(call.body, [r.type for r in call.results], kind, name, call.loc)


def call_params(op: Operation) -> dict:
    """The template parameters a generated-kernel call was planned with (its `param.<name>`
    attributes, as select-kernels writes them); none for a `kernel.fused`."""
    return {k[6:]: v for k, v in op.attributes.items() if k.startswith("param.")}


def kernel_symbol(fused: FusedOp) -> str:
    """A C symbol for the kernel of `fused`, compiled as its own translation unit."""
    return module_names().allocate(str(fused.attr("name")), forms=SYMBOL_FORMS)


# -- the kernels of regions, made once per distinct region -----------------------------------------

_REGION_KERNELS: dict[tuple, Kernel | None] = {}


def region_kernel(region: KernelRegion) -> Kernel | None:
    """The generated kernel of `region` (cached per structural key and target GPU), or None
    when the code generator cannot make it."""
    key = region_key(region)
    cached = (key, TARGET["arch"])
    if cached not in _REGION_KERNELS:
        _REGION_KERNELS[cached] = _make_region_kernel(region, key)
    return _REGION_KERNELS[cached]


# The template parameters tuning searches (`tgc-profile --tune`), per template: name -> values.
# A region's domain of each is the value its generator chose by default (first), then these; a
# name the generator did not use for the region (the f32 attention kernel has no
# rows_per_warp) is not offered. The values are those a template accepts for any region;
# whether one fits a given region is the kernel's parameter constraint (its code generates).
TUNABLE: dict[str, dict[str, tuple]] = {
    "elementwise": {"block_size": (128, 256, 512, 1024), "streaming": (False, True)},
    "row_reduction": {
        "block_size": (64, 128, 256, 512, 1024),
        "warp_per_row_max": (512, 1024, 2048),
        "merge_passes": (False, True),
        "keep_in_registers": (True, False),
        "streaming": (False, True),
    },
    "matmul": {
        "block_m": (32, 64, 128, 256),
        "block_n": (32, 64, 128, 256),
        "block_k": (8, 16, 32, 64),
        "thread_m": (2, 4, 8),
        "thread_n": (2, 4, 8),
        "tensor_cores": (False, True),
        "stages": (2, 3, 4),  # the tensor-core skeleton's cp.async pipeline
        "wgmma": (False, True),  # the Hopper skeleton (sm_90), default there where it fits
        "tma": (True, False),  # its copies: TMA boxes (default where they fit), cp.async
        "gemv": (True, False),  # the few-rows skeleton, default where it fits
        "gemv_mma": (False, True),  # its tensor-core variant
        "warps": (2, 4, 8),  # its warps a block, columns a warp and loads in flight a lane
        "columns": (1, 2, 4),
        "unroll": (1, 2, 4, 8),
        "split_k": (1, 2, 4, 8),  # its warps a column group
    },
    "conv": {"block_m": (64, 128), "block_n": (32, 64, 128), "block_k": (16, 32)},
    "attention": {
        "rows_per_warp": (1, 2),
        "q_in_registers": (False, True),
        "block_n": (32, 64, 128),
        "warps": (4, 8),
        "wgmma": (False, True),
        "overlap": (True, False),
        "pingpong": (False, True),
        "head_group": (1, 4, 16, 64),
        "swizzle": (False, True),
        "persistent": (False, True),  # the wgmma kernel's blocks take query tiles in turn
        "tma": (False, True),  # the warp-specialised wgmma kernel: a TMA producer warpgroup
        "stages": (2, 3, 4),  # its rings' depth
        "q_stages": (1, 2),  # its Q buffers
        "merge_tiles": (False, True),  # a query tile's last round with the next one's first
        "decode": (True, False),  # the split-KV skeleton (codegen/attention_decode.py)
        "splits": (1, 2, 4, 8, 16, 32, 64),
    },
}
REGION_PARAM = "region"  # the one-value parameter naming the region (module doc)
# The GPU region kernels are made for (`register`'s `arch`, nvcc's name: "sm_90"), or None
# (kernels for any sm_80 or later; tests' stand-in devices). A region kernel's `arch` is a
# one-value parameter, so the generator's defaults for that GPU are the ones measured first
# (on sm_90 the wgmma attention kernel) and its measurements say which GPU they were for.
TARGET: dict[str, str | None] = {"arch": None}


def template_params(params: dict) -> dict:
    """The template parameters among a region kernel's parameters (the region key left out)."""
    return {k: v for k, v in params.items() if k != REGION_PARAM}


def _make_region_kernel(region: KernelRegion, key: tuple) -> Kernel | None:
    template = TEMPLATE_OF_KIND[region.kind]
    func = region_function(region)
    fused = fused_from_block(
        func.body, list(func.function_type.results), region.kind, "plan_region", func.loc
    )
    arch = TARGET["arch"]
    try:
        chosen = generate_kernel(fused, {"arch": arch} if arch else None).params
    except (TgcError, KeyError):  # no C code for an op on this type, an unsupported shape...
        return None
    text = print_op(func)
    digest = hashlib.blake2b(repr(key).encode(), digest_size=8).hexdigest()
    params: dict[str, tuple] = {REGION_PARAM: (digest,)}
    if arch:
        params["arch"] = (arch,)
    for name, values in TUNABLE.get(fused.attr("template"), {}).items():
        if name in chosen:
            params[name] = (chosen[name], *(v for v in values if v != chosen[name]))
    kernel = Kernel(
        template.name,
        "cuda",
        reference=text,
        params=params,
        param_constraints=_generates(fused),
        max_rel_error=template.max_rel_error,
        doc=f"{template.doc}: {', '.join(op.name for op in region.ops)}",
    )
    try:
        canonical_references(kernel)  # parsed once here: the roofline counts its flops
    except TypeError:  # canonicalisation folds an argument away: no option, rather than a crash
        return None
    return kernel


def _generates(fused: FusedOp):
    """The parameter constraint of a region kernel: a point is refused when the template cannot
    make the region's code with it (a tile that does not divide, too many threads), with the
    generator's reason. Remembered per point: tuning asks again for points it has seen."""
    seen: dict[tuple, str | None] = {}

    def constraint(types, params: dict) -> str | None:
        point = tuple(sorted(template_params(params).items()))
        if point not in seen:
            try:
                generate_kernel(fused, dict(point))
                seen[point] = None
            except TgcError as e:
                seen[point] = e.message
            except (KeyError, ValueError) as e:
                seen[point] = f"{type(e).__name__}: {e}"
        return seen[point]

    return constraint


def _match(region: KernelRegion | None) -> Match | None:
    if region is None:
        return None
    kernel = region_kernel(region)
    if kernel is None:
        return None
    root = region.root
    return Match(
        kernel,
        root,
        tuple(region.ops),
        tuple(region.inputs),
        tuple(region.outputs),
        tuple(region.by_value),
    )


# -- the regions fuse would form ----------------------------------------------------------------------

_GROUPS: OrderedDict[Block, tuple[int, dict[Operation, list[tuple[str, list[Operation]]]]]] = (
    OrderedDict()
)
_GROUP_CACHE_SIZE = 8  # blocks: select-kernels asks for the options of one block at a time


def fusion_groups(block: Block) -> dict[Operation, list[tuple[str, list[Operation]]]]:
    """Root op -> (kind, ops) of each group of two or more ops `fuse` forms in `block`, with
    and without matmul epilogues (cached for the last few blocks, recomputed when one changed
    length)."""
    found = _GROUPS.get(block)
    if found is not None and found[0] == len(block):
        _GROUPS.move_to_end(block)
        return found[1]
    func = block.region.parent if block.region is not None else None
    groups: dict[Operation, list[tuple[str, list[Operation]]]] = {}
    if isinstance(func, FuncOp):
        for epilogue in (False, True):
            for kind, group in fuse.fusion_groups(func, matmul_epilogue=epilogue):
                for piece_kind, ops in [(kind, group), *_pieces(kind, group)]:
                    if len(ops) < 2:
                        continue
                    listed = groups.setdefault(ops[-1], [])
                    if all(set(other) != set(ops) for _, other in listed):
                        listed.append((piece_kind, ops))
        _add_prologues(block, groups)
        _add_halves_epilogues(block, groups)
    _GROUPS[block] = (len(block), groups)
    while len(_GROUPS) > _GROUP_CACHE_SIZE:
        _GROUPS.popitem(last=False)
    return groups


def _add_prologues(
    block: Block, groups: dict[Operation, list[tuple[str, list[Operation]]]]
) -> None:
    """Each few-rows matmul (at most GEMV_MAX_ROWS rows of A) whose A a group of elementwise ops
    and row reductions computes, read by nothing else, offered once more with that group as
    its prologue (codegen/matmul.py `a_prologue`): the norm before a decoding step's
    projection, or SiLU(gate) * up before its down projection, computed where the few-rows
    kernel reads A instead of in a kernel of their own. The product alone and with its
    epilogue stay offered; the planner measures each."""
    position = {op: i for i, op in enumerate(block.ops)}
    with_epilogue: dict[Operation, list[list[Operation]]] = {}
    for listed in groups.values():
        for kind, ops in listed:
            if kind == "matmul":
                for op in ops:
                    if op.name == "atomic.matmul":
                        with_epilogue.setdefault(op, []).append(ops)
    for mm in block.ops:
        if mm.name != "atomic.matmul" or mm.attr("transpose_a"):
            continue
        a = mm.operands[0]
        producer = a.defining_op
        if producer is None or producer.block is not block or len(list(a.users())) != 1:
            continue
        if math.prod(a.type.shape[:-1]) > GEMV_MAX_ROWS:
            continue
        prologues = [
            ops
            for kind, ops in groups.get(producer, [])
            if kind in ("elementwise", "row_reduction")
        ]
        for before in prologues:
            for after in [[mm], *with_epilogue.get(mm, [])]:
                ops = sorted({*before, *after}, key=position.__getitem__)
                listed = groups.setdefault(ops[-1], [])
                if all(set(other) != set(ops) for _, other in listed):
                    listed.append(("matmul", ops))


# Rows of A up to which a product whose halves one elementwise group reads is offered with it
# as its epilogue (`_add_halves_epilogues`): the few-rows skeleton's
HALVES_MAX_ROWS = GEMV_MAX_ROWS


def _add_halves_epilogues(
    block: Block, groups: dict[Operation, list[tuple[str, list[Operation]]]]
) -> None:
    """Each few-rows matmul whose product only an `atomic.split` along n into two equal halves
    reads, and whose halves only one elementwise group reads (SiLU(gate) * up of a packed
    gate+up projection), offered once more with that group as an epilogue reading the halves
    (codegen/matmul.py `_halves`): the product and with it its prologue (a norm before it, where
    offered), so that SiLU(gate) * up is computed where the products are summed instead of in a
    kernel of its own. The product alone and the group stay offered; the planner measures each."""
    position = {op: i for i, op in enumerate(block.ops)}
    for mm in block.ops:
        if mm.name != "atomic.matmul":
            continue
        if math.prod(mm.operands[0].type.shape[:-1]) > HALVES_MAX_ROWS:
            continue
        users = list(mm.results[0].users())
        split = users[0] if len(users) == 1 else None
        # (the code generator refuses a split other than in two equal halves along n)
        if split is None or split.name != "atomic.split" or len(split.results) != 2:
            continue
        readers = {u for r in split.results for u in r.users()}
        after = [
            ops
            for listed in groups.values()
            for kind, ops in listed
            if kind == "elementwise" and readers <= set(ops)
        ]
        before = [[mm]] + [ops for kind, ops in groups.get(mm, []) if kind == "matmul"]
        for epilogue in after:
            for head in before:
                ops = sorted({*head, split, *epilogue}, key=position.__getitem__)
                listed = groups.setdefault(ops[-1], [])
                if all(set(other) != set(ops) for _, other in listed):
                    listed.append(("matmul", ops))


def _pieces(kind: str, group: list[Operation]) -> list[tuple[str, list[Operation]]]:
    """A group whose inner values are read outside it, cut at those values: each piece ending
    at a value read outside, and the rest, which reads those values. The group is offered whole
    too, writing those values as more results, where they are read only after its root
    (`region_of(several=True)`); the pieces are the way to run it where they are read earlier,
    or where the whole kernel does not generate. In a GPT-2 block the bias add, residual add
    and layernorm become the adds (one elementwise kernel, writing the residual sum the
    block's last add reads again) and the layernorm. A piece without a reduction or matmul is
    offered as an elementwise kernel."""
    members = set(group)
    cuts = [op for op in group[:-1] if any(u not in members for r in op.results for u in r.users())]
    if not cuts:
        return []
    pieces: list[tuple[str, list[Operation]]] = []
    taken: set[Operation] = set()
    for end in [*cuts, group[-1]]:
        piece: set[Operation] = set()
        stack = [end]
        while stack:
            op = stack.pop()
            if op in piece or op in taken or op not in members:
                continue
            piece.add(op)
            stack += [v.defining_op for v in op.operands if v.defining_op is not None]
        taken |= piece
        ops = [op for op in group if op in piece]
        simple = all(single_op_kind(op) == "elementwise" for op in ops)
        pieces.append(("elementwise" if simple else kind, ops))
    return pieces


def cuda_options(op: Operation) -> list[Match]:
    """The fused-kernel hook: the generated kernels rooted at `op` (it alone, and each region
    `fuse` would form that ends at it)."""
    out: list[Match] = []
    kind = single_op_kind(op)
    if kind is not None:
        m = _match(region_of(kind, [op]))
        if m is not None:
            out.append(m)
    if op.block is None:
        return out
    groups = fusion_groups(op.block)
    for group_kind, ops in groups.get(op, []):
        if not all(_has_elements(x) for x in ops):
            continue
        m = _match(region_of(group_kind, ops, several=True))
        if m is not None:
            out.append(m)
    return out


# -- cuBLAS ----------------------------------------------------------------------------------------


def cublas_types(types) -> str | None:
    """The constraint of cuda.cublas.gemm: what `cublas_can_run` accepts, with elements."""
    operands, results = types
    if any(t.num_elements == 0 for t in [*operands, *results]):
        return "runs no tensor without elements"
    if results[0].element_type not in GEMM_TYPES:
        return f"takes {', '.join(GEMM_TYPES)} values, not {results[0].element_type}"
    proxy = SimpleNamespace(
        operands=[SimpleNamespace(type=t) for t in operands],
        results=[SimpleNamespace(type=t) for t in results],
    )
    if not cublas_can_run(proxy):
        return "needs each operand batched like the result or not at all"
    return None


def gemm_of(operand_types: list[TensorType], result_type: TensorType, attrs: dict) -> Gemm:
    """The cuBLAS call of a matmul: row-major C = op(A) @ op(B), batched (stride 0 for an
    unbatched operand). Buffers are left out: the caller passes pointers."""
    a, b = operand_types
    ta, tb = bool(attrs.get("transpose_a")), bool(attrs.get("transpose_b"))
    m, n = result_type.shape[-2], result_type.shape[-1]
    k = a.shape[-2] if ta else a.shape[-1]
    batch = math.prod(result_type.shape[:-2])
    stride_a = m * k if any(d != 1 for d in a.shape[:-2]) else 0
    stride_b = k * n if any(d != 1 for d in b.shape[:-2]) else 0
    return Gemm(result_type.element_type, m, n, k, batch, ta, tb, stride_a, stride_b)


def cublas_kernel(run=None) -> Kernel:
    return Kernel(
        CUBLAS_GEMM,
        "cuda",
        op="atomic.matmul",
        run=run,
        constraints=cublas_types,
        max_rel_error=SUMS_ERROR,
        doc="atomic.matmul by cuBLAS (strided batched GEMM)",
    )


def _row_aligned(elements: int, itemsize: int) -> bool:
    return elements * itemsize % GEMM_ROW_ALIGNMENT == 0


def padded_gemm_types(types) -> str | None:
    """The constraint of cuda.cublas.gemm_padded: a GEMM cuBLAS runs whose result rows (n
    elements) are not 16-byte multiples, while A's rows and a transposed B's rows are (so B is
    [..., n, k]: its first columns of the result are a prefix of its rows)."""
    problem = cublas_types(types)
    if problem is not None:
        return problem
    (a, b), (c,) = types
    item = c.dtype.itemsize
    if _row_aligned(c.shape[-1], item):
        return "pads only a result whose rows are not 16-byte multiples"
    if not (_row_aligned(a.shape[-1], item) and _row_aligned(b.shape[-1], item)):
        return "needs the operands' rows 16-byte multiples (it pads the result alone)"
    return None


def padded_ld(n: int, itemsize: int) -> int:
    """The leading dimension of a padded result: n rounded up to 16-byte rows."""
    step = GEMM_ROW_ALIGNMENT // math.gcd(GEMM_ROW_ALIGNMENT, itemsize)
    return -(-n // step) * step


def padded_gemm_parts(g: Gemm, itemsize: int) -> list[tuple[Gemm, int, int]]:
    """The cuBLAS calls of cuda.cublas.gemm_padded's `g` (B transposed, [n, k]), each as (gemm,
    elements into B, elements into a result row), writing rows of `padded_ld` elements: the
    result's columns up to the last 16-byte boundary (n aligned: cuBLAS's fast kernels), then
    the few left. Only an aligned n keeps cuBLAS fast: padding the result's rows alone was
    measured as slow as the plain call on GPT-2's head
    (bench/results/design-evidence-2026-11-28.md)."""
    assert g.transpose_b, "cuda.cublas.gemm_padded reads B transposed (its constraint)"
    step = GEMM_ROW_ALIGNMENT // math.gcd(GEMM_ROW_ALIGNMENT, itemsize)
    aligned = g.n - g.n % step
    parts = [(replace(g, n=aligned), 0, 0)] if aligned else []
    if aligned < g.n:
        parts.append((replace(g, n=g.n - aligned), aligned * g.k, aligned))
    return parts


def padded_row_strides(shape: tuple[int, ...], itemsize: int, ld: int) -> tuple[int, ...]:
    """The byte strides of an array of `shape` whose rows (the last dim) start `ld` elements
    apart, every other dim packed: gemm_padded's result handed out as it was written."""
    strides, step = [itemsize], ld * itemsize
    for d in reversed(shape[:-1]):
        strides.append(step)
        step *= d
    return tuple(reversed(strides))


def split_ld(name: str, g: Gemm, itemsize: int) -> int:
    """The leading dimension the parts of SPLIT_GEMMS kernel `name` write with."""
    return padded_ld(g.n, itemsize) if name == CUBLAS_GEMM_PADDED else g.n


def split_gemm_kernel(name: str, run=None) -> Kernel:
    into = "rows padded to 16 bytes, then copied compact"
    return Kernel(
        name,
        "cuda",
        op="atomic.matmul",
        run=run,
        constraints=padded_gemm_types,
        max_rel_error=SUMS_ERROR,
        doc="atomic.matmul by cuBLAS over the aligned columns and the rest, into "
        + (into if name == CUBLAS_GEMM_PADDED else "the compact result"),
    )


# -- splits into contiguous pieces: views of the operand ---------------------------------------------


def split_view_problem(
    shape: tuple[int, ...], itemsize: int, axis: int, sizes: tuple[int, ...]
) -> str | None:
    """Why the pieces of a split of a contiguous array of `shape` along `axis` (non-negative)
    into `sizes` are not views of it (one-line reasons), or None: they are contiguous ranges
    (the dims before `axis` are 1, or there is one piece) starting VIEW_ALIGNMENT-aligned."""
    if math.prod(shape) == 0 or 0 in sizes:
        return "runs no tensor without elements"
    outer = math.prod(shape[:axis])
    if outer != 1 and len(sizes) > 1:
        return (
            f"needs the dims before the split axis {axis} to be 1 (each piece one contiguous "
            f"range), not {'x'.join(map(str, shape[:axis]))}"
        )
    inner = math.prod(shape[axis + 1 :]) * itemsize
    for i, start in enumerate(np.cumsum([0, *sizes[:-1]])):
        if int(start) * inner % VIEW_ALIGNMENT:
            return (
                f"needs every piece to start {VIEW_ALIGNMENT}-byte aligned; piece {i} starts "
                f"at byte {int(start) * inner}"
            )
    return None


def split_view_pieces(
    shape: tuple[int, ...], itemsize: int, axis: int, sizes: tuple[int, ...]
) -> list[tuple[int, tuple[int, ...]]]:
    """(byte offset, shape) of each piece of that split (`axis` may be negative); a TgcError
    (no location: the caller's op has it) where the pieces are not views."""
    rank = len(shape)
    if not -rank <= axis < rank or sum(sizes) != shape[axis]:
        raise TgcError(f"{SPLIT_VIEW}: sizes {list(sizes)} do not split {shape} along {axis}")
    axis %= rank
    problem = split_view_problem(shape, itemsize, axis, sizes)
    if problem is not None:
        raise TgcError(f"{SPLIT_VIEW} {problem}")
    inner = math.prod(shape[axis + 1 :]) * itemsize
    out, start = [], 0
    for size in sizes:
        out.append((start * inner, (*shape[:axis], size, *shape[axis + 1 :])))
        start += size
    return out


def _split_axis(x: TensorType, pieces: list[TensorType]) -> int | None:
    """The axis a split of `x` into `pieces` is along, from the types alone (the constraint sees
    no attributes): the one dim where a piece differs from `x`; 0 where none does (one piece,
    the whole of `x`), None where pieces differ in several dims (no split)."""
    axes = {d for t in pieces for d in range(x.rank) if t.shape[d] != x.shape[d]}
    if len(axes) > 1 or x.rank == 0:
        return None
    return axes.pop() if axes else 0


def split_view_types(types) -> str | None:
    """The constraint of cuda.split_view (`split_view_problem` on the types)."""
    (x,), pieces = types
    axis = _split_axis(x, pieces)
    if axis is None:
        return "takes a split of a tensor of rank 1 or more"
    sizes = tuple(t.shape[axis] for t in pieces)
    return split_view_problem(x.shape, np.dtype(x.dtype).itemsize, axis, sizes)


def _split_view_host(inputs: list, attrs: dict, result_types: list[TensorType]) -> list:
    """cuda.split_view on a host array (the kernel's `run`, for checking it): each piece read at
    its byte offset of the array's buffer, as the device views it."""
    x = np.ascontiguousarray(inputs[0])
    raw = x.reshape(-1).view(np.uint8)
    pieces = split_view_pieces(x.shape, x.itemsize, attrs["axis"], tuple(attrs["sizes"]))
    return [
        raw[offset : offset + math.prod(shape) * x.itemsize].view(x.dtype).reshape(shape)
        for offset, shape in pieces
    ]


def split_view_kernel() -> Kernel:
    return Kernel(
        SPLIT_VIEW,
        "cuda",
        op="atomic.split",
        run=_split_view_host,
        constraints=split_view_types,
        doc="atomic.split into contiguous pieces: views of the operand's buffer, nothing copied",
        view=True,
    )


def _has_elements_types(types) -> str | None:
    operands, results = types
    if any(t.num_elements == 0 for t in [*operands, *results]):
        return "runs no tensor without elements"
    return None


def _reshape_view_host(inputs: list, attrs: dict, result_types: list[TensorType]) -> list:
    """cuda.reshape_view on a host array (its `run`): the buffer read in the result's shape."""
    return [np.ascontiguousarray(inputs[0]).reshape(result_types[0].shape)]


def reshape_view_kernel() -> Kernel:
    return Kernel(
        RESHAPE_VIEW,
        "cuda",
        op="atomic.reshape",
        run=_reshape_view_host,
        constraints=_has_elements_types,
        doc="atomic.reshape: a view of the operand's buffer in the new shape, nothing copied",
        view=True,
    )


VIEW_KERNELS = {SPLIT_VIEW: split_view_kernel, RESHAPE_VIEW: reshape_view_kernel}


def write_rows_kernel() -> Kernel:
    return Kernel(
        WRITE_ROWS,
        "cuda",
        op="atomic.write_rows",
        run=op_kernel_run(WriteRowsOp),  # on host arrays, for checking it: the op's meaning
        constraints=_has_elements_types,
        doc="atomic.write_rows: the rows written into x's own memory where it is free to take "
        "(tgc/donation.py), else into a copy of x (codegen/write_rows.py)",
    )


# -- cuBLASLt: GEMMs with the bias, GELU and residual of a linear layer in their epilogue -------------

# Reference graphs (their types only make them parse). Each is matched as written and lowered,
# so it applies both to a program that keeps hl.linear and to one lowered for planning.
_X, _W, _V, _Y = "tensor<4x8xf32>", "tensor<8x6xf32>", "tensor<6xf32>", "tensor<4x6xf32>"
_W_T = "tensor<6x8xf32>"  # w stored transposed, n x k


def _lt_reference(bias: bool, then: str = "", transposed: bool = False) -> str:
    """x @ w (+ b where `bias`), then `then`: "gelu" (tanh) or "residual" (r + ...). Where
    `transposed`, w is stored n x k, as PyTorch's nn.Linear keeps its weight and torch.export
    writes its product (`atomic.matmul {transpose_b = true}`, the bias added after it); else
    the product with a bias is hl.linear."""
    w = _W_T if transposed else _W
    args = ["%x: " + _X, "%w: " + w] + (["%b: " + _V] if bias else [])
    args += ["%r: " + _Y] if then == "residual" else []
    if transposed:
        lines = [f"%p = atomic.matmul %x, %w {{transpose_b = true}} : ({_X}, {w}) -> {_Y}"]
        if bias:
            lines.append(f"%l = atomic.add %p, %b : ({_Y}, {_V}) -> {_Y}")
    elif bias:
        lines = [f"%l = hl.linear %x, %w, %b : ({_X}, {w}, {_V}) -> {_Y}"]
    else:
        lines = [f"%l = atomic.matmul %x, %w : ({_X}, {w}) -> {_Y}"]
    product = "%l" if bias or not transposed else "%p"
    if then == "gelu":
        lines.append(f'%y = hl.gelu {product} {{approximate = "tanh"}} : ({_Y}) -> {_Y}')
    elif then == "residual":
        lines.append(f"%y = atomic.add %r, {product} : ({_Y}, {_Y}) -> {_Y}")
    result = "%y" if then else product
    body = "".join(f"  {line}\n" for line in lines)
    return f"func.func @lt({', '.join(args)}) -> {_Y} {{\n{body}  func.return {result} : {_Y}\n}}\n"


@dataclass(frozen=True)
class LtKernel:
    """What defines one cuBLASLt kernel: the graph it computes, its epilogue, whether it reads
    a residual as the GEMM's C, whether w is stored transposed, the element types it takes."""

    reference: str
    epilogue: str  # runtime/cublaslt.py's EPILOGUES
    residual: bool
    dtypes: tuple[str, ...]
    doc: str
    transposed_w: bool = False

    @property
    def bias(self) -> bool:
        """Whether the kernel reads a bias vector (its third operand): every epilogue but
        "none" adds one."""
        return self.epilogue != "none"


_ALL = ("f32", "f16", "bf16")
# cuBLASLt's GELU epilogue is within f16/bf16 rounding of the formula, not within f32's
_16_BIT = ("f16", "bf16")
# name: (bias, then, epilogue, element types, what it computes)
_LT_FORMS = {
    "linear": (True, "", "bias", _ALL, "x @ w + b, the bias added in the GEMM's epilogue"),
    "linear_gelu": (
        True,
        "gelu",
        "gelu_bias",
        _16_BIT,
        "gelu_tanh(x @ w + b), bias and GELU in the GEMM's epilogue",
    ),
    "linear_residual": (
        True,
        "residual",
        "bias",
        _ALL,
        "r + (x @ w + b): the residual r read as the GEMM's C (beta = 1)",
    ),
    # A layer without a bias (Llama's attention output and down projections) adds its
    # residual in the GEMM too: the add kernel after a plain GEMM reads and writes the whole
    # result once more
    "matmul_residual": (
        False,
        "residual",
        "none",
        _ALL,
        "r + x @ w: the residual r read as the GEMM's C (beta = 1)",
    ),
}
# Each form twice: w stored k x n, and (`<name>_wt`) n x k, as models imported from PyTorch
# keep it (cuBLASLt reads it with op T; transposing it once instead would keep two copies of
# every weight)
LT_KERNELS = {
    f"cuda.cublaslt.{form}{'_wt' if transposed else ''}": LtKernel(
        _lt_reference(bias, then, transposed),
        epilogue,
        then == "residual",
        dtypes,
        f"{doc} by cuBLASLt" + (", w stored transposed (n x k)" if transposed else ""),
        transposed,
    )
    for transposed in (False, True)
    for form, (bias, then, epilogue, dtypes, doc) in _LT_FORMS.items()
}


def lt_operands(kernel_name: str, operands: list) -> tuple:
    """(x, w, bias or None, residual or None) of the operands of cuBLASLt kernel
    `kernel_name`, in its order: x, w, then the bias where it reads one, then the residual
    where it reads one."""
    spec = LT_KERNELS[kernel_name]
    x, w, *rest = operands
    bias = rest.pop(0) if spec.bias else None
    return x, w, bias, rest[0] if spec.residual else None


def lt_gemm(kernel_name: str, operand_types: list[TensorType], result_type: TensorType) -> LtGemm:
    """The cuBLASLt call of kernel `kernel_name` on these types (its constraint accepted them):
    x's leading dims are the GEMM's rows (x is contiguous)."""
    spec = LT_KERNELS[kernel_name]
    x = operand_types[0]
    m = x.num_elements // x.shape[-1]
    n, k = result_type.shape[-1], x.shape[-1]
    return LtGemm(
        result_type.element_type, m, n, k, spec.epilogue, spec.residual, spec.transposed_w
    )


def _lt_constraint(kernel_name: str):
    dtypes = LT_KERNELS[kernel_name].dtypes

    def constraint(types) -> str | None:
        operands, (y,) = types
        x, w, b, r = lt_operands(kernel_name, operands)
        if any(t.num_elements == 0 for t in [*operands, y]):
            return "runs no tensor without elements"
        if y.element_type not in dtypes:
            return f"takes {', '.join(dtypes)} values, not {y.element_type}"
        if any(t.element_type != y.element_type for t in operands):
            return "needs every operand of the result's element type"
        if x.rank < 2 or w.rank != 2:
            return "needs x of rank 2 or more (its rows one matrix) and a matrix w"
        if b is not None and b.shape != (y.shape[-1],):
            return f"needs a bias of {y.shape[-1]} elements, one per output column, not {b}"
        if r is not None and r.shape != y.shape:
            return "needs a residual of the result's shape"
        return None

    return constraint


def lt_kernels(run=None) -> list[Kernel]:
    """The cuBLASLt kernels, with `run` (kernel name -> the backend's run) where given."""
    out = []
    for name, spec in LT_KERNELS.items():
        out.append(
            Kernel(
                name,
                "cuda",
                reference=(spec.reference, Lowered(spec.reference)),
                run=run(name) if run is not None else None,
                constraints=_lt_constraint(name),
                max_rel_error=SUMS_ERROR,
                doc=spec.doc,
            )
        )
    return out


# -- the "cuda" space --------------------------------------------------------------------------------


def host_array(array, t: TensorType | None = None) -> np.ndarray:
    """`array` as the contiguous host array an upload copies, of `t`'s dtype where given and of
    its own shape: a rank-0 value stays rank 0 (`np.ascontiguousarray` would make it a
    1-element vector, and the value downloaded would not be the value uploaded)."""
    return np.asarray(array, dtype=t.dtype if t is not None else None, order="C")


# -- registration -------------------------------------------------------------------------------------


def register(
    backend: Backend,
    space: Space,
    cublas_run=None,
    lt_run=None,
    arch: str | None = None,
    split_run=None,
) -> None:
    """Register the planner side of the CUDA backend with `backend` and `space` (the device's,
    or a test's stand-in): the templates, the cuBLAS and cuBLASLt kernels (their host runs,
    for checking them, from `cublas_run`, `split_run(kernel name)` (else `cublas_run`) and
    `lt_run(kernel name)`), the view kernels, the
    fused-kernel hook; region kernels are made for a GPU of `arch` (TARGET).
    Idempotent."""
    _register_kernels(cublas_run, lt_run, arch, split_run)
    register_backend(backend)
    register_space(space)


def _register_kernels(cublas_run=None, lt_run=None, arch=None, split_run=None) -> None:
    """What planning needs of `register`: everything but the backend and the space."""
    TARGET["arch"] = arch
    for template in TEMPLATE_OF_KIND.values():
        register_template(template)
    if CUBLAS_GEMM not in KERNELS:
        register_kernel(cublas_kernel(cublas_run))
    for name in SPLIT_GEMMS:
        if name not in KERNELS:
            register_kernel(split_gemm_kernel(name, split_run(name) if split_run else cublas_run))
    for name, make in VIEW_KERNELS.items():
        if name not in KERNELS:
            register_kernel(make())
    if WRITE_ROWS not in KERNELS:
        register_kernel(write_rows_kernel())
    for kernel in lt_kernels(lt_run):
        if kernel.name not in KERNELS:
            register_kernel(kernel)
    if cuda_options not in planner_options.FUSED_OPTIONS:
        planner_options.FUSED_OPTIONS.append(cuda_options)


@contextmanager
def planning_kernels(arch: str | None) -> Iterator[None]:
    """The kernels of the CUDA backend registered for planning, their regions made for a GPU
    of `arch`, inside the block: the standalone file plans without a device. A registration
    already there (the device's, a test's stand-in) serves as it is, its target `arch` for the
    block; otherwise the kernels are registered with nothing to run them and removed after, so
    that a later `load_backends` registers the device's own."""
    registered, previous = CUBLAS_GEMM in KERNELS, TARGET["arch"]
    if not registered:
        _register_kernels(arch=arch)
    TARGET["arch"] = arch
    try:
        yield
    finally:
        if registered:
            TARGET["arch"] = previous
        else:
            unregister()


def unregister() -> None:
    """Remove what `register` added (tests)."""
    TARGET["arch"] = None
    for template in TEMPLATE_OF_KIND.values():
        TEMPLATES.pop(template.name, None)
    KERNELS.pop(CUBLAS_GEMM, None)
    for name in SPLIT_GEMMS:
        KERNELS.pop(name, None)
    for name in VIEW_KERNELS:
        KERNELS.pop(name, None)
    KERNELS.pop(WRITE_ROWS, None)
    for name in LT_KERNELS:
        KERNELS.pop(name, None)
    BACKENDS.pop("cuda", None)
    SPACES.pop("cuda", None)
    if cuda_options in planner_options.FUSED_OPTIONS:
        planner_options.FUSED_OPTIONS.remove(cuda_options)


__all__ = [
    "CUBLAS_GEMM",
    "LT_KERNELS",
    "RESHAPE_VIEW",
    "SPLIT_VIEW",
    "LtKernel",
    "TEMPLATE_OF_KIND",
    "KernelRegion",
    "cuda_options",
    "fused_from_call",
    "fusion_groups",
    "gemm_of",
    "host_array",
    "lt_gemm",
    "planning_kernels",
    "region_kernel",
    "region_of",
    "register",
    "single_op_kind",
    "split_view_pieces",
    "unregister",
    "VIEW_KERNELS",
    "WRITE_ROWS",
]
