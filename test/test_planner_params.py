"""Parameters computed once (planner/fixed.py): what reads only `{tgc.param}` arguments (and
constants) runs once per set of parameter arrays, and is not in the plan's per-call cost.

Checked on the stacked QKV (test_planner_stacked.py's: the three param weights reshaped and
concatenated, one batched matmul, a split, reshapes) with the numpy backend and with the
stand-in CUDA device (test_planner_cuda.py's), values on the host and on the device:

- which ops are once (the reshapes and concat of the weights, and the copy of the packed
  weights to the device; not the matmul nor what follows it, nor anything without params);
- the executor (`PlannedFunction`) against float64 on fresh random inputs over several calls:
  the same parameter arrays run the once kernels (and copies) only on the first call; a new
  array object for one parameter runs them again, and the results follow the new weights;
  `forget_params` after an in-place change; without `{tgc.param}` every kernel runs each call;
- the plan's estimated cost: the per-call kernels and copies only (the negative: without
  `{tgc.param}` the concat and the reshapes are counted), equal to `plan_cost` of the plan;
- the state of values (`Fixed`) on small functions, and `tgc-plan --explain`'s once mark.
"""

from __future__ import annotations

import dataclasses
import secrets
from collections import Counter

import numpy as np
import pytest
from test_planner_split_view import stand_in  # noqa: F401 (the fixture)
from test_planner_stacked import stacked_qkv_text

import tgc
from tgc.dialects.kernel import CallOp, CopyOp
from tgc.planner.backends import BACKENDS
from tgc.planner.cost import CachedCosts, RooflineCostSource
from tgc.planner.executor import PlannedFunction
from tgc.fixed import CONST, PARAM, VARIES
from tgc.planner.fixed import ONCE_ATTR, ONCE_WEIGHT, Fixed
from tgc.planner.kernel import rel_error
from tgc.planner.options import PlanContext
from tgc.planner.paths import plan_cost
from tgc.planner.select import plan_function, select_kernels

# f32 products of 32 terms against float64 on the same inputs, normwise
TOLERANCE = 1e-5
CALLS = 3


def _text(space: str | None = None, params: bool = True) -> str:
    text = stacked_qkv_text(rows=64, d=32, dtype="f32", space=space)
    return text if params else text.replace(" {tgc.param}", "")


def _planned(text: str, families: tuple[str, ...]):
    module = tgc.parse(text, "params.tg")
    func = module.funcs[0]
    selection = select_kernels(func, tolerance=1e-5, backends=families)
    tgc.verify(module)
    return func, selection


def _name(op) -> str:
    return op.attr("callee") if isinstance(op, CallOp) else op.name


def _once(func) -> list[str]:
    return [_name(op) for op in func.body.ops if ONCE_ATTR in op.attributes]


def _counting(counts: Counter) -> dict:
    """The registered backends, each kernel call (by callee) counted."""
    out = {}
    for name, b in BACKENDS.items():

        def call(kernel, inputs, attrs, types, _call=b.call):
            counts[kernel.name] += 1
            return _call(kernel, inputs, attrs, types)

        run_region = None
        if b.run_region is not None:

            def run_region(op, inputs, _run=b.run_region):
                counts[op.attr("callee")] += 1
                return _run(op, inputs)

        out[name] = dataclasses.replace(b, call=call, run_region=run_region, prepare=None)
    return out


class _Inputs:
    """Fresh random x each call; the weights kept (the same objects) until `new_weight`."""

    def __init__(self, func, space) -> None:
        self.rng = np.random.default_rng(secrets.randbits(32))
        self.func = func
        self.space = space
        self.weights = [self._random(a.type.shape) for a in func.body.args[1:]]
        self.moved = [self._in_space(w) for w in self.weights]

    def _random(self, shape) -> np.ndarray:
        return self.rng.standard_normal(shape).astype(np.float32)

    def _in_space(self, a: np.ndarray):
        if self.space is None:
            return a
        from tgc.planner.backends import SPACES

        return SPACES[self.space].from_host(a, self.func.body.args[0].type.with_encoding(None))

    def new_weight(self, i: int) -> None:
        self.weights[i] = self._random(self.weights[i].shape)
        self.moved[i] = self._in_space(self.weights[i])

    def call(self, planned: PlannedFunction) -> None:
        x = self._random(self.func.body.args[0].type.shape)
        outs = planned([self._in_space(x), *self.moved])
        x64 = x.astype(np.float64)
        for got, w in zip(outs, self.weights):
            host = got if self.space is None else _to_host(got, self.space)
            assert rel_error(host, x64 @ w.astype(np.float64)) <= TOLERANCE


