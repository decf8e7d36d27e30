"""Planning work done once where the GPU route used to repeat it (planner/options.py "options
shared between copies of a block", planner/match.py `accepts`, planner/solve.py
`Solver.kernel_seconds`), on the stand-in device of test_route.py.

What is checked, by counting calls (not time):

- the route's compile finds the options of its function once: the instances first use would
  measure, the plan and the plan of the default costs each have a copy of the function, and a
  copy is mapped, not matched again;
- a model of N equal layers (GPT-2 blocks, tied as GPT-2's embedding is, so that no cut splits
  it and every layer is planned in one problem) asks each kernel's constraints once per distinct
  set of types and costs each kernel once per distinct set of types, as one layer does;
- the candidate plans' text is the same with and without the sharing, on several models.
"""

from __future__ import annotations

import dataclasses
import sys
from pathlib import Path

import pytest
from test_route import _stand_in_device, stand_in  # noqa: F401  (fixtures)

import tgc
from tgc.planner import match, options, route
from tgc.planner.cost import CachedCosts, RooflineCostSource
from tgc.planner.kernel import KERNELS
from tgc.printer import print_op

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
sys.path.insert(0, str(ROOT / "bench"))


def layers(n: int, tied: bool = True) -> str:
    """N GPT-2 blocks chained (bench/pass_scaling.py); `tied`: the result adds the function's
    first argument, read at both ends as GPT-2's tied embedding weight is."""
    from pass_scaling import generate

    text = generate(n)
    if not tied:
        return text
    last = f"%y_{n - 1}"
    t = "tensor<64x768xf32>"
    tie = f"  %tied = atomic.add {last}, %x : ({t}, {t}) -> {t}\n  func.return %tied : {t}"
    return text.replace(f"  func.return {last} : {t}", tie)


def compile_text(text: str, tmp_path: Path, monkeypatch) -> dict[str, str | None]:
    """The route's candidate plans of `text` (nothing measured, nothing run): name -> text."""
    texts: dict[str, str | None] = {}

    def record(candidates, report, *rest):
        for name, c in candidates.items():
            planned = getattr(c, "planned", c)
            ops = None if planned is None else planned.func.body.ops
            texts[name] = None if ops is None else "\n".join(print_op(op) for op in ops)
        return "planned"

    monkeypatch.setattr(route, "_choose", record)
    module = tgc.parse(text)
    opts = route.RouteOptions(db=str(tmp_path / "none.sqlite"), measure=False, progress=False)
    route.compile_module(module, None, opts)
    return texts


def _fresh_caches() -> None:
    options._SHARED.clear()
    match._ACCEPTED.clear()


MODELS = {
    **{name: (EXAMPLES / f"{name}.tg").read_text() for name in ("mlp", "gpt2_block", "attention")},
    "layers": None,  # made in the test (bench/ on the path)
}


@pytest.mark.parametrize("model", sorted(MODELS))
def test_the_plans_are_those_found_without_sharing(model, stand_in, tmp_path, monkeypatch):  # noqa: F811
    text = MODELS[model] or layers(3)
    _fresh_caches()
    monkeypatch.setattr(options, "SHARE_OPTIONS", False)
    alone = compile_text(text, tmp_path, monkeypatch)
    _fresh_caches()
    monkeypatch.setattr(options, "SHARE_OPTIONS", True)
    shared = compile_text(text, tmp_path, monkeypatch)
    again = compile_text(text, tmp_path, monkeypatch)  # a second compile in the process
    assert set(alone) >= {"planned", "default"}
    assert shared == alone
    assert again == alone


def test_a_compile_finds_the_options_of_its_function_once(stand_in, tmp_path, monkeypatch):  # noqa: F811
    _fresh_caches()
    found = []
    real = options.BlockOptions.__init__

    def counted(self, block, ctx):
        found.append(len(block))
        real(self, block, ctx)

    monkeypatch.setattr(options.BlockOptions, "__init__", counted)
    text = layers(2)
    compile_text(text, tmp_path, monkeypatch)
    first = sorted(found)
    # One walk's worth: the function's block and each decomposition's block, once each (the
    # plan of library kernels matches the segments it does not copy itself, planner/copies.py).
    func = lowered(text)
    found.clear()
    _fresh_caches()
    route._instances(func, route.plan_tolerance(func), str(tmp_path / "none.sqlite"))
    assert first == sorted(found) and max(found) > 100
    # and a second compile of the same program in the process finds none
    found.clear()
    compile_text(text, tmp_path, monkeypatch)
    assert found == []


def _counting_constraints(monkeypatch, name: str) -> list:
    calls = []
    kernel = KERNELS[name]
    inner = kernel.constraints

    def constraints(types):
        calls.append(types)
        return inner(types)

    monkeypatch.setitem(KERNELS, name, dataclasses.replace(kernel, constraints=constraints))
    return calls


