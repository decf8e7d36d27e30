"""Which parameter arrays a runner's device state belongs to (no GPU needed: tested on the CPU).

A plan's prologue (codegen/plan.py) computes from the parameters, the arguments marked
`{tgc.param}`; the CUDA runner uploads them and runs the prologue once per set of parameter
arrays. A set is known by the identity of its arrays, not their contents (comparing 100 MB of
weights on every call would cost more than it saves): the runner holds a reference to each, so
no new array can take the id of one it still compares against. An array changed in place is the
same array: parameters must not change between calls; pass a new array object to change one.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence


class ParamSet:
    """The parameter arrays last held, by input position."""

    def __init__(self, positions: Iterable[int]) -> None:
        self.positions = tuple(sorted(positions))
        self.arrays: tuple[object, ...] | None = None  # held: their ids stay taken

    def same(self, inputs: Sequence[object]) -> bool:
        """Whether `inputs` holds, at every parameter position, the very array last held."""
        if self.arrays is None:
            return False
        return all(inputs[i] is a for i, a in zip(self.positions, self.arrays))

    def hold(self, inputs: Sequence[object]) -> None:
        """Remember the parameter arrays of `inputs` (keeping them alive)."""
        self.arrays = tuple(inputs[i] for i in self.positions)
