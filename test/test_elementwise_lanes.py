"""The elementwise template's vector loads of inputs read through views along the last dim
(codegen/elementwise.py, its module doc): which reads become one vector per step, and that the
address each vector load starts at is the address lane 0 would read, lane l reading l elements
on, for every step (the generated C index arithmetic evaluated here, with C's integer division
on non-negative values); nvcc compiles the kernel. What the kernels compute on a GPU is
test_cuda.py's (its random regions go through this path)."""

from __future__ import annotations

import re

import numpy as np
import pytest
from nvcc_batch import NVCC, compile_unit
from test_codegen import fused_kernels

from tgc.codegen.kernels import generate_kernel
from tgc.codegen.render import prelude
from tgc.dialects.kernel import FusedOp
from tgc.parser import parse_module


def swiglu(rows: int, half: int, dtype: str = "bf16", axis_view: str = "split") -> str:
    g, h = f"tensor<{rows}x{2 * half}x{dtype}>", f"tensor<{rows}x{half}x{dtype}>"
    if axis_view == "split":
        halves = f"%a, %b = atomic.split %gu {{axis = 1, sizes = [{half}, {half}]}} : ({g}) -> ({h}, {h})"
    else:  # every second column from 0 and from 1: lanes read 2 elements apart
        halves = (
            f"%a = atomic.slice %gu {{start = [0, 0], stop = [{rows}, {2 * half}], step = [1, 2]}}"
            f" : ({g}) -> {h}\n"
            f"  %b = atomic.slice %gu {{start = [0, 1], stop = [{rows}, {2 * half}], step = [1, 2]}}"
            f" : ({g}) -> {h}"
        )
    return (
        f"func.func @swiglu(%gu: {g}) -> {h} {{\n  {halves}\n"
        f"  %s = hl.silu %a : ({h}) -> {h}\n"
        f"  %m = atomic.mul %s, %b : ({h}, {h}) -> {h}\n"
        f"  func.return %m : {h}\n}}\n"
    )


def kernel_source(text: str) -> str:
    (op,) = fused_kernels(text)
    return generate_kernel(op, {}).source


def c_value(expr: str, **names: int) -> int:
    """A C index expression of non-negative ints, evaluated as C does."""
    return eval(re.sub(r"(?<![/])/(?!/)", "//", expr), {}, dict(names))  # noqa: S307


def hoisted_offsets(source: str) -> list[str]:
    return re.findall(r"if \(reinterpret_cast<uintptr_t>\(in\d+ \+ \((.*)\)\) %", source)


@pytest.mark.parametrize("rows, half, dtype", [(64, 5632, "bf16"), (3, 40, "f32"), (5, 24, "f16")])
def test_the_halves_of_a_packed_projection_load_as_vectors(rows, half, dtype):
    source = kernel_source(swiglu(rows, half, dtype))
    offsets = hoisted_offsets(source)
    assert len(offsets) == 2, source
    lc0 = re.search(r"const idx_t lc0 = (.*);", source).group(1)
    vec = 16 // {"bf16": 2, "f16": 2, "f32": 4}[dtype]
    rng = np.random.default_rng(rows)
    for base in rng.integers(0, rows * half // vec, size=200) * vec:
        lane0 = c_value(lc0, base=int(base))
        for start, offset in zip((0, half), offsets):
            at = c_value(offset, base=int(base), lc0=lane0)
            for lane in range(vec):
                i = int(base) + lane
                want = (i // half) * 2 * half + i % half + start  # element i of that half
                assert at + lane == want


def test_lanes_that_do_not_read_consecutive_elements_load_one_by_one():
    """A slice with step 2 along the last dim: lane l reads 2l on, so no vector of it."""
    source = kernel_source(swiglu(4, 64, "bf16", axis_view="strided"))
    assert hoisted_offsets(source) == []
    assert "lc0" in source  # the steps are still within rows


def test_a_last_dim_that_is_no_multiple_of_the_width_keeps_per_lane_loads():
    source = kernel_source(swiglu(4, 60, "bf16"))  # 60 bf16: not a multiple of 8
    assert hoisted_offsets(source) == [] and "lc0" not in source


def test_reads_in_a_concats_branches_stay_per_lane():
    """A branch's loads are in bounds only for the lanes that take it: no vector of them."""
    x, c = "tensor<4x64xbf16>", "tensor<4x128xbf16>"
    module = parse_module(
        f"func.func @f(%x: {x}, %y: {x}) -> {c} {{\n"
        f'  %r = kernel.fused %x, %y {{name = "cat", template = "elementwise"}} : ({x}, {x}) -> {c} {{\n'
        f"  ^bb0(%a: {x}, %b: {x}):\n"
        f"    %c = atomic.concat %a, %b {{axis = 1}} : ({x}, {x}) -> {c}\n"
        f"    %e = atomic.exp %c : ({c}) -> {c}\n"
        f"    kernel.yield %e : {c}\n  }}\n"
        f"  func.return %r : {c}\n}}\n"
    )
    (fused,) = [op for op in module.funcs[0].body.ops if isinstance(op, FusedOp)]
    source = generate_kernel(fused, {}).source
    assert "lc0" in source and "else if" not in source.split("#pragma unroll")[0]
    assert "(lc - 64)" in source and hoisted_offsets(source) == []


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_kernel_with_vector_loads_of_views_compiles(tmp_path):
    source = prelude() + "\n" + kernel_source(swiglu(64, 5632))
    ok, log = compile_unit(tmp_path, source, ["-arch=sm_90", "-cubin"])
    assert ok, log[-3000:]


def test_a_0d_input_is_read_as_it_was():
    """A rank-0 input (a scalar argument) has no last coordinate: one load, no vector."""
    x, s = "tensor<4x64xbf16>", "tensor<bf16>"
    source = kernel_source(
        f"func.func @f(%x: {x}, %s: {s}) -> {x} {{\n"
        f"  %m = atomic.mul %x, %s : ({x}, {s}) -> {x}\n"
        f"  func.return %m : {x}\n}}\n"
    )
    assert "lc0" in source and hoisted_offsets(source) == [] and "in1[0]" in source
