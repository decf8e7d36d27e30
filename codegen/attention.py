"""The fused attention kernel (template `attention`): one `hl.attention` in a `kernel.fused`
region, computed flash-attention style (tiles of queries against tiles of keys, online softmax,
the score matrix never in memory), exact f32 arithmetic (no TF32; f16 and bf16 are loaded into
f32 and rounded on store).

On the CUDA route (the `cuda` pipeline) `lower-unsupported-attention` and
`lower-hl{keep=attention}` leave `hl.attention` alone when `attention_supported` holds, and
`place-on-device` wraps it into its own region. Its q, k, v and mask operands may be views
(transpose, reshape, slice, broadcast) of kernel inputs: `strided_layout` turns the chain of
views into an offset and one stride per dim, so the transposes that split heads are index
arithmetic on the tile loads instead of copy kernels. Both predicates live in
passes/cuda_support.py, where placement decides with them. See docs/fusion.md.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.codegen.cuda_ops import STORAGE_CTYPE
from tgc.codegen.render import KernelSource, kernel_label, render
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.ir import Operation, Value
from tgc.passes.cuda_support import attention_supported, strided_layout

BLOCK_M = 64  # queries per block: 8 rows of threads x 8 rows each
BLOCK_N = 64  # keys per tile: 16 columns of threads x 4 keys each
THREADS = 128


def generate_attention(fused: FusedOp, params: dict, symbol: str) -> KernelSource:
    """The KernelSource of an `attention` region (one hl.attention, its operands block arguments
    or views of them, its result the region's only yield), its C symbol `symbol`."""
    att = _attention_of(fused)
    q, k, v, *mask = att.operands
    out = att.results[0].type
    batch_shape = list(out.shape[:-2])
    d, dv = q.type.shape[-1], v.type.shape[-1]
    elem = q.type.element_type
    ops = _operand_layouts(fused, att, batch_shape)
    _mark_vector_loads(ops, elem, d, dv)
    nb = math.prod(batch_shape)
    nq = (q.type.shape[-2] + BLOCK_M - 1) // BLOCK_M
    dp, cw = (d + 3) // 4 * 4, (dv + 15) // 16
    qstr, vstr, pstr = dp + 4, 16 * cw, BLOCK_N + 4
    shared_floats = BLOCK_M * qstr + BLOCK_N * qstr + BLOCK_N * vstr + BLOCK_M * pstr
    source = render(
        "attention.cu.j2",
        name=symbol,
        **_signature(fused, out.num_elements, elem),
        seq_q=q.type.shape[-2],
        seq_k=k.type.shape[-2],
        offset_k=k.type.shape[-2] - q.type.shape[-2],
        d=d,
        dp=dp,
        dv=dv,
        cw=cw,
        qstr=qstr,
        vstr=vstr,
        pstr=pstr,
        bm=BLOCK_M,
        bn=BLOCK_N,
        threads=THREADS,
        nb=nb,
        nq=nq,
        causal=bool(att.attr("causal")),
        has_mask=bool(mask),
        scale=f"{float(np.float32(att.scale()))!r}f",
        **_bases(ops, batch_shape),
        out_vec=(elem == "f32" and cw == 4 and dv == 64),
        shape=f"q {q.type.shape} k {k.type.shape} v {v.type.shape}"
        + (f" mask {mask[0].type.shape}" if mask else ""),
    )
    params = dict(params)
    params.setdefault("block_m", BLOCK_M)
    params.setdefault("block_n", BLOCK_N)
    ks = KernelSource(
        symbol,
        source,
        "attention",
        len(fused.operands),
        1,
        (nb * nq, 1, 1),
        (THREADS, 1, 1),
        params,
        fused.loc,
        fused.attr("name"),
    )
    ks.shared_bytes = shared_floats * 4
    return ks


def _attention_of(fused: FusedOp) -> Operation:
    """The region's one hl.attention, which must be one the kernel supports."""
    inner = [o for o in fused.body.ops if o.name == "hl.attention"]
    if len(inner) != 1 or len(fused.results) != 1:
        raise TgcError(f"attention kernel '{kernel_label(fused)}' needs exactly one hl.attention")
    att = inner[0]
    if not attention_supported(att):
        raise TgcError("this hl.attention cannot run as a fused kernel (lower it first)", att.loc)
    return att


def _signature(fused: FusedOp, out_elements: int, elem: str) -> dict:
    """The kernel's parameters, storage type, index type and rounding store function."""
    args = list(fused.body.args)
    sizes = [a.type.num_elements for a in args] + [out_elements]
    return {
        "params": [
            f"const {STORAGE_CTYPE[a.type.element_type]}* __restrict__ in{i}"
            for i, a in enumerate(args)
        ]
        + [f"{STORAGE_CTYPE[elem]}* __restrict__ out0"],
        "T": STORAGE_CTYPE[elem],
        "idx_t": "long long" if max(sizes) > 2**31 - 1 else "int",
        "store": (
            "" if elem == "f32" else {"bf16": "__float2bfloat16_rn", "f16": "__float2half_rn"}[elem]
        ),
    }


def _layout(args: list[Value], x: Value, what: str) -> tuple[int, int, list[int]]:
    """The kernel input `x` is a strided view of: its position, offset and strides."""
    found = strided_layout(x)
    if found is None or found[0] not in args:
        raise TgcError(f"attention operand '{what}' is not a strided view of a kernel input")
    root, offset, strides = found
    return args.index(root), offset, strides


def _operand_layouts(fused: FusedOp, att: Operation, batch_shape: list[int]) -> dict[str, dict]:
    """Per operand (q, k, v, and mask when there is one): its pointer, offset, the stride of
    each result batch dim, of its rows and of its columns (broadcast dims: stride 0)."""
    args = list(fused.body.args)
    q, k, v, *mask = att.operands
    ops = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        idx, offset, strides = _layout(args, x, name)
        ops[name] = {
            "ptr": f"in{idx}",
            "offset": offset,
            "batch": _batch_strides(x.type.shape, strides, batch_shape, 2),
            "row": strides[-2],
            "col": strides[-1],
        }
    if mask:
        ops["mask"] = _mask_layout(args, mask[0], batch_shape)
    return ops


def _mask_layout(args: list[Value], m: Value, batch_shape: list[int]) -> dict:
    """The mask's layout; it may have fewer than two dims (missing or unit dims broadcast)."""
    idx, offset, strides = _layout(args, m, "mask")
    mshape = list(m.type.shape)
    full = [1] * (2 - min(2, len(mshape))) + mshape[-2:]
    fstr = [0] * (2 - min(2, len(strides))) + strides[-2:]
    return {
        "ptr": f"in{idx}",
        "offset": offset,
        "batch": _batch_strides(mshape, strides, batch_shape, min(2, len(mshape))),
        "row": 0 if full[0] == 1 else fstr[0],
        "col": 0 if full[1] == 1 else fstr[1],
    }


def _batch_strides(shape, strides, batch_shape, tail: int) -> list[int]:
    """The stride of each result batch dim in an operand of `shape` (broadcast dims: 0)."""
    lead = shape[: len(shape) - tail]
    lead_strides = strides[: len(shape) - tail]
    pad = len(batch_shape) - len(lead)
    out = []
    for d in range(len(batch_shape)):
        j = d - pad
        out.append(lead_strides[j] if j >= 0 and lead[j] != 1 else 0)
    return out


def _mark_vector_loads(ops: dict[str, dict], elem: str, d: int, dv: int) -> None:
    """f32 operands whose rows are contiguous and 16-byte aligned move as float4 (the base
    pointers are checked again at run time): sets each of q, k, v's `vec`."""
    for name in ("q", "k", "v"):
        o = ops[name]
        width = d if name != "v" else dv
        o["vec"] = (
            elem == "f32"
            and o["col"] == 1
            and width % 4 == 0
            and o["offset"] % 4 == 0
            and o["row"] % 4 == 0
            and all(s % 4 == 0 for s in o["batch"])
        )


def _bases(ops: dict[str, dict], batch_shape: list[int]) -> dict:
    """The operand layouts and the C expression of each operand's start for the flat batch
    index `bz` (row-major over batch_shape)."""
    bcoords = []
    rest = "bz"
    for i in range(len(batch_shape) - 1, -1, -1):
        n = batch_shape[i]
        bcoords.insert(0, f"({rest} % {n})" if i > 0 else rest)
        rest = f"({rest} / {n})"

    def base(o) -> str:
        terms = [str(o["offset"])] + [
            f"(long long) {c} * {s}" for c, s in zip(bcoords, o["batch"]) if s
        ]
        return " + ".join(terms)

    return {
        "q": ops["q"],
        "k": ops["k"],
        "v": ops["v"],
        "mask": ops.get("mask"),
        "q_base": base(ops["q"]),
        "k_base": base(ops["k"]),
        "v_base": base(ops["v"]),
        "mask_base": base(ops["mask"]) if "mask" in ops else "0",
    }
