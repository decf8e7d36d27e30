"""Verifier diagnostics of the atomic and hl ops, through the real parser and verifier.

Each invalid case is one function whose last op is wrong; the error must name that op, contain
the expected words and point (line and column) at the op name, as mlir-opt does. Valid cases,
including every op's docstring example, must verify.
"""

from __future__ import annotations

import re

import pytest

import tgc.dialects  # noqa: F401  (registers the ops)
from tgc.diagnostics import TgcError
from tgc.opdef import OPS, dialect_ops
from tgc.parser import parse_module
from tgc.printer import print_op
from tgc.verifier import verify

T = "tensor<4x16xf32>"


def function(args: str, body: str) -> str:
    lines = "".join(f"  {line.strip()}\n" for line in body.strip().splitlines())
    return f"func.func @f({args}) {{\n{lines}  func.return : () -> ()\n}}\n"


def expect_error(args: str, body: str, *words: str) -> TgcError:
    """Verify the function; the last op of `body` must be reported with all of `words`."""
    text = function(args, body)
    module = parse_module(text, "t.tg")  # parses: the error is the verifier's
    with pytest.raises(TgcError) as info:
        verify(module)
    err = info.value
    lines = text.splitlines()
    line_no = len(lines) - 2  # the op before `func.return`
    op_name = re.search(r"[a-z_]+\.[a-z_]+", lines[line_no - 1]).group()
    assert err.message.startswith(f"'{op_name}' op "), err.message
    for word in words:
        assert word in err.message, (word, err.message)
    assert (err.loc.file, err.loc.line, err.loc.col) == (
        "t.tg",
        line_no,
        lines[line_no - 1].index(op_name) + 1,
    )
    return err


# -- atomic ---------------------------------------------------------------------------------------

