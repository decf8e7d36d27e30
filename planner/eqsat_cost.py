"""`eqsat{cost=planner}`: the e-graph's extraction priced by the planner (issue 28: the graph
chosen should be the one whose best plan is cheapest, not the one with the fewest flops).

Each e-node is an op on known types; it costs what its cheapest kernel costs on the backends
allowed (the pass's `backends`, else every one that loads here): measured in the database (the
pass's `db`, else the default one), else estimated from that kernel's other measurements, else
the planner's roofline (planner/estimate.py). Kernels over several ops (fused regions) are not
priced, so a graph's cost is the sum of its ops' single-op kernels: what select-kernels pays
before it fuses. An op no kernel here runs keeps `algebraic`'s roofline cost. Leaves, pieces of
a split and ops on fixed values are free, as in the roofline model.

Registered in passes/eqsat `COST_MODELS` when tgc loads (tgc.load_all), which imports this
module only when a pipeline asks for it.
"""

from __future__ import annotations

import math

from tgc.passes.eqsat import roofline_cost
from tgc.passes.eqsat.egraph import LEAF
from tgc.passes.eqsat.rules import PIECE


def planner_cost(eg, options):
    """The pass's NodeCost from the planner's kernels and cost source (module doc)."""
    from tgc.planner import check_families, kernel_backends, load_backends
    from tgc.planner.cost import CachedCosts
    from tgc.planner.estimate import DatabaseCostSource
    from tgc.planner.kernel import kernels_for_op

    families = check_families(options.backends) if options.backends else None
    load_backends(families, required=bool(families))
    allowed = kernel_backends(families) if families else None
    costs = CachedCosts(DatabaseCostSource(options.db or None))
    fallback = roofline_cost(eg, options.weights())
    memo: dict[tuple, float] = {}

    def cost(node, cls: int) -> float:
        op, key, kids = node
        if op in (LEAF, PIECE) or (kids and all(eg.fixed[eg.find(k)] for k in kids)):
            return 0.0
        operands = tuple(eg.types[eg.find(k)] for k in kids)
        results = (eg.types[cls],)
        found = memo.get((op, operands, results))
        if found is None:
            found = math.inf
            for kernel in kernels_for_op(op):
                if allowed is not None and kernel.backend not in allowed:
                    continue
                if kernel.constraints((list(operands), list(results))) is not None:
                    continue
                try:
                    found = min(found, costs.cost(kernel, operands, results).seconds)
                except LookupError:  # a backend the cost source cannot describe here
                    continue
            memo[(op, operands, results)] = found
        return found if found < math.inf else fallback(node, cls)

    return cost
