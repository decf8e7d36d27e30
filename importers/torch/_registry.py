"""The lowerings of aten ops, by op name: `@lowering("add", "sub")` registers a function for
every overload of aten.add and aten.sub (it reads the overload from `cx.overload` where they
differ). The families live in ops_elementwise.py, ops_rounding.py, ops_shape.py, ops_nn.py
and ops_conv.py.
"""

from __future__ import annotations

from collections.abc import Callable

LOWERINGS: dict[str, Callable] = {}

# Ops whose result is one of their operands as it is (in a program with no mutation).
IDENTITY_OPS = ("clone", "detach", "alias", "contiguous", "lift_fresh_copy", "alias_copy")
# Ops that check metadata when PyTorch runs and compute nothing.
ASSERT_OPS = ("_assert_tensor_metadata", "_assert_async", "_assert_scalar")
# Ops that make random or uninitialised values: never folded, never imported.
NONDETERMINISTIC_OPS = (
    "rand",
    "rand_like",
    "randn",
    "randn_like",
    "randint",
    "randint_like",
    "randperm",
    "bernoulli",
    "normal",
    "uniform",
    "multinomial",
    "native_dropout",
    "empty",
    "empty_like",
    "empty_strided",
    "new_empty",
    "new_empty_strided",
)
# Factories whose tensor inputs matter only by their shape and dtype (`zeros_like(x)`): folded
# like the factories without inputs.
LIKE_OPS = ("full_like", "zeros_like", "ones_like", "new_full", "new_zeros", "new_ones")


def lowering(*names: str) -> Callable[[Callable], Callable]:
    def register(fn: Callable) -> Callable:
        for name in names:
            if name in LOWERINGS:
                raise ValueError(f"two lowerings for aten.{name}")
            LOWERINGS[name] = fn
        return fn

    return register
