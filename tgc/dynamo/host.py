"""A graph's module planned and run on the CPU, torch tensors in and out without copies.

The plan is the one `tgc-run --backend auto` makes: `lower-for-planning`, then `select-kernels`'
planning, here over the kernels that run on the host alone (numpy's, and PyTorch's CPU kernels
where PyTorch imports: the tensors live on the host, and a plan that moved them to a GPU would
copy them there on every call). The plan runs in one `PlannedFunction` (planner/executor.py),
whose once steps (packing weights) run again only when a parameter tensor changed
(tensors.ParamViews).
"""

from __future__ import annotations


from tgc.builtin import FuncOp
from tgc.dynamo.lowering import Lowered, kept_results
from tgc.dynamo.options import BackendOptions
from tgc.dynamo.tensors import ParamViews, as_array, as_tensor
from tgc.pass_manager import PassManager
from tgc.planner import load_backends
from tgc.planner.cost import CachedCosts, RooflineCostSource
from tgc.planner.executor import PlannedFunction
from tgc.planner.kernel import BACKEND_SPACE
from tgc.planner.options import PlanContext
from tgc.planner.route import plan_tolerance
from tgc.planner.select import plan_function, prepare, write_plan

# The kernel backends whose values live on the host (numpy, torch-cpu).
HOST_BACKENDS = frozenset(b for b, space in BACKEND_SPACE.items() if space is None)


def plan_on_host(func: FuncOp, options: BackendOptions) -> None:
    """Plan `func` (after lower-for-planning) over the host's kernels, in place: what
    `select_kernels` does, with the backends limited to the host's and no generated kernel."""
    load_backends(("numpy", "torch"))
    prepare(func)
    tolerance = plan_tolerance(func) if options.tolerance is None else options.tolerance
    if options.db is None:
        source = RooflineCostSource()
    else:
        from tgc.planner.estimate import DatabaseCostSource

        source = DatabaseCostSource(options.db)
    costs = CachedCosts(source)
    ctx = PlanContext(None, tolerance, backends=HOST_BACKENDS, generated=False)
    write_plan(func, plan_function(func, ctx, costs), costs)


class HostGraph:
    """One graph at one set of shapes, planned on the host: called with the graph's arguments
    (tensors and the ints Dynamo passes for symbolic sizes), it returns what the graph returns
    and writes the graph's in-place updates into their tensors."""

    def __init__(self, lowered: Lowered, options: BackendOptions) -> None:
        PassManager.from_text("lower-for-planning").run(lowered.module)
        func = lowered.func
        plan_on_host(func, options)
        self.lowered = lowered
        self.planned = PlannedFunction(func)
        first = len(lowered.own)
        self.param_slots = {i for i in range(first, len(func.body.args)) if func.is_param(i)}
        self.copied = kept_results(func)
        self.params = ParamViews()

    def __call__(self, args: list):
        lowered = self.lowered
        values = lowered.arguments(lowered.own, args, self.params, self.param_slots, _Arrays)
        results = self.planned(values)
        return lowered.hand_back(
            results, args, lambda i, array: as_tensor(array, copy=i in self.copied)
        )


class _Arrays:
    """A graph input that is not a parameter: its memory as a numpy array, every call."""

    @staticmethod
    def view(slot: int, tensor):
        return as_array(tensor)