ATOMIC_INVALID = {
    "bad-perm": (
        f"%x: {T}",
        f"%y = atomic.transpose %x {{perm = [0, 0]}} : ({T}) -> {T}",
        ["perm [0, 0] is not a permutation of the 2 dims"],
    ),
    "perm-wrong-length": (
        f"%x: {T}",
        f"%y = atomic.transpose %x {{perm = [1, 0, 2]}} : ({T}) -> tensor<16x4xf32>",
        ["not a permutation"],
    ),
    "reshape-count": (
        f"%x: {T}",
        f"%y = atomic.reshape %x : ({T}) -> tensor<5x13xf32>",
        ["cannot reshape", "64 elements", "65 elements"],
    ),
    "reshape-dtype": (
        f"%x: {T}",
        f"%y = atomic.reshape %x : ({T}) -> tensor<64xf16>",
        ["element type and memory space must not change"],
    ),
    "add-broadcast": (
        "%a: tensor<3x4xf32>, %b: tensor<5x4xf32>",
        "%c = atomic.add %a, %b : (tensor<3x4xf32>, tensor<5x4xf32>) -> tensor<3x4xf32>",
        ["not broadcast-compatible", "(3, 4)", "(5, 4)"],
    ),
    "broadcast-op": (
        "%x: tensor<3xf32>",
        "%y = atomic.broadcast %x : (tensor<3xf32>) -> tensor<4x5xf32>",
        ["broadcast"],
    ),
    "broadcast-to-lower-rank": (
        "%x: tensor<1x5xf32>",
        "%y = atomic.broadcast %x : (tensor<1x5xf32>) -> tensor<5xf32>",
        ["cannot broadcast tensor<1x5xf32> to tensor<5xf32>"],
    ),
    "mixed-element-types": (
        "%a: tensor<4xf32>, %b: tensor<4xf16>",
        "%c = atomic.mul %a, %b : (tensor<4xf32>, tensor<4xf16>) -> tensor<4xf32>",
        ["same element type"],
    ),
    "matmul-contraction": (
        "%a: tensor<4x8xf32>, %b: tensor<7x16xf32>",
        "%c = atomic.matmul %a, %b : (tensor<4x8xf32>, tensor<7x16xf32>) -> tensor<4x16xf32>",
        ["contraction dimensions differ: 8 and 7"],
    ),
    "matmul-transposed-contraction": (
        "%a: tensor<4x8xf32>, %b: tensor<8x16xf32>",
        (
            "%c = atomic.matmul %a, %b {transpose_b = true} "
            ": (tensor<4x8xf32>, tensor<8x16xf32>) -> tensor<4x8xf32>"
        ),
        ["contraction dimensions differ: 8 and 16"],
    ),
    "matmul-batch": (
        "%a: tensor<2x4x8xf32>, %b: tensor<3x8x4xf32>",
        "%c = atomic.matmul %a, %b : (tensor<2x4x8xf32>, tensor<3x8x4xf32>) -> tensor<2x4x4xf32>",
        ["not broadcast-compatible"],
    ),
    "concat-axis": (
        "%a: tensor<2x8xf32>, %b: tensor<3x8xf32>",
        (
            "%c = atomic.concat %a, %b {axis = 2} "
            ": (tensor<2x8xf32>, tensor<3x8xf32>) -> tensor<5x8xf32>"
        ),
        ["axis 2 out of range for rank 2"],
    ),
    "concat-shapes": (
        "%a: tensor<2x8xf32>, %b: tensor<3x7xf32>",
        (
            "%c = atomic.concat %a, %b {axis = 0} "
            ": (tensor<2x8xf32>, tensor<3x7xf32>) -> tensor<5x8xf32>"
        ),
        ["differ outside axis 0"],
    ),
    "split-sizes": (
        "%x: tensor<5x8xf32>",
        (
            "%a, %b = atomic.split %x {axis = 0, sizes = [2, 2]} "
            ": (tensor<5x8xf32>) -> (tensor<2x8xf32>, tensor<2x8xf32>)"
        ),
        ["sizes [2, 2] do not add up", "(5)"],
    ),
    "split-axis": (
        "%x: tensor<5x8xf32>",
        (
            "%a, %b = atomic.split %x {axis = -3, sizes = [2, 3]} "
            ": (tensor<5x8xf32>) -> (tensor<2x8xf32>, tensor<3x8xf32>)"
        ),
        ["axis -3 out of range for rank 2"],
    ),
    "slice-bounds": (
        "%x: tensor<4x8xf32>",
        (
            "%y = atomic.slice %x {start = [0, 2], stop = [4, 9], step = [1, 1]} "
            ": (tensor<4x8xf32>) -> tensor<4x7xf32>"
        ),
        ["bounds [2, 9) of dim 1 are outside [0, 8]"],
    ),
    "slice-step": (
        "%x: tensor<4x8xf32>",
        (
            "%y = atomic.slice %x {start = [0, 0], stop = [4, 8], step = [1, 0]} "
            ": (tensor<4x8xf32>) -> tensor<4x8xf32>"
        ),
        ["step 0 of dim 1 must be >= 1"],
    ),
    "slice-entries": (
        "%x: tensor<4x8xf32>",
        (
            "%y = atomic.slice %x {start = [0], stop = [4], step = [1]} "
            ": (tensor<4x8xf32>) -> tensor<4x8xf32>"
        ),
        ["one entry per dim (2)"],
    ),
    "gather-float-indices": (
        "%t: tensor<10x4xf32>, %i: tensor<3xf32>",
        "%y = atomic.gather %t, %i : (tensor<10x4xf32>, tensor<3xf32>) -> tensor<3x4xf32>",
        ["indices must be integers"],
    ),
    "write-rows-indices": (
        "%x: tensor<8x4xf32>, %i: tensor<2x1xi64>, %v: tensor<2x4xf32>",
        (
            "%y = atomic.write_rows %x, %i, %v "
            ": (tensor<8x4xf32>, tensor<2x1xi64>, tensor<2x4xf32>) -> tensor<8x4xf32>"
        ),
        ["indices must be a vector of integers, got tensor<2x1xi64>"],
    ),
    "write-rows-values": (
        "%x: tensor<8x4xf32>, %i: tensor<2xi64>, %v: tensor<3x4xf32>",
        (
            "%y = atomic.write_rows %x, %i, %v "
            ": (tensor<8x4xf32>, tensor<2xi64>, tensor<3x4xf32>) -> tensor<8x4xf32>"
        ),
        ["values must be tensor<2x4xf32> (x with a row per index along axis 0)"],
    ),
    "where-cond": (
        "%c: tensor<4xf32>, %a: tensor<4xf32>",
        (
            "%y = atomic.where %c, %a, %a "
            ": (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>"
        ),
        ["condition must have element type i1"],
    ),
    "result-type": (
        "%a: tensor<3x4xf32>",
        "%c = atomic.add %a, %a : (tensor<3x4xf32>, tensor<3x4xf32>) -> tensor<4x3xf32>",
        ["result type tensor<4x3xf32> does not match the inferred type tensor<3x4xf32>"],
    ),
    "cmp-result-type": (
        "%a: tensor<4xf32>",
        '%c = atomic.cmp %a, %a {pred = "lt"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>',
        ["does not match the inferred type tensor<4xi1>"],
    ),
    "missing-attribute": (
        f"%x: {T}",
        f"%y = atomic.transpose %x : ({T}) -> {T}",
        ["requires attribute 'perm'"],
    ),
    "cmp-missing-pred": (
        "%a: tensor<4xf32>",
        "%c = atomic.cmp %a, %a : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>",
        ["requires attribute 'pred'"],
    ),
    "cmp-bad-pred": (
        "%a: tensor<4xf32>",
        '%c = atomic.cmp %a, %a {pred = "lte"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xi1>',
        ["attribute 'pred' must be one of", '"le"'],
    ),
    "unknown-attribute": (
        "%a: tensor<4xf32>",
        "%c = atomic.add %a, %a {alpha = 2} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>",
        ["unknown attribute 'alpha'"],
    ),
    "attribute-kind": (
        "%x: tensor<4x8xf32>",
        "%s = atomic.reduce_sum %x {axes = 1} : (tensor<4x8xf32>) -> tensor<4xf32>",
        ["attribute 'axes' must be an array of integers"],
    ),
    "operand-count": (
        "%a: tensor<4xf32>",
        (
            "%c = atomic.add %a, %a, %a "
            ": (tensor<4xf32>, tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>"
        ),
        ["expected 2 operands, but got 3"],
    ),
    "unary-operand-count": (
        "%a: tensor<4xf32>",
        "%c = atomic.exp %a, %a : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>",
        ["expected 1 operand, but got 2"],
    ),
    "reduce-axis-range": (
        "%x: tensor<4x8xf32>",
        "%s = atomic.reduce_max %x {axes = [2]} : (tensor<4x8xf32>) -> tensor<4xf32>",
        ["axis 2 out of range for rank 2"],
    ),
    "reduce-repeated-axis": (
        "%x: tensor<4x8xf32>",
        "%s = atomic.reduce_min %x {axes = [1, -1]} : (tensor<4x8xf32>) -> tensor<4xf32>",
        ["repeat an axis"],
    ),
    "reduce-keepdims-type": (
        "%x: tensor<4x8xf32>",
        (
            "%s = atomic.reduce_sum %x {axes = [1], keepdims = true} "
            ": (tensor<4x8xf32>) -> tensor<4xf32>"
        ),
        ["inferred type tensor<4x1xf32>"],
    ),
    "exp-integer": (
        "%x: tensor<4xi32>",
        "%y = atomic.exp %x : (tensor<4xi32>) -> tensor<4xi32>",
        ["float element type"],
    ),
    "cast-shape": (
        "%x: tensor<4xf32>",
        "%y = atomic.cast %x : (tensor<4xf32>) -> tensor<2x2xf16>",
        ["cannot change the shape"],
    ),
    "iota-axis": (
        "",
        "%i = atomic.iota {axis = 2} : () -> tensor<4x8xi32>",
        ["axis 2 out of range for rank 2"],
    ),
    "constant-type": (
        "",
        "%c = atomic.constant {value = dense<0.5> : tensor<4xf32>} : () -> tensor<5xf32>",
        ["does not match the inferred type tensor<4xf32>"],
    ),
}


