"""A small e-graph: e-classes of equal values, each a set of e-nodes, kept congruent.

An e-node is `(op, attr_key, children)`: an op name, its attributes as a comparable key
(passes/rule_file.py `attr_key_of`) and the ids of its operands' e-classes. Leaves (function
arguments, results of ops the e-graph does not model) are nodes of op `LEAF` whose key names
them. Every class has one tensor type (all its values are equal, so of one type) and knows
whether it is *fixed* (computed from parameters and constants alone: priced as free, as
`algebraic`'s cost model does).

Union-find merges classes; `rebuild` restores congruence (two nodes with the same op and
attributes over the same classes are one class) by recanonicalising every node until nothing
merges: simple, and linear per round in the size of the graph, which the pass bounds.
"""

from __future__ import annotations

from tgc.types import TensorType

LEAF = "eqsat.leaf"

ENode = tuple  # (op, attr_key, children)


class EGraph:
    def __init__(self) -> None:
        self.parent: list[int] = []
        self.nodes: dict[int, set[ENode]] = {}
        self.types: list[TensorType] = []
        self.fixed: list[bool] = []
        self.memo: dict[ENode, int] = {}
        self.attributes: dict[tuple, tuple] = {}  # (op, attr_key) -> attributes to build with
        self.merged: set[int] = set()  # classes made by merging matmuls (rules.py)

    def find(self, c: int) -> int:
        while self.parent[c] != c:
            self.parent[c] = self.parent[self.parent[c]]
            c = self.parent[c]
        return c

    def canon(self, node: ENode) -> ENode:
        op, key, kids = node
        return (op, key, tuple(self.find(k) for k in kids))

    def add(self, node: ENode, type: TensorType, fixed: bool = False, attributes=()) -> int:
        node = self.canon(node)
        found = self.memo.get(node)
        if found is not None:
            return self.find(found)
        c = len(self.parent)
        self.parent.append(c)
        self.types.append(type)
        self.fixed.append(fixed or (node[0] != LEAF and all(self.fixed[k] for k in node[2])))
        self.nodes[c] = {node}
        self.memo[node] = c
        self.attributes.setdefault(node[:2], attributes)
        return c

    def union(self, a: int, b: int) -> int:
        a, b = self.find(a), self.find(b)
        if a == b:
            return a
        if len(self.nodes[a]) < len(self.nodes[b]):
            a, b = b, a
        self.parent[b] = a
        self.nodes[a] |= self.nodes.pop(b)
        self.fixed[a] = self.fixed[a] or self.fixed[b]
        return a

    def rebuild(self) -> None:
        while True:
            memo: dict[ENode, int] = {}
            pairs = []
            for c in list(self.nodes):
                for node in self.nodes[c]:
                    n = self.canon(node)
                    other = memo.setdefault(n, c)
                    if self.find(other) != self.find(c):
                        pairs.append((other, c))
            for a, b in pairs:
                self.union(a, b)
            if not pairs:
                break
        self.memo = {}
        for c in self.nodes:
            self.nodes[c] = {self.canon(n) for n in self.nodes[c]}
            for n in self.nodes[c]:
                self.memo[n] = c

    def classes(self) -> list[int]:
        return list(self.nodes)

    @property
    def size(self) -> int:
        return sum(len(ns) for ns in self.nodes.values())
