"""The CUDA backend's view kernels: `cuda.split_view` (an `atomic.split` whose pieces are
contiguous ranges of its operand, each a view at its byte offset) and `cuda.reshape_view`.

Without a GPU: which splits the kernel accepts (and why it refuses the others), its pieces
computed at their byte offsets of the operand's buffer against `np.split`, its roofline cost,
and select-kernels + run_plan with a stand-in device (test_planner_cuda.py's) on the lead's
pattern, a batched matmul `x @ W[N]` split along its leading axis and each piece reshaped: the
split and the reshapes stay on the device as views, no copy to the host; a split along an axis
with rows before it does not get the view kernel. On a GPU (marked `cuda`): the same plan run
on the device, its pieces views of the product's buffer, against float64; and the profiler
measures the view kernels.
"""

from __future__ import annotations

import secrets

import ml_dtypes
import numpy as np
import pytest
from test_planner_cuda import Boxed, _stand_in_call, _stand_in_region

import tgc
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import CallOp, CopyOp
from tgc.planner.backends import Backend, Space
from tgc.planner.backends import cuda_kernels as ck
from tgc.planner.cost import VIEW_SECONDS, RooflineCostSource
from tgc.planner.executor import run_plan
from tgc.planner.kernel import KERNELS, rel_error
from tgc.planner.select import select_kernels
from tgc.types import TensorType

FAMILIES = ("numpy", "cuda")


@pytest.fixture
def stand_in():
    """The CUDA planner side with a stand-in device (values boxed host arrays, generated kernels
    interpreted); the moves between host and device are counted."""
    counts = {"to_host": 0, "from_host": 0}

    def to_host(v):
        counts["to_host"] += 1
        return v.array.copy()

    def from_host(a, t):
        counts["from_host"] += 1
        return Boxed(ck.host_array(a, t).copy())

    backend = Backend("cuda", call=_stand_in_call, run_region=_stand_in_region)
    ck.register(backend, Space("cuda", to_host, from_host))
    yield counts
    ck.unregister()


def t(shape, dtype="f32") -> TensorType:
    return TensorType.get(tuple(shape), dtype)


def split_types(shape, axis, sizes, dtype="f32"):
    pieces = [t((*shape[:axis], s, *shape[axis + 1 :]), dtype) for s in sizes]
    return [t(shape, dtype)], pieces


# -- which splits are views ------------------------------------------------------------------------

ACCEPTED = [
    ((3, 64, 32), 0, (1, 1, 1)),  # the stacked matmul's split
    ((1, 1, 12, 8), 2, (4, 8)),  # only 1s before the axis
    ((24,), 0, (4, 12, 8)),
    ((2, 8), 0, (2,)),  # one piece: the whole
    ((5, 3), 1, (3,)),  # one piece along an axis with rows before it: still the whole
    ((3, 4), 0, (1, 2)),  # f32 rows of 16 bytes: every piece starts aligned
]
REFUSED = [
    ((4, 6), 1, (2, 4), "needs the dims before the split axis 1 to be 1"),
    ((2, 3, 8), 2, (4, 4), "needs the dims before the split axis 2 to be 1"),
    ((3, 1), 0, (1, 2), "needs every piece to start 16-byte aligned; piece 1 starts at byte 4"),
    ((5, 4), 0, (0, 5), "runs no tensor without elements"),
]


@pytest.mark.parametrize("shape, axis, sizes", ACCEPTED)
def test_a_split_into_contiguous_aligned_pieces_is_accepted(shape, axis, sizes):
    assert ck.split_view_types(split_types(shape, axis, sizes)) is None


@pytest.mark.parametrize("shape, axis, sizes, reason", REFUSED)
def test_a_split_whose_pieces_are_not_views_is_refused_saying_why(shape, axis, sizes, reason):
    got = ck.split_view_types(split_types(shape, axis, sizes))
    assert got is not None and got.startswith(reason), got


