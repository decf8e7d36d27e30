"""The ONNX backend node tests as tgc conformance cases: which are in scope, which are expected
to fail (and why), and how one is run and checked.

Shared by the pytest suite (test/test_onnx_conformance.py) and the script that writes the table
of docs/onnx.md (test/onnx_conformance_table.py), so that the table states what the suite checks.

The cases are the folders of `onnx/backend/test/data/node` in the installed onnx package (1.22.0:
later releases no longer ship the files): `model.onnx` and `test_data_set_*/{input,output}_*.pb`.

Scope, the rule (first reason that applies wins; `out_of_scope(case)` returns it):
1. the model imports only ONNX's default domain, at opset 13 or later (what tgc-import reads);
2. every graph input and output is a tensor (no sequence or optional) whose element type is
   numpy-native and a tgc element type: float16, float, double, bool, int8, int32, int64
   (bfloat16 and the float8/float4 types are not numpy-native; uint8/16/32/64, int16, int4/2
   and string have no tgc element type);
3. every node's op type is one the issue lists (ISSUE_OPS) or one the importer converts
   (`supported_op_types()`), so an op that gains a converter joins the suite at once.
Single-node models are the goal; multi-node ones (mostly functions expanded into their body,
`*_expanded`) are in scope by the same rule and counted apart.

Each in-scope case also runs after the PIPELINE ("optimize": lower-hl, canonicalize, cse,
algebraic, dce), against the same expected outputs; EXPECTED_FAILURES_OPTIMIZED lists the cases
that fail only there.

An in-scope case passes, or is listed in EXPECTED_FAILURES (test name -> reason) or its op in
EXPECTED_FAILING_OPS (op type -> reason): the suite runs those as xfail(strict=True), so a fixed
case must leave the list. Out-of-scope cases are reported as skipped with "out of scope: ...".

Shape-carrying inputs: the node tests pass a Reshape's shape, a Slice's bounds, the axes of
Squeeze... as graph inputs, but tgc tensors have static shapes, so tgc-import needs those
constant. The runner binds a graph input that feeds one of the slots of SHAPE_INPUTS to the
data set's value (an initializer) before importing, as it does a graph input such a slot is
computed from (not through Shape or Size, which read only the type); every other input stays
an argument.

A case passes when every test data set gives outputs of the expected number, shape and dtype,
equal to the expected ones within the ONNX runner's tolerances (numpy.testing.assert_allclose,
rtol=1e-3, atol=1e-7, NaN equal to NaN; no node test in 1.22.0 sets its own).
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import numpy_helper

NODE_DIR = Path(onnx.__file__).resolve().parent / "backend" / "test" / "data" / "node"

MIN_OPSET = 13
DEFAULT_RTOL, DEFAULT_ATOL = 1e-3, 1e-7

# Element types in scope: numpy-native and held by tgc (ONNX names).
IN_SCOPE_TYPES = frozenset({"float16", "float", "double", "bool", "int8", "int32", "int64"})


def is_numpy_type(name: str) -> bool:
    """Whether numpy itself has the ONNX element type `name` (bfloat16, float8, int4... come
    from ml_dtypes; string is numpy's object dtype, which tgc has not)."""
    code = onnx.TensorProto.DataType.Value(name.upper())
    dtype = onnx.helper.tensor_dtype_to_np_dtype(code)
    return dtype.type.__module__ == "numpy"


# The ops issue 9 names for the importer ("elementwise math and comparisons, MatMul, Gemm,
# reductions, ..."), spelled as ONNX op types.
ISSUE_OPS = frozenset(
    """
    Abs Neg Exp Log Sqrt Reciprocal Erf Sin Cos Tanh Sigmoid Relu Gelu Pow
    Add Sub Mul Div Equal Less Greater LessOrEqual GreaterOrEqual Where Cast
    MatMul Gemm
    ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum
    ReduceLogSumExp ReduceSumSquare
    Softmax LogSoftmax LayerNormalization Attention
    Reshape Transpose Squeeze Unsqueeze Concat Split Slice Gather Expand
    Shape ConstantOfShape Range Constant Identity
    Max Min Sum Mean
    """.split()
)

# The input slots that carry a shape, axes, bounds, sizes or counts, by op type (opset 13 and
# later): the output's shape depends on their values, so tgc needs them at import time.
_REDUCTIONS = """ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceLogSum
    ReduceLogSumExp ReduceSumSquare""".split()
SHAPE_INPUTS: dict[str, tuple[int, ...]] = {
    "AffineGrid": (1,),
    "BlackmanWindow": (0,),
    "CenterCropPad": (1, 2),
    "Col2Im": (1, 2),
    "ConstantOfShape": (0,),
    "CumProd": (1,),
    "CumSum": (1,),
    "DFT": (1, 2),
    "Dropout": (1, 2),  # ratio and training_mode: whether the node is the identity
    "Expand": (1,),
    "HammingWindow": (0,),
    "HannWindow": (0,),
    "MaxUnpool": (2,),
    "OneHot": (1,),
    "Pad": (1, 3),
    "Range": (0, 1, 2),
    "Reshape": (1,),
    "Resize": (1, 2, 3),
    "Slice": (1, 2, 3, 4),
    "Split": (1,),
    "STFT": (1, 3),
    "Squeeze": (1,),
    "TopK": (1,),
    "Tile": (1,),
    "Unsqueeze": (1,),
    **{op: (1,) for op in _REDUCTIONS},
}

# In-scope cases that fail today, by test name, with the reason. Keep sorted.
_FFT_ROUNDOFF = (
    "the expected output holds a float32 FFT's round-off (1.9e-7) at 10 elements whose exact "
    "value is 0 (numpy's float64 ifft of the same input: 5e-15); tgc's transform, a matmul "
    "with exact cosine/sine matrices, gives 0 there, and atol 1e-7 rejects the exact answer"
)
_RANDOM_DROPOUT = (
    "training_mode = true with a ratio > 0 draws a random mask (the expected output is one draw "
    "of numpy's RandomState(seed) in onnx's reference); tgc-import refuses a dropout that is not "
    "the identity, as it imports inference graphs"
)
_ARGMAX_POOL = (
    "MaxPool's Indices output (the argmax of each window) is refused: hl.max_pool{k}d gives the "
    "maxima only"
)
EXPECTED_FAILURES: dict[str, str] = {
    "test_dft_inverse": _FFT_ROUNDOFF,
    "test_dft_inverse_opset19": _FFT_ROUNDOFF,
    "test_maxpool_with_argmax_2d_precomputed_pads": _ARGMAX_POOL,
    "test_maxpool_with_argmax_2d_precomputed_strides": _ARGMAX_POOL,
    "test_training_dropout": _RANDOM_DROPOUT,
    "test_training_dropout_default": _RANDOM_DROPOUT,
    "test_training_dropout_default_mask": _RANDOM_DROPOUT,
    "test_training_dropout_mask": _RANDOM_DROPOUT,
}

# In-scope ops whose every case fails today (a test-name entry above overrides it).
EXPECTED_FAILING_OPS: dict[str, str] = {}

# The pipeline the suite also runs each in-scope case through before interpreting it (the
# hl decompositions and the rewrites on graphs that real exporters write), and the cases that
# fail only there, with the reason.
PIPELINE = "optimize"
_TANH_NEAR_ZERO = (
    "hl.tanh's decomposition (1 - e^-2|x|) / (1 + e^-2|x|) cancels for |x| < ~1e-3 in f32: "
    "mish(x) at x near -10 has tanh(softplus(x)) with softplus(x) ~ 4.5e-5, relative error ~1e-3"
)
EXPECTED_FAILURES_OPTIMIZED: dict[str, str] = {
    "test_mish": _TANH_NEAR_ZERO,
    "test_mish_expanded": _TANH_NEAR_ZERO,
}


@dataclass(frozen=True)
class Case:
    """One node test: its folder and what the scope rule reads of its model."""

    name: str
    path: Path
    op_types: tuple[str, ...]  # of the graph's nodes, in order
    domains: tuple[tuple[str, int], ...]  # opset imports (domain, version)
    io_types: tuple[str, ...]  # ONNX names of the inputs' and outputs' types
    rtol: float = DEFAULT_RTOL
    atol: float = DEFAULT_ATOL

    @property
    def single_node(self) -> bool:
        return len(self.op_types) == 1

    @property
    def op(self) -> str:
        """The op the case is about: its node's op type, or for a multi-node case that expands
        one (`test_softmax_axis_0_expanded`) the op of the single-node case of the same name."""
        if self.single_node:
            return self.op_types[0]
        base = re.sub(r"_expanded(_ver\d+)?$", "", self.name)
        found = _single_node_ops().get(base)
        return found if found else "(multi-node)"


def _type_name(value_info: onnx.ValueInfoProto) -> str:
    kind = value_info.type.WhichOneof("value")
    if kind != "tensor_type":
        return kind.removesuffix("_type")  # sequence, optional, map, sparse_tensor
    return onnx.TensorProto.DataType.Name(value_info.type.tensor_type.elem_type).lower()


def _tolerances(folder: Path) -> tuple[float, float]:
    data = folder / "data.json"  # the runner reads it where a case has one (none in 1.22.0)
    if not data.exists():
        return DEFAULT_RTOL, DEFAULT_ATOL
    found = json.loads(data.read_text())
    return found.get("rtol", DEFAULT_RTOL), found.get("atol", DEFAULT_ATOL)


def load_case(folder: Path) -> Case:
    model = onnx.load_model(folder / "model.onnx", load_external_data=False)
    graph = model.graph
    rtol, atol = _tolerances(folder)
    return Case(
        name=folder.name,
        path=folder,
        op_types=tuple(n.op_type for n in graph.node),
        domains=tuple((o.domain, o.version) for o in model.opset_import),
        io_types=tuple(_type_name(v) for v in [*graph.input, *graph.output]),
        rtol=rtol,
        atol=atol,
    )


@functools.cache
def all_cases() -> tuple[Case, ...]:
    """Every node test of the installed onnx package, sorted by name."""
    folders = sorted(p for p in NODE_DIR.iterdir() if (p / "model.onnx").exists())
    return tuple(load_case(p) for p in folders)


@functools.cache
def _single_node_ops() -> dict[str, str]:
    return {c.name: c.op_types[0] for c in all_cases() if c.single_node}


@functools.cache
def converted_ops() -> frozenset[str]:
    from tgc.importers.onnx.registry import supported_op_types

    return frozenset(supported_op_types())


def out_of_scope(case: Case) -> str | None:
    """Why `case` is out of scope ("out of scope: ..."), or None when it is in scope."""
    for domain, version in case.domains:
        if domain not in ("", "ai.onnx"):
            return f"out of scope: domain {domain}"
        if version < MIN_OPSET:
            return (
                f"out of scope: opset {version} < {MIN_OPSET} (tgc-import reads {MIN_OPSET} and up)"
            )
    for t in case.io_types:
        if t in IN_SCOPE_TYPES:
            continue
        if t in ("sequence", "optional", "map", "sparse_tensor"):
            return f"out of scope: {t} inputs or outputs (tgc values are dense tensors)"
        if not is_numpy_type(t):
            return f"out of scope: element type {t} (not a numpy type)"
        return f"out of scope: element type {t} (tgc has no such element type)"
    known = ISSUE_OPS | converted_ops()
    missing = sorted({op for op in case.op_types if op not in known})
    if missing:
        return f"out of scope: op {', '.join(missing)} (not in the issue's list, no converter)"
    return None


def expected_failure(case: Case, optimized: bool = False) -> str | None:
    """Why an in-scope case is expected to fail (as imported, or after PIPELINE when
    `optimized`), or None when it must pass."""
    if optimized and case.name in EXPECTED_FAILURES_OPTIMIZED:
        return EXPECTED_FAILURES_OPTIMIZED[case.name]
    if case.name in EXPECTED_FAILURES:
        return EXPECTED_FAILURES[case.name]
    for op in case.op_types:
        if op in EXPECTED_FAILING_OPS:
            return f"{op}: {EXPECTED_FAILING_OPS[op]}"
    return None


# -- running a case ---------------------------------------------------------------------------


def _read_tensor(path: Path) -> np.ndarray:
    proto = onnx.TensorProto()
    proto.ParseFromString(path.read_bytes())
    return numpy_helper.to_array(proto)


def data_sets(case: Case) -> list[tuple[list[np.ndarray], list[np.ndarray]]]:
    """(inputs, expected outputs) of each test data set, in order."""
    found = []
    for folder in sorted(case.path.glob("test_data_set_*")):
        count = {kind: len(list(folder.glob(f"{kind}_*.pb"))) for kind in ("input", "output")}
        inputs = [_read_tensor(folder / f"input_{i}.pb") for i in range(count["input"])]
        outputs = [_read_tensor(folder / f"output_{i}.pb") for i in range(count["output"])]
        found.append((inputs, outputs))
    return found


def shape_input_names(model: onnx.ModelProto) -> set[str]:
    """The graph inputs whose values a shape-carrying slot (SHAPE_INPUTS) of some node depends
    on, directly or through other nodes (not through Shape or Size, which read only a type)."""
    producer = {out: node for node in model.graph.node for out in node.output}
    pending = [
        node.input[slot]
        for node in model.graph.node
        for slot in SHAPE_INPUTS.get(node.op_type, ())
        if slot < len(node.input) and node.input[slot]
    ]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen:
            continue
        seen.add(name)
        node = producer.get(name)
        if node is not None and node.op_type not in ("Shape", "Size"):
            pending.extend(i for i in node.input if i)
    return seen & {i.name for i in model.graph.input}


def bind_inputs(
    model: onnx.ModelProto, inputs: list[np.ndarray]
) -> tuple[onnx.ModelProto, list[np.ndarray]]:
    """The model with its shape-carrying graph inputs made initializers holding the data set's
    values, and the inputs left to pass at run time (in order)."""
    bound = shape_input_names(model)
    if not bound:
        return model, inputs
    model = onnx.ModelProto.FromString(model.SerializeToString())  # a copy to edit
    kept, rest = [], []
    for info, value in zip(list(model.graph.input), inputs):
        if info.name in bound:
            model.graph.initializer.append(numpy_helper.from_array(value, info.name))
        else:
            kept.append(info)
            rest.append(value)
    del model.graph.input[:]
    model.graph.input.extend(kept)
    return model, rest


def run_case(case: Case, pipeline: str | None = None) -> None:
    """Import the case's model (then run `pipeline` on it, if given), run it on the numpy
    interpreter on each data set and compare with the expected outputs; an AssertionError (or
    the importer's TgcError) when it differs."""
    import tgc
    from tgc.importers.onnx import import_onnx

    model = onnx.load_model(case.path / "model.onnx")
    for index, (inputs, expected) in enumerate(data_sets(case)):
        bound, rest = bind_inputs(model, inputs)
        module = import_onnx(bound)
        if pipeline:
            tgc.run_pipeline(module, pipeline)
        got = tgc.run(module, rest)
        compare(got, expected, case.rtol, case.atol, f"{case.name} data set {index}")


def compare(
    got: list[np.ndarray], expected: list[np.ndarray], rtol: float, atol: float, where: str
) -> None:
    """The ONNX runner's check: as many outputs, each of the same shape and dtype, allclose."""
    assert len(got) == len(expected), f"{where}: {len(got)} outputs, expected {len(expected)}"
    for i, (g, e) in enumerate(zip(got, expected)):
        what = f"{where}, output {i}"
        assert g.shape == e.shape, f"{what}: shape {g.shape}, expected {e.shape}"
        assert g.dtype == e.dtype, f"{what}: dtype {g.dtype}, expected {e.dtype}"
        np.testing.assert_allclose(g, e, rtol=rtol, atol=atol, err_msg=what)
