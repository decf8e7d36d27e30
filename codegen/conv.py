"""The convolution template: one `hl.conv1d/2d/3d` of kernel inputs as an implicit GEMM on
tensor cores (`conv_tc.cu.j2`), with the rest of the region as its epilogue.

Per group the convolution is a GEMM: C[pixels, channels] = im2col(x)[pixels, k] @ w[k,
channels], k running over (input channel of the group, kernel taps) in the weights' own order,
so the weights [O, C/groups, *K] are B as they lie ([channel][k], read as mma's column-major B).
The im2col matrix is never made: each thread gathers its pixel's elements of a k tile from the
NC... input (consecutive threads, consecutive pixels: coalesced where the stride is 1), a tap in
the pads or past the end a predicated zero. The tile goes through registers (the next step's
loads in flight while this step's mma run) into double-buffered shared memory, k-major, and
`ldmatrix.trans` makes the row-major A fragments. The accumulator (f32) plus the bias, then the
region's other ops (activation, residual add, cast: the `Emitter` at the output element's
coordinates) are stored NC... straight from registers.

Template parameters: `block_m` (pixels per block: 64 or 128; default 128 where there are at
least 8192 pixels per group, else 64), `block_n` (output channels: 32, 64 or 128; default the
least of 32 and 64 covering a group's channels, else 64), `block_k` (16 or 32, default 32).
Four warps, 2x2. What the kernel does not run (`conv_misfit`: f32, depthwise) is a TgcError,
so the planner keeps cuDNN there.
"""

from __future__ import annotations

import math

from tgc.codegen.cuda_ops import STORAGE_CTYPE, load_expression, store_value
from tgc.codegen.emitter import Emitter, linear_offset
from tgc.codegen.render import KernelSource, idx_type, kernel_label, params_decl, render, yields_of
from tgc.cuda_target import CONV_OPS, conv_misfit
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import FusedOp
from tgc.ir import Operation

PTX_TYPES = {"bf16": "bf16", "f16": "f16"}  # element type -> mma.sync's operand type
BLOCK_M, BLOCK_N, BLOCK_K = (64, 128), (32, 64, 128), (16, 32)
THREADS = 128
WIDE_M = 8192  # the least pixels per group whose default tile is 128 pixels


def conv_of(op: FusedOp) -> Operation:
    """The convolution of a conv kernel."""
    found = [inner for inner in op.body.ops if inner.name in CONV_OPS]
    if len(found) != 1:
        raise TgcError(f"conv kernel '{kernel_label(op)}' needs exactly one convolution", op.loc)
    return found[0]


def _tiles(params: dict, pixels: int, og: int) -> tuple[int, int, int]:
    bm = params.setdefault("block_m", 128 if pixels >= WIDE_M else 64)
    bn = params.setdefault("block_n", 32 if og <= 32 else 64)
    bk = params.setdefault("block_k", 32)
    if bm not in BLOCK_M or bn not in BLOCK_N or bk not in BLOCK_K:
        raise TgcError(
            f"conv tiles take block_m 64 or 128, block_n 32, 64 or 128 and block_k 16 or 32, "
            f"not {bm}, {bn}, {bk}"
        )
    return bm, bn, bk


def generate_conv(op: FusedOp, params: dict, symbol: str) -> KernelSource:
    """The implicit-GEMM kernel of `op`'s convolution, the region's other ops its epilogue."""
    decls, ptrs, outs = params_decl(op)
    conv = conv_of(op)
    why = conv_misfit(conv)
    if why is not None:
        raise TgcError(
            f"the tensor-core convolution cannot run '{kernel_label(op)}': {why}", conv.loc
        )
    for v in conv.operands:
        if v not in ptrs:
            raise TgcError("convolution operands must be kernel inputs", conv.loc)
    x, w = (v.type for v in conv.operands[:2])
    y = conv.results[0].type
    spatial = x.rank - 2
    groups = int(conv.attr("groups"))
    strides = _ints(conv, "strides", 1, spatial)
    dilations = _ints(conv, "dilations", 1, spatial)
    pads = _ints(conv, "pads", 0, 2 * spatial)
    n, c, sizes = x.shape[0], x.shape[1], x.shape[2:]
    o, cg, kernel = w.shape[0], w.shape[1], w.shape[2:]
    outs_sp = y.shape[2:]
    og = o // groups
    pixels, taps = math.prod(outs_sp), math.prod(kernel)
    m = n * pixels
    bm, bn, bk = _tiles(params, m, og)
    dims = [
        {
            "size": sizes[d],
            "in_stride": math.prod(sizes[d + 1 :]),
            "out": outs_sp[d],
            "out_stride": math.prod(outs_sp[d + 1 :]),
            "k": kernel[d],
            "tap_stride": math.prod(kernel[d + 1 :]),
            "stride": strides[d],
            "dilation": dilations[d],
            "pad": pads[d],
        }
        for d in range(spatial)
    ]
    bias = None
    if len(conv.operands) > 2:
        bias = load_expression(ptrs[conv.operands[2]], "o", conv.operands[2].type.element_type)
    source = render(
        "conv_tc.cu.j2",
        name=symbol,
        op_name=conv.name,
        params=decls,
        idx_t=idx_type(op),
        T=STORAGE_CTYPE[y.element_type],
        elem=y.element_type,
        ptx_type=PTX_TYPES[y.element_type],
        m=m,
        og=og,
        groups=groups,
        kdim=cg * taps,
        taps=taps,
        pixels=pixels,
        channels=c,
        cg=cg,
        plane=math.prod(sizes),
        dims=dims,
        bm=bm,
        bn=bn,
        bk=bk,
        wm=bm // 2,
        wn=bn // 2,
        x=ptrs[conv.operands[0]],
        w=ptrs[conv.operands[1]],
        bias=bias,
        epilogue=_epilogue(op, conv, spatial, ptrs, outs),
    )
    grid = (math.ceil(m / bm), math.ceil(og / bn), groups)
    return KernelSource(
        symbol,
        source,
        "conv",
        len(op.operands),
        len(op.results),
        grid,
        (THREADS, 1, 1),
        params,
        op.loc,
        op.attr("name"),
    )


def _ints(conv: Operation, name: str, default: int, count: int) -> tuple[int, ...]:
    value = conv.attributes.get(name)
    return tuple(int(v) for v in value) if value is not None else (default,) * count


def _epilogue(op: FusedOp, conv: Operation, spatial: int, ptrs: dict, outs: list[str]) -> str:
    """The statements storing every output at (n_img, o, q...), the convolution there (with
    its bias) being conv_val."""
    em = Emitter(ptrs)
    em.hooks[conv.results[0]] = lambda c: "conv_val"
    shape = conv.results[0].type.shape
    coords = ("n_img", "o", *(f"q{d}" for d in range(spatial)))
    for j, (v, r) in enumerate(zip(yields_of(op), op.results)):
        if r.type.shape != shape:
            raise TgcError(f"conv kernel '{kernel_label(op)}' yields a value of another shape")
        val = store_value(em.value(v, coords), r.type.element_type)
        em.emit(f"{outs[j]}[{linear_offset(shape, coords)}] = {val};")
    return em.take(10)


__all__ = ["conv_of", "generate_conv"]
