"""`atomic.write_rows` written in place (tgc/donation.py): which operands a kernel may
overwrite, and numpy's and the GPU's kernels writing the rows into the operand's own memory
there and into a copy elsewhere, each on fresh random inputs against the float64 meaning.

The GPU's tests are marked `cuda` (skipped without one); its kernel's source is compiled by nvcc
here wherever nvcc is installed.
"""

from __future__ import annotations

import numpy as np
import pytest
from test_attention_tc import NVCC, compile_kernels

import tgc
import tgc.planner
from tgc.codegen.write_rows import write_rows_kernel
from tgc.dialects.kernel import CallOp
from tgc.donation import may_overwrite
from tgc.parser import parse_module
from tgc.planner.cost import DictCostSource, RooflineCostSource
from tgc.planner.executor import PlannedFunction
from tgc.planner.select import select_kernels
from tgc.runtime.interpreter import run_function
from tgc.types import TensorType

C, IX, V = "tensor<2x8x4xf32>", "tensor<3xi64>", "tensor<2x3x4xf32>"

# Which write may go in place, by the name of its result (module doc of tgc/donation.py).
WRITES = f"""
func.func @f(%cache: {C} {{tgc.donated}}, %x: {C}, %w: {C} {{tgc.param}}, %i: {IX}, %v: {V})
    -> ({C}, {C}, {C}, {C}, {C}, {C}, {C}, {C}) {{
  %donated = atomic.write_rows %cache, %i, %v {{axis = 1}} : ({C}, {IX}, {V}) -> {C}
  %given = atomic.write_rows %x, %i, %v {{axis = 1}} : ({C}, {IX}, {V}) -> {C}
  %made = atomic.add %x, %x : ({C}, {C}) -> {C}
  %fresh = atomic.write_rows %made, %i, %v {{axis = 1}} : ({C}, {IX}, {V}) -> {C}
  %chained = atomic.write_rows %fresh, %i, %v {{axis = 1}} : ({C}, {IX}, {V}) -> {C}
  %packed = atomic.add %w, %w : ({C}, {C}) -> {C}
  %kept = atomic.write_rows %packed, %i, %v {{axis = 1}} : ({C}, {IX}, {V}) -> {C}
  %other = atomic.div %x, %w : ({C}, {C}) -> {C}
  %flat = atomic.reshape %other : ({C}) -> tensor<2x32xf32>
  %back = atomic.reshape %flat : (tensor<2x32xf32>) -> {C}
  %viewed = atomic.write_rows %back, %i, %v {{axis = 1}} : ({C}, {IX}, {V}) -> {C}
  %read = atomic.mul %x, %x : ({C}, {C}) -> {C}
  %shared = atomic.write_rows %read, %i, %v {{axis = 1}} : ({C}, {IX}, {V}) -> {C}
  %twice = atomic.sub %read, %x : ({C}, {C}) -> {C}
  func.return %donated, %given, %chained, %kept, %viewed, %shared, %twice, %x
      : {C}, {C}, {C}, {C}, {C}, {C}, {C}, {C}
}}
"""
IN_PLACE = {"donated", "fresh", "chained"}


def test_a_write_goes_in_place_where_its_operand_is_free_to_take():
    func = parse_module(WRITES).funcs[0]
    found = {
        op.results[0].name_hint: may_overwrite(op, 0)
        for op in func.body.ops
        if op.name == "atomic.write_rows"
    }
    assert found == {name: name in IN_PLACE for name in found}, found
    # the second operand (the indices) is read by every write: never overwritten
    assert not any(may_overwrite(op, 1) for op in func.body.ops if op.name == "atomic.write_rows")


def test_a_donated_argument_is_no_parameter():
    text = WRITES.replace(
        "%cache: tensor<2x8x4xf32> {tgc.donated}", "%cache: " + C + " {tgc.donated, tgc.param}"
    )
    with pytest.raises(tgc.TgcError, match=r"argument #0 is a parameter .* and donated") as info:
        tgc.verify(parse_module(text, "donated.tg"))
    assert info.value.loc.file == "donated.tg"


CACHE = "tensor<2x16x3xf32>"
ROWS = "tensor<2x5x3xf32>"
UPDATE = f"""
func.func @update(%cache: {CACHE} {{tgc.donated}}, %keep: {CACHE}, %i: tensor<5xi32>, %v: {ROWS})
    -> ({CACHE}, {CACHE}) {{
  %new = atomic.write_rows %cache, %i, %v {{axis = 1}} : ({CACHE}, tensor<5xi32>, {ROWS}) -> {CACHE}
  %other = atomic.write_rows %keep, %i, %v {{axis = 1}} : ({CACHE}, tensor<5xi32>, {ROWS}) -> {CACHE}
  func.return %new, %other : {CACHE}, {CACHE}
}}
"""


