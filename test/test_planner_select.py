"""select-kernels: the DP against brute force, tolerance, the IR it writes (planner/select.py,
planner/solve.py)."""

from __future__ import annotations

import random

import numpy as np
import pytest
from planner_fakes import (
    cone_matcher,
    fake_kernels,
    random_costs,
    random_dag,
    random_tree,
    with_graph_kernels,
    with_multi_output_regions,
)

import tgc
from tgc.diagnostics import TgcError
from tgc.pass_manager import PipelineError, parse_pipeline
from tgc.planner import kernel_backends, load_backends
from tgc.planner.cost import CachedCosts, DictCostSource
from tgc.planner.executor import run_plan
from tgc.planner.kernel import Kernel
from tgc.planner.options import PlanContext
from tgc.planner.paths import count_paths, paths, plan_cost
from tgc.planner.select import plan_function, select_kernels
from tgc.runtime.interpreter import random_inputs, run_function
from tgc.verifier import verify

MAX_PLANS = 4000  # brute force enumerates at most this many plans per case
# The real kernels these tests plan with: numpy's alone, whatever else is installed.
NUMPY = ("numpy",)


def _case(seed: int, shape: str):
    rng = random.Random(seed)
    kernels = fake_kernels(rng)
    if shape == "chain":
        func = random_tree(rng, rng.randint(1, 6), hl=0.15, chain=True)
    elif shape == "tree":
        func = random_tree(rng, rng.randint(1, 6), hl=0.15)
    else:
        func = random_dag(rng, rng.randint(2, 8), hl=0.1)
    kernels = with_graph_kernels(kernels) if seed % 2 == 0 else kernels
    ctx = PlanContext(kernels, match=cone_matcher)
    return func, ctx, CachedCosts(random_costs(rng, kernels))


def _brute_force(func, ctx, costs) -> float:
    return min(plan_cost(p, costs) for p in paths(func, ctx))


@pytest.mark.parametrize("shape", ["chain", "tree"])
@pytest.mark.parametrize("seed", range(150))
def test_dp_equals_brute_force_on_trees_and_chains(seed, shape):
    """Random costs, numpy and cuda kernels with copies, decompositions (hl.relu, hl.silu) and
    fake graph kernels: the DP's plan costs exactly the minimum over every path, and the DP's
    own value is that cost."""
    _assert_the_dp_finds_the_optimum(*_case(seed, shape))


def _assert_the_dp_finds_the_optimum(func, ctx, costs) -> None:
    """The DP's plan costs the minimum over every path, and the DP's own value is that cost."""
    if count_paths(func, ctx) > MAX_PLANS:
        pytest.skip("too many plans to enumerate")
    selection = plan_function(func, ctx, costs)
    best = _brute_force(func, ctx, costs)
    assert selection.exact
    assert selection.seconds == pytest.approx(best, rel=1e-12)
    assert selection.dp_seconds == pytest.approx(best, rel=1e-12)


@pytest.mark.parametrize("seed", range(200))
def test_dp_on_small_dags_is_exact_by_enumerating_shared_values(seed):
    """On small DAGs (shared values and arguments, values read inside graph kernels and
    outside) the solver enumerates the placements of shared values: exact."""
    func, ctx, costs = _case(10_000 + seed, "dag")
    if count_paths(func, ctx) > MAX_PLANS:
        pytest.skip("too many plans to enumerate")
    selection = plan_function(func, ctx, costs)
    assert selection.exact
    assert selection.seconds == pytest.approx(_brute_force(func, ctx, costs), rel=1e-12)


@pytest.mark.parametrize("seed", range(200))
def test_dp_with_regions_writing_two_results_equals_brute_force(seed):
    """A region that also writes a value it covers for later readers (a fused kernel with two
    outputs) is planned exactly: the DP's plan costs the minimum over every path, those that
    take such a region included."""
    _assert_the_dp_finds_the_optimum(*_multi_case(seed))