@pytest.mark.parametrize("case", sorted(ATOMIC_INVALID))
def test_atomic_invalid(case):
    args, body, words = ATOMIC_INVALID[case]
    expect_error(args, body, *words)


# -- hl -------------------------------------------------------------------------------------------

HL_INVALID = {
    "softmax-axis": (
        f"%x: {T}",
        f"%y = hl.softmax %x {{axis = 2}} : ({T}) -> {T}",
        ["axis 2 out of range for rank 2"],
    ),
    "log-softmax-negative-axis": (
        f"%x: {T}",
        f"%y = hl.log_softmax %x {{axis = -3}} : ({T}) -> {T}",
        ["axis -3 out of range for rank 2"],
    ),
    "softmax-integer": (
        "%x: tensor<4xi32>",
        "%y = hl.softmax %x : (tensor<4xi32>) -> tensor<4xi32>",
        ["float element type"],
    ),
    "softmax-result-type": (
        f"%x: {T}",
        f"%y = hl.softmax %x : ({T}) -> tensor<4x16xf16>",
        [f"does not match the inferred type {T}"],
    ),
    "tanh-integer": (
        "%x: tensor<4xi32>",
        "%y = hl.tanh %x : (tensor<4xi32>) -> tensor<4xi32>",
        ["float element type"],
    ),
    "relu-i1": (
        "%x: tensor<4xi1>",
        "%y = hl.relu %x : (tensor<4xi1>) -> tensor<4xi1>",
        ["float or an integer"],
    ),
    "gelu-approximate": (
        f"%x: {T}",
        f'%y = hl.gelu %x {{approximate = "fast"}} : ({T}) -> {T}',
        ["attribute 'approximate' must be one of", '"none"', '"tanh"'],
    ),
    "sigmoid-unknown-attribute": (
        f"%x: {T}",
        f"%y = hl.sigmoid %x {{axis = 0}} : ({T}) -> {T}",
        ["unknown attribute 'axis' (known: none)"],
    ),
    "mean-missing-axes": (
        f"%x: {T}",
        f"%y = hl.mean %x : ({T}) -> tensor<4xf32>",
        ["requires attribute 'axes'"],
    ),
    "mean-axes": (
        f"%x: {T}",
        f"%y = hl.mean %x {{axes = [0, -2]}} : ({T}) -> tensor<16xf32>",
        ["repeat an axis"],
    ),
    "mean-keepdims-type": (
        f"%x: {T}",
        f"%y = hl.mean %x {{axes = [-1], keepdims = true}} : ({T}) -> tensor<4xf32>",
        ["inferred type tensor<4x1xf32>"],
    ),
    "layernorm-gamma": (
        f"%x: {T}, %g: tensor<8xf32>, %b: tensor<16xf32>",
        f"%y = hl.layernorm %x, %g, %b : ({T}, tensor<8xf32>, tensor<16xf32>) -> {T}",
        ["gamma tensor<8xf32> does not broadcast to shape [16]"],
    ),
    "layernorm-beta-rank": (
        f"%x: {T}, %g: tensor<16xf32>, %b: {T}",
        f"%y = hl.layernorm %x, %g, %b : ({T}, tensor<16xf32>, {T}) -> {T}",
        [f"beta {T} does not broadcast to shape [16]"],
    ),
    "layernorm-axis-gamma": (  # axis 0: gamma must fit [4, 16]; [16] would, [4] does not
        f"%x: {T}, %g: tensor<4xf32>, %b: tensor<16xf32>",
        f"%y = hl.layernorm %x, %g, %b {{axis = 0}} : ({T}, tensor<4xf32>, tensor<16xf32>) -> {T}",
        ["gamma tensor<4xf32> does not broadcast to shape [4, 16]"],
    ),
    "layernorm-axis": (
        f"%x: {T}, %g: tensor<16xf32>, %b: tensor<16xf32>",
        f"%y = hl.layernorm %x, %g, %b {{axis = 2}} : ({T}, tensor<16xf32>, tensor<16xf32>) -> {T}",
        ["axis 2 out of range for rank 2"],
    ),
    "layernorm-eps": (
        f"%x: {T}, %g: tensor<16xf32>, %b: tensor<16xf32>",
        (
            f"%y = hl.layernorm %x, %g, %b {{eps = -1.0}} "
            f": ({T}, tensor<16xf32>, tensor<16xf32>) -> {T}"
        ),
        ["eps -1.0 must be non-negative"],
    ),
    "layernorm-dtype": (
        f"%x: {T}, %g: tensor<16xf16>, %b: tensor<16xf32>",
        f"%y = hl.layernorm %x, %g, %b : ({T}, tensor<16xf16>, tensor<16xf32>) -> {T}",
        ["same element type"],
    ),
    "layernorm-operand-count": (
        f"%x: {T}, %g: tensor<16xf32>",
        f"%y = hl.layernorm %x, %g : ({T}, tensor<16xf32>) -> {T}",
        ["expected 3 operands, but got 2"],
    ),
    "rmsnorm-gamma": (
        f"%x: {T}, %g: tensor<4xf32>",
        f"%y = hl.rmsnorm %x, %g : ({T}, tensor<4xf32>) -> {T}",
        ["gamma tensor<4xf32> does not broadcast to shape [16]"],
    ),
    "linear-contraction": (
        "%x: tensor<8x32xf32>, %w: tensor<16x4xf32>",
        "%y = hl.linear %x, %w : (tensor<8x32xf32>, tensor<16x4xf32>) -> tensor<8x4xf32>",
        ["contraction dimensions differ", "32", "16"],
    ),
    "linear-w-rank": (
        "%x: tensor<8x32xf32>, %w: tensor<2x32x4xf32>",
        "%y = hl.linear %x, %w : (tensor<8x32xf32>, tensor<2x32x4xf32>) -> tensor<8x4xf32>",
        ["w rank 2"],
    ),
    "linear-bias": (
        "%x: tensor<8x32xf32>, %w: tensor<32x4xf32>, %b: tensor<8xf32>",
        (
            "%y = hl.linear %x, %w, %b "
            ": (tensor<8x32xf32>, tensor<32x4xf32>, tensor<8xf32>) -> tensor<8x4xf32>"
        ),
        ["bias tensor<8xf32> does not broadcast to shape [8, 4]"],
    ),
    "linear-operand-count": (
        "%x: tensor<8x32xf32>",
        (
            "%y = hl.linear %x, %x, %x, %x : (tensor<8x32xf32>, tensor<8x32xf32>, "
            "tensor<8x32xf32>, tensor<8x32xf32>) -> tensor<8x32xf32>"
        ),
        ["expected 2 or 3 operands, but got 4"],
    ),
    "attention-head-dim": (
        "%q: tensor<2x8x64xf32>, %k: tensor<2x8x32xf32>",
        (
            "%o = hl.attention %q, %k, %k : (tensor<2x8x64xf32>, tensor<2x8x32xf32>, "
            "tensor<2x8x32xf32>) -> tensor<2x8x32xf32>"
        ),
        ["q and k head dims differ: 64 and 32"],
    ),
    "attention-kv-seq": (
        "%q: tensor<2x8x64xf32>, %v: tensor<2x6x64xf32>",
        (
            "%o = hl.attention %q, %q, %v : (tensor<2x8x64xf32>, tensor<2x8x64xf32>, "
            "tensor<2x6x64xf32>) -> tensor<2x8x64xf32>"
        ),
        ["k and v sequence lengths differ: 8 and 6"],
    ),
    "attention-rank": (
        "%q: tensor<64xf32>",
        (
            "%o = hl.attention %q, %q, %q "
            ": (tensor<64xf32>, tensor<64xf32>, tensor<64xf32>) -> tensor<64xf32>"
        ),
        ["rank >= 2"],
    ),
    "attention-batch": (
        "%q: tensor<2x8x64xf32>, %k: tensor<3x8x64xf32>",
        (
            "%o = hl.attention %q, %k, %k : (tensor<2x8x64xf32>, tensor<3x8x64xf32>, "
            "tensor<3x8x64xf32>) -> tensor<2x8x64xf32>"
        ),
        ["not broadcast-compatible"],
    ),
    "attention-result-type": (
        "%q: tensor<2x8x64xf32>, %k: tensor<2x5x64xf32>",
        (
            "%o = hl.attention %q, %k, %k : (tensor<2x8x64xf32>, tensor<2x5x64xf32>, "
            "tensor<2x5x64xf32>) -> tensor<2x5x64xf32>"
        ),
        ["inferred type tensor<2x8x64xf32>"],
    ),
    "attention-mask": (
        "%q: tensor<2x8x64xf32>, %m: tensor<8x7xf32>",
        (
            "%o = hl.attention %q, %q, %q, %m : (tensor<2x8x64xf32>, tensor<2x8x64xf32>, "
            "tensor<2x8x64xf32>, tensor<8x7xf32>) -> tensor<2x8x64xf32>"
        ),
        ["mask tensor<8x7xf32> does not broadcast to shape [2, 8, 8]"],
    ),
    "attention-mask-rank": (
        "%q: tensor<8x64xf32>, %m: tensor<2x8x8xf32>",
        (
            "%o = hl.attention %q, %q, %q, %m : (tensor<8x64xf32>, tensor<8x64xf32>, "
            "tensor<8x64xf32>, tensor<2x8x8xf32>) -> tensor<8x64xf32>"
        ),
        ["mask tensor<2x8x8xf32> does not broadcast to shape [8, 8]"],
    ),
    "attention-mask-dtype": (
        "%q: tensor<8x64xf32>, %m: tensor<8x8xi1>",
        (
            "%o = hl.attention %q, %q, %q, %m : (tensor<8x64xf32>, tensor<8x64xf32>, "
            "tensor<8x64xf32>, tensor<8x8xi1>) -> tensor<8x64xf32>"
        ),
        ["same element type"],
    ),
    "attention-causal-seq": (
        "%q: tensor<8x64xf32>, %k: tensor<4x64xf32>",
        (
            "%o = hl.attention %q, %k, %k {causal = true} "
            ": (tensor<8x64xf32>, tensor<4x64xf32>, tensor<4x64xf32>) -> tensor<8x64xf32>"
        ),
        ["causal attention needs seq_q <= seq_k, got 8 > 4"],
    ),
    "attention-scale-kind": (
        "%q: tensor<8x64xf32>",
        (
            '%o = hl.attention %q, %q, %q {scale = "auto"} '
            ": (tensor<8x64xf32>, tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>"
        ),
        ["attribute 'scale' must be a float"],
    ),
    "attention-operand-count": (
        "%q: tensor<8x64xf32>",
        "%o = hl.attention %q, %q : (tensor<8x64xf32>, tensor<8x64xf32>) -> tensor<8x64xf32>",
        ["expected 3 or 4 operands, but got 2"],
    ),
}


