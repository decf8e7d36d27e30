"""The order tgc-profile measures in (planner/profile.py `instances` with `costs`): each op's
options that the current costs rank best first, round-robin by rank over the ops; an instance
several ops have takes its best rank; without costs, the walk order of before."""

from __future__ import annotations

import math

import numpy as np
import pytest

from tgc.parser import parse_module
from tgc.planner import load_backends
from tgc.planner.cost import DictCostSource, RooflineCostSource
from tgc.planner.db import Database
from tgc.planner.kernel import KERNELS, Kernel, register_kernel, unregister_kernel
from tgc.planner.options import PlanContext
from tgc.planner.profile import Profiler, instances, measure
from tgc.planner.select import prepare

load_backends(["numpy"])
NUMPY = [k for k in KERNELS.values() if k.backend == "numpy"]


def func_of(text: str):
    func = parse_module(text, "<test>").funcs[0]
    prepare(func)
    return func


def _exp(inputs, attrs, result_types):
    return [np.exp(inputs[0]).astype(result_types[0].dtype)]


def _neg(inputs, attrs, result_types):
    return [np.negative(inputs[0]).astype(result_types[0].dtype)]


@pytest.fixture
def variants():
    """Two more kernels for atomic.exp and two for atomic.neg (correct ones)."""
    made = [
        register_kernel(Kernel(f"numpy.order_{op}_{v}", "numpy", op=f"atomic.{op}", run=run))
        for op, run in (("exp", _exp), ("neg", _neg))
        for v in ("b", "c")
    ]
    yield {k.name: k for k in made}
    for k in made:
        unregister_kernel(k.name)


TWO_OPS = """
func.func @f(%x: tensor<16x16xf32>) -> tensor<16x16xf32> {
  %e = atomic.exp %x : (tensor<16x16xf32>) -> tensor<16x16xf32>
  %n = atomic.neg %e : (tensor<16x16xf32>) -> tensor<16x16xf32>
  func.return %n : tensor<16x16xf32>
}
"""

# seconds: exp's cheapest is its last option, neg's its second
COSTS = {
    "numpy.atomic.exp": 5.0,
    "numpy.order_exp_b": 3.0,
    "numpy.order_exp_c": 1.0,
    "numpy.atomic.neg": 6.0,
    "numpy.order_neg_b": 2.0,
    "numpy.order_neg_c": 4.0,
}


def _pool(variants):
    return [
        KERNELS["numpy.atomic.exp"],
        variants["numpy.order_exp_b"],
        variants["numpy.order_exp_c"],
        KERNELS["numpy.atomic.neg"],
        variants["numpy.order_neg_b"],
        variants["numpy.order_neg_c"],
    ]


def test_each_ops_cheapest_options_come_first_round_robin(variants):
    pool = _pool(variants)
    walk = [i.kernel.name for i in instances(func_of(TWO_OPS), PlanContext(pool, 1e-5))]
    ranked = instances(func_of(TWO_OPS), PlanContext(pool, 1e-5), DictCostSource(COSTS))
    assert sorted(walk) == sorted(COSTS)  # the same instances, only the order differs
    assert [i.kernel.name for i in ranked] == [
        "numpy.order_exp_c",  # rank 0: each op's cheapest
        "numpy.order_neg_b",
        "numpy.order_exp_b",  # rank 1
        "numpy.order_neg_c",
        "numpy.atomic.exp",  # rank 2
        "numpy.atomic.neg",
    ]
    assert set(walk[:2]) != {"numpy.order_exp_c", "numpy.order_neg_b"}  # the old order differs


def test_a_budget_for_two_measures_each_ops_estimated_cheapest(tmp_path, variants):
    """A fake measurement that spends the budget after two: those two are the estimated
    cheapest option of each op (the walk order measured two options of the first op)."""
    insts = instances(func_of(TWO_OPS), PlanContext(_pool(variants), 1e-5), DictCostSource(COSTS))
    measured = []
    with Database.open(str(tmp_path / "m.sqlite")) as db:

        def two_then_out_of_time(inst, min_time):
            measured.append(inst.kernel.name)
            if len(measured) == 2:
                profiler.deadline = -math.inf
            return measure(inst, 0.001)

        profiler = Profiler(db, progress=False, measure_fn=two_then_out_of_time)
        report = profiler.run(insts)
        recorded = {m.kernel.name for m in db.rows()}
    assert measured == ["numpy.order_exp_c", "numpy.order_neg_b"]
    assert recorded == set(measured)
    assert (report.measured, report.failed, report.left) == (2, 0, 4)


