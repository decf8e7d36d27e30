"""tgc/views.py: a chain of views read through the strides `strided_layout` gives is the chain's
value, as the numpy interpreter computes it (exact: views move elements, no arithmetic)."""

from __future__ import annotations

import numpy as np
import pytest

from tgc.builder import FunctionBuilder, tensor
from tgc.runtime.interpreter import run_function
from tgc.views import is_unit_reshape, strided_layout


def _heads(fb, x):
    """GPT-2's head split: a piece of a split along the last axis, reshaped, transposed."""
    _, k, _ = fb.atomic.split(x, axis=2, sizes=(12, 12, 12))
    k4 = fb.atomic.reshape(k, result_type=tensor("2x5x3x4xf32"))
    return fb.atomic.transpose(k4, perm=(0, 2, 1, 3))


def _sliced(fb, x):
    """Steps and starts in two dims, then a broadcast of a unit dim and a new leading dim."""
    s = fb.atomic.slice(x, start=(1, 0, 3), stop=(2, 5, 36), step=(1, 2, 3))
    return fb.atomic.broadcast(s, result_type=tensor("4x2x3x11xf32"))


def _reshaped(fb, x):
    """A transpose, then a reshape that splits a dim and drops a unit one."""
    t = fb.atomic.transpose(x, perm=(1, 0, 2))
    piece = fb.atomic.slice(t, start=(0, 1, 0), stop=(5, 2, 36), step=(1, 1, 1))
    return fb.atomic.reshape(piece, result_type=tensor("5x4x9xf32"))


CHAINS = {"heads": _heads, "sliced": _sliced, "reshaped": _reshaped}


@pytest.mark.parametrize("name", sorted(CHAINS))
def test_strided_reads_equal_the_interpreted_chain(name):
    fb = FunctionBuilder("f", [tensor("2x5x36xf32")], ["x"])
    (x,) = fb.args
    y = CHAINS[name](fb, x)
    module = fb.ret(y)
    func = module.funcs[0]
    found = strided_layout(func.body.last.operands[0])
    assert found is not None
    root, offset, strides = found
    assert root is func.body.args[0]
    data = np.random.default_rng(7).standard_normal((2, 5, 36)).astype(np.float32)
    (want,) = run_function(func, [data])
    flat = data.reshape(-1)
    item = flat.itemsize
    got = np.lib.stride_tricks.as_strided(
        flat[offset:], shape=want.shape, strides=[s * item for s in strides]
    )
    np.testing.assert_array_equal(got, want)


def test_a_reshape_that_splits_a_transposed_dim_has_no_strides():
    """Merging dims the transpose made non-adjacent needs a copy: no layout."""
    fb = FunctionBuilder("f", [tensor("4x6xf32")], ["x"])
    (x,) = fb.args
    t = fb.atomic.transpose(x, perm=(1, 0))
    module = fb.ret(fb.atomic.reshape(t, result_type=tensor("24xf32")))
    assert strided_layout(module.funcs[0].body.last.operands[0]) is None


def test_unit_reshapes_only_add_or_drop_unit_dims():
    fb = FunctionBuilder("f", [tensor("4x6xf32")], ["x"])
    (x,) = fb.args
    unit = fb.atomic.reshape(x, result_type=tensor("4x1x6xf32"))
    merged = fb.atomic.reshape(x, result_type=tensor("24xf32"))
    fb.ret(unit, merged)
    assert is_unit_reshape(unit.defining_op) and not is_unit_reshape(merged.defining_op)
