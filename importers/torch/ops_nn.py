"""Lowerings of the aten ops that carry a model's structure: matrix products (mm, bmm, matmul,
addmm, linear), reductions (sum, mean, amax, amin, max, min, any, all, var), softmax and
log-softmax, layer_norm (all three results of native_layer_norm), rms_norm,
scaled_dot_product_attention and dropout in eval mode."""

from __future__ import annotations

import math

import torch

from tgc.importers.torch._context import Cx
from tgc.importers.torch._registry import lowering
from tgc.ir import Value

# -- matrix products ------------------------------------------------------------------------------


def _same_type(cx: Cx, *names: str) -> list[Value]:
    elem = cx.out.element_type
    return [cx.value(name, elem) for name in names]


@lowering("mm", "bmm")
def mm(cx: Cx) -> Value:
    return cx.b.atomic.matmul(*_same_type(cx, "self", "mat2"))


@lowering("matmul")
def matmul(cx: Cx) -> Value:
    """torch.matmul: a 1-d operand is a row (left) or a column (right), and that dim is dropped
    from the result."""
    a, b = _same_type(cx, "self", "other")
    if a.type.rank == 1:
        a = cx.reshape(a, (1, a.type.shape[0]))
    if b.type.rank == 1:
        b = cx.reshape(b, (b.type.shape[0], 1))
    return cx.reshape(cx.b.atomic.matmul(a, b), cx.out.shape)


@lowering("linear")
def linear(cx: Cx) -> Value:
    """x @ weight^T + bias as hl.linear, whose weight is [in, out]: the transpose of PyTorch's
    [out, in] (canonicalize folds it into the matmul once lowered)."""
    x = cx.value("input", cx.out.element_type)
    w = cx.value("weight", cx.out.element_type)
    if w.type.rank != 2:
        raise cx.error(f"weight of rank {w.type.rank} (a linear layer's weight has rank 2)")
    w = cx.b.atomic.transpose(w, perm=[1, 0])
    if cx.arg("bias") is None:
        return cx.b.hl.linear(x, w)
    return cx.b.hl.linear(x, w, cx.value("bias", cx.out.element_type))


@lowering("addmm", "baddbmm")
def addmm(cx: Cx) -> Value:
    """beta * self + alpha * (mat1 @ mat2) (batch1 @ batch2 for baddbmm); beta = 0 ignores self,
    as PyTorch does (a NaN there does not propagate)."""
    names = ("mat1", "mat2") if cx.node.target._opname == "addmm" else ("batch1", "batch2")
    product = cx.b.atomic.matmul(*_same_type(cx, *names))
    elem = cx.out.element_type
    alpha, beta = cx.arg("alpha"), cx.arg("beta")
    if alpha != 1:
        product = cx.b.atomic.mul(product, cx.scalar(alpha, elem))
    if beta == 0:
        return cx.broadcast(product, cx.out.shape)
    bias = cx.value("self", elem)
    if beta != 1:
        bias = cx.b.atomic.mul(bias, cx.scalar(beta, elem))
    return cx.b.atomic.add(product, bias)


# -- reductions -----------------------------------------------------------------------------------


def _axes(cx: Cx, dims, rank: int) -> list[int]:
    """The reduced axes: None or [] is every axis, as in PyTorch."""
    if dims is None or (isinstance(dims, (list, tuple)) and len(dims) == 0):
        return list(range(rank))
    if isinstance(dims, int):
        dims = [dims]
    return sorted({cx.axis(d, rank) for d in dims})


def _reduce(cx: Cx, op, x: Value, dims, keepdim: bool) -> Value:
    axes = _axes(cx, dims, x.type.rank)
    if not axes:  # a rank-0 tensor reduced over "every" axis is itself
        return x
    return op(x, axes=axes, keepdims=bool(keepdim))


@lowering("sum")
def sum_(cx: Cx) -> Value:
    x = cx.value("self", cx.out.element_type)  # a sum of bools or ints is an int64
    return _reduce(cx, cx.b.atomic.reduce_sum, x, cx.args.get("dim"), cx.args.get("keepdim"))


@lowering("mean")
def mean(cx: Cx) -> Value:
    x = cx.value("self", cx.out.element_type)
    return _reduce(cx, cx.b.hl.mean, x, cx.args.get("dim"), cx.args.get("keepdim"))


@lowering("amax", "amin")
def amax(cx: Cx) -> Value:
    x = cx.value("self")
    op = cx.b.atomic.reduce_max if cx.node.target._opname == "amax" else cx.b.atomic.reduce_min
    return _reduce(cx, op, x, cx.arg("dim"), cx.arg("keepdim"))


