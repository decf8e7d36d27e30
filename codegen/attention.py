"""The fused attention kernel (template `attention`): one `hl.attention` in a `kernel.fused`
region, computed flash-attention style (tiles of queries against tiles of keys, online softmax,
the score matrix never in memory), exact f32 arithmetic (no TF32; f16 and bf16 are loaded into
f32 and rounded on store).

On the CUDA path `lower-hl` leaves `hl.attention` alone when `attention_supported` holds and
placement wraps it into its own region (runtime/placement.py). Its q, k, v and mask operands
may be views (transpose, reshape, slice, broadcast) of kernel inputs: `strided_layout` turns the
chain of views into an offset and one stride per dim, so the transposes that split heads are
index arithmetic on the tile loads instead of copy kernels. See docs/fusion.md.
"""

from __future__ import annotations

import math

import numpy as np

from tgc.codegen.cuda_ops import STORAGE_CTYPE
from tgc.codegen.names import display_name
from tgc.diagnostics import TgcError
from tgc.ir import Value

ATTENTION_TYPES = ("f32", "bf16", "f16")
MAX_HEAD_DIM = 128
BLOCK_M = 64  # queries per block: 8 rows of threads x 8 rows each
BLOCK_N = 64  # keys per tile: 16 columns of threads x 4 keys each
THREADS = 128
VIEW_NAMES = (
    "atomic.reshape",
    "atomic.transpose",
    "atomic.slice",
    "atomic.broadcast",
    "atomic.split",
)


def attention_supported(op) -> bool:
    """Can the fused kernel run this `hl.attention`? f32/bf16/f16, head dims <= 128."""
    q, k, v = (x.type for x in op.operands[:3])
    if q.element_type not in ATTENTION_TYPES:
        return False
    if q.shape[-1] > MAX_HEAD_DIM or v.shape[-1] > MAX_HEAD_DIM:
        return False
    if min(q.shape[-1], v.shape[-1], q.shape[-2], k.shape[-2]) < 1:
        return False
    return op.results[0].type.num_elements > 0


def _contiguous(shape) -> list[int]:
    strides, acc = [], 1
    for d in reversed(shape):
        strides.append(acc)
        acc *= d
    return strides[::-1]


def _reshape_strides(old_shape, old_strides, new_shape) -> list[int] | None:
    """Strides of a reshape of a strided view without a copy (numpy's rule), or None."""
    old = [(d, s) for d, s in zip(old_shape, old_strides) if d != 1]
    new_dims = list(new_shape)
    if math.prod(old_shape) != math.prod(new_dims):
        return None
    if math.prod(new_dims) == 0:
        return _contiguous(new_dims)
    out = [0] * len(new_dims)
    nonunit = [i for i, d in enumerate(new_dims) if d != 1]
    oi = ni = 0
    while oi < len(old) and ni < len(nonunit):
        op_, np_ = old[oi][0], new_dims[nonunit[ni]]
        oj, nj = oi + 1, ni + 1
        while op_ != np_:
            if op_ < np_:
                if oj >= len(old):
                    return None
                op_ *= old[oj][0]
                oj += 1
            else:
                if nj >= len(nonunit):
                    return None
                np_ *= new_dims[nonunit[nj]]
                nj += 1
        for k in range(oi, oj - 1):  # the old group must be one contiguous run
            if old[k][1] != old[k + 1][1] * old[k + 1][0]:
                return None
        stride = old[oj - 1][1]
        for k in range(nj - 1, ni - 1, -1):
            out[nonunit[k]] = stride
            stride *= new_dims[nonunit[k]]
        oi, ni = oj, nj
    return out


def strided_layout(v: Value, stop=None):
    """(root, offset, strides) when `v` is a chain of views of `root` (every dim an affine
    function of v's coordinates), else None. The walk stops at a value that no view defines, or
    where `stop(op)` is true."""
    chain = []
    x = v
    while True:
        op = x.defining_op
        if op is None or op.name not in VIEW_NAMES or (stop is not None and stop(op)):
            break
        chain.append((op, x))
        x = op.operands[0]
    root = x
    shape = list(root.type.shape)
    strides = _contiguous(shape)
    offset = 0
    for op, result in reversed(chain):
        out_shape = list(result.type.shape)
        if op.name == "atomic.transpose":
            perm = list(op.attr("perm"))
            strides = [strides[p] for p in perm]
        elif op.name == "atomic.slice":
            for d, (lo, st) in enumerate(zip(op.attr("start"), op.attr("step"))):
                offset += lo * strides[d]
                strides[d] *= st
        elif op.name == "atomic.split":
            axis = op.attr("axis") % len(shape)
            index = list(op.results).index(result)
            offset += sum(op.attr("sizes")[:index]) * strides[axis]
        elif op.name == "atomic.broadcast":
            pad = len(out_shape) - len(shape)
            new = [0] * pad
            for d, (n, s) in enumerate(zip(shape, strides)):
                new.append(0 if n == 1 and out_shape[pad + d] != 1 else s)
            strides = new
        elif op.name == "atomic.reshape":
            reshaped = _reshape_strides(shape, strides, out_shape)
            if reshaped is None:
                return None
            strides = reshaped
        shape = out_shape
    if offset < 0:
        return None
    return root, offset, strides


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
