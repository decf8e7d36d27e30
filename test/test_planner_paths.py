"""Paths, path counts, plan costs and the cost sources (planner/paths.py, planner/cost.py)."""

from __future__ import annotations

import math
import random

import pytest
from planner_fakes import (
    T,
    cone_matcher,
    fake_kernels,
    random_costs,
    random_dag,
    random_tree,
    with_graph_kernels,
)

import tgc
from tgc.planner.cost import (
    DEVICES,
    LINKS,
    CachedCosts,
    Cost,
    DictCostSource,
    RooflineCostSource,
    kernel_flops,
    op_flops,
)
from tgc.planner.kernel import Kernel
from tgc.planner.options import (
    COPY_KERNELS,
    DECOMPOSE,
    PlanContext,
    copy_kernel,
    decomposition_of,
    live_ops,
)
from tgc.planner.paths import count_paths, paths, plan_cost
from tgc.types import TensorType

TANH = """
func.func @f(%x: tensor<4x16xf32>) -> tensor<4x16xf32> {
  %y = hl.tanh %x : (tensor<4x16xf32>) -> tensor<4x16xf32>
  func.return %y : tensor<4x16xf32>
}
"""


def _func(text: str):
    return tgc.parse(text).funcs[0]


def _covers_each_live_op_once(plan) -> bool:
    covered = [op for step in plan.steps for op in step.option.ops]
    if sorted(map(id, covered)) != sorted(map(id, live_ops(plan.block))):
        return False
    return all(_covers_each_live_op_once(s.nested) for s in plan.steps if s.nested is not None)


# -- counting against enumeration -----------------------------------------------------------------


@pytest.mark.parametrize("seed", range(300))
def test_count_paths_equals_enumeration(seed):
    """count_paths (never enumerating) equals the number of plans paths() yields, on random
    small trees and DAGs with two backends, decompositions and overlapping graph kernels; every
    plan covers each live op exactly once, and no plan is yielded twice."""
    rng = random.Random(seed)
    kernels = fake_kernels(rng)
    if seed % 3 == 0:
        func = random_tree(rng, rng.randint(1, 5), hl=0.15)
    else:
        func = random_dag(rng, rng.randint(1, 6), hl=0.1)
    graph = seed % 2 == 0
    ctx = PlanContext(with_graph_kernels(kernels) if graph else kernels, match=cone_matcher)
    count = count_paths(func, ctx)
    if count > 5000:
        pytest.skip(f"{count} plans: too many to enumerate in a unit test")
    plans = list(paths(func, ctx))
    assert len(plans) == count
    assert len({p.key() for p in plans}) == count
    assert all(_covers_each_live_op_once(p) for p in plans)


def test_count_paths_of_tanh_with_decomposition():
    """hl.tanh on one backend: its own kernel, or its decomposition (12 ops, one kernel each
    here, so one nested plan): 2 plans; with a second backend for every op the decomposition
    alone has 2^12 plans."""
    func = _func(TANH)
    ops = ("hl.tanh", *{op.name for op in decomposition_of(func.body.first).func.body.ops})
    one = [Kernel(f"numpy.t.{n}", "numpy", op=n) for n in ops if n != "func.return"]
    two = one + [Kernel(f"cuda.t.{n}", "cuda", op=n) for n in ops if n != "func.return"]
    inner = len(live_ops(decomposition_of(func.body.first).func.body))
    assert count_paths(func, PlanContext(one)) == 2
    assert count_paths(func, PlanContext(two)) == 2 + 2**inner
    plans = [str(p) for p in paths(func, PlanContext(one))]
    assert plans[0] == "numpy.t.hl.tanh(%x)"
    assert plans[1].startswith("decompose hl.tanh[ ") and "numpy.t.atomic.exp(" in plans[1]


def test_an_op_without_options_has_no_plans():
    func = _func(TANH)
    assert count_paths(func, PlanContext([], decompose=False)) == 0
    assert list(paths(func, PlanContext([], decompose=False))) == []


def test_dead_ops_are_not_planned():
    func = _func(
        """
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %dead = atomic.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %y = atomic.neg %x : (tensor<4xf32>) -> tensor<4xf32>
  func.return %y : tensor<4xf32>
}
"""
    )
    kernels = [
        Kernel("numpy.t.exp", "numpy", op="atomic.exp"),
        Kernel("numpy.t.neg", "numpy", op="atomic.neg"),
    ]
    assert [str(p) for p in paths(func, PlanContext(kernels))] == ["numpy.t.neg(%x)"]