@lowering("max", "min")
def max_(cx: Cx):
    """max(x) over everything, max(x, dim) -> (values, indices), max(x, other) elementwise."""
    is_max = cx.node.target._opname == "max"
    if cx.overload == "other":
        elem = cx.out.element_type
        op = cx.b.atomic.max if is_max else cx.b.atomic.min
        return op(cx.value("self", elem), cx.value("other", elem))
    reduce = cx.b.atomic.reduce_max if is_max else cx.b.atomic.reduce_min
    x = cx.value("self")
    if cx.overload == "default":
        return _reduce(cx, reduce, x, None, False)
    if 1 in cx.used_outputs():
        raise cx.error("the indices of a max or min along a dim (argmax) have no tgc op")
    return (_reduce(cx, reduce, x, cx.arg("dim"), cx.arg("keepdim")), None)


@lowering("any", "all")
def any_(cx: Cx) -> Value:
    x = cx.value("self")
    if x.type.element_type != "i1":
        x = cx.b.atomic.cmp(x, cx.scalar(0, x.type.element_type), pred="ne")
    op = cx.b.atomic.reduce_max if cx.node.target._opname == "any" else cx.b.atomic.reduce_min
    dims = cx.args.get("dim")
    return _reduce(cx, op, x, dims, cx.args.get("keepdim", False))


@lowering("var", "std")
def var(cx: Cx) -> Value:
    """sum((x - mean)**2) / (n - correction), correction 1 unless given (unbiased=False: 0)."""
    x = cx.value("self", cx.out.element_type)
    axes = _axes(cx, cx.args.get("dim"), x.type.rank)
    correction = cx.args.get("correction")
    if correction is None:
        correction = 1 if cx.args.get("unbiased", True) else 0
    keepdim = bool(cx.args.get("keepdim", False))
    elem = x.type.element_type
    count = math.prod(x.type.shape[a] for a in axes)
    centred = cx.b.atomic.sub(x, cx.b.hl.mean(x, axes=axes, keepdims=True))
    total = cx.b.atomic.reduce_sum(cx.b.atomic.mul(centred, centred), axes=axes, keepdims=keepdim)
    result = cx.b.atomic.div(total, cx.scalar(max(count - correction, 0), elem))
    return cx.b.atomic.sqrt(result) if cx.node.target._opname == "std" else result


# -- softmax --------------------------------------------------------------------------------------


@lowering("softmax", "_softmax", "log_softmax", "_log_softmax")
def softmax(cx: Cx) -> Value:
    x = cx.value("self", cx.out.element_type)  # dtype= or half_to_float: computed in the result's
    axis = cx.axis(cx.arg("dim"), x.type.rank)
    if "log" in cx.node.target._opname:
        return cx.b.hl.log_softmax(x, axis=axis)
    return cx.b.hl.softmax(x, axis=axis)


# -- normalisations -------------------------------------------------------------------------------


def _norm_axis(cx: Cx, x: Value) -> int:
    shape = list(cx.arg("normalized_shape"))
    rank = x.type.rank
    if not shape or len(shape) > rank or list(x.type.shape[rank - len(shape) :]) != shape:
        raise cx.error(f"normalized_shape {shape} is not a non-empty suffix of {x.type}")
    return rank - len(shape)


def _param_or(cx: Cx, name: str, default: float, elem: str) -> Value:
    """The affine parameter `name`, or a rank-0 constant where the module has none."""
    if cx.arg(name) is None:
        return cx.scalar(default, elem)
    return cx.value(name, elem)


@lowering("layer_norm", "native_layer_norm")
def layer_norm(cx: Cx):
    x = cx.value("input")
    elem = x.type.element_type
    axis = _norm_axis(cx, x)
    eps = float(cx.arg("eps"))
    gamma, beta = _param_or(cx, "weight", 1.0, elem), _param_or(cx, "bias", 0.0, elem)
    out = cx.b.hl.layernorm(x, gamma, beta, axis=axis, eps=eps)
    if cx.node.target._opname == "layer_norm":
        return out
    # native_layer_norm also returns the mean and 1/std it normalised with (shape [..., 1, 1]).
    used = cx.used_outputs()
    mean = rstd = None
    axes = list(range(axis, x.type.rank))
    if used & {1, 2}:
        mu = cx.b.hl.mean(x, axes=axes, keepdims=True)
        mean = cx.cast(mu, cx.outs[1].element_type)
    if 2 in used:
        centred = cx.b.atomic.sub(x, mu)
        var = cx.b.hl.mean(cx.b.atomic.mul(centred, centred), axes=axes, keepdims=True)
        rstd = cx.b.atomic.rsqrt(cx.b.atomic.add(var, cx.scalar(eps, elem)))
        rstd = cx.cast(rstd, cx.outs[2].element_type)
    return (out, mean, rstd)