@pytest.mark.parametrize("case", sorted(HL_INVALID))
def test_hl_invalid(case):
    args, body, words = HL_INVALID[case]
    expect_error(args, body, *words)


def test_error_renders_like_mlir_opt():
    err = expect_error(
        f"%x: {T}",
        f"%y = hl.softmax %x {{axis = 2}} : ({T}) -> {T}",
        "axis 2 out of range for rank 2",
    )
    assert str(err) == (
        "t.tg:2:8: error: 'hl.softmax' op axis 2 out of range for rank 2\n"
        f"  %y = hl.softmax %x {{axis = 2}} : ({T}) -> {T}\n"
        "       ^"
    )


def test_error_on_a_later_line_points_at_that_op():
    body = f"""
        %a = hl.tanh %x : ({T}) -> {T}
        %b = hl.softmax %a {{axis = -1}} : ({T}) -> {T}
        %c = atomic.transpose %b {{perm = [1, 1]}} : ({T}) -> tensor<16x4xf32>
    """
    expect_error(f"%x: {T}", body, "not a permutation")


# -- valid IR -------------------------------------------------------------------------------------

VALID = [
    (
        "%x: tensor<2x4x16xf32>, %g: tensor<f32>, %b: tensor<1x16xf32>",
        (
            "%y = hl.layernorm %x, %g, %b {axis = -2, eps = 0.001} "
            ": (tensor<2x4x16xf32>, tensor<f32>, tensor<1x16xf32>) -> tensor<2x4x16xf32>"
        ),
    ),
    (
        "%x: tensor<2x4x16xbf16>, %g: tensor<4x16xbf16>",
        (
            "%y = hl.rmsnorm %x, %g {axis = 1} "
            ": (tensor<2x4x16xbf16>, tensor<4x16xbf16>) -> tensor<2x4x16xbf16>"
        ),
    ),
    (
        "%x: tensor<16xf16>, %w: tensor<16x8xf16>",
        "%y = hl.linear %x, %w : (tensor<16xf16>, tensor<16x8xf16>) -> tensor<8xf16>",
    ),
    (
        (
            "%q: tensor<2x4x3x8xf32>, %k: tensor<1x4x9x8xf32>, %v: tensor<2x1x9x5xf32>, "
            "%m: tensor<3x9xf32>"
        ),
        (
            "%o = hl.attention %q, %k, %v, %m {causal = true, scale = 0.5} : (tensor<2x4x3x8xf32>, "
            "tensor<1x4x9x8xf32>, tensor<2x1x9x5xf32>, tensor<3x9xf32>) -> tensor<2x4x3x5xf32>"
        ),
    ),
    (
        "%x: tensor<4x1x16xf32>",
        (
            "%y = hl.mean %x {axes = [-1, 0], keepdims = true} "
            ": (tensor<4x1x16xf32>) -> tensor<1x1x1xf32>"
        ),
    ),
    ("%x: tensor<4xi32>", "%y = hl.relu %x : (tensor<4xi32>) -> tensor<4xi32>"),
    (f"%x: {T}", f'%y = hl.gelu %x {{approximate = "none"}} : ({T}) -> {T}'),
    (f"%x: {T}", f"%y = hl.log_softmax %x {{axis = -2}} : ({T}) -> {T}"),
]


