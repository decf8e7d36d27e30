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
from tgc.codegen.names import display_name
from tgc.diagnostics import TgcError
from tgc.ir import Value
from tgc.passes.cuda_support import attention_supported, strided_layout

BLOCK_M = 64  # queries per block: 8 rows of threads x 8 rows each
BLOCK_N = 64  # keys per tile: 16 columns of threads x 4 keys each
THREADS = 128


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


def generate_attention(fused, params: dict, render, symbol: str, kernel_source):
    """The KernelSource of an `attention` region (one hl.attention, its operands block arguments
    or views of them, its result the region's only yield), its C symbol `symbol`."""
    inner = [o for o in fused.body.ops if o.name == "hl.attention"]
    if len(inner) != 1 or len(fused.results) != 1:
        label = display_name(str(fused.attr("name")))
        raise TgcError(f"attention kernel '{label}' needs exactly one hl.attention")
    att = inner[0]
    if not attention_supported(att):
        raise TgcError("this hl.attention cannot run as a fused kernel (lower it first)", att.loc)
    args = list(fused.body.args)

    def layout(x: Value, what: str):
        found = strided_layout(x)
        if found is None or found[0] not in args:
            raise TgcError(f"attention operand '{what}' is not a strided view of a kernel input")
        root, offset, strides = found
        return args.index(root), offset, strides

    q, k, v, *mask = att.operands
    qt, kt, vt = q.type, k.type, v.type
    out = att.results[0].type
    batch_shape = list(out.shape[:-2])
    seq_q, seq_k = qt.shape[-2], kt.shape[-2]
    d, dv = qt.shape[-1], vt.shape[-1]
    elem = qt.element_type
    ops = {}
    for name, x in (("q", q), ("k", k), ("v", v)):
        idx, offset, strides = layout(x, name)
        ops[name] = {
            "ptr": f"in{idx}",
            "offset": offset,
            "batch": _batch_strides(x.type.shape, strides, batch_shape, 2),
            "row": strides[-2],
            "col": strides[-1],
        }
    has_mask = bool(mask)
    if has_mask:
        m = mask[0]
        idx, offset, strides = layout(m, "mask")
        mshape = list(m.type.shape)
        full = [1] * (2 - min(2, len(mshape))) + mshape[-2:]
        fstr = [0] * (2 - min(2, len(strides))) + strides[-2:]
        ops["mask"] = {
            "ptr": f"in{idx}",
            "offset": offset,
            "batch": _batch_strides(mshape, strides, batch_shape, min(2, len(mshape))),
            "row": 0 if full[0] == 1 else fstr[0],
            "col": 0 if full[1] == 1 else fstr[1],
        }
    dp = (d + 3) // 4 * 4
    cw = (dv + 15) // 16
    # f32 operands whose rows are contiguous and 16-byte aligned move as float4 (the base
    # pointers are checked again at run time).
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
    sizes = [a.type.num_elements for a in args] + [out.num_elements]
    idx_t = "long long" if max(sizes) > 2**31 - 1 else "int"
    nb = math.prod(batch_shape)
    nq = (seq_q + BLOCK_M - 1) // BLOCK_M
    # batch coordinates of the flat batch index `bz` (row-major over batch_shape)
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

    scale = np.float32(att.scale())
    causal = bool(att.attr("causal"))
    qstr, vstr, pstr = dp + 4, 16 * cw, BLOCK_N + 4
    shared_floats = BLOCK_M * qstr + BLOCK_N * qstr + BLOCK_N * vstr + BLOCK_M * pstr
    source = render(
        "attention.cu.j2",
        name=symbol,
        params=[
            f"const {STORAGE_CTYPE[a.type.element_type]}* __restrict__ in{i}"
            for i, a in enumerate(args)
        ]
        + [f"{STORAGE_CTYPE[elem]}* __restrict__ out0"],
        T=STORAGE_CTYPE[elem],
        idx_t=idx_t,
        store=(
            "" if elem == "f32" else {"bf16": "__float2bfloat16_rn", "f16": "__float2half_rn"}[elem]
        ),
        seq_q=seq_q,
        seq_k=seq_k,
        offset_k=seq_k - seq_q,
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
        causal=causal,
        has_mask=has_mask,
        scale=f"{float(scale)!r}f",
        q=ops["q"],
        k=ops["k"],
        v=ops["v"],
        mask=ops.get("mask"),
        q_base=base(ops["q"]),
        k_base=base(ops["k"]),
        v_base=base(ops["v"]),
        mask_base=base(ops["mask"]) if has_mask else "0",
        out_vec=(elem == "f32" and cw == 4 and dv == 64),
        shape=f"q {qt.shape} k {kt.shape} v {vt.shape}"
        + (f" mask {mask[0].type.shape}" if has_mask else ""),
    )
    params = dict(params)
    params.setdefault("block_m", BLOCK_M)
    params.setdefault("block_n", BLOCK_N)
    ks = kernel_source(
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