def test_costs_the_source_cannot_give_rank_last(variants):
    """A kernel the cost source knows nothing of (LookupError) comes after those it knows."""
    known = {k: v for k, v in COSTS.items() if k != "numpy.order_exp_c"}
    ranked = instances(func_of(TWO_OPS), PlanContext(_pool(variants), 1e-5), DictCostSource(known))
    names = [i.kernel.name for i in ranked]
    assert names[:2] == ["numpy.order_exp_b", "numpy.order_neg_b"]
    assert names.index("numpy.order_exp_c") > names.index("numpy.atomic.exp")


# hl.tanh lowered: the graph kernel numpy.tanh covers the formula, rooted at its atomic.where
TANH = """
  %0 = atomic.constant {value = dense<1.0> : tensor<f32>} : () -> tensor<f32>
  %1 = atomic.abs %x : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %2 = atomic.constant {value = dense<-2.0> : tensor<f32>} : () -> tensor<f32>
  %3 = atomic.mul %1, %2 : (tensor<4x16xf32>, tensor<f32>) -> tensor<4x16xf32>
  %4 = atomic.exp %3 : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %5 = atomic.sub %0, %4 : (tensor<f32>, tensor<4x16xf32>) -> tensor<4x16xf32>
  %6 = atomic.add %4, %0 : (tensor<4x16xf32>, tensor<f32>) -> tensor<4x16xf32>
  %7 = atomic.div %5, %6 : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
  %8 = atomic.constant {value = dense<0.0> : tensor<f32>} : () -> tensor<f32>
  %9 = atomic.cmp %x, %8 {pred = "lt"} : (tensor<4x16xf32>, tensor<f32>) -> tensor<4x16xi1>
  %10 = atomic.neg %7 : (tensor<4x16xf32>) -> tensor<4x16xf32>
  %y = atomic.where %9, %10, %7 : (tensor<4x16xi1>, tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32>
"""
T = "tensor<4x16xf32>"
TANH_ONLY = f"func.func @f(%x: {T}) -> {T} {{{TANH}  func.return %y : {T}\n}}\n"
# the same where instance at a second op, where it is the only option (rank 0)
TANH_AND_WHERE = (
    f"func.func @f(%x: {T}) -> {T} {{{TANH}"
    f'  %c = atomic.cmp %x, %y {{pred = "gt"}} : ({T}, {T}) -> tensor<4x16xi1>\n'
    f"  %z = atomic.where %c, %x, %y : (tensor<4x16xi1>, {T}, {T}) -> {T}\n"
    f"  func.return %z : {T}\n}}\n"
)


def test_an_instance_of_several_ops_takes_its_best_rank(variants):
    """numpy.atomic.where is rank 1 at the formula's root (the fused numpy.tanh costs less per
    op it covers) and rank 0 at a where of its own: with that second op it comes before the
    other rank-1 instance (an expensive exp kernel found earlier in the walk); without, after."""
    pool = [*NUMPY, variants["numpy.order_exp_b"]]
    costs = DictCostSource({"numpy.order_exp_b": 1.0}, fallback=RooflineCostSource())

    def order(text):
        names = [i.kernel.name for i in instances(func_of(text), PlanContext(pool, 1e-5), costs)]
        assert "numpy.tanh" in names  # the fused option is there: where has a rival at the root
        return names.index("numpy.atomic.where"), names.index("numpy.order_exp_b")

    where, slow_exp = order(TANH_ONLY)
    assert where > slow_exp  # both rank 1: the walk found the exp first
    where, slow_exp = order(TANH_AND_WHERE)
    assert where < slow_exp  # rank 0 at the second where
