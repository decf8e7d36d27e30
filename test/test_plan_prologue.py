"""The prologue of a CUDA plan (codegen/plan.py `prologue_steps`): the steps that read only fixed
buffers (parameter inputs, constants, results of earlier prologue steps), which the PyCUDA runtime
runs once per set of parameters. Plans are built on the CPU from the `cuda` pipeline's placed IR;
running them is test/test_cuda_params.py's business (GPU).
"""

from __future__ import annotations

import gc
import weakref

import numpy as np

import pytest

import tgc.dialects  # noqa: F401  (registers the ops)
from tgc.codegen.plan import (
    Buffer,
    DeviceCopy,
    Gemm,
    Launch,
    Plan,
    build_plan,
    prologue_steps,
    step_reads,
    step_writes,
)
from tgc.codegen.render import KernelSource
from tgc.parser import parse_module
from tgc.pass_manager import PassManager
from tgc.runtime.param_set import ParamSet
from tgc.types import TensorType

from test_codegen import EXAMPLES, ROOT


def qkv(dtype: str, params: bool, m: int = 8192, k: int = 1024) -> str:
    """GPT-2's three projections of one input (x m x k, weights k x k)."""
    x, w = f"tensor<{m}x{k}x{dtype}>", f"tensor<{k}x{k}x{dtype}>"
    p = " {tgc.param}" if params else ""
    return f"""func.func @qkv(%x: {x}, %wq: {w}{p}, %wk: {w}{p}, %wv: {w}{p}) -> ({x}, {x}, {x}) {{
  %q = atomic.matmul %x, %wq : ({x}, {w}) -> {x}
  %k = atomic.matmul %x, %wk : ({x}, {w}) -> {x}
  %v = atomic.matmul %x, %wv : ({x}, {w}) -> {x}
  func.return %q, %k, %v : {x}, {x}, {x}
}}"""


def merged_qkv(dtype: str, params: bool, m: int = 8192, k: int = 1024) -> str:
    """The same projections already merged: one matmul on the concatenated weights, split.
    (`algebraic` no longer merges them itself here, since the function returns q, k and v and
    each piece of the split is then copied out: test/lit/algebraic/merge-results.tg.)"""
    x, w = f"tensor<{m}x{k}x{dtype}>", f"tensor<{k}x{k}x{dtype}>"
    w3, y3 = f"tensor<{k}x{3 * k}x{dtype}>", f"tensor<{m}x{3 * k}x{dtype}>"
    p = " {tgc.param}" if params else ""
    return f"""func.func @qkv(%x: {x}, %wq: {w}{p}, %wk: {w}{p}, %wv: {w}{p}) -> ({x}, {x}, {x}) {{
  %w = atomic.concat %wq, %wk, %wv {{axis = 1}} : ({w}, {w}, {w}) -> {w3}
  %y = atomic.matmul %x, %w : ({x}, {w3}) -> {y3}
  %q, %k, %v = atomic.split %y {{axis = 1, sizes = [{k}, {k}, {k}]}} : ({y3}) -> ({x}, {x}, {x})
  func.return %q, %k, %v : {x}, {x}, {x}
}}"""


def plan_of(text: str, pipeline: str = "cuda") -> Plan:
    module = parse_module(text)
    PassManager.from_text(pipeline).run(module)
    return build_plan(module.funcs[0])


def kinds(plan: Plan, steps) -> list[str]:
    return [type(plan.steps[i]).__name__ for i in steps]


def fixed_buffers(plan: Plan) -> set[int]:
    """Ids of the buffers a call does not change: parameter inputs, constants, and what the
    prologue writes."""
    fixed = {
        id(b)
        for b in plan.buffers
        if b.kind == "const" or (b.kind == "input" and b.index in plan.params)
    }
    for i in plan.prologue:
        fixed.update(id(b) for b in step_writes(plan.steps[i]))
    return fixed