@lowering("rms_norm")
def rms_norm(cx: Cx) -> Value:
    x = cx.value("input")
    elem = x.type.element_type
    eps = cx.arg("eps")
    if eps is None:  # PyTorch's default: the machine epsilon of the input's dtype
        eps = torch.finfo(cx.dtype_of(x)).eps
    gamma = _param_or(cx, "weight", 1.0, elem)
    return cx.b.hl.rmsnorm(x, gamma, axis=_norm_axis(cx, x), eps=float(eps))


# -- attention ------------------------------------------------------------------------------------


@lowering("scaled_dot_product_attention")
def attention(cx: Cx) -> Value:
    """hl.attention. PyTorch's is_causal aligns the mask to the top left (query i sees keys
    0..i), hl.attention's causal to the bottom right: they agree when there are as many queries
    as keys, otherwise the top-left mask is built here. A boolean attn_mask (True: attend)
    becomes an additive one (0 or -inf). enable_gqa repeats each key/value head for its group
    of query heads."""
    if cx.arg("dropout_p"):
        raise cx.error(
            f"dropout_p={cx.arg('dropout_p')}: attention dropout is random "
            "(export the model in eval mode, with dropout_p=0)"
        )
    elem = cx.out.element_type
    q, k, v = (cx.value(name, elem) for name in ("query", "key", "value"))
    if cx.arg("enable_gqa"):
        k, v = _repeat_heads(cx, k, q), _repeat_heads(cx, v, q)
    operands = [q, k, v]
    attrs = {}
    if cx.arg("scale") is not None:
        attrs["scale"] = float(cx.arg("scale"))
    mask = cx.arg("attn_mask")
    if mask is not None:
        operands.append(_additive_mask(cx, cx.value(mask), elem))
    if cx.arg("is_causal"):
        if mask is not None:
            raise cx.error("both attn_mask and is_causal (PyTorch refuses them together)")
        seq_q, seq_k = q.type.shape[-2], k.type.shape[-2]
        if seq_q == seq_k:
            attrs["causal"] = True
        else:
            operands.append(_top_left_causal_mask(cx, seq_q, seq_k, elem))
    return cx.b.hl.attention(*operands, **attrs)


def _additive_mask(cx: Cx, mask: Value, elem: str) -> Value:
    if mask.type.element_type != "i1":
        return cx.cast(mask, elem)
    return cx.b.atomic.where(mask, cx.scalar(0.0, elem), cx.scalar(-math.inf, elem))


def _top_left_causal_mask(cx: Cx, seq_q: int, seq_k: int, elem: str) -> Value:
    """0 where key j <= query i, -inf elsewhere ([seq_q, seq_k], from iotas, no constant)."""
    positions = cx.out.with_shape((seq_q, seq_k)).with_element_type("i32")
    row = cx.b.atomic.iota(axis=0, result_type=positions)
    col = cx.b.atomic.iota(axis=1, result_type=positions)
    allowed = cx.b.atomic.cmp(col, row, pred="le")
    return cx.b.atomic.where(allowed, cx.scalar(0.0, elem), cx.scalar(-math.inf, elem))


def _repeat_heads(cx: Cx, kv: Value, q: Value) -> Value:
    """[..., h_kv, s, d] -> [..., h_q, s, d], each head repeated h_q / h_kv times in place
    (repeat_interleave on dim -3, as PyTorch's enable_gqa)."""
    if kv.type.rank < 3 or q.type.rank < 3:
        raise cx.error("enable_gqa needs query, key and value of rank >= 3 (heads at dim -3)")
    *batch, heads, seq, dim = kv.type.shape
    q_heads = q.type.shape[-3]
    if heads == q_heads:
        return kv
    if heads == 0 or q_heads % heads:
        raise cx.error(f"{q_heads} query heads are not a multiple of {heads} key/value heads")
    group = q_heads // heads
    spread = cx.reshape(kv, (*batch, heads, 1, seq, dim))
    spread = cx.broadcast(spread, (*batch, heads, group, seq, dim))
    return cx.reshape(spread, (*batch, q_heads, seq, dim))


@lowering("dropout", "feature_dropout", "alpha_dropout")
def dropout(cx: Cx) -> Value:
    """The identity in eval mode (train=False) or with p=0; random otherwise."""
    if cx.arg("train") and cx.arg("p"):
        raise cx.error(
            f"dropout with p={cx.arg('p')} in training mode is random "
            "(export the model in eval mode: model.eval())"
        )
    return cx.value("input")