def test_tolerance_removes_approximate_kernels_from_the_options():
    func = _func(TANH)
    exact = Kernel("numpy.t.tanh", "numpy", op="hl.tanh")
    fast = Kernel("numpy.t.fast_tanh", "numpy", op="hl.tanh", max_rel_error=1e-3)
    ctx = PlanContext([exact, fast], tolerance=1e-5, decompose=False)
    assert [str(p) for p in paths(func, ctx)] == ["numpy.t.tanh(%x)"]
    ctx = PlanContext([exact, fast], tolerance=1e-2, decompose=False)
    assert sorted(str(p) for p in paths(func, ctx)) == ["numpy.t.fast_tanh(%x)", "numpy.t.tanh(%x)"]


# -- plan costs --------------------------------------------------------------------------------------


def _two_backends(*ops):
    return [Kernel(f"{b}.t.{n}", b, op=n) for n in ops for b in ("numpy", "cuda")]


def test_plan_cost_counts_one_copy_per_value_and_space():
    """%e = exp on cuda is read by two numpy kernels: one copy back, not two; the host
    argument is copied to the device once."""
    func = _func(
        """
func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %e = atomic.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %a = atomic.neg %e : (tensor<4xf32>) -> tensor<4xf32>
  %b = atomic.abs %e : (tensor<4xf32>) -> tensor<4xf32>
  %y = atomic.add %a, %b : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  func.return %y : tensor<4xf32>
}
"""
    )
    kernels = _two_backends("atomic.exp", "atomic.neg", "atomic.abs", "atomic.add")
    costs = DictCostSource(
        {k.name: (1.0 if k.backend == "numpy" else 0.25) for k in kernels}
        | {"copy.host_to_cuda": 10.0, "copy.cuda_to_host": 100.0}
    )
    by_text = {str(p): plan_cost(p, costs) for p in paths(func, PlanContext(kernels))}
    assert len(by_text) == 16
    mixed = (
        "cuda.t.atomic.exp(%x) ; numpy.t.atomic.neg(%e) ; numpy.t.atomic.abs(%e) ; "
        "numpy.t.atomic.add(%a, %b)"
    )
    assert by_text[mixed] == 0.25 + 3 * 1.0 + 10.0 + 100.0
    all_cuda = mixed.replace("numpy", "cuda")
    assert by_text[all_cuda] == 4 * 0.25 + 10.0 + 100.0  # the result goes back to the host
    assert min(by_text.values()) == 4.0  # all on numpy


def test_plan_cost_of_a_decomposition_inlines_it():
    """The decomposition's kernels are paid where they run; its argument and result are the
    op's operand and result (no copy when all runs on the host)."""
    func = _func(TANH)
    ops = {op.name for op in decomposition_of(func.body.first).func.body.ops} - {"func.return"}
    kernels = [Kernel(f"numpy.t.{n}", "numpy", op=n) for n in ops]
    costs = DictCostSource({k.name: 1.0 for k in kernels})
    (plan,) = paths(func, PlanContext(kernels))
    assert plan.steps[0].option.kind == DECOMPOSE
    inner = live_ops(decomposition_of(func.body.first).func.body)
    assert plan_cost(plan, costs) == len(inner)


def test_a_missing_copy_kernel_makes_a_plan_infinite(monkeypatch):
    func = _func(TANH.replace("tensor<4x16xf32>", 'tensor<4x16xf32, "cuda">'))
    kernels = [Kernel("numpy.t.tanh", "numpy", op="hl.tanh")]
    (plan,) = paths(func, PlanContext(kernels, decompose=False))
    costs = DictCostSource(
        {"numpy.t.tanh": 1.0, "copy.host_to_cuda": 2.0, "copy.cuda_to_host": 3.0}
    )
    assert plan_cost(plan, costs) == 6.0
    monkeypatch.delitem(COPY_KERNELS, ("cuda", None))
    assert plan_cost(plan, costs) == math.inf


# -- cost sources ----------------------------------------------------------------------------------


def _t(text):
    return tgc.tensor(text)