@pytest.mark.parametrize("args, body", VALID)
def test_valid(args, body):
    module = parse_module(function(args, body), "t.tg")
    verify(module)
    assert print_op(parse_module(print_op(module))) == print_op(module)


_EXAMPLE = re.compile(r"`?((?:%[\w.]+(?:, %[\w.]+)* = )?(\w+\.\w+)[^`\n]*: \(.*)`?")


def docstring_example(name: str) -> tuple[str, str]:
    """(function arguments, op line) from the syntax example in op `name`'s docstring."""
    for line in OPS[name].__doc__.splitlines():
        m = _EXAMPLE.search(line)
        if m and m.group(2) == name:
            text = m.group(1).rstrip("`").strip()
            ins = re.search(r": \((.*?)\) -> ", text).group(1)
            types = re.split(r",\s*(?=tensor<)", ins) if ins else []
            rest = text.split(name, 1)[1]
            names = re.findall(r"%[\w.]+", rest.split("{")[0].split(":")[0])
            args = ", ".join(f"{n}: {t}" for n, t in zip(dict.fromkeys(names), types))
            return args, text
    raise AssertionError(f"{name}: no syntax example in the docstring")


@pytest.mark.parametrize("name", sorted(op.name for d in ("atomic", "hl") for op in dialect_ops(d)))
def test_docstring_example_verifies(name):
    args, line = docstring_example(name)
    verify(parse_module(function(args, line), "doc.tg"))