def _to_host(value, space):
    from tgc.planner.backends import SPACES

    return SPACES[space].to_host(value)


# -- numpy alone ----------------------------------------------------------------------------------


def test_numpy_the_packed_weights_are_made_once_per_set_of_parameter_arrays():
    func, _ = _planned(_text(), ("numpy",))
    assert _once(func) == ["numpy.atomic.reshape"] * 3 + ["numpy.atomic.concat"]
    counts = Counter()
    planned = PlannedFunction(func, _counting(counts))
    inputs = _Inputs(func, None)
    for _ in range(CALLS):
        inputs.call(planned)
    assert counts["numpy.atomic.concat"] == 1 and counts["numpy.atomic.matmul"] == CALLS
    assert counts["numpy.atomic.reshape"] == 3 + 3 * CALLS  # the weights' once, q k v each call
    assert planned.once_runs == 1
    inputs.new_weight(1)  # a new array object for wk: everything once runs again
    for _ in range(CALLS):
        inputs.call(planned)
    assert counts["numpy.atomic.concat"] == 2 and counts["numpy.atomic.matmul"] == 2 * CALLS
    assert planned.once_runs == 2
    # changed in place: identity cannot see it; forget_params says so
    inputs.weights[2][...] = inputs._random(inputs.weights[2].shape)
    planned.forget_params()
    inputs.call(planned)
    assert counts["numpy.atomic.concat"] == 3 and planned.once_runs == 3


def test_numpy_without_params_every_kernel_runs_every_call():
    func, _ = _planned(_text(params=False), ("numpy",))
    assert _once(func) == []
    counts = Counter()
    planned = PlannedFunction(func, _counting(counts))
    inputs = _Inputs(func, None)
    for _ in range(CALLS):
        inputs.call(planned)
    assert counts["numpy.atomic.concat"] == CALLS and counts["numpy.atomic.reshape"] == 6 * CALLS
    assert planned.once_runs == 0


# -- the stand-in CUDA device ---------------------------------------------------------------------


def test_device_values_the_concat_region_runs_once(stand_in):  # noqa: F811
    """Values in device memory (as bench/gpu_suite.py's QKV row runs through auto): the concat
    (a generated elementwise region) runs once; per call the GEMM and the views."""
    func, _ = _planned(_text("cuda"), ("numpy", "cuda"))
    assert _once(func) == ["cuda.elementwise"]
    per_call = [_name(op) for op in func.body.ops if ONCE_ATTR not in op.attributes]
    assert per_call == ["cuda.cublas.gemm", "cuda.split_view"] + ["cuda.reshape_view"] * 3 + [
        "func.return"
    ]
    counts = Counter()
    planned = PlannedFunction(func, _counting(counts))
    inputs = _Inputs(func, "cuda")
    for _ in range(CALLS):
        inputs.call(planned)
    assert counts["cuda.elementwise"] == 1 and counts["cuda.cublas.gemm"] == CALLS
    inputs.new_weight(0)
    inputs.call(planned)
    assert counts["cuda.elementwise"] == 2 and counts["cuda.cublas.gemm"] == CALLS + 1


def test_host_params_are_packed_and_copied_to_the_device_once(stand_in):  # noqa: F811
    """Values on the host, the GEMM on the device: the copy of the packed weights to the
    device is once too; x goes up and q, k, v's product comes down every call."""
    func, _ = _planned(_text(), ("numpy", "cuda"))
    once = [op for op in func.body.ops if ONCE_ATTR in op.attributes]
    copies = [op for op in func.body.ops if isinstance(op, CopyOp)]
    assert any(isinstance(op, CopyOp) for op in once), _once(func)
    assert any(isinstance(op, CopyOp) for op in copies if op not in once)  # x's, the product's
    up = sum(1 for op in once if isinstance(op, CopyOp) and op.results[0].type.encoding)
    up_per_call = sum(
        1 for op in copies if op not in once and op.results[0].type.encoding == "cuda"
    )
    counts = Counter()
    planned = PlannedFunction(func, _counting(counts))
    inputs = _Inputs(func, None)
    for _ in range(CALLS):
        inputs.call(planned)
    assert stand_in["from_host"] == up + CALLS * up_per_call
    assert counts["numpy.atomic.concat"] == 1 and counts["cuda.cublas.gemm"] == CALLS
    inputs.new_weight(2)
    inputs.call(planned)
    assert stand_in["from_host"] == 2 * up + (CALLS + 1) * up_per_call
    assert counts["numpy.atomic.concat"] == 2


# -- costs ----------------------------------------------------------------------------------------


def _seconds(op) -> float:
    return float(op.attr("plan.seconds"))