def test_roofline_elementwise_is_launch_plus_bytes_over_bandwidth():
    k = Kernel("numpy.t.add", "numpy", op="atomic.add")
    t = _t("1024x1024xf32")
    cost = RooflineCostSource().cost(k, [t, t], [t], {})
    dev = DEVICES["numpy"]
    assert cost.source == "roofline" and cost.rel_uncertainty > 0
    assert cost.seconds == pytest.approx(dev.launch + 3 * t.nbytes / dev.bandwidth)


def test_roofline_matmul_is_compute_bound_at_2mnk():
    k = Kernel("cuda.t.matmul", "cuda", op="atomic.matmul")
    a, b, c = _t("512x256xf32"), _t("256x128xf32"), _t("512x128xf32")
    assert op_flops("atomic.matmul", (a, b), (c,)) == 2 * 512 * 128 * 256
    cost = RooflineCostSource().cost(k, [a, b], [c], {})
    dev = DEVICES["cuda"]
    expected = dev.launch + max(
        (a.nbytes + b.nbytes + c.nbytes) / dev.bandwidth, 2 * 512 * 128 * 256 / dev.peak_flops
    )
    assert cost.seconds == pytest.approx(expected)


def test_flops_of_reductions_views_and_hl_ops():
    x, r = _t("4x8xf32"), _t("4x1xf32")
    assert op_flops("atomic.reduce_sum", (x,), (r,)) == 32
    assert op_flops("atomic.transpose", (x,), (_t("8x4xf32"),)) == 0
    assert op_flops("atomic.exp", (x,), (x,)) == 32
    # hl.tanh counts its decomposition: several ops per element
    assert op_flops("hl.tanh", (x,), (x,)) > 4 * 32
    k = Kernel("numpy.t.tanh", "numpy", op="hl.tanh")
    assert kernel_flops(k, (x,), (x,)) == op_flops("hl.tanh", (x,), (x,))


def test_roofline_copy_uses_the_link():
    t = _t("1024xf32")
    cost = RooflineCostSource().cost(copy_kernel(None, "cuda"), [t], [t.with_encoding("cuda")], {})
    link = LINKS[(None, "cuda")]
    assert cost.seconds == pytest.approx(link.latency + t.nbytes / link.bandwidth)


def test_roofline_unknown_backend_device_is_a_lookup_error():
    k = Kernel("cuda.t.exp", "cuda", op="atomic.exp")
    with pytest.raises(LookupError, match="no device is described for backend 'cuda'"):
        RooflineCostSource(devices={"numpy": DEVICES["numpy"]}).cost(k, [T], [T], {})


def test_dict_cost_source_per_type_entry_wins_and_missing_is_an_error():
    k = Kernel("numpy.t.exp", "numpy", op="atomic.exp")
    small, big = _t("4xf32"), _t("4096xf32")
    source = DictCostSource(
        {"numpy.t.exp": 2.0, ("numpy.t.exp", (big,), (big,)): Cost(5.0, "estimated", 0.3)}
    )
    assert source.cost(k, [small], [small], {}) == Cost(2.0, "measured")
    assert source.cost(k, [big], [big], {}) == Cost(5.0, "estimated", 0.3)
    other = Kernel("numpy.t.neg", "numpy", op="atomic.neg")
    with pytest.raises(LookupError, match="no cost for kernel 'numpy.t.neg'"):
        source.cost(other, [small], [small], {})
    fallback = DictCostSource({}, fallback=RooflineCostSource())
    assert fallback.cost(other, [small], [small], {}).source == "roofline"


def test_cost_validates_source_and_seconds():
    with pytest.raises(ValueError, match="cost source must be one of"):
        Cost(1.0, "guessed")
    with pytest.raises(ValueError, match="non-negative"):
        Cost(-1.0, "measured")


def test_cached_costs_ask_once_per_signature():
    calls = []

    class Counting:
        def cost(self, kernel, ins, outs, params):
            calls.append(kernel.name)
            return Cost(1.0, "measured")

    cached = CachedCosts(Counting())
    k = Kernel("numpy.t.exp", "numpy", op="atomic.exp")
    for _ in range(3):
        cached.cost(k, [T], [T])
    cached.cost(k, [TensorType.get((2,), "f32")], [TensorType.get((2,), "f32")])
    assert calls == ["numpy.t.exp", "numpy.t.exp"]


def test_random_costs_cover_every_fake_kernel():
    rng = random.Random(0)
    kernels = with_graph_kernels(fake_kernels(rng))
    source = random_costs(rng, kernels)
    for k in kernels:
        assert source.cost(k, [T], [T], {}).seconds > 0