def update_inputs(seed: int) -> list[np.ndarray]:
    rng = np.random.default_rng(seed)
    indices = rng.integers(0, 16, 5).astype(np.int32)
    indices[3] = indices[0]  # a repeated index: the last row given for it is written
    return [
        rng.uniform(-2, 2, (2, 16, 3)).astype(np.float32),
        rng.uniform(-2, 2, (2, 16, 3)).astype(np.float32),
        indices,
        rng.uniform(5, 9, (2, 5, 3)).astype(np.float32),
    ]


def planned(text: str, costs=None, backends=("numpy",)) -> PlannedFunction:
    module = parse_module(text)
    costs = costs or RooflineCostSource()
    select_kernels(module.funcs[0], costs, tolerance=1e-5, backends=backends)
    return PlannedFunction(module.funcs[0])


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_numpy_writes_a_donated_cache_in_place_and_copies_the_other(seed):
    tgc.planner.load_backends(["numpy"])
    run = planned(UPDATE)
    assert {op.attr("callee") for op in run.func.body.ops if isinstance(op, CallOp)} == {
        "numpy.atomic.write_rows"
    }
    cache, keep, indices, values = update_inputs(seed)
    want = run_function(parse_module(UPDATE).funcs[0], [cache, keep, indices, values], "f64")
    kept = keep.copy()
    new, other = run([cache, keep, indices, values])
    assert np.shares_memory(new, cache) and np.array_equal(cache, want[0])
    assert not np.shares_memory(other, keep) and np.array_equal(keep, kept)
    assert np.array_equal(other, want[1])


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_kernel_compiles_without_spills_or_warnings(tmp_path):
    kernels = [
        write_rows_kernel(TensorType.get((1, 8, 640, 64), "bf16"), TensorType.get((1,), "i64"), 2),
        write_rows_kernel(TensorType.get((2, 16, 3), "f32"), TensorType.get((5,), "i32"), -2),
        write_rows_kernel(TensorType.get((4096, 8), "i1"), TensorType.get((9,), "i64"), 0),
    ]
    logs = compile_kernels(
        tmp_path, [(k, ("-arch=sm_90", "-cubin", "-Xptxas", "-v")) for k in kernels]
    )
    bad = [log for log in logs if "0 bytes spill stores" not in log or "warning" in log]
    assert not bad, "\n\n".join(bad)


@pytest.mark.cuda
@pytest.mark.parametrize("seed", [0, 1, 2])
def test_the_gpu_writes_a_donated_cache_in_place_and_copies_the_other(seed):
    tgc.planner.load_backends(["cuda"])
    try:
        from tgc.planner.backends.cuda import DeviceArray, from_host, to_host

        text = UPDATE.replace(CACHE, CACHE[:-1] + ', "cuda">').replace(
            ROWS, ROWS[:-1] + ', "cuda">'
        )
        text = text.replace("tensor<5xi32>", 'tensor<5xi32, "cuda">')
        costs = DictCostSource({"cuda.write_rows": 1e-9}, fallback=RooflineCostSource())
        run = planned(text, costs, backends=("cuda",))
        assert {op.attr("callee") for op in run.func.body.ops if isinstance(op, CallOp)} == {
            "cuda.write_rows"
        }
        inputs = update_inputs(seed)
        want = run_function(parse_module(UPDATE).funcs[0], inputs, "f64")
        device = [from_host(a, None) for a in inputs]
        new, other = run(device)
        assert DeviceArray.of(new).ptr == device[0].ptr  # the cache's own memory
        assert np.array_equal(to_host(device[0]), want[0])
        assert DeviceArray.of(other).ptr != device[1].ptr
        assert np.array_equal(to_host(device[1]), inputs[1])  # untouched
        assert np.array_equal(to_host(other), want[1])
    finally:
        tgc.planner.unload_backends()


def test_numpy_copies_a_donated_array_it_may_not_write():
    tgc.planner.load_backends(["numpy"])
    run = planned(UPDATE)
    cache, keep, indices, values = update_inputs(3)
    want = run_function(parse_module(UPDATE).funcs[0], [cache, keep, indices, values], "f64")
    cache.flags.writeable = False  # a caller's read-only array, donated all the same
    kept = cache.copy()
    new, _ = run([cache, keep, indices, values])
    assert np.array_equal(new, want[0]) and np.array_equal(cache, kept)