def test_alignment_counts_bytes_of_the_element_type():
    # [2, 2] rows of 2 elements: piece 1 at 2 elements, 8 bytes in f32, 16 in f64
    assert ck.split_view_types(split_types((4, 2), 0, (1, 3), "f32")) is not None
    assert ck.split_view_types(split_types((4, 2), 0, (1, 3), "f64")) is None
    assert ck.split_view_types(split_types((16, 1), 0, (8, 8), "bf16")) is None
    assert ck.split_view_types(split_types((16, 1), 0, (7, 9), "bf16")) is not None


DTYPES = {"f32": np.float32, "f64": np.float64, "f16": np.float16, "bf16": ml_dtypes.bfloat16}
PIECE_CASES = [
    ((3, 5, 8), 0, (1, 1, 1), "f32"),
    ((1, 24, 4), 1, (4, 12, 8), "f32"),
    ((1, 24, 4), -2, (8, 16), "f16"),
    ((2, 16), 0, (1, 1), "bf16"),
    ((6, 2, 3), 0, (2, 4), "f64"),
]


@pytest.mark.parametrize("shape, axis, sizes, dtype", PIECE_CASES)
def test_the_pieces_at_their_byte_offsets_are_the_split(shape, axis, sizes, dtype):
    """The kernel's host run reads each piece at the byte offset the device views it at: equal
    to np.split, and sharing the operand's memory (nothing copied)."""
    kernel = ck.split_view_kernel()
    rng = np.random.default_rng(secrets.randbits(32))
    x = rng.standard_normal(shape).astype(DTYPES[dtype])
    (xt,), pieces = split_types(shape, axis % len(shape), sizes, dtype)
    assert kernel.constraints(([xt], pieces)) is None
    got = kernel.run([x], {"axis": axis, "sizes": list(sizes)}, pieces)
    want = np.split(x, np.cumsum(sizes)[:-1], axis=axis)
    assert len(got) == len(want)
    for g, w, p in zip(got, want, pieces):
        assert g.shape == p.shape and g.dtype == x.dtype
        assert np.array_equal(g, w)
        assert np.shares_memory(g, x)


def test_split_view_pieces_refuses_a_split_that_is_not_one_of_views():
    with pytest.raises(TgcError, match="needs the dims before the split axis 1 to be 1"):
        ck.split_view_pieces((4, 6), 4, 1, (2, 4))
    with pytest.raises(TgcError, match=r"sizes \[2, 3\] do not split \(4, 6\) along 1"):
        ck.split_view_pieces((4, 6), 4, 1, (2, 3))
    with pytest.raises(TgcError, match="do not split"):
        ck.split_view_pieces((4, 6), 4, 2, (4,))
    assert ck.split_view_pieces((3, 2, 4), 4, 0, (1, 2)) == [(0, (1, 2, 4)), (32, (2, 2, 4))]


def test_a_view_kernel_costs_no_device_time_whatever_its_size(stand_in):
    roofline = RooflineCostSource()
    for n in (4, 4096):
        ins, outs = split_types((3, n, 256), 0, (1, 1, 1))
        ins, outs = [x.with_encoding("cuda") for x in ins], [x.with_encoding("cuda") for x in outs]
        cost = roofline.cost(KERNELS[ck.SPLIT_VIEW], ins, outs, {})
        assert cost.seconds == VIEW_SECONDS and cost.source == "roofline"
        reshape = roofline.cost(KERNELS[ck.RESHAPE_VIEW], outs[:1], [t((n, 256), "f32")], {})
        assert reshape.seconds == VIEW_SECONDS
        # the same split on the host pays its launch and bytes
        host = roofline.cost(KERNELS["numpy.atomic.split"], ins, outs, {})
        assert host.seconds > VIEW_SECONDS


# -- planned on the (stand-in) device --------------------------------------------------------------