@pytest.mark.parametrize("space, families", [(None, ("numpy",)), ("cuda", ("numpy", "cuda"))])
def test_the_per_call_cost_leaves_out_the_once_steps(stand_in, space, families):  # noqa: F811
    with_params, sel = _planned(_text(space), families)
    steps = [op for op in with_params.body.ops if op is not with_params.body.last]
    once = sum(_seconds(op) for op in steps if ONCE_ATTR in op.attributes)
    per_call = sum(_seconds(op) for op in steps if ONCE_ATTR not in op.attributes)
    assert once > 0
    # The annotations carry four significant digits (planner/materialise.py).
    assert sel.seconds == pytest.approx(per_call + ONCE_WEIGHT * once, rel=1e-3)
    # the negative: without {tgc.param} the same kinds of kernels, every one counted
    without, plain = _planned(_text(space, params=False), families)
    assert _once(without) == []
    everything = sum(_seconds(op) for op in without.body.ops if op is not without.body.last)
    assert plain.seconds == pytest.approx(everything, rel=1e-3)
    # here the same kernels either way: the difference is the once steps, the concat's included
    assert [_name(op) for op in without.body.ops] == [_name(op) for op in with_params.body.ops]
    assert plain.seconds == pytest.approx(per_call + once, rel=1e-3)
    concat = [op for op in steps if "concat" in _name(op) or "elementwise" in _name(op)]
    assert concat and all(ONCE_ATTR in op.attributes for op in concat)


def test_plan_cost_of_the_chosen_plan_is_the_selection_cost(stand_in):  # noqa: F811
    """`plan_cost` (the brute force's measure) weighs once kernels and copies as the solver."""
    for params in (True, False):
        func = tgc.parse(_text(params=params), "params.tg").funcs[0]
        costs = CachedCosts(RooflineCostSource())
        from tgc.planner import kernel_backends

        ctx = PlanContext(tolerance=1e-5, backends=kernel_backends(("numpy", "cuda")))
        sel = plan_function(func, ctx, costs)
        assert plan_cost(sel.plan, costs) == pytest.approx(sel.seconds, rel=1e-9)


# -- which values are fixed -----------------------------------------------------------------------

SMALL = """
func.func @f(%x: tensor<4xf32>, %w: tensor<4xf32> {tgc.param}) -> tensor<4xf32> {
  %c = atomic.constant {value = dense<2.0> : tensor<4xf32>} : () -> tensor<4xf32>
  %c2 = atomic.mul %c, %c : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %wc = atomic.mul %w, %c2 : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  %e = atomic.exp %wc : (tensor<4xf32>) -> tensor<4xf32>
  %y = atomic.add %x, %e : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  func.return %y : tensor<4xf32>
}
"""


def test_a_value_is_once_from_a_param_and_fixed_values_only():
    func = tgc.parse(SMALL, "small.tg").funcs[0]
    fixed = Fixed()
    x, w = func.body.args
    ops = {op.results[0].name_hint: op for op in func.body.ops if op.results}
    assert fixed.state(w) == PARAM and fixed.state(x) == VARIES
    assert fixed.state(ops["c"].results[0]) == CONST  # constants alone: fixed, not once
    assert fixed.state(ops["c2"].results[0]) == CONST
    assert [n for n, op in ops.items() if fixed.op(op)] == ["wc", "e"]
    assert not fixed.op(ops["y"])  # reads x


def test_the_once_mark_survives_printing_and_parsing(stand_in):  # noqa: F811
    func, _ = _planned(_text("cuda"), ("numpy", "cuda"))
    again = tgc.parse(str(func), "printed.tg").funcs[0]
    assert _once(again) == ["cuda.elementwise"]
    counts = Counter()
    planned = PlannedFunction(again, _counting(counts))
    inputs = _Inputs(again, "cuda")
    for _ in range(2):
        inputs.call(planned)
    assert counts["cuda.elementwise"] == 1


def test_tgc_plan_explain_marks_the_once_steps(tmp_path, capsys):
    from tgc.tools.plan import main

    path = tmp_path / "qkv.tg"
    path.write_text(_text())
    assert main([str(path), "-p", "", "--explain", "--planner-backends", "numpy"]) == 0
    out = capsys.readouterr().out
    marked = [line for line in out.splitlines() if line.endswith("(once per parameters)")]
    assert len(marked) == 4 and all("reshape" in m or "concat" in m for m in marked), out
    assert not any("matmul" in m for m in marked)
    # the negative: without {tgc.param}, nothing marked and no note
    path.write_text(_text(params=False))
    assert main([str(path), "-p", "", "--explain", "--planner-backends", "numpy"]) == 0
    assert "once per parameters" not in capsys.readouterr().out