def _multi_case(seed: int):
    """A random DAG whose options include fake regions with two results (planner_fakes)."""
    rng = random.Random(30_000 + seed)
    kernels = with_multi_output_regions(fake_kernels(rng))
    func = random_dag(rng, rng.randint(3, 8), hl=0.1)
    return func, PlanContext(kernels, match=cone_matcher), CachedCosts(random_costs(rng, kernels))


def test_regions_writing_two_results_are_taken_where_they_pay():
    """Over the cases above, some optimal plans take a two-result region (so the comparison
    exercises them), and a plan that takes one runs the covered op nowhere else."""
    taken = 0
    for seed in range(200):
        selection = plan_function(*_multi_case(seed))
        steps = _flat_steps(selection.plan)
        covered = [op for s in steps for op in s.option.ops]
        assert len(covered) == len(set(covered))
        taken += any(s.option.kernel is not None and s.option.extra_outputs for s in steps)
    assert taken >= 10


def _flat_steps(plan) -> list:
    out = []
    for s in plan.steps:
        out += _flat_steps(s.nested) if s.nested is not None else [s]
    return out


def test_plain_recurrence_on_dags_is_a_valid_plan_within_the_measured_gap():
    """Without enumeration (budget 0, what a problem too large to enumerate gets) each reader
    pays for a shared value: the plan is valid and never below the optimum; over these DAGs the
    gap stays small (docs/planner.md gives the measured numbers)."""
    gaps = []
    for seed in range(120):
        func, ctx, costs = _case(20_000 + seed, "dag")
        if count_paths(func, ctx) > MAX_PLANS:
            continue
        selection = plan_function(func, ctx, costs, budget=0)
        best = _brute_force(func, ctx, costs)
        assert not selection.exact or len(func.body.ops) <= 2
        assert selection.seconds >= best * (1 - 1e-12)
        gaps.append(selection.seconds / best - 1)
    assert len(gaps) > 80
    assert np.mean(gaps) < 0.05 and max(gaps) < 1.0


# -- tolerance ---------------------------------------------------------------------------------------

TANH = """
func.func @f(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %y = hl.tanh %x : (tensor<4x16xf32>) -> tensor<4x16xf32>
  func.return %y : tensor<4x16xf32>
}
"""


@pytest.mark.parametrize(
    ("tolerance", "chosen"),
    [
        (0.0, "numpy.t.tanh"),
        (1e-5, "numpy.t.tanh"),
        (1e-3, "numpy.t.fast_tanh"),
        (1.0, "numpy.t.fast_tanh"),
    ],
)
def test_an_approximate_kernel_is_chosen_only_when_the_tolerance_allows(tolerance, chosen):
    exact = Kernel("numpy.t.tanh", "numpy", op="hl.tanh")
    fast = Kernel("numpy.t.fast_tanh", "numpy", op="hl.tanh", max_rel_error=1e-3)
    costs = DictCostSource({"numpy.t.tanh": 5e-6, "numpy.t.fast_tanh": 1e-6})
    module = tgc.parse(TANH)
    selection = select_kernels(
        module.funcs[0], costs, tolerance, kernels=[exact, fast], canonicalize=False
    )
    assert selection.plan.kernels() == [chosen]
    (call,) = [op for op in module.funcs[0].body.ops if op.name == "kernel.call"]
    assert call.attr("callee") == chosen


def test_no_kernel_within_tolerance_is_a_located_error():
    fast = Kernel("numpy.t.fast_tanh", "numpy", op="hl.tanh", max_rel_error=1e-3)
    module = tgc.parse(TANH, "tanh.tg")
    with pytest.raises(TgcError) as info:
        plan_function(
            module.funcs[0], PlanContext([fast], 1e-5, decompose=False), DictCostSource({})
        )
    assert "no kernel can run 'hl.tanh' within tolerance 1e-05" in info.value.message
    assert (info.value.loc.file, info.value.loc.line) == ("tanh.tg", 3)


# -- the IR it writes --------------------------------------------------------------------------------

MIXED = """
func.func @f(%x: tensor<64x64xf32>, %w: tensor<64x64xf32>) -> tensor<64x64xf32> {
  %m = atomic.matmul %x, %w : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  %e = atomic.exp %m : (tensor<64x64xf32>) -> tensor<64x64xf32>
  %y = atomic.add %e, %x : (tensor<64x64xf32>, tensor<64x64xf32>) -> tensor<64x64xf32>
  func.return %y : tensor<64x64xf32>
}
"""