def test_equal_layers_ask_each_constraint_once(stand_in, tmp_path, monkeypatch):  # noqa: F811
    from tgc.planner.backends import cuda_kernels as ck

    counts = {}
    # (the first layer reads an argument, in device memory: its own types; the others alike)
    for n in (2, 4):
        _fresh_caches()
        calls = _counting_constraints(monkeypatch, ck.CUBLAS_GEMM)
        lt = _counting_constraints(monkeypatch, "cuda.cublaslt.linear")
        compile_text(layers(n), tmp_path, monkeypatch)
        counts[n] = (len(calls), len(lt))
        distinct = {(tuple(a), tuple(r)) for a, r in calls}
        assert len(calls) == len(distinct) > 0  # each question once
    assert counts[4] == counts[2]  # four layers: no more questions than two


def lowered(text: str):
    """`text`'s function as the route plans it: lowered for planning, its signature on the
    device, in canonical form."""
    from tgc.planner.select import prepare

    module = tgc.parse(text)
    tgc.run_pipeline(module, "lower-for-planning")
    func = module.funcs[0]
    route.move_signature_to_device(func)
    prepare(func)
    return func


def test_equal_layers_cost_each_kernel_once(stand_in):  # noqa: F811
    from tgc.planner.select import plan_function

    asked: dict[int, list] = {}
    for n in (2, 4):
        calls = asked[n] = []

        class Counting(CachedCosts):
            def cost(self, kernel, operand_types, result_types, params=None):
                calls.append((kernel, tuple(operand_types), tuple(result_types)))
                return super().cost(kernel, operand_types, result_types, params)

        _fresh_caches()
        func = lowered(layers(n))
        ctx = route._context(route.plan_tolerance(func))
        selection = plan_function(func, ctx, Counting(RooflineCostSource.gpu_defaults()))
        assert selection.segments == 1  # the tie: one problem holds every layer
    # Four layers ask what two ask (the plan's cost is then checked over its steps,
    # planner/paths.py `plan_cost`: the solver's questions again, once each).
    assert 0 < len(asked[4]) == len(asked[2])
    assert len(asked[4]) <= 2 * len(set(asked[4]))


def test_a_segment_alone_of_its_size_is_not_hashed(stand_in, monkeypatch):  # noqa: F811
    from tgc.planner import chain
    from tgc.planner.select import plan_function

    hashed = []
    real = chain.segment_key

    def counted(seg, *rest):
        hashed.append(len(seg.ops))
        return real(seg, *rest)

    monkeypatch.setattr(chain, "segment_key", counted)
    costs = CachedCosts(RooflineCostSource.gpu_defaults())
    tied = lowered(layers(2))
    selection = plan_function(tied, route._context(route.plan_tolerance(tied)), costs)
    assert selection.segments == 1 and hashed == []  # one segment of every op: nothing to match
    # Without generated kernels (whose regions span the blocks' cuts), with every backend (numpy
    # runs the reductions) and through planner/chain.py (a matcher passed in: not the copies of
    # planner/copies.py), equal blocks are segments of equal sizes, hashed and planned once.
    untied = lowered(layers(3, tied=False))
    ctx = options.PlanContext(
        tolerance=1e-3, match=lambda op, kernels: match.matches_at(op, kernels), generated=False
    )
    selection = plan_function(untied, ctx, costs)
    assert selection.distinct_segments < selection.segments
    assert hashed and all(sorted(hashed).count(n) > 1 for n in hashed)


def test_a_second_compile_asks_the_database_once_and_plans_nothing_more(
    stand_in,  # noqa: F811
    tmp_path,
    monkeypatch,
):
    from tgc.planner import profile

    db = tmp_path / "m.sqlite"
    text = (EXAMPLES / "mlp.tg").read_text()
    opts = route.RouteOptions(db=str(db), progress=False, min_time=0.002, whole_plan_check=False)
    first = route.compile_module(tgc.parse(text), None, opts)
    assert first.report.measured > 0 and first.report.unmeasured == 0
    asked, guessed = [], []
    real_unknown, real_guessed = profile.unknown, route._guessed
    monkeypatch.setattr(
        profile, "unknown", lambda insts, d: asked.append(1) or real_unknown(insts, d)
    )
    monkeypatch.setattr(route, "_guessed", lambda *a: guessed.append(1) or real_guessed(*a))
    second = route.compile_module(tgc.parse(text), None, opts)
    assert second.report.measured == second.report.unmeasured == 0
    # one look at what the database knows; no plan made to find guesses there are none of
    assert asked == [1] and guessed == []