def stacked_text(n: int = 3, rows: int = 64, d: int = 256, axis: int = 0) -> str:
    """The lead's rewrite: x @ W[n] -> P[n, rows, d] with the values in device memory, split
    and reshaped, then read by two GEMMs (which read whole buffers) and an add (whose region
    could read its piece by value). axis 0: n pieces [1, rows, d], reshaped to [rows, d]
    (contiguous); axis 1: two halves [n, rows/2, d] (n ranges each), reshaped to
    [n*rows/2, d]."""
    c = ', "cuda"'
    x, w, v = f"tensor<{rows}x{d}xf32{c}>", f"tensor<{n}x{d}x{d}xf32{c}>", f"tensor<{d}x{d}xf32{c}>"
    p = f"tensor<{n}x{rows}x{d}xf32{c}>"
    if axis == 0:
        count, size, added = n, 1, n - 1
        piece, y = f"tensor<1x{rows}x{d}xf32{c}>", f"tensor<{rows}x{d}xf32{c}>"
    else:
        count, size, added = 2, rows // 2, 1
        piece, y = f"tensor<{n}x{size}x{d}xf32{c}>", f"tensor<{n * size}x{d}xf32{c}>"
    names = ", ".join(f"%s{i}" for i in range(count))
    sizes = ", ".join([str(size)] * count)
    pieces = ", ".join([piece] * count)
    reshapes = "\n".join(f"  %r{i} = atomic.reshape %s{i} : ({piece}) -> {y}" for i in range(count))
    return f"""
func.func @f(%x: {x}, %w: {w}, %v: {v}) -> ({y}, {y}) {{
  %p = atomic.matmul %x, %w : ({x}, {w}) -> {p}
  {names} = atomic.split %p {{axis = {axis}, sizes = [{sizes}]}} : ({p}) -> ({pieces})
{reshapes}
  %m0 = atomic.matmul %r0, %v : ({y}, {v}) -> {y}
  %m1 = atomic.matmul %r1, %v : ({y}, {v}) -> {y}
  %s = atomic.add %m0, %r{added} : ({y}, {y}) -> {y}
  func.return %s, %m1 : {y}, {y}
}}
"""


def _planned(text: str, costs=None):
    module = tgc.parse(text, "split_view.tg")
    func = module.funcs[0]
    select_kernels(func, costs, tolerance=1e-5, backends=FAMILIES)
    tgc.verify(module)
    return func


def _callees(func) -> list[str]:
    return [op.attr("callee") for op in func.body.ops if isinstance(op, CallOp)]


def _check_stacked(func, axis: int, seeds) -> None:
    """The planned function against float64 numpy on fresh random inputs."""
    for seed in seeds:
        rng = np.random.default_rng(seed)
        x, w, v = (rng.standard_normal(s.type.shape).astype(np.float32) for s in func.body.args)
        p = np.matmul(x.astype(np.float64), w.astype(np.float64))
        if axis == 0:
            r = [p[i] for i in range(p.shape[0])]
        else:
            half = p.shape[1] // 2
            r = [p[:, :half].reshape(-1, p.shape[2]), p[:, half:].reshape(-1, p.shape[2])]
        v64 = v.astype(np.float64)
        want = [r[0] @ v64 + r[2 if axis == 0 else 1], r[1] @ v64]
        got = run_plan(func, [x, w, v])
        for g, wnt in zip(got, want):
            # two f32 GEMMs of 256 terms each: within 1e-5 normwise of float64
            assert rel_error(g, wnt) <= 1e-5, seed


def test_the_stacked_matmuls_split_and_reshapes_stay_on_the_device_as_views(stand_in):
    text = stacked_text()
    func = _planned(text)
    callees = _callees(func)
    assert callees.count(ck.SPLIT_VIEW) == 1, callees
    assert callees.count(ck.RESHAPE_VIEW) == 2, callees  # the GEMMs' operands
    assert not any(c.startswith("numpy.") for c in callees), callees
    assert not any(isinstance(op, CopyOp) for op in func.body.ops)
    (split,) = [op for op in func.body.ops if op.attributes.get("callee") == ck.SPLIT_VIEW]
    assert all(r.type.encoding == "cuda" for r in split.results)
    assert float(split.attr("plan.seconds")) == VIEW_SECONDS
    _check_stacked(func, 0, [secrets.randbits(32) for _ in range(2)])
    # the arguments go up and the results come down; nothing else crosses
    assert stand_in["from_host"] == 2 * 3 and stand_in["to_host"] == 2 * 2