def test_written_ir_places_values_copies_and_annotates():
    """matmul is cheap only on cuda, exp and add only on numpy: the IR copies the inputs to the
    device once each, the product back once, and annotates every call and copy; the
    annotations add up to the plan's cost."""
    kernels = [
        Kernel("cuda.t.matmul", "cuda", op="atomic.matmul"),
        Kernel("numpy.t.matmul", "numpy", op="atomic.matmul"),
        Kernel("numpy.t.exp", "numpy", op="atomic.exp"),
        Kernel("numpy.t.add", "numpy", op="atomic.add"),
    ]
    costs = DictCostSource(
        {
            "cuda.t.matmul": 1.0,
            "numpy.t.matmul": 100.0,
            "numpy.t.exp": 1.0,
            "numpy.t.add": 1.0,
            "copy.host_to_cuda": 2.0,
            "copy.cuda_to_host": 3.0,
        }
    )
    module = tgc.parse(MIXED)
    func = module.funcs[0]
    selection = select_kernels(func, costs, kernels=kernels)
    verify(module)
    assert selection.seconds == 1.0 + 1.0 + 1.0 + 2 * 2.0 + 3.0
    ops = [op for op in func.body.ops if op.name != "func.return"]
    assert [op.name for op in ops] == [
        "kernel.copy",
        "kernel.copy",
        "kernel.call",
        "kernel.copy",
        "kernel.call",
        "kernel.call",
    ]
    to_device = ops[:2]
    assert all(op.results[0].type.encoding == "cuda" for op in to_device)
    matmul = ops[2]
    assert matmul.attr("callee") == "cuda.t.matmul" and matmul.attr("op") == "atomic.matmul"
    assert matmul.attributes["plan.backend"] == "cuda"
    assert matmul.results[0].type.encoding == "cuda"
    assert ops[3].results[0].type.encoding is None
    add = ops[5]
    assert func.body.args[0] in add.operands  # the host %x, not its device copy
    assert sum(op.attributes["plan.seconds"] for op in ops) == selection.seconds
    assert {op.attributes["plan.source"] for op in ops} == {"measured"}


def test_decomposition_is_written_as_the_calls_of_its_plan():
    """Without a tanh kernel, hl.tanh runs as its decomposition; the IR holds its calls."""
    load_backends(NUMPY)
    module = tgc.parse(TANH)
    func = module.funcs[0]
    selection = select_kernels(
        func, kernels=[k for k in _numpy_kernels() if k.op != "hl.tanh" and k.op is not None]
    )
    verify(module)
    assert selection.plan.steps[0].option.kind == "decompose"
    callees = [op.attr("callee") for op in func.body.ops if op.name == "kernel.call"]
    assert "numpy.atomic.exp" in callees and "numpy.hl.tanh" not in callees
    _check_runs(module, TANH)


def _numpy_kernels():
    from tgc.planner.kernel import KERNELS

    return [k for k in KERNELS.values() if k.backend == "numpy"]


def _check_runs(module, source_text: str, rtol: float = 2e-5):
    """The placed function, run by the executor, equals the float64 interpreter."""
    reference = tgc.parse(source_text).funcs[0]
    inputs = random_inputs(reference, 7)
    got = run_plan(module.funcs[0], inputs)
    want = run_function(reference, inputs, "f64")
    for g, w in zip(got, want):
        scale = max(float(np.max(np.abs(w))), 1.0)
        assert float(np.max(np.abs(g - w))) <= rtol * scale


FORMULA = """
func.func @f(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %ep = atomic.exp %x : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %nx = atomic.neg %x : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %en = atomic.exp %nx : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %num = atomic.sub %ep, %en : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
  %den = atomic.add %ep, %en : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
  %y = atomic.div %num, %den : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
  func.return %y : tensor<4x16xf32>
}
"""


