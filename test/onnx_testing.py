"""What the ONNX importer's tests share: building small models, drawing inputs, comparing outputs.

Imported by test/test_import_onnx*.py (the test folder is on pytest's path); needs the onnx
extra, which those modules check with `pytest.importorskip` before importing this one.
"""

from __future__ import annotations

import numpy as np
from onnx import helper

RNG = np.random.default_rng()


def make_model(nodes, inputs, outputs, initializers=(), *, opset: int, name: str = "g"):
    """A model of `nodes` in the default domain at `opset`; inputs/outputs are
    (name, TensorProto element type, shape) triples."""
    graph = helper.make_graph(
        nodes,
        name,
        [helper.make_tensor_value_info(*i) for i in inputs],
        [helper.make_tensor_value_info(*o) for o in outputs],
        list(initializers),
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])


def random_array(shape, dtype=np.float32, int_range: tuple[int, int] = (-5, 6)) -> np.ndarray:
    """Fresh values: booleans fair, integers uniform in [low, high), floats from N(0, 1)."""
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        return RNG.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return RNG.integers(*int_range, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def assert_outputs_match(got, want, rtol: float, atol: float) -> None:
    """Same count, shapes and dtypes; floats within the tolerances (NaN where the other has
    NaN), everything else exactly."""
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if np.issubdtype(w.dtype, np.floating):
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)