def assert_exact_prologue(plan: Plan) -> None:
    """Sound (a prologue step reads only fixed buffers, written before it) and maximal (every
    other step reads something a call changes)."""
    fixed: set[int] = {
        id(b)
        for b in plan.buffers
        if b.kind == "const" or (b.kind == "input" and b.index in plan.params)
    }
    once = set(plan.prologue)
    for i, step in enumerate(plan.steps):
        reads_fixed = all(id(b) in fixed for b in step_reads(step))
        assert reads_fixed == (i in once), f"step {i} ({type(step).__name__})"
        if i in once:
            fixed.update(id(b) for b in step_writes(step))
    assert plan.per_call == [i for i in range(len(plan.steps)) if i not in once]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_merged_qkv_with_params_packs_the_weights_once(dtype):
    plan = plan_of(merged_qkv(dtype, params=True))
    assert plan.params == [1, 2, 3]
    (first,) = plan.prologue
    concat = plan.steps[first]
    assert isinstance(concat, Launch) and concat.kernel.ir_name == "qkv_concat"
    assert sorted(b.index for b in step_reads(concat)) == [1, 2, 3]
    assert all(b.kind == "input" for b in step_reads(concat))
    # the merged GEMM reads x and the packed weights, every call
    gemms = [i for i, s in enumerate(plan.steps) if isinstance(s, Gemm)]
    assert len(gemms) == 1 and gemms[0] in plan.per_call
    gemm = plan.steps[gemms[0]]
    assert (gemm.a.kind, gemm.a.index) == ("input", 0)
    assert gemm.b is step_writes(concat)[0]
    assert_exact_prologue(plan)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_plain_weights_have_no_prologue(dtype):
    """Nothing is a parameter: algebraic leaves the three GEMMs alone and no step is fixed."""
    plan = plan_of(qkv(dtype, params=False))
    assert plan.params == [] and plan.prologue == []
    assert kinds(plan, plan.per_call) == ["Gemm", "Gemm", "Gemm"]


def test_concat_of_plain_arguments_runs_every_call():
    """A merge written by hand on plain arguments: its concat is a per-call step."""
    x, w, w3, y = (
        "tensor<64x32xf32>",
        "tensor<32x32xf32>",
        "tensor<32x96xf32>",
        "tensor<64x96xf32>",
    )
    plan = plan_of(f"""func.func @f(%x: {x}, %a: {w}, %b: {w}, %c: {w}) -> {y} {{
  %w = atomic.concat %a, %b, %c {{axis = 1}} : ({w}, {w}, {w}) -> {w3}
  %y = atomic.matmul %x, %w : ({x}, {w3}) -> {y}
  func.return %y : {y}
}}""")
    assert plan.prologue == []
    assert kinds(plan, plan.per_call) == ["Launch", "Gemm"]


def test_a_step_reading_x_is_never_in_the_prologue():
    """x is read by the matmul, so the matmul and everything after it run every call, while the
    parameter's own computation and the copy of the parameter to a result run once."""
    f = """func.func @f(%x: tensor<8x4xf32>, %w: tensor<4x4xf32> {tgc.param}) -> (tensor<8x4xf32>, tensor<4x4xf32>) {
  %w2 = atomic.mul %w, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>
  %y = atomic.matmul %x, %w2 : (tensor<8x4xf32>, tensor<4x4xf32>) -> tensor<8x4xf32>
  %z = atomic.exp %y : (tensor<8x4xf32>) -> tensor<8x4xf32>
  func.return %z, %w : tensor<8x4xf32>, tensor<4x4xf32>
}"""
    plan = plan_of(f, "place-on-device")
    assert kinds(plan, range(len(plan.steps))) == ["Launch", "Gemm", "Launch", "DeviceCopy"]
    assert plan.prologue == [0, 3]  # w*w, and the copy of w to result 1
    for i in plan.per_call:
        assert not all(id(b) in fixed_buffers(plan) for b in step_reads(plan.steps[i]))
    assert_exact_prologue(plan)


def test_constants_alone_make_a_prologue_step():
    """No parameter, but a kernel computing from a constant only: it runs once too."""
    c = "[[1.0, 2.0], [3.0, 4.0]]"
    plan = plan_of(
        f"""func.func @f(%x: tensor<8x2xf32>) -> tensor<8x2xf32> {{
  %c = atomic.constant {{value = dense<{c}> : tensor<2x2xf32>}} : () -> tensor<2x2xf32>
  %e = atomic.exp %c : (tensor<2x2xf32>) -> tensor<2x2xf32>
  %y = atomic.matmul %x, %e : (tensor<8x2xf32>, tensor<2x2xf32>) -> tensor<8x2xf32>
  func.return %y : tensor<8x2xf32>
}}""",
        "place-on-device",
    )
    assert plan.params == [] and plan.prologue == [0]
    assert kinds(plan, plan.per_call) == ["Gemm"]