def test_a_split_with_rows_before_its_axis_does_not_get_the_view_kernel(stand_in):
    """Split along axis 1 of [n, rows, d]: each piece is n ranges, not one; the plan has no
    cuda.split_view (its pieces come out of copy kernels), and still computes the split."""
    text = stacked_text(axis=1)
    func = _planned(text)
    callees = _callees(func)
    assert ck.SPLIT_VIEW not in callees, callees
    _check_stacked(func, 1, [secrets.randbits(32) for _ in range(2)])


def test_a_hand_written_call_of_the_view_kernel_on_strided_pieces_is_a_located_error(stand_in):
    text = """
func.func @f(%p: tensor<4x8xf32, "cuda">) -> (tensor<4x4xf32, "cuda">, tensor<4x4xf32, "cuda">) {
  %a, %b = kernel.call %p {axis = 1, callee = "cuda.split_view", op = "atomic.split", sizes = [4, 4]} : (tensor<4x8xf32, "cuda">) -> (tensor<4x4xf32, "cuda">, tensor<4x4xf32, "cuda">)
  func.return %a, %b : tensor<4x4xf32, "cuda">, tensor<4x4xf32, "cuda">
}
"""
    func = tgc.parse(text, "strided.tg").funcs[0]
    with pytest.raises(TgcError) as info:
        run_plan(func, [np.ones((4, 8), np.float32)])
    e = info.value
    assert "cuda.split_view needs the dims before the split axis 1 to be 1" in e.message
    assert e.loc is not None and (e.loc.line, e.loc.col) == (3, 12), e.loc


# -- on the GPU ------------------------------------------------------------------------------------


@pytest.fixture
def gpu_backends():
    import tgc.planner

    loaded = tgc.planner.load_backends(FAMILIES)
    assert "tgc.planner.backends.cuda" in loaded, tgc.planner.UNAVAILABLE
    yield loaded
    tgc.planner.unload_backends()


@pytest.mark.cuda
def test_on_the_gpu_the_pieces_are_views_of_the_product_and_match_float64(gpu_backends):
    from tgc.planner.backends.cuda import DeviceArray
    from tgc.planner.executor import run_planned

    text = stacked_text()
    func = _planned(text)
    callees = _callees(func)
    assert ck.SPLIT_VIEW in callees and ck.RESHAPE_VIEW in callees, callees
    _check_stacked(func, 0, [secrets.randbits(32) for _ in range(3)])
    # the split alone, its pieces returned: each a view at its offset of one buffer
    c = ', "cuda"'
    p, q = f"tensor<3x40x24xf32{c}>", f"tensor<1x40x24xf32{c}>"
    only = f"""
func.func @g(%p: {p}) -> ({q}, {q}, {q}) {{
  %a, %b, %c = atomic.split %p {{axis = 0, sizes = [1, 1, 1]}} : ({p}) -> ({q}, {q}, {q})
  func.return %a, %b, %c : {q}, {q}, {q}
}}
"""
    g = _planned(only)
    assert _callees(g) == [ck.SPLIT_VIEW]
    x = np.random.default_rng(secrets.randbits(32)).standard_normal((3, 40, 24)).astype(np.float32)
    device = DeviceArray.from_host(x)
    pieces = run_planned(g, [device])
    assert [piece.ptr - device.ptr for piece in pieces] == [0, 40 * 24 * 4, 2 * 40 * 24 * 4]
    for i, piece in enumerate(pieces):
        assert np.array_equal(piece.get(), x[i : i + 1])


@pytest.mark.cuda
def test_the_profiler_measures_the_view_kernels_on_the_gpu(gpu_backends):
    from tgc.planner.profile import Instance, measure

    ins, outs = split_types((3, 64, 256), 0, (1, 1, 1))
    ins, outs = [x.with_encoding("cuda") for x in ins], [x.with_encoding("cuda") for x in outs]
    split = Instance(
        KERNELS[ck.SPLIT_VIEW], tuple(ins), tuple(outs), {"axis": 0, "sizes": (1, 1, 1)}
    )
    reshape = Instance(KERNELS[ck.RESHAPE_VIEW], (outs[0],), (t((64, 256)).with_encoding("cuda"),))
    for inst in (split, reshape):
        m = measure(inst, min_time=0.01)
        assert m.ok, m.message
        assert m.max_error == 0.0 and m.median < 1e-3