def test_graph_kernel_is_a_call_with_its_subgraph_in_a_region():
    """The hand-written tanh formula runs as numpy.tanh (one kernel instead of six); the call
    holds the covered subgraph in its region."""
    load_backends(NUMPY)
    module = tgc.parse(FORMULA)
    func = module.funcs[0]
    selection = select_kernels(func, tolerance=1e-5, backends=NUMPY)
    verify(module)
    assert selection.plan.kernels() == ["numpy.tanh"]
    (call,) = [op for op in func.body.ops if op.name == "kernel.call"]
    assert call.attr("callee") == "numpy.tanh" and call.attr("op") is None
    assert [op.name for op in call.body.ops][-1] == "kernel.yield"
    assert "atomic.div" in [op.name for op in call.body.ops]
    _check_runs(module, FORMULA)
    # at a tolerance below the kernel's stated error, the six op kernels run instead
    module = tgc.parse(FORMULA)
    selection = select_kernels(module.funcs[0], tolerance=0.0, backends=NUMPY)
    assert "numpy.tanh" not in selection.plan.kernels()
    assert len(selection.plan.kernels()) == 6


@pytest.mark.parametrize(
    "example", ["gpt2_block", "attention", "layernorm", "mlp", "softmax", "gelu_scale"]
)
@pytest.mark.parametrize("lowered", [False, True])
def test_examples_run_and_match_the_float64_interpreter(example, lowered):
    from pathlib import Path

    text = (Path(__file__).resolve().parent.parent / "examples" / f"{example}.tg").read_text()
    module = tgc.parse(text)
    if lowered:
        tgc.run_pipeline(module, "lower-hl")
    tgc.run_pipeline(module, "select-kernels{backends=numpy}")
    verify(module)
    assert all(
        op.name in ("kernel.call", "kernel.copy", "func.return") for op in module.funcs[0].body.ops
    )
    _check_runs(module, text, rtol=2e-4)


@pytest.mark.parametrize(
    ("name", "text", "pipeline"),
    [
        ("tanh", TANH, ""),
        ("tanh lowered", TANH, "lower-hl"),
        ("tanh formula", FORMULA, ""),
        ("gelu_scale", "gelu_scale", ""),
        ("gelu_scale lowered", "gelu_scale", "lower-hl"),
        ("softmax lowered", "softmax", "lower-hl"),
        ("layernorm lowered", "layernorm", "lower-hl"),
        ("mlp lowered", "mlp", "lower-hl"),
    ],
)
def test_dp_equals_brute_force_with_the_numpy_backend_and_the_roofline(name, text, pipeline):
    """The real kernels (graph kernels reading constants by value included) and roofline
    costs: the DP finds the cheapest of all paths."""
    from pathlib import Path

    from tgc.planner.cost import RooflineCostSource
    from tgc.planner.select import prepare

    load_backends(NUMPY)
    if not text.lstrip().startswith("func.func"):
        text = (Path(__file__).resolve().parent.parent / "examples" / f"{text}.tg").read_text()
    module = tgc.parse(text)
    if pipeline:
        tgc.run_pipeline(module, pipeline)
    func = module.funcs[0]
    prepare(func)
    ctx = PlanContext(tolerance=1e-5, backends=kernel_backends(NUMPY))
    costs = CachedCosts(RooflineCostSource())
    selection = plan_function(func, ctx, costs)
    assert count_paths(func, ctx) <= MAX_PLANS
    assert selection.exact
    assert selection.seconds == pytest.approx(_brute_force(func, ctx, costs), rel=1e-12)


# -- the pass -----------------------------------------------------------------------------------------


def test_pass_options_are_checked_when_the_pipeline_is_parsed():
    import tgc.planner.select  # noqa: F401  (registers the pass)

    (p,) = parse_pipeline("select-kernels{tolerance=0.01 objective=time}")
    assert p.tolerance == 0.01 and p.objective == "time"
    with pytest.raises(PipelineError, match="unknown objective 'memory'"):
        parse_pipeline("select-kernels{objective=memory}")
    with pytest.raises(PipelineError, match="needs tolerance >= 0, got -1"):
        parse_pipeline("select-kernels{tolerance=-1}")
    with pytest.raises(PipelineError, match="invalid value 'tight' for option 'tolerance'"):
        parse_pipeline("select-kernels{tolerance=tight}")