def test_prologue_steps_on_a_plan_built_by_hand():
    """The pure function alone: a GEMM of a parameter and a constant, a kernel reading nothing,
    a kernel reading x, and copies of a fixed and of a per-call buffer."""
    t = TensorType.get((4, 4), "f32")
    x, w = Buffer("input", t, index=0), Buffer("input", t, index=1)
    c, out0, out1 = Buffer("const", t), Buffer("output", t, index=0), Buffer("output", t, index=1)
    packed, filled, mixed = Buffer("scratch", t), Buffer("scratch", t), Buffer("scratch", t)

    def kernel(ins: int, outs: int) -> KernelSource:
        return KernelSource("k", "", "elementwise", ins, outs, (1, 1, 1), (1, 1, 1))

    gemm = Gemm("atomic.matmul", "f32", 4, 4, 4, 1, False, False, 0, 0, w, c, packed)
    steps = [
        gemm,
        Launch(kernel(0, 1), [filled]),  # an iota: reads nothing
        Launch(kernel(3, 1), [x, packed, filled, mixed]),
        DeviceCopy(packed, out0),
        DeviceCopy(mixed, out1),
    ]
    plan = Plan("f", [t, t], [t, t], [x, w, c, out0, out1, packed, filled, mixed], steps)
    assert prologue_steps(plan) == [1]  # nothing is a parameter: only the iota is fixed
    plan.params = [1]  # w: the GEMM of w and a constant, and the copy of its result
    assert prologue_steps(plan) == [0, 1, 3]
    gemm.a = x  # the GEMM now reads x, and so does everything after it
    assert prologue_steps(plan) == [1]
    plan.params = [0]  # x a parameter: everything is fixed
    assert prologue_steps(plan) == [0, 1, 2, 3, 4]


def test_packed_weights_keep_their_arena_bytes():
    """The prologue's result read on every call (the packed weights) shares its bytes with no
    other scratch buffer, so no per-call step overwrites it."""
    plan = plan_of(merged_qkv("bf16", params=True, m=512, k=256))
    (first,) = plan.prologue
    (packed,) = step_writes(plan.steps[first])
    assert packed.kind == "scratch"
    lo, hi = packed.offset, packed.offset + packed.nbytes
    others = [b for b in plan.buffers if b.kind == "scratch" and b is not packed]
    assert others  # the GEMM's result and the slices' outputs share the arena
    for b in others:
        assert b.offset + b.nbytes <= lo or b.offset >= hi, (b.name, b.offset, lo, hi)
    assert plan.scratch_bytes >= hi


@pytest.mark.parametrize("name", EXAMPLES)
@pytest.mark.parametrize("params", ["none", "weights"])
def test_examples_prologue_is_exact(name, params):
    """Every example, with no parameters and with every argument but the first one a parameter
    (its weights): the prologue is exactly the steps reading fixed buffers."""
    module = parse_module((ROOT / "examples" / name).read_text())
    func = module.funcs[0]
    if params == "weights":
        for i in range(1, len(func.body.args)):
            func.set_arg_attr(i, "tgc.param")
    PassManager.from_text("cuda").run(module)
    plan = build_plan(module.funcs[0])
    assert plan.params == ([] if params == "none" else list(range(1, len(plan.inputs))))
    assert_exact_prologue(plan)
    assert plan.per_call  # the first argument is read by some step every call


def test_param_set_knows_parameters_by_identity():
    """The runner's test for "same parameters": the very arrays, whatever the other inputs; an
    equal copy is another set (it re-uploads and repeats the prologue)."""
    rng = np.random.default_rng(0)
    x, w, b = rng.random((4, 3)), rng.random((3, 3)), rng.random(3)
    params = ParamSet([2, 1])
    assert params.positions == (1, 2)
    assert not params.same([x, w, b])  # nothing held yet
    params.hold([x, w, b])
    assert params.same([x, w, b])
    assert params.same([rng.random((4, 3)), w, b])  # a new x: same parameters
    assert not params.same([x, w.copy(), b])  # equal values, another array
    assert not params.same([x, w, b.copy()])
    none = ParamSet([])
    assert not none.same([x])
    none.hold([x])
    assert none.same([rng.random((4, 3))])  # no parameters: only the first call differs


def test_param_set_keeps_its_arrays_alive():
    """A held array cannot be freed, so a new array never takes its id and passes for it."""
    params = ParamSet([0])
    w = np.ones(4)
    ref = weakref.ref(w)
    params.hold([w])
    del w
    gc.collect()
    assert ref() is not None
    fresh = [np.ones(4) for _ in range(100)]
    assert not any(params.same([f]) for f in fresh)
    params.hold([fresh[0]])
    gc.collect()
    assert ref() is None  # released once another set is held
