"""Extraction: choose one e-node per needed e-class so that the chosen graph costs least.

Exact extraction of a DAG is an integer program (Tensat solves one); this is two greedy passes
and a check, which is what fits here:

1. *tree* costs: each class's cheapest node by its own cost plus its children's classes' best
   costs, to a fixpoint. A shared child is counted once per reader, so this misses rewrites
   that pay only through sharing (two matmuls merged into one that both read);
2. *amortised* costs: the same, with a child's cost divided by the number of classes that
   read it, which favours shared children;
3. each choice is priced as the DAG it is (every chosen class once, from the roots), and the
   cheaper wins;
4. *local improvement*: one class of the chosen DAG at a time takes each of its other nodes,
   and a change that makes the DAG cheaper is kept, until no single change helps (or
   `IMPROVE_SECONDS` pass). The greedy passes miss optima that pay through sharing two ways at
   once: `x*a + x*b` and `x@a + x@b` both rewritten around one `a+b` (a 33% cheaper graph).

Nodes are visited in a fixed order (their text), so that the graph extracted does not depend on
the order Python's hashing puts a set in (it did: half of all processes missed that optimum).

Every node also costs a tiny `EPSILON`, so that a cycle of free nodes (views, fixed values) is
never the cheapest way to a class.
"""

from __future__ import annotations

import time
from collections.abc import Callable

from tgc.passes.eqsat.egraph import EGraph, ENode

EPSILON = 1e-15
IMPROVE_SECONDS = 1.0  # at most this long improving a greedy choice (step 4)
NodeCost = Callable[[ENode, int], float]  # (node, its class) -> seconds


def _ordered(nodes) -> list[ENode]:
    """A set of e-nodes in a fixed order (their text: ids, op names and attribute keys)."""
    return sorted(nodes, key=repr)


def _fixpoint(eg: EGraph, own: dict, share: dict[int, float]) -> dict[int, ENode]:
    best: dict[int, tuple[float, ENode]] = {}
    changed = True
    while changed:
        changed = False
        for cls, nodes in sorted(eg.nodes.items()):
            for node in _ordered(nodes):
                kids = node[2]
                if any(k not in best for k in kids):
                    continue
                total = own[node] + EPSILON + sum(best[k][0] / share.get(k, 1.0) for k in kids)
                if cls not in best or total < best[cls][0] * (1 - 1e-12):
                    best[cls] = (total, node)
                    changed = True
    return {cls: node for cls, (_, node) in best.items()}


def dag_cost(choice: dict[int, ENode], roots, own: dict) -> float | None:
    """The cost of the chosen DAG below `roots` (None: a cycle or a class without a choice)."""
    total, done, active = 0.0, set(), set()

    def visit(cls: int) -> bool:
        nonlocal total
        if cls in done:
            return True
        if cls in active or cls not in choice:
            return False
        active.add(cls)
        node = choice[cls]
        if not all(visit(k) for k in node[2]):
            return False
        active.discard(cls)
        done.add(cls)
        total += own[node]
        return True

    return total if all(visit(r) for r in roots) else None


def extract(eg: EGraph, roots: list[int], cost: NodeCost) -> tuple[dict[int, ENode], float]:
    own = {node: cost(node, cls) for cls, nodes in eg.nodes.items() for node in nodes}
    readers: dict[int, set[int]] = {}
    for cls, nodes in eg.nodes.items():
        for node in nodes:
            for k in node[2]:
                readers.setdefault(k, set()).add(cls)
    share = {k: float(len(v)) for k, v in readers.items()}
    best_choice, best_cost = None, float("inf")
    for shares in ({}, share):
        choice = _fixpoint(eg, own, shares)
        price = dag_cost(choice, roots, own)
        if price is not None and price < best_cost:
            best_choice, best_cost = choice, price
    if best_choice is None:
        raise ValueError("no acyclic extraction")
    return _improve(eg, roots, best_choice, best_cost, own)


def _reachable(choice: dict[int, ENode], roots) -> list[int]:
    seen, stack = set(), list(roots)
    while stack:
        cls = stack.pop()
        if cls not in seen and cls in choice:
            seen.add(cls)
            stack.extend(choice[cls][2])
    return sorted(seen)


def _improve(eg: EGraph, roots, choice: dict, price: float, own: dict):
    """Step 4 of the module doc: single-class changes kept while they make the DAG cheaper."""
    deadline = time.monotonic() + IMPROVE_SECONDS
    choice = dict(choice)
    improved = True
    while improved and time.monotonic() < deadline:
        improved = False
        for cls in _reachable(choice, roots):
            if time.monotonic() >= deadline:
                break  # a round over a large e-graph may itself outlast the budget
            current = choice[cls]
            for node in _ordered(eg.nodes[cls]):
                if node == current:
                    continue
                choice[cls] = node
                tried = dag_cost(choice, roots, own)
                if tried is not None and tried < price * (1 - 1e-12):
                    price, current, improved = tried, node, True
                else:
                    choice[cls] = current
            if improved:
                break  # the DAG changed: walk the classes it now reaches
    return choice, price