def test_the_backends_option_is_checked_and_kept():
    import tgc.planner.select  # noqa: F401  (registers the pass)

    (p,) = parse_pipeline("select-kernels{backends=numpy,torch}")
    assert p.backends == ("numpy", "torch")
    assert parse_pipeline("select-kernels")[0].backends == ()
    with pytest.raises(PipelineError, match=r"unknown planner backend 'tpu' \(known: numpy, cuda,"):
        parse_pipeline("select-kernels{backends=numpy,tpu}")


# -- which backends' kernels are considered ------------------------------------------------------


def _three_backends() -> tuple[list[Kernel], DictCostSource]:
    """hl.tanh on three backends, cheapest on cuda, then torch-cpu, then numpy."""
    kernels = [
        Kernel("numpy.t.tanh", "numpy", op="hl.tanh"),
        Kernel("torch-cpu.t.tanh", "torch-cpu", op="hl.tanh"),
        Kernel("cuda.t.tanh", "cuda", op="hl.tanh"),
    ]
    costs = {"numpy.t.tanh": 9.0, "torch-cpu.t.tanh": 5.0, "cuda.t.tanh": 1.0}
    return kernels, DictCostSource({**costs, "copy.host_to_cuda": 1.0, "copy.cuda_to_host": 1.0})


@pytest.mark.parametrize(
    ("backends", "chosen"),
    [
        (None, ["copy.host_to_cuda", "cuda.t.tanh", "copy.cuda_to_host"]),
        (("numpy", "torch", "cuda"), ["copy.host_to_cuda", "cuda.t.tanh", "copy.cuda_to_host"]),
        (("numpy", "torch"), ["torch-cpu.t.tanh"]),
        (("torch",), ["torch-cpu.t.tanh"]),
        (("numpy",), ["numpy.t.tanh"]),
        (("numpy", "cuda"), ["copy.host_to_cuda", "cuda.t.tanh", "copy.cuda_to_host"]),
    ],
)
def test_backends_limit_the_kernels_considered_to_theirs(backends, chosen):
    """`backends` (families) keeps the kernels of those backends ("torch": torch-cpu and
    torch-cuda): the cheapest of the others is never chosen, and no value is placed in the
    memory of a backend left out (no copy to cuda without cuda)."""
    kernels, costs = _three_backends()
    module = tgc.parse(TANH)
    func = module.funcs[0]
    select_kernels(func, costs, kernels=kernels, canonicalize=False, backends=backends)
    verify(module)
    written = []
    for op in func.body.ops:
        if op.name == "kernel.call":
            written.append(op.attr("callee"))
        elif op.name == "kernel.copy":
            to_device = op.results[0].type.encoding == "cuda"
            written.append("copy.host_to_cuda" if to_device else "copy.cuda_to_host")
    assert written == chosen


def test_backends_leaving_no_kernel_for_an_op_is_the_located_no_kernel_error():
    kernels, costs = _three_backends()
    module = tgc.parse(TANH, "tanh.tg")
    with pytest.raises(TgcError, match="no kernel can run 'hl.tanh'") as e:
        select_kernels(
            module.funcs[0],
            costs,
            kernels=kernels[1:],
            canonicalize=False,
            backends=("numpy",),
        )
    assert (e.value.loc.file, e.value.loc.line) == ("tanh.tg", 3)


def test_the_pass_plans_with_the_backends_of_its_option(monkeypatch):
    """`select-kernels{backends=...}` reaches the planner (and an empty option: every backend,
    None)."""
    import tgc.planner.select as select

    seen = []
    real = select.select_kernels

    def spy(func, *args, **kwargs):
        seen.append(kwargs.get("backends"))
        return real(func, *args, **kwargs)

    monkeypatch.setattr(select, "select_kernels", spy)
    for pipeline in ("select-kernels{backends=numpy}", "select-kernels"):
        tgc.run_pipeline(tgc.parse(TANH), pipeline)
    assert seen == [("numpy",), None]
