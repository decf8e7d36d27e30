"""The data-movement and shape converters of tgc-import (importers/onnx/ops_shape.py and
ops_resize.py): one-node models on fresh random inputs and parameters, imported, run on the
numpy interpreter and compared with onnx's ReferenceEvaluator; and each diagnostic they give.

Tolerances: the ops that only move data (everything but Resize's interpolation) must be exact;
Resize's linear and cubic modes sum up to a dozen f32 products of inputs of size ~1 against the
reference's float64 sums: within rtol 1e-5, atol 1e-5.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest

onnx = pytest.importorskip("onnx", reason="the onnx extra is not installed")

from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx.reference import ReferenceEvaluator  # noqa: E402

import tgc  # noqa: E402
from tgc.diagnostics import TgcError  # noqa: E402
from tgc.importers.onnx import import_onnx  # noqa: E402

OPSET = 21
RNG = np.random.default_rng()
ELEM = {
    np.dtype(np.float32): TensorProto.FLOAT,
    np.dtype(np.float64): TensorProto.DOUBLE,
    np.dtype(np.int64): TensorProto.INT64,
    np.dtype(np.int32): TensorProto.INT32,
    np.dtype(np.bool_): TensorProto.BOOL,
}


class Const:
    """A node input given as an initializer (a constant) rather than a graph input."""

    def __init__(self, value) -> None:
        self.value = np.asarray(value)


def one_node(
    op, inputs, attrs=None, outputs=1, out_dtype=None, opset=OPSET, name="n", out_shape=None
):
    """A model of one `op` node; `inputs` are arrays (graph inputs), Const (initializers) or
    None (an absent optional input). The outputs are declared with the type and shape the
    ReferenceEvaluator computes (or, where it refuses the node, as rank-0 tensors of
    `out_dtype`, default the first input's, and `out_shape`: the importer's error comes
    first)."""
    names, graph_inputs, initializers, feeds = [], [], [], {}
    for i, value in enumerate(inputs):
        if value is None:
            names.append("")
            continue
        label = f"in{i}"
        names.append(label)
        if isinstance(value, Const):
            initializers.append(numpy_helper.from_array(value.value, label))
        else:
            value = np.asarray(value)
            graph_inputs.append(
                helper.make_tensor_value_info(label, ELEM[value.dtype], value.shape)
            )
            feeds[label] = value
    first = next(v for v in inputs if v is not None)
    first = first.value if isinstance(first, Const) else np.asarray(first)
    outs = [f"y{i}" for i in range(outputs)]
    node = helper.make_node(op, names, outs, name=name, **(attrs or {}))

    def build(declared):
        graph = helper.make_graph([node], "g", graph_inputs, declared, initializers)
        return helper.make_model(graph, opset_imports=[helper.make_opsetid("", opset)])

    untyped = [helper.make_tensor_value_info(o, ELEM[np.dtype(np.float32)], None) for o in outs]
    try:
        results = ReferenceEvaluator(build(untyped)).run(None, feeds)
        shapes = [(ELEM[np.asarray(r).dtype], np.asarray(r).shape) for r in results]
    except Exception:  # noqa: BLE001  (an invalid node: the importer must refuse it)
        shapes = [(ELEM[np.dtype(out_dtype or first.dtype)], out_shape or ())] * outputs
    declared = [helper.make_tensor_value_info(o, *t) for o, t in zip(outs, shapes)]
    return build(declared), feeds


def check(model, feeds, rtol=0.0, atol=0.0):
    """Import and run on tgc's interpreter; compare with the ReferenceEvaluator (exactly when
    both tolerances are 0). Returns the imported module."""
    module = import_onnx(model)
    got = tgc.run(module, list(feeds.values()))
    want = ReferenceEvaluator(model).run(None, feeds)
    assert len(got) == len(want)
    for g, w in zip(got, want):
        w = np.asarray(w)
        assert g.shape == w.shape and g.dtype == w.dtype, (g.shape, g.dtype, w.shape, w.dtype)
        if rtol or atol:
            np.testing.assert_allclose(g, w, rtol=rtol, atol=atol)
        else:
            np.testing.assert_array_equal(g, w)
    return module


def error_of(model) -> str:
    with pytest.raises(TgcError) as info:
        import_onnx(model)
    return info.value.render()


def data(*shape, dtype=np.float32):
    if np.dtype(dtype) == np.bool_:
        return RNG.random(shape) < 0.5
    if np.issubdtype(dtype, np.integer):
        return RNG.integers(-50, 50, size=shape).astype(dtype)
    return RNG.standard_normal(shape).astype(dtype)


def ints(*values):
    return Const(np.array(values, np.int64))


def ops_of(module) -> list[str]:
    return [op.name for op in module.funcs[0].body.ops]


# -- reshapes --------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "target", "allowzero"),
    [
        ((2, 3, 4), (4, -1), 0),
        ((2, 3, 4), (0, -1), 0),  # 0 copies dim 0
        ((2, 3, 4), (0, 0, 2, 2), 0),
        ((2, 3, 4), (-1,), 0),
        ((0, 3, 4), (3, 4, 0), 1),  # allowzero: 0 is a size
        ((2, 3, 4), (2, 3, 4), 0),  # nothing to do
    ],
)
def test_reshape(shape, target, allowzero):
    model, feeds = one_node("Reshape", [data(*shape), ints(*target)], {"allowzero": allowzero})
    check(model, feeds)


@pytest.mark.parametrize(
    ("target", "allowzero", "message"),
    [
        ((-1, -1), 0, "shape [-1, -1] has more than one -1"),
        ((0, -1), 1, "shape [0, -1] has both 0 and -1, which allowzero=1 forbids"),
        ((5, -1), 0, "cannot reshape tensor<2x3xf32> to [5, -1]: no size for the -1 fits"),
        ((7,), 0, "cannot reshape tensor<2x3xf32> (6 elements) to [7]"),
        ((2, -2), 0, "shape [2, -2] has the invalid dim -2"),
        ((1, 1, 0, 6), 0, "shape [1, 1, 0, 6] copies dim 2, but the input is tensor<2x3xf32>"),
    ],
)
def test_reshape_errors(target, allowzero, message):
    model, _ = one_node("Reshape", [data(2, 3), ints(*target)], {"allowzero": allowzero})
    assert error_of(model) == f"<onnx model>: error: node 'n' (Reshape): {message}"


def test_reshape_shape_known_only_at_run_time_is_an_error():
    model, _ = one_node("Reshape", [data(2, 3), np.array([3, 2], np.int64)])
    assert error_of(model) == (
        "<onnx model>: error: node 'n' (Reshape): 'shape' ('in1') must be a constant (an "
        "initializer or computed from constants): tgc tensors have static shapes"
    )


@pytest.mark.parametrize("axis", [-4, -2, 0, 1, 3, 4])
def test_flatten(axis):
    model, feeds = one_node("Flatten", [data(2, 3, 4, 5)], {"axis": axis})
    check(model, feeds)


def test_flatten_axis_out_of_range():
    model, _ = one_node("Flatten", [data(2, 3)], {"axis": 3})
    assert error_of(model).endswith("(Flatten): axis 3 is out of range for rank 2")


@pytest.mark.parametrize("axes", [None, (0,), (-1, 0), (2,)])
def test_squeeze(axes):
    inputs = [data(1, 3, 1)] + ([] if axes is None else [ints(*axes)])
    model, feeds = one_node("Squeeze", inputs)
    check(model, feeds)


def test_squeeze_errors():
    model, _ = one_node("Squeeze", [data(1, 3), ints(1)])
    assert error_of(model).endswith(
        "(Squeeze): cannot squeeze dim 1 of tensor<1x3xf32>: its size is not 1"
    )
    model, _ = one_node("Squeeze", [data(1, 3), ints(0, -2)])
    assert error_of(model).endswith("(Squeeze): axes [0, -2] repeat an axis")
    model, _ = one_node("Squeeze", [data(1, 3), ints(2)])
    assert error_of(model).endswith("(Squeeze): axes 2 is out of range for rank 2")


@pytest.mark.parametrize("axes", [(0,), (-1,), (3, 0), (1, -1, 0)])
def test_unsqueeze(axes):
    model, feeds = one_node("Unsqueeze", [data(3, 4), ints(*axes)])
    check(model, feeds)


# -- permutations, concatenation, split ---------------------------------------------------------


@pytest.mark.parametrize("perm", [None, *itertools.permutations(range(3))])
def test_transpose(perm):
    attrs = {} if perm is None else {"perm": list(perm)}
    model, feeds = one_node("Transpose", [data(2, 3, 4)], attrs)
    check(model, feeds)


def test_transpose_not_a_permutation():
    model, _ = one_node("Transpose", [data(2, 3)], {"perm": [0, 0]})
    assert error_of(model).endswith("(Transpose): perm [0, 0] is not a permutation of the 2 dims")


@pytest.mark.parametrize("axis", [0, 1, -1, -2])
def test_concat(axis):
    parts = [data(2, 3), data(2, 3), data(2, 3)]
    model, feeds = one_node("Concat", parts, {"axis": axis})
    check(model, feeds)


def test_concat_of_one_and_of_constants():
    model, feeds = one_node("Concat", [data(4, 2)], {"axis": 0})
    check(model, feeds)
    model, feeds = one_node("Concat", [data(2, 2), Const(data(1, 2))], {"axis": 0})
    check(model, feeds)


@pytest.mark.parametrize(
    ("dim", "attrs", "split", "outputs", "opset"),
    [
        (6, {}, None, 3, 13),  # equal parts, as many as outputs
        (6, {}, (1, 5), 2, 13),  # sizes as an input
        (7, {"num_outputs": 3}, None, 3, 18),  # the last piece smaller
        (8, {"num_outputs": 4}, None, 4, 18),
        (6, {}, (6,), 1, 18),
        (0, {}, (0, 0, 0), 3, 18),
    ],
)
def test_split(dim, attrs, split, outputs, opset):
    inputs = [data(2, dim)] + ([] if split is None else [ints(*split)])
    model, feeds = one_node("Split", inputs, {"axis": 1, **attrs}, outputs=outputs, opset=opset)
    check(model, feeds)


def test_split_errors():
    model, _ = one_node("Split", [data(2, 7)], {"axis": 1}, outputs=2)
    assert error_of(model).endswith("(Split): dim of size 7 does not split into 2 equal parts")
    model, _ = one_node("Split", [data(2, 7), ints(3, 3)], {"axis": 1}, outputs=2)
    assert error_of(model).endswith(
        "(Split): split sizes [3, 3] do not add up to dim 1 of tensor<2x7xf32> (7)"
    )
    model, _ = one_node("Split", [data(5), ints(1, 1, 3)], outputs=2)
    assert error_of(model).endswith("(Split): 3 split sizes [1, 1, 3] for 2 outputs")


# -- slicing and gathering ----------------------------------------------------------------------


def test_slice_random():
    """Random bounds (negative, beyond the dims, INT64 extremes), steps of either sign,
    axes given or not, in any order."""
    big = np.iinfo(np.int64)
    for _ in range(60):
        shape = tuple(RNG.integers(1, 7, size=3))
        axes = RNG.permutation(3)[: RNG.integers(1, 4)]
        starts, ends, steps = [], [], []
        for a in axes:
            n = shape[a]
            pick = [RNG.integers(-n - 3, n + 3), big.max, big.min]
            starts.append(pick[0] if RNG.random() < 0.8 else pick[RNG.integers(1, 3)])
            ends.append(RNG.integers(-n - 3, n + 3) if RNG.random() < 0.8 else pick[2])
            steps.append(RNG.choice([-3, -2, -1, 1, 2, 3]))
        inputs = [data(*shape), ints(*starts), ints(*ends), ints(*axes), ints(*steps)]
        model, feeds = one_node("Slice", inputs)
        check(model, feeds)


def test_slice_defaults_and_no_op():
    model, feeds = one_node("Slice", [data(4, 5), ints(1, 0), ints(3, 5)])
    check(model, feeds)
    model, feeds = one_node("Slice", [data(4, 5), ints(0), ints(9)])
    module = check(model, feeds)
    assert "atomic.slice" not in ops_of(module)


def test_slice_errors():
    model, _ = one_node("Slice", [data(4), ints(0), ints(4), ints(0), ints(0)])
    assert error_of(model).endswith("(Slice): a step of 0 is not allowed")
    model, _ = one_node("Slice", [data(4), ints(0, 1), ints(4)])
    assert error_of(model).endswith(
        "(Slice): starts, ends, axes and steps must have the same length"
    )
    model, _ = one_node("Slice", [data(4, 4), ints(0, 0), ints(1, 1), ints(1, -1)])
    assert error_of(model).endswith("(Slice): axes [1, -1] repeat an axis")


@pytest.mark.parametrize("axis", [0, 1, -1])
@pytest.mark.parametrize("known", [True, False])
def test_gather_negative_indices(axis, known):
    table = data(4, 5, 3)
    size = table.shape[axis]
    indices = RNG.integers(-size, size, size=(2, 3)).astype(np.int64)
    model, feeds = one_node("Gather", [table, Const(indices) if known else indices], {"axis": axis})
    check(model, feeds)


def test_gather_scalar_and_int32_indices():
    model, feeds = one_node("Gather", [data(5, 3), np.array(-2, np.int64)])
    check(model, feeds)
    indices = np.array([[0, -1], [3, -5]], np.int32)
    model, feeds = one_node("Gather", [data(5, 3), indices], {"axis": 0})
    check(model, feeds)


def test_gather_index_out_of_range():
    model, _ = one_node("Gather", [data(5, 3), ints(0, 5)])
    assert error_of(model).endswith("(Gather): index 5 is out of range for dim 0 of size 5")
    model, _ = one_node("Gather", [data(5, 3), ints(-6)])
    assert error_of(model).endswith("(Gather): index -6 is out of range for dim 0 of size 5")
    model, feeds = one_node("Gather", [data(5, 3), np.array([7], np.int64)], out_shape=(1, 3))
    module = import_onnx(model)
    with pytest.raises(TgcError, match=r"index 7 .* is out of range \[0, 5\)"):
        tgc.run(module, list(feeds.values()))


@pytest.mark.parametrize("axis", [0, 1, 2, -1])
def test_gather_elements(axis):
    """Against np.take_along_axis (the reference evaluator rejects a negative axis)."""
    table = data(3, 4, 5)
    shape = list(table.shape)
    shape[axis] = 6  # the indexed axis may have any length
    size = table.shape[axis]
    indices = RNG.integers(-size, size, size=shape).astype(np.int64)
    model, _ = one_node("GatherElements", [table, indices], {"axis": axis}, out_shape=shape)
    got = tgc.run(import_onnx(model), [table, indices])[0]
    want = np.take_along_axis(table, np.where(indices < 0, indices + size, indices), axis)
    np.testing.assert_array_equal(got, want)


def test_gather_elements_indices_that_do_not_fit():
    model, _ = one_node("GatherElements", [data(2, 2), np.zeros((3, 2), np.int64)], {"axis": 1})
    assert error_of(model).endswith(
        "(GatherElements): indices tensor<3x2xi64> do not fit data tensor<2x2xf32> along axis 1"
    )


@pytest.mark.parametrize(
    ("shape", "ishape", "batch"),
    [
        ((4, 5, 3), (2, 2), 0),
        ((4, 5, 3), (3, 1, 3), 0),
        ((4, 5, 3), (4, 2, 1), 1),
        ((2, 3), (2,), 0),
    ],
)
def test_gather_nd(shape, ishape, batch):
    table = data(*shape)
    addressed = shape[batch : batch + ishape[-1]]
    indices = np.stack([RNG.integers(-d, d, size=ishape[:-1]) for d in addressed], axis=-1).astype(
        np.int64
    )
    model, feeds = one_node("GatherND", [table, indices], {"batch_dims": batch})
    check(model, feeds)


# -- broadcasting, repetition, padding ----------------------------------------------------------


@pytest.mark.parametrize(
    ("shape", "target"), [((3, 1), (2, 3, 4)), ((3, 1), (1,)), ((1, 4), (3, 1)), ((2,), (2,))]
)
def test_expand(shape, target):
    model, feeds = one_node("Expand", [data(*shape), ints(*target)])
    check(model, feeds)


def test_expand_incompatible():
    model, _ = one_node("Expand", [data(3, 2), ints(3, 4)])
    assert error_of(model).endswith("(Expand): cannot expand tensor<3x2xf32> to shape [3, 4]")


@pytest.mark.parametrize("repeats", [(1, 1), (2, 3), (1, 4), (0, 2)])
def test_tile(repeats):
    model, feeds = one_node("Tile", [data(3, 2), ints(*repeats)])
    check(model, feeds)


def test_tile_wrong_repeats():
    model, _ = one_node("Tile", [data(3, 2), ints(2)])
    assert error_of(model).endswith("(Tile): repeats [2] must be 2 non-negative counts")


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_random(mode):
    for _ in range(10):
        x = data(3, 4, 5)
        pads = RNG.integers(0, 5, size=6)
        inputs = [x, ints(*pads)]
        if mode == "constant":
            inputs.append(np.array(RNG.standard_normal(), np.float32))
        model, feeds = one_node("Pad", inputs, {"mode": mode})
        check(model, feeds)


def test_pad_negative_pads_crop():
    """The reference evaluator refuses negative pads (np.pad does): numpy by hand."""
    x = data(4, 5)
    pads = [-1, 2, 1, -3]  # begins, ends
    model, _ = one_node("Pad", [x, ints(*pads), np.array(9, np.float32)], out_shape=(4, 4))
    got = tgc.run(import_onnx(model), [x, np.array(9, np.float32)])[0]
    want = np.pad(x[1:, : 5 - 3], [(0, 1), (2, 0)], constant_values=9)
    np.testing.assert_array_equal(got, want)


def test_pad_axes_and_default_value():
    model, feeds = one_node("Pad", [data(3, 4), ints(1, 2), None, ints(-1)])
    check(model, feeds)


def test_pad_errors():
    model, _ = one_node("Pad", [data(3, 4), ints(1, 2, 3)])
    assert error_of(model).endswith("(Pad): pads [1, 2, 3] must have 2 entries per padded axis (2)")
    model, _ = one_node("Pad", [data(3), ints(-2, -2)])
    assert error_of(model).endswith("(Pad): pads crop more than dim 0 has (3)")
    model, _ = one_node("Pad", [data(0, 2), ints(1, 0, 0, 0)], {"mode": "edge"})
    assert error_of(model).endswith("(Pad): mode 'edge' cannot pad dim 0, which has size 0")


@pytest.mark.parametrize("axes", [None, (0, 1), (-1,)])
def test_center_crop_pad(axes):
    x = data(5, 6, 3)
    rank_axes = range(3) if axes is None else axes
    target = [int(RNG.integers(1, 9)) for _ in rank_axes]
    attrs = {} if axes is None else {"axes": list(axes)}
    model, feeds = one_node("CenterCropPad", [x, ints(*target)], attrs)
    check(model, feeds)


@pytest.mark.parametrize("mode", ["DCR", "CRD"])
def test_depth_to_space_and_back(mode):
    model, feeds = one_node("DepthToSpace", [data(2, 12, 3, 4)], {"blocksize": 2, "mode": mode})
    check(model, feeds)
    model, feeds = one_node("SpaceToDepth", [data(2, 3, 4, 6)], {"blocksize": 2})
    check(model, feeds)


def test_depth_to_space_errors():
    model, _ = one_node("DepthToSpace", [data(1, 6, 2, 2)], {"blocksize": 2})
    assert error_of(model).endswith(
        "(DepthToSpace): needs a 4-D input whose channels divide by 2², got tensor<1x6x2x2xf32>"
    )
    model, _ = one_node("SpaceToDepth", [data(1, 1, 3, 2)], {"blocksize": 2})
    assert error_of(model).endswith(
        "(SpaceToDepth): needs a 4-D input whose H and W divide by 2, got tensor<1x1x3x2xf32>"
    )


@pytest.mark.parametrize("upper", [0, 1])
@pytest.mark.parametrize("k", [None, -2, 0, 3, "run time"])
def test_trilu(upper, k):
    x = data(2, 4, 5)
    inputs = [x]
    if k == "run time":
        inputs.append(np.array(int(RNG.integers(-4, 5)), np.int64))
    elif k is not None:
        inputs.append(Const(np.array(k, np.int64)))
    model, feeds = one_node("Trilu", inputs, {"upper": upper})
    check(model, feeds)


# -- shape arithmetic ---------------------------------------------------------------------------


@pytest.mark.parametrize(("start", "end"), [(None, None), (1, None), (-2, -1), (5, 1), (-9, 9)])
def test_shape_folds(start, end):
    attrs = {k: v for k, v in (("start", start), ("end", end)) if v is not None}
    model, feeds = one_node("Shape", [data(2, 3, 4)], attrs)
    module = check(model, feeds)
    assert ops_of(module) == ["atomic.constant", "func.return"]


def test_shape_feeds_a_reshape_without_reading_the_value():
    """Shape -> Gather -> Concat -> Reshape: all folded at import, the data stays an argument."""
    nodes = [
        helper.make_node("Shape", ["x"], ["s"]),
        helper.make_node("Gather", ["s", "zero"], ["batch"], axis=0),
        helper.make_node("Concat", ["batch", "minus_one"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
    ]
    inits = [
        numpy_helper.from_array(np.array([0], np.int64), "zero"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus_one"),
    ]
    graph = helper.make_graph(
        nodes,
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 3, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 12])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)])
    module = check(model, {"x": data(2, 3, 4)})
    assert ops_of(module) == ["atomic.reshape", "func.return"]


def test_size_and_constant_of_shape_and_range_fold():
    model, feeds = one_node("Size", [data(2, 3)])
    check(model, feeds)
    value = numpy_helper.from_array(np.array([2.5], np.float64), "value")
    model, feeds = one_node("ConstantOfShape", [ints(2, 3)], {"value": value})
    module = check(model, feeds)
    assert ops_of(module) == ["atomic.constant", "func.return"]
    model, feeds = one_node("ConstantOfShape", [ints(0)])
    check(model, feeds)
    for start, limit, delta, dtype in [(1, 10, 3, np.int64), (2.5, -1.0, -0.75, np.float32)]:
        scalars = [Const(np.array(v, dtype)) for v in (start, limit, delta)]
        model, feeds = one_node("Range", scalars)
        check(model, feeds)


def test_range_and_constant_of_shape_errors():
    model, _ = one_node("Range", [np.array(0, np.int64), ints(5), ints(1)])
    assert error_of(model).endswith(
        "(Range): 'start' ('in0') must be a constant (an initializer or computed from "
        "constants): tgc tensors have static shapes"
    )
    model, _ = one_node("Range", [Const(np.array(0, np.int64)), ints(5), ints(0)])
    assert error_of(model).endswith("(Range): delta must not be 0")
    model, _ = one_node("ConstantOfShape", [ints(2, -1)])
    assert error_of(model).endswith("(ConstantOfShape): shape [2, -1] has a negative dim")


@pytest.mark.parametrize("k", [-1, 0, 2])
def test_eye_like(k):
    model, feeds = one_node(
        "EyeLike", [data(3, 4)], {"k": k, "dtype": TensorProto.INT64}, out_dtype=np.int64
    )
    module = check(model, feeds)
    assert ops_of(module) == ["atomic.constant", "func.return"]
    model, feeds = one_node("EyeLike", [data(3, 3, dtype=np.float64)])
    check(model, feeds)


# -- Resize ---------------------------------------------------------------------------------------

TRANSFORMS = [
    "half_pixel",
    "half_pixel_symmetric",
    "pytorch_half_pixel",
    "align_corners",
    "asymmetric",
]


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("transform", TRANSFORMS)
def test_resize_random(mode, transform):
    """Random sizes up and down, by scales or by sizes, with the mode's options drawn too."""
    for _ in range(4):
        x = data(1, 2, int(RNG.integers(1, 7)), int(RNG.integers(1, 7)))
        attrs = {"mode": mode, "coordinate_transformation_mode": transform}
        if mode == "nearest":
            attrs["nearest_mode"] = str(
                RNG.choice(["round_prefer_floor", "round_prefer_ceil", "floor", "ceil"])
            )
        else:
            attrs["antialias"] = int(RNG.integers(0, 2))
            attrs["exclude_outside"] = int(RNG.integers(0, 2))
            attrs["cubic_coeff_a"] = float(RNG.choice([-0.75, -0.5]))
        if RNG.random() < 0.5:
            scales = [1.0, 1.0, *RNG.choice([0.5, 0.6, 1.0, 1.5, 2.0, 3.0], size=2)]
            inputs = [x, None, Const(np.array(scales, np.float32))]
        else:
            sizes = [1, 2, *RNG.integers(1, 9, size=2)]
            inputs = [x, None, None, ints(*sizes)]
        model, feeds = one_node("Resize", inputs, attrs, opset=19)
        check(model, feeds, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("policy", ["not_larger", "not_smaller"])
def test_resize_keep_aspect_ratio_on_axes(policy):
    attrs = {"axes": [2, 3], "keep_aspect_ratio_policy": policy, "mode": "linear"}
    model, feeds = one_node("Resize", [data(1, 1, 3, 5), None, None, ints(7, 4)], attrs, opset=19)
    check(model, feeds, rtol=1e-5, atol=1e-5)


def test_resize_tf_crop_and_resize_extrapolates():
    attrs = {
        "mode": "linear",
        "coordinate_transformation_mode": "tf_crop_and_resize",
        "extrapolation_value": 7.0,
    }
    roi = Const(np.array([0, 0, -0.2, 0.4, 1, 1, 0.9, 1.3], np.float32))
    model, feeds = one_node("Resize", [data(1, 1, 4, 4), roi, None, ints(1, 1, 5, 3)], attrs)
    check(model, feeds, rtol=1e-5, atol=1e-5)


def test_resize_nearest_keeps_integers_exact():
    x = data(1, 1, 3, 3, dtype=np.int64)
    scales = Const(np.array([1, 1, 2.5, 0.7], np.float32))
    model, feeds = one_node("Resize", [x, None, scales], {"mode": "nearest"})
    module = check(model, feeds)
    assert "atomic.matmul" not in ops_of(module)


def test_resize_errors():
    scales = Const(np.array([1, 1, 2, 2], np.float32))
    model, _ = one_node("Resize", [data(1, 1, 2, 2), None, scales], {"mode": "area"})
    assert error_of(model).endswith(
        "(Resize): mode 'area' is not supported (nearest, linear, cubic)"
    )
    model, _ = one_node("Resize", [data(1, 1, 2, 2), None, scales, ints(1, 1, 4, 4)])
    assert error_of(model).endswith("(Resize): exactly one of 'scales' and 'sizes' must be given")
    x = data(1, 1, 2, 2, dtype=np.int64)
    model, _ = one_node("Resize", [x, None, scales], {"mode": "linear"})
    assert error_of(model).endswith(
        "(Resize): mode 'linear' needs a float input, got tensor<1x1x2x2xi64>"
    )
    model, _ = one_node("Resize", [data(1, 1, 2, 2), None, scales], {"antialias": 1})
    assert error_of(model).endswith(
        "(Resize): antialias is not supported with mode 'nearest' (ONNX defines none)"
    )


# -- scatters -------------------------------------------------------------------------------------


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_scatter_elements_random(reduction, dtype):
    """Indices drawn with repeats (ONNX writes in order: the last one stays for "none")."""
    for axis in (0, 1, -1):
        table = data(4, 5, 3, dtype=dtype)
        shape = list(table.shape)
        shape[axis] = 7
        shape[(axis + 1) % 3] -= 1  # the other dims may be shorter than the data's
        size = table.shape[axis]
        indices = RNG.integers(-size, size, size=shape).astype(np.int64)
        updates = data(*shape, dtype=dtype)
        attrs = {"axis": axis, "reduction": reduction}
        model, feeds = one_node("ScatterElements", [table, indices, updates], attrs)
        check(model, feeds, *((1e-5, 1e-5) if dtype == np.float32 else (0.0, 0.0)))


COMBINE = {
    "none": lambda old, new: new,
    "add": np.add,
    "mul": np.multiply,
    "max": np.maximum,
    "min": np.minimum,
}


def scatter_nd_numpy(table, indices, updates, reduction):
    """ScatterND as the spec says it, one update after the other (the reference evaluator's
    max and min index the output wrongly for tuples of more than one index)."""
    out = table.copy()
    for i in np.ndindex(indices.shape[:-1]):
        at = tuple(indices[i])
        out[at] = COMBINE[reduction](out[at], updates[i])
    return out


@pytest.mark.parametrize("reduction", ["none", "add", "mul", "max", "min"])
@pytest.mark.parametrize(
    ("shape", "ishape"), [((4, 5, 3), (6, 1)), ((4, 5, 3), (2, 3, 2)), ((5,), (9, 1))]
)
def test_scatter_nd_random(reduction, shape, ishape):
    table = data(*shape)
    depth = ishape[-1]
    indices = np.stack(
        [RNG.integers(-d, d, size=ishape[:-1]) for d in shape[:depth]], axis=-1
    ).astype(np.int64)
    updates = data(*ishape[:-1], *shape[depth:])
    attrs = {"reduction": reduction}
    model, _ = one_node("ScatterND", [table, indices, updates], attrs, out_shape=shape)
    got = tgc.run(import_onnx(model), [table, indices, updates])[0]
    want = scatter_nd_numpy(table, indices, updates, reduction)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_scatter_errors():
    model, _ = one_node(
        "ScatterElements", [data(3), ints(0), Const(data(1))], {"reduction": "mean"}
    )
    assert error_of(model).endswith(
        "(ScatterElements): reduction 'mean' is not supported (none, add, mul, max, min)"
    )
    model, _ = one_node("ScatterElements", [data(3, 2), np.zeros((2, 2), np.int64), data(2, 1)])
    assert error_of(model).endswith(
        "(ScatterElements): indices tensor<2x2xi64> and updates tensor<2x1xf32> must have one "
        "shape, of the rank of data tensor<3x2xf32>"
    )
    model, _ = one_node("ScatterND", [data(3, 2), np.zeros((2, 1), np.int64), data(2, 3)])
    assert error_of(model).endswith(
        "(ScatterND): indices tensor<2x1xi64> and updates tensor<2x3xf32> do not address data "
        "tensor<3x2xf32>"
    )
    flags = np.zeros(3, np.bool_)
    model, _ = one_node(
        "ScatterElements", [flags, ints(0), Const(np.ones(1, np.bool_))], {"reduction": "add"}
    )
    assert error_of(model).endswith(
        "(ScatterElements): reduction 'add' is not supported on booleans"
    )


# -- windows ------------------------------------------------------------------------------------


@pytest.mark.parametrize("op", ["HannWindow", "HammingWindow", "BlackmanWindow"])
@pytest.mark.parametrize("periodic", [0, 1])
@pytest.mark.parametrize("datatype", [TensorProto.FLOAT, TensorProto.DOUBLE])
def test_windows_fold(op, periodic, datatype):
    size = Const(np.array(int(RNG.integers(2, 40)), np.int64))
    attrs = {"periodic": periodic, "output_datatype": datatype}
    model, feeds = one_node(op, [size], attrs)
    module = check(model, feeds, rtol=1e-6, atol=1e-7)
    assert ops_of(module) == ["atomic.constant", "func.return"]


def test_window_size_errors():
    model, _ = one_node("HannWindow", [np.array(4, np.int64)], out_dtype=np.float32)
    assert error_of(model).endswith(
        "(HannWindow): 'size' ('in0') must be a constant (an initializer or computed from "
        "constants): tgc tensors have static shapes"
    )
    model, _ = one_node("HannWindow", [Const(np.array(-1, np.int64))], out_dtype=np.float32)
    assert error_of(model).endswith("(HannWindow): size must be one non-negative integer, got [-1]")


def test_scatter_and_gather_nd_with_int32_indices():
    table = data(4, 3)
    indices = np.array([[1, -1, 0]], np.int32)
    updates = data(1, 3)
    model, feeds = one_node("ScatterElements", [table, indices, updates], {"axis": 0})
    check(model, feeds)
    model, feeds = one_node("GatherND", [table, np.array([[-1], [2]], np.int32)])
    check(model, feeds)


# -- TopK -----------------------------------------------------------------------------------------


@pytest.mark.parametrize("largest", [0, 1])
@pytest.mark.parametrize("dtype", [np.float32, np.int64])
def test_top_k_random_with_ties(largest, dtype):
    """Values drawn from few levels, so that ties are common: the lower index comes first."""
    for axis in (0, 1, -1):
        x = RNG.integers(-3, 4, size=(4, 6, 5)).astype(dtype)
        k = int(RNG.integers(1, x.shape[axis] + 1))
        attrs = {"axis": axis, "largest": largest}
        model, feeds = one_node("TopK", [x, ints(k)], attrs, outputs=2)
        module = import_onnx(model)
        values, indices = tgc.run(module, [x])
        order = np.argsort(-x if largest else x, axis=axis, kind="stable")
        want = np.take(order, np.arange(k), axis=axis)
        np.testing.assert_array_equal(indices, want)
        np.testing.assert_array_equal(values, np.take_along_axis(x, want, axis))


def test_top_k_against_the_reference_and_errors():
    x = data(3, 7)
    model, feeds = one_node("TopK", [x, ints(3)], {"axis": 1}, outputs=2)
    check(model, feeds)
    model, _ = one_node("TopK", [data(3, 4), ints(5)], outputs=2)
    assert error_of(model).endswith("(TopK): K 5 is out of range for dim 1 of size 4")


# -- image layouts ---------------------------------------------------------------------------------


@pytest.mark.parametrize("align", [0, 1])
@pytest.mark.parametrize("size", [(2, 3, 4, 5), (1, 2, 3, 4, 2)])
def test_affine_grid(align, size):
    r = len(size) - 2
    theta = data(size[0], r, r + 1)
    model, feeds = one_node("AffineGrid", [theta, ints(*size)], {"align_corners": align})
    check(model, feeds, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(
    ("image", "block", "attrs"),
    [
        ((5, 5), (2, 2), {}),
        ((6, 7), (3, 2), {"strides": [2, 1], "pads": [1, 0, 1, 2], "dilations": [1, 2]}),
        ((4, 5, 3), (2, 2, 1), {"strides": [2, 1, 1]}),
    ],
)
def test_col2im(image, block, attrs):
    r = len(image)
    dil = attrs.get("dilations", [1] * r)
    pads = attrs.get("pads", [0] * 2 * r)
    strides = attrs.get("strides", [1] * r)
    blocks = np.prod(
        [
            (image[d] + pads[d] + pads[d + r] - dil[d] * (block[d] - 1) - 1) // strides[d] + 1
            for d in range(r)
        ]
    )
    x = data(2, 3 * int(np.prod(block)), int(blocks))
    model, feeds = one_node("Col2Im", [x, ints(*image), ints(*block)], attrs)
    if r == 2:  # the reference evaluator does 2-D only
        check(model, feeds, rtol=1e-5, atol=1e-6)
    else:
        import_onnx(model)


def test_max_unpool_round_trip():
    """MaxPool's values and flat indices unpool to the maximum at each window's argmax."""
    x = data(2, 3, 4, 6)
    windows = x.reshape(2, 3, 2, 2, 3, 2).transpose(0, 1, 2, 4, 3, 5).reshape(2, 3, 2, 3, 4)
    best = windows.argmax(-1)
    rows = np.arange(2)[None, None, :, None] * 2 + best // 2
    cols = np.arange(3)[None, None, None, :] * 2 + best % 2
    planes = np.arange(2)[:, None, None, None] * 3 + np.arange(3)[None, :, None, None]
    flat = (planes * 4 + rows) * 6 + cols
    pooled = windows.max(-1)
    attrs = {"kernel_shape": [2, 2], "strides": [2, 2]}
    model, feeds = one_node("MaxUnpool", [pooled, flat.astype(np.int64)], attrs)
    check(model, feeds)
    model, feeds = one_node("MaxUnpool", [pooled, flat.astype(np.int64), ints(2, 3, 5, 7)], attrs)
    check(model, feeds)


# -- TensorScatter ----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["linear", "circular"])
def test_tensor_scatter(mode):
    cache = data(3, 2, 8, 4)
    update = data(3, 2, 3, 4)
    high = 8 if mode == "circular" else 6
    write = RNG.integers(0, high, size=3).astype(np.int64)
    model, feeds = one_node("TensorScatter", [cache, update, write], {"mode": mode}, opset=24)
    check(model, feeds)
    model, feeds = one_node("TensorScatter", [cache, update], {"mode": mode}, opset=24)
    check(model, feeds)


# -- DFT and STFT -----------------------------------------------------------------------------------


def complex_of(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    return x[..., 0] if x.shape[-1] == 1 else x[..., 0] + 1j * x[..., 1]


def parts_of(z: np.ndarray, real: bool = False) -> np.ndarray:
    return np.stack([z.real] if real else [z.real, z.imag], axis=-1)


@pytest.mark.parametrize("parts", [1, 2])
@pytest.mark.parametrize("length", [None, 6, 12])
@pytest.mark.parametrize(("inverse", "onesided"), [(0, 0), (0, 1), (1, 0), (1, 1)])
def test_dft_against_numpy_fft(parts, length, inverse, onesided):
    """Against numpy's float64 FFTs (fft, rfft, ifft, irfft) of the same input."""
    if onesided and not inverse and parts == 2:
        return  # a one-sided forward transform takes a real signal
    if inverse and onesided:
        parts = 2
    x = data(2, 9, 3, parts)
    inputs = [x, None if length is None else ints(length), ints(1)]
    attrs = {"inverse": inverse, "onesided": onesided}
    z = complex_of(x)
    if not inverse:
        want = np.fft.fft(z, n=length, axis=1)
        if onesided:
            want = want[:, : (length or 9) // 2 + 1]
        want = parts_of(want)
    elif not onesided:
        want = parts_of(np.fft.ifft(z, n=length, axis=1))
    else:
        want = parts_of(np.fft.irfft(z, n=length or 16, axis=1), real=True)
    model, _ = one_node("DFT", inputs, attrs, out_shape=want.shape, opset=20)
    got = tgc.run(import_onnx(model), [x])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_stft_against_numpy():
    signal = data(2, 40, 1)
    window = data(8)
    frames = np.stack([signal[:, s : s + 8, 0] * window for s in range(0, 33, 5)], axis=1)
    want = parts_of(np.fft.rfft(frames.astype(np.float64), axis=-1))
    model, _ = one_node("STFT", [signal, ints(5), window], out_shape=want.shape)
    got = tgc.run(import_onnx(model), [signal, window])[0]
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_dft_errors():
    model, _ = one_node("DFT", [data(2, 4, 2), None, ints(2)], out_shape=(1,), opset=20)
    assert error_of(model).endswith(
        "(DFT): axis 2 must name a signal dim of tensor<2x4x2xf32>, not the last"
    )
    model, _ = one_node("DFT", [data(2, 4, 2), None, ints(1)], {"onesided": 1}, opset=20)
    assert error_of(model).endswith(
        "(DFT): a one-sided forward DFT needs a real signal (last dim 1)"
    )


# -- GridSample -----------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", ["nearest", "linear", "cubic"])
@pytest.mark.parametrize("padding", ["zeros", "border", "reflection"])
@pytest.mark.parametrize("align", [0, 1])
def test_grid_sample_random(mode, padding, align):
    """Grid positions up to 1.6x beyond the borders, so that every padding rule is used."""
    spatial = [(4, 5), (3, 4, 2)] if mode != "cubic" else [(4, 5)]
    for dims in spatial:
        x = data(2, 3, *dims)
        out = (3, 4) if len(dims) == 2 else (2, 3, 2)
        grid = (RNG.random((2, *out, len(dims))) * 3.2 - 1.6).astype(np.float32)
        attrs = {"mode": mode, "padding_mode": padding, "align_corners": align}
        model, feeds = one_node("GridSample", [x, grid], attrs, opset=22)
        check(model, feeds, rtol=1e-5, atol=1e-5)


def test_grid_sample_errors():
    model, _ = one_node("GridSample", [data(1, 1, 3, 3), data(1, 2, 2, 3)], opset=22)
    assert error_of(model).endswith(
        "(GridSample): grid tensor<1x2x2x3xf32> must be [N, *out, 2] for X tensor<1x1x3x3xf32>"
    )
    model, _ = one_node("GridSample", [data(1, 1, 3), data(1, 2, 1)], {"mode": "area"}, opset=22)
    assert error_of(model).endswith(
        "(GridSample): mode 'area' is not supported (nearest, linear, cubic)"
    )
