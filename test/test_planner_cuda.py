"""The CUDA backend (issue 12, items 1 and 6).

Without a GPU (CI, this machine): the planner side, planner/backends/cuda_kernels.py. Which
template runs each op; the regions `fuse` would form offered as options (self-contained ones
only); their code generates and, where nvcc is installed, compiles; the cuBLAS call a matmul
becomes computes the matmul (runtime/cublas.py's arguments, run by a numpy model of the
column-major GEMM); and select-kernels + run_plan with a stand-in device (values boxed in the
"cuda" space, generated kernels interpreted from the `kernel.fused` their call stands for) match
float64 on every example, with copies between host and device.

On a GPU (marked `cuda`, skipped elsewhere with the reason): the real backend. Every template
and cuBLAS within their stated errors; a plan mixing numpy, CUDA and torch-cuda kernels; and
`tgc-run --backend auto --check` on every example with every backend that loads.
"""

from __future__ import annotations

import ctypes
import importlib.util
import shutil
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import pytest
from test_planner_kernels import random_inputs as kernel_inputs

import tgc
from tgc.codegen.kernels import generate_kernel, prelude
from tgc.diagnostics import TgcError
from tgc.dialects.kernel import CallOp, FusedOp
from tgc.planner.backends import BACKENDS, TEMPLATES, Backend, Space, Template
from tgc.planner.backends import cuda_kernels as ck
from tgc.planner.cost import DictCostSource, RooflineCostSource
from tgc.planner.executor import PlannedFunction, run_plan
from tgc.planner.kernel import KERNELS, rel_error
from tgc.planner.select import select_kernels
from tgc.runtime.interpreter import random_inputs, run_function
from tgc.printer import print_op

EXAMPLES = sorted((Path(__file__).resolve().parent.parent / "examples").glob("*.tg"))


def parse(text: str):
    module = tgc.parse(text, "cuda.tg")
    return module, module.funcs[0]


def ops_of(func) -> list:
    return [op for op in func.body.ops if op is not func.body.last]


# -- which template runs one op --------------------------------------------------------------------

ONE_OP_CASES = [
    ("atomic.exp %x : (tensor<4x8xf32>) -> tensor<4x8xf32>", "elementwise"),
    ('hl.gelu %x {approximate = "tanh"} : (tensor<4x8xf32>) -> tensor<4x8xf32>', "elementwise"),
    ("atomic.transpose %x {perm = [1, 0]} : (tensor<4x8xf32>) -> tensor<8x4xf32>", "elementwise"),
    ("atomic.reduce_sum %x {axes = [1]} : (tensor<4x8xf32>) -> tensor<4xf32>", "row_reduction"),
    ("atomic.reduce_max %x {axes = [0]} : (tensor<4x8xf32>) -> tensor<8xf32>", "row_reduction"),
    (
        "atomic.matmul %x, %x {transpose_b = true} : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x4xf32>",
        "matmul",
    ),
    ("hl.softmax %x {axis = -1} : (tensor<4x8xf32>) -> tensor<4x8xf32>", None),
    ("atomic.exp %z : (tensor<4x0xf32>) -> tensor<4x0xf32>", None),
    (
        "hl.attention %x, %x, %x : (tensor<4x8xf32>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>",
        "attention",
    ),
    (
        "hl.attention %w, %w, %w : (tensor<2x256xf32>, tensor<2x256xf32>, tensor<2x256xf32>) -> tensor<2x256xf32>",
        None,
    ),
]


@pytest.mark.parametrize("line, kind", ONE_OP_CASES)
def test_the_template_that_runs_one_op(line, kind):
    result = line.rsplit("-> ", 1)[1]
    text = (
        "func.func @f(%x: tensor<4x8xf32>, %z: tensor<4x0xf32>, %w: tensor<2x256xf32>) -> "
        f"{result} {{\n  %y = {line}\n  func.return %y : {result}\n}}\n"
    )
    _, func = parse(text)
    (op,) = ops_of(func)
    assert ck.single_op_kind(op) == kind
    matches = ck.cuda_options(op)
    if kind is None:
        assert matches == []
    else:
        assert [m.kernel.name for m in matches] == [f"cuda.{kind}"]
        assert matches[0].ops == (op,) and matches[0].kernel.space == "cuda"


# -- the regions fuse would form ---------------------------------------------------------------------

# Large enough that the roofline prefers the device to the copies there and back.
X, W, B = "tensor<64x256xf32>", "tensor<256x256xf32>", "tensor<256xf32>"
MLP = f"""
func.func @f(%x: {X}, %w: {W}, %b: {B}) -> {X} {{
  %m = atomic.matmul %x, %w : ({X}, {W}) -> {X}
  %s = atomic.add %m, %b : ({X}, {B}) -> {X}
  %g = hl.gelu %s {{approximate = "tanh"}} : ({X}) -> {X}
  %r = hl.softmax %g {{axis = -1}} : ({X}) -> {X}
  func.return %r : {X}
}}
"""


def lowered(text: str):
    module, _ = parse(text)
    tgc.run_pipeline(module, "lower-hl,canonicalize,cse")
    return module, module.funcs[0]


def options_by_root(func) -> dict:
    return {op: ck.cuda_options(op) for op in ops_of(func)}


def test_the_regions_fuse_forms_are_options_rooted_at_their_last_op():
    _, func = lowered(MLP)
    found = options_by_root(func)
    regions = {(m.kernel.name, tuple(op.name for op in m.ops)) for ms in found.values() for m in ms}
    softmax = ("atomic.reduce_max", "atomic.sub", "atomic.exp", "atomic.reduce_sum", "atomic.div")
    assert ("cuda.row_reduction", softmax) in regions
    # matmul with its epilogue (bias, gelu) and, without epilogues, the epilogue alone
    with_epilogue = [r for r in regions if r[0] == "cuda.matmul" and len(r[1]) > 1]
    assert with_epilogue and with_epilogue[0][1][0] == "atomic.matmul"
    assert any(r[0] == "cuda.elementwise" and r[1][0] == "atomic.add" for r in regions)
    for op, ms in found.items():
        for m in ms:
            assert m.root is op and m.ops[-1] is op
            assert m.kernel.params["region"] and m.kernel.max_rel_error > 0
            # splat constants are recomputed inside, not read from memory
            assert not any(
                v.defining_op is not None and v.defining_op.name == "atomic.constant"
                for v in m.inputs
            )


def test_a_region_whose_inner_value_is_read_outside_is_offered_in_pieces_cut_there():
    text = f"""
func.func @f(%x: {X}) -> ({X}, {X}) {{
  %e = atomic.exp %x : ({X}) -> {X}
  %n = atomic.neg %e : ({X}) -> {X}
  %s = atomic.add %n, %x : ({X}, {X}) -> {X}
  func.return %s, %e : {X}, {X}
}}
"""
    _, func = parse(text)
    groups = ck.fusion_groups(func.body)
    whole = [ops for gs in groups.values() for _, ops in gs if len(ops) == 3]
    assert whole  # fuse forms it, and the planner sees the group ...
    exp, neg, add = ops_of(func)
    # ... whole, writing %e as a second result (its one outside reader, the return, comes
    # after the root), and cut at %e: %e alone, then neg + add reading it
    found = ck.cuda_options(add)
    assert [m.ops for m in found] == [(add,), (exp, neg, add), (neg, add)]
    assert found[1].outputs == (exp.results[0], add.results[0])
    assert found[2].inputs == (exp.results[0], func.body.args[0])
    assert found[2].outputs == (add.results[0],)
    assert [m.ops for m in ck.cuda_options(exp)] == [(exp,)]


def test_a_group_whose_inner_value_is_read_before_its_root_is_not_offered_whole():
    """A second result must not be needed before the kernel that writes it has run: the same
    group, its inner value %e read by an abs after the group's root, then before it."""

    def func_with(abs_first: bool):
        lines = [
            f"  %e = atomic.exp %x : ({X}) -> {X}",
            f"  %n = atomic.neg %e : ({X}) -> {X}",
            f"  %s = atomic.add %n, %x : ({X}, {X}) -> {X}",
        ]
        lines.insert(1 if abs_first else 3, f"  %a = atomic.abs %e : ({X}) -> {X}")
        body = "\n".join(lines)
        return parse(
            f"func.func @f(%x: {X}) -> {X} {{\n{body}\n"
            f"  %t = atomic.add %s, %a : ({X}, {X}) -> {X}\n  func.return %t : {X}\n}}\n"
        )[1]

    after = func_with(abs_first=False)
    exp, neg, add = ops_of(after)[:3]
    region = ck.region_of("elementwise", [exp, neg, add], several=True)
    assert region is not None and region.outputs == [exp.results[0], add.results[0]]
    assert ck.region_of("elementwise", [exp, neg, add]) is None  # one result only
    before = func_with(abs_first=True)
    exp, _, neg, add = ops_of(before)[:4]
    assert ck.region_of("elementwise", [exp, neg, add], several=True) is None


def test_a_layernorm_after_a_residual_add_read_again_is_cut_into_the_adds_and_the_layernorm():
    """The GPT-2 block's bias + residual + layernorm group (fuse's kernel writes the residual
    sum too, which a later add reads): the adds become one elementwise region, and the
    layernorm one row reduction reading their sum."""
    text = f"""
func.func @f(%m: {X}, %b: tensor<256xf32>, %x: {X}, %g: tensor<256xf32>, %w: tensor<256x256xf32>) -> {X} {{
  %mb = atomic.add %m, %b : ({X}, tensor<256xf32>) -> {X}
  %x1 = atomic.add %x, %mb : ({X}, {X}) -> {X}
  %h = hl.layernorm %x1, %g, %b {{axis = -1, eps = 1e-5}} : ({X}, tensor<256xf32>, tensor<256xf32>) -> {X}
  %p = atomic.matmul %h, %w : ({X}, tensor<256x256xf32>) -> {X}
  %y = atomic.add %x1, %p : ({X}, {X}) -> {X}
  func.return %y : {X}
}}
"""
    _, func = lowered(text)
    found = options_by_root(func)
    x1 = next(op for op in ops_of(func) if op.results[0].name_hint == "x1")
    adds = [m for m in found[x1] if len(m.ops) == 2]
    assert [m.kernel.name for m in adds] == ["cuda.elementwise"]
    matmul = next(op for op in ops_of(func) if op.name == "atomic.matmul")
    norm_root = matmul.operands[0].defining_op
    norms = [m for m in found[norm_root] if m.kernel.name == "cuda.row_reduction"]
    cut = [m for m in norms if len(m.outputs) == 1]
    assert cut and all(x1 not in m.ops and x1.results[0] in m.inputs for m in cut)
    # and whole, as fuse makes it: the adds and the layernorm, writing x1 as well
    (whole,) = [m for m in norms if len(m.outputs) == 2]
    assert x1 in whole.ops and whole.outputs == (x1.results[0], norm_root.results[0])


def test_a_self_contained_group_is_not_cut():
    _, func = lowered(MLP)
    for kind, group in (g for gs in ck.fusion_groups(func.body).values() for g in gs):
        assert ck._pieces(kind, group) == []


def test_the_same_region_is_one_kernel_and_other_regions_are_others():
    _, func = lowered(MLP + MLP.replace("@f", "@g"))
    _, f2 = lowered(MLP.replace("@f", "@g"))
    first = {m.kernel for ms in options_by_root(func).values() for m in ms}
    second = {m.kernel for ms in options_by_root(f2).values() for m in ms}
    assert first == second  # equal regions share one kernel (and its cost)
    assert len({k.params["region"] for k in first}) == len(first)


# -- template parameters: what tuning searches -------------------------------------------------------


def _fused_of(m):
    kind = m.kernel.name.split(".")[1]
    region = ck.region_function(ck.region_of(kind, list(m.ops), several=True))
    return ck.fused_from_block(region.body, [v.type for v in m.outputs], kind, "k", None)


def test_a_region_kernel_offers_its_template_parameters_its_generators_choice_first():
    _, func = lowered((EXAMPLES[0].parent / "gpt2_block.tg").read_text())
    matches = _distinct_region_kernels(func)
    for m in matches:
        kind = m.kernel.name.split(".")[1]
        chosen = generate_kernel(_fused_of(m)).params
        offered = ck.template_params(m.kernel.params)
        assert offered and set(offered) <= set(ck.TUNABLE[kind]), m.kernel.name
        for name, domain in offered.items():
            assert domain[0] == chosen[name], (m.kernel.name, name)
            assert set(ck.TUNABLE[kind][name]) <= set(domain)
            assert len(set(domain)) == len(domain)
        assert len(m.kernel.params[ck.REGION_PARAM]) == 1  # the region key is no choice


def test_a_parameter_point_the_template_cannot_make_is_refused_with_its_reason():
    _, func = lowered(MLP)
    (m, *_) = [m for m in _distinct_region_kernels(func) if m.kernel.name == "cuda.matmul"]
    kernel = m.kernel
    default = kernel.default_params
    assert kernel.param_constraints(None, default) is None
    too_many = {**default, "block_m": 128, "block_n": 128, "thread_m": 2, "thread_n": 2}
    reason = kernel.param_constraints(None, too_many)
    assert reason is not None and "need 4096 threads" in reason and "a block has 1024" in reason
    uneven = {**default, "block_m": 32, "thread_m": 8, "block_n": 32, "thread_n": 8}
    assert kernel.param_constraints(None, uneven) is None  # 16 threads: slow, but a kernel


def test_a_call_runs_its_region_with_the_parameters_it_names(stand_in):
    """The call the profiler times and select-kernels writes names the template parameters as
    `param.<name>` (not the region key); the kernel generated from it uses them."""
    from tgc.planner.profile import Instance, reference_function, region_call

    _, func = lowered(MLP)
    (m, *_) = [m for m in _distinct_region_kernels(func) if m.kernel.name == "cuda.elementwise"]
    types = ([v.type for v in m.inputs], [m.outputs[0].type])
    point = {**m.kernel.default_params, "block_size": 512, "streaming": True}
    inst = Instance(m.kernel, *types, params=point)
    ref = reference_function(inst)
    call = region_call(inst, ref)
    assert ck.call_params(call) == {"block_size": 512, "streaming": True}
    tuned = generate_kernel(ck.fused_from_call(call), ck.call_params(call))
    assert (tuned.block, tuned.params["streaming"]) == ((512, 1, 1), True)
    plain = region_call(Instance(m.kernel, *types, params=m.kernel.default_params), ref)
    assert ck.call_params(plain) == {"block_size": 256, "streaming": False}
    default = generate_kernel(ck.fused_from_call(plain), ck.call_params(plain))
    assert (default.block, default.params["streaming"]) == ((256, 1, 1), False)
    assert tuned.source != default.source


# -- the generated code ------------------------------------------------------------------------------


def _distinct_region_kernels(func):
    seen = {}
    for ms in options_by_root(func).values():
        for m in ms:
            seen.setdefault(m.kernel.params["region"], m)
    return list(seen.values())


def test_every_offered_region_generates_its_kernel():
    """Regions are offered only where the generator makes their code (it is run while
    planning); here each one again, from the IR select-kernels writes for it."""
    _, func = lowered((EXAMPLES[0].parent / "gpt2_block.tg").read_text())
    matches = _distinct_region_kernels(func)
    templates = {m.kernel.name for m in matches}
    assert templates == {"cuda.elementwise", "cuda.row_reduction", "cuda.matmul"}
    for m in matches:
        kind = m.kernel.name.split(".")[1]
        fused = ck.fused_from_block(
            ck.region_function(ck.region_of(kind, list(m.ops), several=True)).body,
            [v.type for v in m.outputs],
            kind,
            "k",
            None,
        )
        source = generate_kernel(fused)
        assert source.num_inputs == len(m.inputs) and source.num_outputs == len(m.outputs)


_X, _W, _Y = "tensor<1x12x9x9xbf16>", "tensor<16x12x3x3xbf16>", "tensor<1x16x9x9xbf16>"
CONV_BLOCK = f"""
func.func @conv(%x: {_X}, %w: {_W}, %b: tensor<16xbf16>) -> {_Y} {{
  %c = hl.conv2d %x, %w, %b {{pads = [1, 1, 1, 1]}} : ({_X}, {_W}, tensor<16xbf16>) -> {_Y}
  %r = hl.relu %c : ({_Y}) -> {_Y}
  func.return %r : {_Y}
}}
"""


@pytest.mark.skipif(
    shutil.which("nvcc") is None and not Path("/usr/local/cuda/bin/nvcc").exists(),
    reason="nvcc is not installed",
)
def test_generated_kernels_of_each_template_compile(tmp_path):
    """One region of each template (attention from the attention example, the convolution
    from a bf16 conv block), through nvcc (one run for the five: test/nvcc_batch.py)."""
    from nvcc_batch import compile_each

    picked = {}
    texts = [(EXAMPLES[0].parent / f"{e}.tg").read_text() for e in ("gpt2_block", "attention")]
    for text in [*texts, CONV_BLOCK]:
        module, func = parse(text)
        tgc.run_pipeline(module, "lower-hl{keep=attention,conv2d},canonicalize,cse")
        for m in _distinct_region_kernels(module.funcs[0]):
            picked.setdefault(m.kernel.name, m)
    assert set(picked) == {f"cuda.{k}" for k in ck.TEMPLATE_OF_KIND}
    sources = []
    for name, m in sorted(picked.items()):
        kind = name.split(".")[1]
        region = ck.region_of(kind, list(m.ops), several=True)
        func = ck.region_function(region)
        fused = ck.fused_from_block(func.body, [v.type for v in m.outputs], kind, kind, None)
        source = generate_kernel(fused, None, ck.kernel_symbol(fused))
        sources.append((source.name, source.source))
    flags = ["-cubin", "-arch=sm_90", "-O3", "-std=c++17"]
    built = compile_each(tmp_path, prelude(), sources, flags)
    failed = [f"{name}: {log[:2000]}" for name, (ok, log) in zip(sorted(picked), built) if not ok]
    assert not failed, "\n".join(failed)


# -- cuBLAS, run by a numpy model of the column-major GEMM -------------------------------------


class _Buffers:
    """Numpy arrays by address, so a fake cuBLAS can read and write what pointers point at."""

    def __init__(self) -> None:
        self.arrays: dict[int, np.ndarray] = {}

    def add(self, array: np.ndarray) -> int:
        array = np.ascontiguousarray(array)
        self.arrays[array.ctypes.data] = array
        return array.ctypes.data

    def flat(self, pointer) -> np.ndarray:
        """The elements from `pointer` to the end of the array it points into."""
        for start, array in self.arrays.items():
            if start <= pointer.value < start + array.nbytes:
                offset, rest = divmod(pointer.value - start, array.itemsize)
                assert rest == 0, "a pointer between elements"
                return array.reshape(-1)[offset:]
        raise AssertionError(f"no array at address {pointer.value:#x}")


def _fake_gemm(buffers: _Buffers):
    """cublasGemmStridedBatchedEx with alpha 1, beta 0, in numpy: C_i = op(A_i) op(B_i), all
    column-major with leading dimensions, batch i at i * stride."""

    def gemm(
        handle,
        ta,
        tb,
        m,
        n,
        k,
        alpha,
        a,
        at,
        lda,
        sa,
        b,
        bt,
        ldb,
        sb,
        beta,
        c,
        ct,
        ldc,
        sc,
        batch,
        compute,
        algo,
    ):
        A, Bm, C = buffers.flat(a), buffers.flat(b), buffers.flat(c)

        def matrix(flat, offset, rows, cols, ld):  # column-major rows x cols
            return np.lib.stride_tricks.as_strided(
                flat[offset:], (rows, cols), (flat.itemsize, ld * flat.itemsize)
            )

        for i in range(batch):
            opa = matrix(A, i * sa, k, m, lda).T if ta else matrix(A, i * sa, m, k, lda)
            opb = matrix(Bm, i * sb, n, k, ldb).T if tb else matrix(Bm, i * sb, k, n, ldb)
            out = matrix(C, i * sc, m, n, ldc)
            out[...] = (opa.astype(np.float64) @ opb.astype(np.float64)).astype(C.dtype)
        return 0

    return gemm


def _cublas_with(buffers: _Buffers):
    from tgc.runtime.cublas import Cublas

    blas = Cublas.__new__(Cublas)  # no library: its gemm entry point is the numpy model
    blas.handle = ctypes.c_void_p()
    blas._gemm = _fake_gemm(buffers)
    return blas


@pytest.mark.parametrize("seed", range(12))
def test_gemm_of_makes_cublas_compute_the_matmul(seed):
    from tgc.types import TensorType

    rng = np.random.default_rng(seed)
    ta, tb = bool(seed & 1), bool(seed & 2)
    m, n, k = (int(d) for d in rng.integers(1, 9, size=3))
    batch = (2, 3) if seed % 3 else ()
    a_batch = batch if seed % 4 else tuple(1 for _ in batch)
    b_batch = batch if seed % 5 else ()
    a = rng.standard_normal(a_batch + ((k, m) if ta else (m, k))).astype(np.float32)
    b = rng.standard_normal(b_batch + ((n, k) if tb else (k, n))).astype(np.float32)
    types = [TensorType.get(a.shape, "f32"), TensorType.get(b.shape, "f32")]
    out_shape = tuple(np.broadcast_shapes(a_batch, b_batch)) + (m, n)
    result = TensorType.get(out_shape, "f32")
    assert ck.cublas_types((types, [result])) is None
    g = ck.gemm_of(types, result, {"transpose_a": ta, "transpose_b": tb})
    buffers = _Buffers()
    c = np.zeros(out_shape, np.float32)
    pa, pb, pc = buffers.add(a), buffers.add(b), buffers.add(c)
    assert _cublas_with(buffers).gemm(g, pa, pb, pc) == 0
    got = buffers.arrays[pc]
    want = np.matmul(np.swapaxes(a, -1, -2) if ta else a, np.swapaxes(b, -1, -2) if tb else b)
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


def test_cublas_refuses_what_it_cannot_run():
    from tgc.types import TensorType

    t = TensorType.get
    assert "batched" in ck.cublas_types(
        ([t((2, 4, 3), "f32"), t((3, 3, 5), "f32")], [t((6, 4, 5), "f32")])
    )
    assert "not i32" in ck.cublas_types(([t((4, 3), "i32"), t((3, 5), "i32")], [t((4, 5), "i32")]))
    assert "without elements" in ck.cublas_types(
        ([t((4, 0), "f32"), t((0, 5), "f32")], [t((4, 5), "f32")])
    )


# -- a stand-in device: select-kernels and run_plan with the CUDA planner side -----------------


@dataclass
class Boxed:
    """A value in the stand-in's "cuda" space."""

    array: np.ndarray


def _stand_in_region(op, inputs):
    fused = op if isinstance(op, FusedOp) else ck.fused_from_call(op)
    assert fused.attr("template") in ck.TEMPLATE_OF_KIND
    outs = fused.reference(*[b.array for b in inputs])
    outs = outs if isinstance(outs, tuple) else (outs,)
    return [Boxed(np.asarray(o)) for o in outs]


def _lt_model(name: str, arrays: list, t) -> np.ndarray:
    """What a cuBLASLt kernel computes, in f32 (its accumulators) rounded once to the result."""
    x, w, b, r = ck.lt_operands(name, [np.asarray(a, np.float32) for a in arrays])
    w = w.T if ck.LT_KERNELS[name].transposed_w else w
    y = np.matmul(x, w) + (b if b is not None else 0)
    if ck.LT_KERNELS[name].epilogue == "gelu_bias":
        y = 0.5 * y * (1 + np.tanh(np.float32(0.7978846) * (y + np.float32(0.044715) * y**3)))
    if r is not None:
        y = y + r
    return y.astype(t.dtype)


def _stand_in_call(kernel, inputs, attrs, result_types):
    if kernel.view:  # cuda.split_view, cuda.reshape_view: their host run views the buffer
        return [Boxed(a) for a in kernel.run([x.array for x in inputs], attrs, result_types)]
    if kernel.name in ck.LT_KERNELS:
        return [Boxed(_lt_model(kernel.name, [x.array for x in inputs], result_types[0]))]
    assert kernel.name == ck.CUBLAS_GEMM or kernel.name in ck.SPLIT_GEMMS
    from tgc.types import TensorType

    buffers = _Buffers()
    a, b = (x.array for x in inputs)
    t = result_types[0]
    types = [TensorType.get(a.shape, t.element_type), TensorType.get(b.shape, t.element_type)]
    g = ck.gemm_of(types, t, attrs)
    pa, pb = buffers.add(a), buffers.add(b)
    if kernel.name == ck.CUBLAS_GEMM:
        pc = buffers.add(np.zeros(t.shape, t.dtype))
        _cublas_with(buffers).gemm(g, pa, pb, pc)
        return [Boxed(buffers.arrays[pc])]
    # the parts into rows `ld` apart, then (padded rows) the compact copy cuda.py makes
    item = t.dtype.itemsize
    ld = ck.split_ld(kernel.name, g, item)
    pc = buffers.add(np.full((g.batch * g.m, ld), np.nan, t.dtype))
    for part, into_b, into_c in ck.padded_gemm_parts(g, item):
        _cublas_with(buffers).gemm(part, pa, pb + into_b * item, pc + into_c * item, ldc=ld)
    return [Boxed(buffers.arrays[pc][:, : g.n].reshape(t.shape).copy())]


@pytest.fixture
def stand_in():
    """The CUDA planner side registered with a stand-in device; the moves between spaces and
    the generated calls are counted; `compiled` holds the size of each batch of generated
    kernels compiled (Backend.compile_regions), a kernel run uncompiled compiling alone, as
    cuda.py's does."""
    counts = {"to_host": 0, "from_host": 0, "regions": 0, "compiled": []}
    compiled: set[str] = set()

    def to_host(v):
        counts["to_host"] += 1
        return v.array.copy()

    def from_host(a, t):
        counts["from_host"] += 1
        return Boxed(ck.host_array(a, t).copy())  # as cuda.py uploads

    def compile_regions(ops):
        counts["compiled"].append(len(ops))
        compiled.update(print_op(op) for op in ops)

    def region(op, inputs):
        counts["regions"] += 1
        if print_op(op) not in compiled:
            compile_regions([op])
        return _stand_in_region(op, inputs)

    def lt_run(name):  # a cuBLASLt kernel's host run (the profiler calls it through call)
        return lambda inputs, attrs, result_types: [_lt_model(name, inputs, result_types[0])]

    backend = Backend(
        "cuda", call=_stand_in_call, run_region=region, compile_regions=compile_regions
    )
    ck.register(backend, Space("cuda", to_host, from_host), lt_run=lt_run)
    yield counts
    ck.unregister()


# Made cheap so that plans use them; copies and numpy kernels keep their roofline costs.
CUDA_CHEAP = DictCostSource(
    {**{t.name: 1e-9 for t in ck.TEMPLATE_OF_KIND.values()}, ck.CUBLAS_GEMM: 1e-9},
    fallback=RooflineCostSource(),
)


# The backends the stand-in tests plan with (whatever else is installed), and the GPU tests.
STAND_IN_FAMILIES = ("numpy", "cuda")
GPU_FAMILIES = ("numpy", "cuda", "torch")


def _selected(text: str, pipeline: str, costs=CUDA_CHEAP, backends=STAND_IN_FAMILIES):
    module, _ = parse(text)
    if pipeline:
        tgc.run_pipeline(module, pipeline)
    selection = select_kernels(module.funcs[0], costs, tolerance=1e-5, backends=backends)
    tgc.verify(module)
    return module.funcs[0], selection


def _callees(func) -> list[str]:
    return [op.attr("callee") for op in func.body.ops if isinstance(op, CallOp)]


@pytest.mark.parametrize("pipeline", ["", "lower-hl"])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_plans_on_the_stand_in_device_match_float64(example, pipeline, stand_in):
    text = example.read_text()
    func, _ = _selected(text, pipeline)
    callees = _callees(func)
    assert any(c.startswith("cuda.") for c in callees), callees
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, 5)
    (want,) = run_function(reference, inputs, "f64")
    (got,) = run_plan(func, inputs)
    scale = max(float(np.max(np.abs(want))), 1.0)
    assert float(np.max(np.abs(got - want))) <= 2e-4 * scale
    assert stand_in["regions"] + callees.count(ck.CUBLAS_GEMM) > 0
    assert stand_in["from_host"] >= 1 and stand_in["to_host"] >= 1  # copies both ways


def test_a_fused_region_runs_as_one_generated_kernel(stand_in):
    func, _ = _selected(MLP, "lower-hl")
    calls = [op for op in func.body.ops if isinstance(op, CallOp)]
    fused = [op for op in calls if op.attr("callee") in TEMPLATES and len(op.body) > 2]
    assert fused, _callees(func)
    assert all(op.results[0].type.encoding == "cuda" for op in fused)
    reference = tgc.parse(MLP).funcs[0]
    for seed in range(3):
        inputs = kernel_inputs(reference, np.random.default_rng(seed))
        (want,) = run_function(reference, inputs, "f64")
        (got,) = run_plan(func, inputs)
        assert rel_error(got, want) <= 1e-5
    assert stand_in["regions"] == 3 * len([op for op in calls if op.attr("callee") in TEMPLATES])


def test_a_wrong_generated_kernel_makes_the_plan_wrong(stand_in):
    """The comparison above can fail: the same plan with generated kernels that are 0.1% off."""
    func, _ = _selected(MLP, "lower-hl")

    def off(op, inputs):
        return [Boxed(b.array * b.array.dtype.type(1.001)) for b in _stand_in_region(op, inputs)]

    wrong = {**BACKENDS, "cuda": Backend("cuda", call=_stand_in_call, run_region=off)}
    reference = tgc.parse(MLP).funcs[0]
    inputs = kernel_inputs(reference, np.random.default_rng(0))
    (want,) = run_function(reference, inputs, "f64")
    (got,) = run_plan(func, inputs, wrong)
    assert rel_error(got, want) > 1e-4


def _gpu_suite():
    """bench/gpu_suite.py, whose `on_device` puts a text's values in device memory as its auto
    rows do."""
    import sys

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "bench"))
    import gpu_suite

    return gpu_suite


def test_a_gpt2_block_in_device_memory_plans_the_fixed_routes_kernels(stand_in):
    """Lowered for planning, with cuBLAS and the templates cheap and the GPT-2 block's values
    in device memory (as --backend auto runs it on the GPU), the plan is the fixed cuda
    route's ten kernels: among them the row reduction that also writes the residual sum the
    block's last add reads (a region with two results). It matches float64."""
    text = (EXAMPLES[0].parent / "gpt2_block.tg").read_text()
    device_text = _gpu_suite().on_device(text)
    costs = DictCostSource(
        {**{t.name: 1e-9 for t in ck.TEMPLATE_OF_KIND.values()}, ck.CUBLAS_GEMM: 1e-9,
         "cuda.matmul": 1e-3},
        fallback=RooflineCostSource(),
    )  # fmt: skip
    func, selection = _selected(device_text, "lower-for-planning", costs, ("cuda",))
    assert selection.exact
    calls = [op for op in func.body.ops if isinstance(op, CallOp)]
    assert len(calls) == 10
    (two,) = [op for op in calls if len(op.results) == 2]
    assert two.attr("callee") == "cuda.row_reduction"
    assert [op.attr("callee") for op in calls].count(ck.CUBLAS_GEMM) == 4
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, 4)
    (want,) = run_function(reference, inputs, "f64")
    (got,) = run_plan(func, inputs)
    assert rel_error(got, want) <= 1e-5


# -- cuBLASLt: linear layers with their epilogues -------------------------------------------------

LT_CHEAP = DictCostSource(
    {**CUDA_CHEAP.table, **{name: 1e-10 for name in ck.LT_KERNELS}, "cuda.matmul": 1e-3},
    fallback=RooflineCostSource(),
)


@pytest.mark.parametrize("dtype", ["bf16", "f16"])
def test_a_gpt2_block_plans_its_linear_layers_as_cublaslt_calls_with_their_epilogues(
    dtype, stand_in
):
    """With cuBLASLt's kernels cheapest, the lowered bf16/f16 GPT-2 block runs its QKV
    projection as a GEMM with the bias in its epilogue, the MLP's first layer with bias and GELU
    there, and both residual projections reading the residual as the GEMM's C: no elementwise
    kernel is left around a GEMM. It matches float64 within 16-bit rounding."""
    suite = _gpu_suite()
    text = suite.gpt2_text(2, 16, d=64, h=2, dtype=dtype)
    func, selection = _selected(suite.on_device(text), "lower-for-planning", LT_CHEAP, ("cuda",))
    assert selection.exact
    callees = _callees(func)
    assert sorted(c for c in callees if "cublas" in c) == [
        "cuda.cublaslt.linear",
        "cuda.cublaslt.linear_gelu",
        "cuda.cublaslt.linear_residual",
        "cuda.cublaslt.linear_residual",
    ]
    assert callees.count("cuda.elementwise") == 0
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, 4)
    (want,) = run_function(reference, inputs, "f64")
    (got,) = run_plan(func, inputs)
    assert rel_error(got, want) <= 2e-2


def _linear_text(
    x: str, bias: str | None, dtype: str, then: str = "", n: int = 40, transposed: bool = False
) -> str:
    """x @ w + bias (hl.linear; without a bias, atomic.matmul) on x of shape `x`, w of (x's
    last dim) x n, then `then`: "gelu" (tanh), "residual" (+ %r) or nothing. `transposed`: w
    is n x k, as torch.export writes nn.Linear (a matmul with transpose_b, the bias added)."""
    dims = x.split("x")
    rows, k = "x".join(dims[:-1]), dims[-1]
    xt, w = (
        f"tensor<{x}x{dtype}>",
        f"tensor<{n}x{k}x{dtype}>" if transposed else f"tensor<{k}x{n}x{dtype}>",
    )
    y, b = f"tensor<{rows}x{n}x{dtype}>", f"tensor<{bias}x{dtype}>"
    args = f"%x: {xt}, %w: {w}" + (f", %b: {b}" if bias else "")
    args += f", %r: {y}" if then == "residual" else ""
    lines = [f"func.func @f({args}) -> {y} {{"]
    if transposed and bias:
        lines.append(f"  %p = atomic.matmul %x, %w {{transpose_b = true}} : ({xt}, {w}) -> {y}")
        lines.append(f"  %l = atomic.add %p, %b : ({y}, {b}) -> {y}")
    elif transposed:
        lines.append(f"  %l = atomic.matmul %x, %w {{transpose_b = true}} : ({xt}, {w}) -> {y}")
    elif bias:
        lines.append(f"  %l = hl.linear %x, %w, %b : ({xt}, {w}, {b}) -> {y}")
    else:
        lines.append(f"  %l = atomic.matmul %x, %w : ({xt}, {w}) -> {y}")
    if then == "gelu":
        lines.append(f'  %y = hl.gelu %l {{approximate = "tanh"}} : ({y}) -> {y}')
    if then == "residual":
        lines.append(f"  %y = atomic.add %r, %l : ({y}, {y}) -> {y}")
    lines += [f"  func.return {'%y' if then else '%l'} : {y}", "}"]
    return "\n".join(lines)


@pytest.mark.parametrize("pipeline", ["", "lower-hl", "lower-for-planning"])
def test_a_linear_layer_runs_as_one_cublaslt_call_as_written_and_lowered(pipeline, stand_in):
    """hl.linear on a 3-d x (its rows one matrix), its values in device memory, as written and
    lowered; with GELU after it in bf16, one call with the GELU epilogue."""
    for dtype, then, name in (
        ("f32", "", "cuda.cublaslt.linear"),
        ("bf16", "gelu", "cuda.cublaslt.linear_gelu"),
    ):
        text = _linear_text("3x5x24", "40", dtype, then)
        func, _ = _selected(_gpu_suite().on_device(text), pipeline, LT_CHEAP)
        assert _callees(func) == [name], (dtype, pipeline)
        reference = tgc.parse(text).funcs[0]
        inputs = random_inputs(reference, 1)
        (want,) = run_function(reference, inputs, "f64")
        (got,) = run_plan(func, inputs)
        assert rel_error(got, want) <= (1e-6 if dtype == "f32" else 1e-2)


def test_gpt2s_spelled_out_gelu_after_a_reshaped_linear_runs_in_the_gemms_epilogue(stand_in):
    """Hugging Face GPT-2's gelu_new as torch.export writes it (pow, tanh, bf16-rounded
    scalars), after the linear layer's product reshaped to [batch, seq, n]: lower-for-planning's
    raise-gelu brings it to hl.gelu's form next to the bias add, so that cuBLASLt's GEMM with the
    GELU epilogue takes all of it, and the plan matches float64."""
    lit = Path(__file__).resolve().parent / "lit" / "raise-gelu" / "raise.tg"
    text = lit.read_text().split("// -----")[0]
    func, _ = _selected(_gpu_suite().on_device(text), "lower-for-planning", LT_CHEAP)
    assert "cuda.cublaslt.linear_gelu" in _callees(func)
    # what is left outside the GEMM is the reshape to [batch, seq, n], nothing of the GELU
    outside = {
        inner.name
        for op in func.body.ops
        if isinstance(op, CallOp) and op.attr("callee") != "cuda.cublaslt.linear_gelu"
        for inner in (op.regions[0].blocks[0].ops if op.regions else [op])
    }
    assert outside <= {"atomic.reshape", "kernel.yield", "kernel.call"}, outside
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, 3)
    (want,) = run_function(reference, inputs, "f64")
    (got,) = run_plan(func, inputs)
    assert rel_error(got, want) <= 2e-2


def test_cublaslt_refuses_a_bias_that_is_not_one_per_column_and_gelu_in_f32(stand_in):
    """A [rows, 40] "bias" is a matrix add, not cuBLASLt's bias vector (the plan reads it as
    the residual of the GEMM without a bias); GELU in f32 would be cuBLASLt's approximation
    where the program asks for f32 accuracy."""
    kernel = KERNELS["cuda.cublaslt.linear"]
    from tgc.types import TensorType as TT

    x, w, y = TT.get((15, 24), "f32"), TT.get((24, 40), "f32"), TT.get((15, 40), "f32")
    assert "a bias of 40 elements" in kernel.constraints(([x, w, y], [y]))
    assert kernel.constraints(([x, w, TT.get((40,), "f32")], [y])) is None
    gelu = KERNELS["cuda.cublaslt.linear_gelu"]
    assert "not f32" in gelu.constraints(([x, w, TT.get((40,), "f32")], [y]))
    on_device = _gpu_suite().on_device
    func, _ = _selected(on_device(_linear_text("15x24", "15x40", "f32")), "lower-hl", LT_CHEAP)
    assert _callees(func) == ["cuda.cublaslt.matmul_residual"]
    func, _ = _selected(on_device(_linear_text("15x24", "40", "f32", "gelu")), "lower-hl", LT_CHEAP)
    assert "cuda.cublaslt.linear_gelu" not in _callees(func)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("pipeline", ["", "lower-for-planning"])
def test_a_product_without_bias_adds_its_residual_in_the_gemm(dtype, pipeline, stand_in):
    """r + x @ w (Llama's attention output and down projections): one cuBLASLt call reading
    the residual as the GEMM's C, no add kernel after it; it matches float64."""
    text = _linear_text("3x5x24", None, dtype, "residual")
    func, _ = _selected(_gpu_suite().on_device(text), pipeline, LT_CHEAP)
    assert _callees(func) == ["cuda.cublaslt.matmul_residual"]
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, 2)
    (want,) = run_function(reference, inputs, "f64")
    (got,) = run_plan(func, inputs)
    assert rel_error(got, want) <= (1e-6 if dtype == "f32" else 1e-2)


@pytest.mark.parametrize("pipeline", ["", "lower-for-planning"])
@pytest.mark.parametrize(
    ("dtype", "bias", "then", "name"),
    [
        ("f32", "40", "", "cuda.cublaslt.linear_wt"),
        ("bf16", "40", "gelu", "cuda.cublaslt.linear_gelu_wt"),
        ("f32", "40", "residual", "cuda.cublaslt.linear_residual_wt"),
        ("bf16", None, "residual", "cuda.cublaslt.matmul_residual_wt"),
    ],
)
def test_a_linear_layer_with_pytorchs_weight_layout_runs_as_one_cublaslt_call(
    dtype, bias, then, name, pipeline, stand_in
):
    """nn.Linear as torch.export writes it (w stored n x k, a matmul with transpose_b, the bias
    added after it): the twin of each cuBLASLt kernel that reads w with op T, one call, no add
    or GELU kernel left; it matches float64."""
    text = _linear_text("3x5x24", bias, dtype, then, transposed=True)
    func, _ = _selected(_gpu_suite().on_device(text), pipeline, LT_CHEAP)
    assert _callees(func) == [name]
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, 4)
    (want,) = run_function(reference, inputs, "f64")
    (got,) = run_plan(func, inputs)
    assert rel_error(got, want) <= (1e-6 if dtype == "f32" else 1e-2)


def test_lt_gemm_of_a_transposed_weight_reads_it_with_op_t():
    from tgc.types import TensorType as TT

    x, w, y = TT.get((3, 5, 24), "bf16"), TT.get((40, 24), "bf16"), TT.get((3, 5, 40), "bf16")
    g = ck.lt_gemm("cuda.cublaslt.matmul_residual_wt", [x, w, y], y)
    assert (g.m, g.n, g.k, g.epilogue, g.accumulate, g.transpose_b) == (
        15,
        40,
        24,
        "none",
        True,
        True,
    )
    kernel = ck.LT_KERNELS["cuda.cublaslt.linear_wt"]
    assert kernel.transposed_w and "transpose_b = true" in kernel.reference


def test_matmul_residual_refuses_a_broadcast_addend_and_reads_no_bias(stand_in):
    """A [40] addend is a bias (hl.linear's kernels take it), not a residual; the kernel's
    operands are x, w, r: no bias pointer, cuBLASLt's plain epilogue with beta = 1."""
    from tgc.types import TensorType as TT

    kernel = KERNELS["cuda.cublaslt.matmul_residual"]
    x, w, y = TT.get((15, 24), "bf16"), TT.get((24, 40), "bf16"), TT.get((15, 40), "bf16")
    assert kernel.constraints(([x, w, y], [y])) is None
    assert "a residual of the result's shape" in kernel.constraints(
        ([x, w, TT.get((40,), "bf16")], [y])
    )
    assert ck.lt_operands("cuda.cublaslt.matmul_residual", ["x", "w", "r"]) == ("x", "w", None, "r")
    g = ck.lt_gemm("cuda.cublaslt.matmul_residual", [x, w, y], y)
    assert (g.epilogue, g.accumulate) == ("none", True)


def test_lt_gemm_takes_the_rows_of_every_leading_dim_and_the_epilogue_of_its_kernel():
    from tgc.types import TensorType as TT

    x, w, b = TT.get((3, 5, 24), "bf16"), TT.get((24, 40), "bf16"), TT.get((40,), "bf16")
    y = TT.get((3, 5, 40), "bf16")
    g = ck.lt_gemm("cuda.cublaslt.linear_gelu", [x, w, b], y)
    assert (g.m, g.n, g.k, g.dtype, g.epilogue, g.accumulate) == (
        15,
        40,
        24,
        "bf16",
        "gelu_bias",
        False,
    )
    g = ck.lt_gemm("cuda.cublaslt.linear_residual", [x, w, b, y], y)
    assert (g.epilogue, g.accumulate) == ("bias", True)


def test_a_backend_that_prepares_its_calls_prepares_each_once_and_runs_them(stand_in):
    """Backend.prepare: a PlannedFunction makes each generated call ready once (the CUDA
    backend compiles it and works out its launch then) and runs the prepared call every time;
    a kernel the backend prepares nothing for (None) takes the general path."""
    func, _ = _selected(MLP, "lower-hl")
    template_calls = [
        op for op in func.body.ops if isinstance(op, CallOp) and op.attr("callee") in TEMPLATES
    ]
    prepared, runs = [], []

    def prepare(kernel, op):
        prepared.append(op)
        if not isinstance(kernel, Template):
            return None

        def run(values):
            runs.append(op)
            return _stand_in_region(op, values)

        return run

    base = BACKENDS["cuda"]
    backends = {**BACKENDS, "cuda": replace(base, prepare=prepare)}
    planned = PlannedFunction(func, backends)
    assert {id(op) for op in template_calls} <= {id(op) for op in prepared}
    reference = tgc.parse(MLP).funcs[0]
    for seed in range(3):
        inputs = kernel_inputs(reference, np.random.default_rng(seed))
        (want,) = run_function(reference, inputs, "f64")
        (got,) = planned(inputs)
        assert rel_error(got, want) <= 1e-5
    assert len(prepared) == len({id(op) for op in prepared})  # once per call op
    assert len(runs) == 3 * len(template_calls) and stand_in["regions"] == 0


def test_a_planned_function_compiles_its_generated_kernels_in_one_batch(stand_in):
    """nvcc takes about a second a kernel: a plan's generated kernels are compiled together
    (Backend.compile_regions, in parallel on the GPU), not one after another as each call is
    prepared; a kernel run later finds itself compiled."""
    (block,) = (p for p in EXAMPLES if p.stem == "gpt2_block")
    func, _ = _selected(block.read_text(), "lower-hl")
    template_calls = [
        op for op in func.body.ops if isinstance(op, CallOp) and op.attr("callee") in TEMPLATES
    ]
    assert len(template_calls) > 1
    planned = PlannedFunction(func)
    assert stand_in["compiled"] == [len(template_calls)]
    planned(random_inputs(func, 0))
    assert stand_in["compiled"] == [len(template_calls)] and stand_in["regions"] > 0


def test_a_prepared_call_that_returns_the_wrong_shape_is_a_located_internal_error(stand_in):
    func, _ = _selected(MLP, "lower-hl")
    call = next(
        op for op in func.body.ops if isinstance(op, CallOp) and op.attr("callee") in TEMPLATES
    )

    def prepare(kernel, op):
        if op is not call:
            return None
        return lambda values: [np.zeros((1,), np.float32)]  # a value with a shape

    backends = {**BACKENDS, "cuda": replace(BACKENDS["cuda"], prepare=prepare)}
    with pytest.raises(TgcError, match="returned shape \\(1,\\)") as e:
        PlannedFunction(func, backends)(random_inputs(func, 0))
    assert e.value.loc == call.loc


def test_a_generated_call_without_its_code_is_a_located_error(stand_in):
    func, _ = _selected(MLP, "lower-hl")
    call = next(
        op for op in func.body.ops if isinstance(op, CallOp) and op.attr("callee") in TEMPLATES
    )
    call.regions = []
    with pytest.raises(TgcError, match="needs the code it runs in a region") as e:
        run_plan(func, random_inputs(func, 0))
    assert e.value.loc == call.loc


def test_a_backend_without_generated_kernels_cannot_run_them(stand_in):
    func, _ = _selected(MLP, "lower-hl")
    plain = {**BACKENDS, "cuda": Backend("cuda", call=_stand_in_call)}
    with pytest.raises(TgcError, match="runs no generated kernel"):
        run_plan(func, random_inputs(func, 0), plain)


def test_unregistering_removes_the_hook_and_the_kernels(stand_in):
    from tgc.planner.options import FUSED_OPTIONS

    assert ck.cuda_options in FUSED_OPTIONS and ck.CUBLAS_GEMM in KERNELS
    ck.unregister()
    assert ck.cuda_options not in FUSED_OPTIONS and ck.CUBLAS_GEMM not in KERNELS
    assert "cuda.elementwise" not in TEMPLATES and "cuda" not in BACKENDS


# -- on a GPU -------------------------------------------------------------------------------------

HAVE_TORCH = importlib.util.find_spec("torch") is not None


@pytest.fixture
def gpu_backends():
    """Every backend that loads on this machine (cuda, torch, torch-cuda), removed afterwards."""
    import tgc.planner

    loaded = tgc.planner.load_backends(GPU_FAMILIES)
    assert "tgc.planner.backends.cuda" in loaded, tgc.planner.UNAVAILABLE
    yield loaded
    tgc.planner.unload_backends()


# Shapes large enough that the roofline prefers the device to the copies there and back.
GPU_CASES = {
    "elementwise": (
        f"""
func.func @f(%x: {X}, %b: {B}) -> {X} {{
  %s = atomic.add %x, %b : ({X}, {B}) -> {X}
  %g = hl.gelu %s : ({X}) -> {X}
  %t = hl.tanh %g : ({X}) -> {X}
  func.return %t : {X}
}}
""",
        "",
    ),
    "row_reduction": (MLP, "lower-hl"),
    "matmul": (MLP, "lower-hl"),
    "attention": ((EXAMPLES[0].parent / "attention.tg").read_text(), ""),
    "cublas.gemm": (
        """
func.func @f(%a: tensor<3x400x240xf32>, %b: tensor<400x560xf32>) -> tensor<3x240x560xf32> {
  %y = atomic.matmul %a, %b {transpose_a = true} : (tensor<3x400x240xf32>, tensor<400x560xf32>) -> tensor<3x240x560xf32>
  func.return %y : tensor<3x240x560xf32>
}
""",
        "",
    ),
}


@pytest.mark.cuda
@pytest.mark.parametrize("what", sorted(GPU_CASES))
def test_each_cuda_kernel_on_the_gpu_within_its_stated_error(what, gpu_backends):
    text, pipeline = GPU_CASES[what]
    costs = DictCostSource(
        {**CUDA_CHEAP.table, f"cuda.{what}": 1e-12}, fallback=RooflineCostSource()
    )
    func, _ = _selected(text, pipeline, costs, GPU_FAMILIES)
    callees = _callees(func)
    assert f"cuda.{what}" in callees
    # each CUDA kernel of the plan adds at most its stated error to the native evaluation's
    bounds = [
        TEMPLATES[c].max_rel_error if c in TEMPLATES else KERNELS[c].max_rel_error
        for c in callees
        if c.startswith("cuda.")
    ]
    reference = tgc.parse(text).funcs[0]
    for seed in range(3):
        inputs = kernel_inputs(reference, np.random.default_rng(seed))
        (want,) = run_function(reference, inputs, "f64")
        (native,) = run_function(reference, inputs, "native")
        (got,) = run_plan(func, inputs)
        assert rel_error(got, native) <= sum(bounds), what
        assert rel_error(got, want) <= rel_error(native, want) + sum(bounds), what


# The issue's bounds for 16-bit results (normwise, against float64); f32: cuBLAS's sums.
LT_TOLERANCE = {"f32": 1e-5, "bf16": 1e-2, "f16": 2e-3}
LT_GPU_CASES = [
    (then, dtype, transposed)
    for then in ("", "gelu", "residual", "residual-no-bias")
    for dtype in ("f32", "bf16", "f16")
    for transposed in (False, True)
    if not (then == "gelu" and dtype == "f32")
]


@pytest.mark.cuda
@pytest.mark.parametrize("then, dtype, transposed", LT_GPU_CASES)
def test_each_cublaslt_kernel_on_the_gpu_matches_float64(then, dtype, transposed, gpu_backends):
    """Odd sizes (74 rows over two leading dims, K 72, N 40), fresh random inputs, each kernel
    the plan's only call, w stored k x n and (transposed, as nn.Linear's) n x k; within the
    stated bound of float64."""
    layout = "_wt" if transposed else ""
    if then == "residual-no-bias":
        name = "cuda.cublaslt.matmul_residual" + layout
        text = _linear_text("2x37x72", None, dtype, "residual", transposed=transposed)
    else:
        name = "cuda.cublaslt." + ("linear_" + then if then else "linear") + layout
        text = _linear_text("2x37x72", "40", dtype, then, transposed=transposed)
    func, _ = _selected(_gpu_suite().on_device(text), "", LT_CHEAP, GPU_FAMILIES)
    assert _callees(func) == [name]
    reference = tgc.parse(text).funcs[0]
    for seed in range(3):
        inputs = random_inputs(reference, seed)
        (want,) = run_function(reference, inputs, "f64")
        (got,) = run_plan(func, inputs)
        assert rel_error(np.asarray(got, np.float64), want) <= LT_TOLERANCE[dtype], seed


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed")
def test_a_plan_mixing_numpy_cuda_and_torch_cuda_runs_and_matches_float64(gpu_backends):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")
    text = (EXAMPLES[0].parent / "gpt2_block.tg").read_text()
    # GELU on the host (cheaper there, copies included, than any generated kernel), the
    # layernorms and attention in PyTorch, the GEMMs in cuBLAS. (The qkv split once went to the
    # host too; attention now reads q, k and v as views of the qkv buffer.)
    costs = DictCostSource(
        {
            "torch-cuda.hl.attention": 1e-9,
            "torch-cuda.hl.layernorm": 1e-9,
            ck.CUBLAS_GEMM: 1e-9,
            "cuda.elementwise": 1e-8,
            "numpy.hl.gelu": 1e-12,
            "copy.host_to_cuda": 1e-9,
            "copy.cuda_to_host": 1e-9,
        },
        fallback=RooflineCostSource(),
    )
    func, _ = _selected(text, "", costs, GPU_FAMILIES)
    callees = _callees(func)
    assert any(c.startswith("numpy.") for c in callees), callees
    assert any(c.startswith("cuda.") for c in callees), callees
    assert any(c.startswith("torch-cuda.") for c in callees), callees
    assert any(op.name == "kernel.copy" for op in func.body.ops)
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, 3)
    (want,) = run_function(reference, inputs, "f64")
    (got,) = run_plan(func, inputs)
    scale = max(float(np.max(np.abs(want))), 1.0)
    assert float(np.max(np.abs(got - want))) <= 2e-4 * scale


@pytest.mark.cuda
@pytest.mark.parametrize("pipeline", ["", "lower-hl"])
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_examples_on_the_gpu_with_cuda_kernels_match_float64(example, pipeline, gpu_backends):
    text = example.read_text()
    func, _ = _selected(text, pipeline, backends=GPU_FAMILIES)
    assert any(c.startswith("cuda.") for c in _callees(func))
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, 1)
    (want,) = run_function(reference, inputs, "f64")
    (got,) = run_plan(func, inputs)
    scale = max(float(np.max(np.abs(want))), 1.0)
    assert float(np.max(np.abs(got - want))) <= 2e-4 * scale


@pytest.mark.cuda
@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.stem)
def test_tgc_run_backend_auto_check_on_the_gpu(example, gpu_backends, capsys):
    from tgc.tools import run as run_tool

    code = run_tool.main([str(example), "--backend", "auto", "--check", "--random-inputs", "0"])
    out = capsys.readouterr()
    assert code == 0, out.err
    assert "check: result 0 ok" in out.out


@pytest.mark.cuda
@pytest.mark.skipif(not HAVE_TORCH, reason="PyTorch is not installed")
def test_device_values_pass_between_pycuda_and_torch_without_a_copy(gpu_backends):
    import torch

    if not torch.cuda.is_available():
        pytest.skip("this PyTorch has no CUDA")
    from tgc.planner.backends.cuda import DeviceArray
    from tgc.planner.backends.torch import as_cuda_tensor

    t = torch.arange(12, dtype=torch.float32, device="cuda").reshape(3, 4)
    d = DeviceArray.of(t)
    assert d.ptr == t.data_ptr() and d.shape == (3, 4)
    back = as_cuda_tensor(DeviceArray.from_host(np.ones((2, 2), np.float32)))
    assert back.device.type == "cuda" and float(back.sum()) == 4.0
    assert as_cuda_tensor(d).data_ptr() == t.data_ptr()


def test_a_kernel_fused_on_device_values_runs_as_a_generated_kernel(stand_in):
    """A `kernel.fused` in device memory (as `fuse` writes it in a planned function) runs through
    the backend that generates kernels; on the host it is interpreted."""
    d = 'tensor<4x8xf32, "cuda">'
    text = f"""
func.func @f(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {{
  %d = kernel.copy %x : (tensor<4x8xf32>) -> {d}
  %y = kernel.fused %d {{name = "k", template = "elementwise"}} : ({d}) -> {d} {{
  ^bb0(%p: {d}):
    %e = atomic.exp %p : ({d}) -> {d}
    %n = atomic.neg %e : ({d}) -> {d}
    kernel.yield %n : {d}
  }}
  %h = kernel.copy %y : ({d}) -> tensor<4x8xf32>
  func.return %h : tensor<4x8xf32>
}}
"""
    _, func = parse(text)
    x = kernel_inputs(func, np.random.default_rng(0))[0]
    (got,) = run_plan(func, [x])
    np.testing.assert_allclose(got, -np.exp(x), rtol=1e-6)
    assert stand_in["regions"] == 1
    without = {k: b for k, b in BACKENDS.items() if k != "cuda"}
    with pytest.raises(TgcError, match="no backend here runs a 'kernel.fused' on values in cuda"):
        run_plan(func, [x], without)


# -- the profiler on the stand-in device (planner/profile.py) ----------------------------------------

# Regions holding ops that cannot infer their result types: a reshape (a view of an input the
# region recomputes), an iota; and a rank-0 value, copied between the spaces.
SHAPED = """
func.func @f(%x: tensor<4x8xf32>, %y: tensor<32xf32>, %s: tensor<f32>) -> tensor<32xf32> {
  %r = atomic.reshape %x : (tensor<4x8xf32>) -> tensor<32xf32>
  %e = atomic.exp %r : (tensor<32xf32>) -> tensor<32xf32>
  %i = atomic.iota {axis = 0} : () -> tensor<32xi32>
  %c = atomic.cast %i : (tensor<32xi32>) -> tensor<32xf32>
  %a = atomic.add %e, %c : (tensor<32xf32>, tensor<32xf32>) -> tensor<32xf32>
  %z = atomic.add %a, %y : (tensor<32xf32>, tensor<32xf32>) -> tensor<32xf32>
  %w = atomic.mul %z, %s : (tensor<32xf32>, tensor<f32>) -> tensor<32xf32>
  func.return %w : tensor<32xf32>
}
"""


@pytest.fixture
def profiled(stand_in, monkeypatch):
    """The instances of SHAPED on numpy and the stand-in device, timings said to be the
    stand-in's (no GPU to describe)."""
    from tgc.planner import db
    from tgc.planner.options import PlanContext
    from tgc.planner.profile import instances
    from tgc.planner.select import prepare

    monkeypatch.setitem(db.FINGERPRINTS, "cuda", lambda: {"gpu": "stand-in"})
    db.device_info.cache_clear()
    _, func = parse(SHAPED)
    prepare(func)
    kernels = [k for k in KERNELS.values() if k.backend in STAND_IN_FAMILIES]
    yield instances(func, PlanContext(kernels, 1e-5))
    db.device_info.cache_clear()


def _holding(insts, name: str) -> list:
    from tgc.planner.kernel import canonical_references

    def names(kernel) -> set[str]:
        return {op.name for op in canonical_references(kernel)[0].body.ops}

    return [i for i in insts if i.kernel.name in TEMPLATES and name in names(i.kernel)]


@pytest.mark.parametrize("name", ["atomic.reshape", "atomic.iota"])
def test_a_region_holding_an_op_that_cannot_infer_its_type_is_measured(profiled, name):
    from tgc.planner.profile import measure

    regions = _holding(profiled, name)
    assert regions
    for inst in regions:
        m = measure(inst, min_time=0.001)
        assert m.ok, f"{inst.describe()}: {m.message}"
        assert m.max_error <= inst.kernel.max_rel_error and m.median > 0


def test_the_profiler_compiles_generated_kernels_in_batches_ahead_of_measuring(
    profiled, stand_in, tmp_path, monkeypatch
):
    """First use measured 1.3 generated kernels a second on an H200, each waiting for its own
    nvcc: the profiler hands the backend COMPILE_AHEAD of them at a time before measuring them,
    and no kernel then compiles alone."""
    from tgc.planner import profile
    from tgc.planner.db import Database

    regions = [i for i in profiled if i.kernel.name in TEMPLATES]
    monkeypatch.setattr(profile, "COMPILE_AHEAD", 2)
    assert len(regions) > 2
    with Database.open(str(tmp_path / "m.sqlite")) as db:
        report = profile.Profiler(db, min_time=0.001, progress=False).run(regions)
    assert report.measured == len(regions)
    full, rest = divmod(len(regions), 2)
    assert stand_in["compiled"] == [2] * full + [rest] * (rest > 0)


def test_a_region_computing_a_wrong_value_is_recorded_as_failed(profiled, monkeypatch):
    from tgc.planner.profile import measure

    def off(op, inputs):
        return [Boxed(b.array * b.array.dtype.type(1.001)) for b in _stand_in_region(op, inputs)]

    monkeypatch.setitem(BACKENDS, "cuda", Backend("cuda", call=_stand_in_call, run_region=off))
    (inst, *_) = _holding(profiled, "atomic.reshape")
    m = measure(inst, min_time=0.001)
    assert m.status == "failed" and m.message.startswith("wrong result")
    assert m.median is None and 1e-4 < m.max_error < 1e-2


def _linear_instances(dtype: str, then: str, monkeypatch) -> list:
    """The cuBLASLt instances of a linear layer (then `then`), its values in device memory, on
    the stand-in device."""
    from tgc.planner import db
    from tgc.planner.options import PlanContext
    from tgc.planner.profile import instances
    from tgc.planner.select import prepare

    monkeypatch.setitem(db.FINGERPRINTS, "cuda", lambda: {"gpu": "stand-in"})
    db.device_info.cache_clear()
    _, func = parse(_gpu_suite().on_device(_linear_text("37x24", "40", dtype, then)))
    prepare(func)
    kernels = [k for k in KERNELS.values() if k.backend in STAND_IN_FAMILIES]
    found = instances(func, PlanContext(kernels, 1e-2))
    return {i.kernel.name: i for i in found if "cublaslt" in i.kernel.name}


def test_a_cublaslt_kernel_is_profiled_and_a_wrong_one_is_recorded_as_failed(stand_in, monkeypatch):
    """The profiler measures the linear layer's cuBLASLt kernels like any other (bf16 with its
    GELU, f32); one whose f32 result is off by 0.1% is a failure with its error, never a
    time."""
    from tgc.planner import db
    from tgc.planner.profile import measure

    bf16 = _linear_instances("bf16", "gelu", monkeypatch)
    assert set(bf16) == {"cuda.cublaslt.linear", "cuda.cublaslt.linear_gelu"}
    ok = measure(bf16["cuda.cublaslt.linear_gelu"], min_time=0.001)
    assert ok.status == "ok" and ok.median is not None, ok.message
    f32 = _linear_instances("f32", "residual", monkeypatch)
    assert set(f32) == {"cuda.cublaslt.linear", "cuda.cublaslt.linear_residual"}
    assert measure(f32["cuda.cublaslt.linear_residual"], min_time=0.001).status == "ok"

    def off(kernel, inputs, attrs, result_types):
        right = _stand_in_call(kernel, inputs, attrs, result_types)
        return [Boxed(b.array * b.array.dtype.type(1.001)) for b in right]

    monkeypatch.setitem(BACKENDS, "cuda", Backend("cuda", call=off, run_region=_stand_in_region))
    m = measure(f32["cuda.cublaslt.linear_residual"], min_time=0.001)
    assert m.status == "failed" and m.message.startswith("wrong result") and m.median is None
    assert 1e-4 < m.max_error < 1e-2
    db.device_info.cache_clear()


def test_copies_of_every_rank_between_the_spaces_are_measured(profiled):
    from tgc.planner.profile import measure

    copies = [i for i in profiled if i.kernel.op == "kernel.copy"]
    ranks = {i.operand_types[0].rank for i in copies}
    assert {0, 1, 2} <= ranks
    assert {i.kernel.name for i in copies} == {"copy.host_to_cuda", "copy.cuda_to_host"}
    for inst in copies:
        m = measure(inst, min_time=0.001)
        assert m.ok and m.max_error == 0.0, f"{inst.describe()}: {m.message}"


def test_an_upload_keeps_the_rank_and_makes_the_array_contiguous():
    from tgc.types import TensorType

    scalar = ck.host_array(np.float64(2.5), TensorType.get((), "f32"))
    assert scalar.shape == () and scalar.dtype == np.float32 and float(scalar) == 2.5
    strided = np.arange(12.0).reshape(3, 4).T
    host = ck.host_array(strided)
    assert host.shape == (4, 3) and host.flags["C_CONTIGUOUS"]
    np.testing.assert_array_equal(host, strided)


def test_a_region_that_does_not_fit_quotes_its_own_line(profiled):
    """Every region of a template is parsed under a name of its own, so a diagnostic quotes
    the line of the text it points into (not the same line of another region's text)."""
    import re

    from tgc.planner.profile import Instance, reference_function
    from tgc.types import TensorType

    inst = _holding(profiled, "atomic.reshape")[0]
    assert len({i.kernel.reference for i in profiled if i.kernel.name == inst.kernel.name}) > 1
    wrong = (TensorType.get((4, 9), "f32"), *inst.operand_types[1:])
    with pytest.raises(TypeError) as e:
        reference_function(Instance(inst.kernel, wrong, inst.result_types))
    found = re.search(
        r"(<kernel cuda\.elementwise [0-9a-f]+>):(\d+):\d+: error: (.*)\n(.*)\n", str(e.value)
    )
    assert found, str(e.value)
    assert "reshape" in found[3]
    assert found[4] == inst.kernel.reference.split("\n")[int(found[2]) - 1]


# A device program of one elementwise op (arguments and result in device memory).
DEVICE_EXP = """
func.func @f(%x: tensor<64x256xf32, "cuda">) -> tensor<64x256xf32, "cuda"> {
  %g = atomic.exp %x : (tensor<64x256xf32, "cuda">) -> tensor<64x256xf32, "cuda">
  func.return %g : tensor<64x256xf32, "cuda">
}
"""


def test_tuning_finds_the_fastest_template_parameters_and_the_plan_runs_with_them(
    stand_in, monkeypatch, tmp_path
):
    """On the stand-in device block size 512 is made the fast point (every other one sleeps):
    `tgc-profile --tune` measures the region's points, select-kernels writes the fastest on
    the call, and the executor hands run_region a call naming it."""
    import time

    from tgc.planner import db as dbm
    from tgc.planner.estimate import DatabaseCostSource
    from tgc.planner.options import PlanContext
    from tgc.planner.profile import Profiler, instances
    from tgc.planner.select import prepare

    seen = []

    def region(op, inputs):
        params = ck.call_params(op)
        seen.append(params)
        if params.get("block_size") != 512:
            time.sleep(0.002)
        return _stand_in_region(op, inputs)

    monkeypatch.setitem(BACKENDS, "cuda", Backend("cuda", call=_stand_in_call, run_region=region))
    monkeypatch.setitem(dbm.FINGERPRINTS, "cuda", lambda: {"gpu": "stand-in"})
    dbm.device_info.cache_clear()
    try:
        path = str(tmp_path / "m.sqlite")
        _, func = parse(DEVICE_EXP)
        prepare(func)
        cuda_kernels = [k for k in KERNELS.values() if k.backend == "cuda"]
        insts = instances(func, PlanContext(cuda_kernels, 1e-5))
        regions = [i for i in insts if i.kernel.name == "cuda.elementwise"]
        assert len(regions) == 1 and len(ck.template_params(regions[0].kernel.params)) == 2
        with dbm.Database.open(path) as db:
            report = Profiler(db, min_time=0.005, progress=False).run(regions, tune=True)
        assert (report.measured, report.tuned, report.failed) == (1, 7, 0)  # 4 sizes x 2 hints
        _, func = parse(DEVICE_EXP)
        select_kernels(func, DatabaseCostSource(path), tolerance=1e-5, kernels=cuda_kernels)
        (call,) = [op for op in func.body.ops if isinstance(op, CallOp)]
        assert call.attr("callee") == "cuda.elementwise" and call.attr("param.block_size") == 512
        seen.clear()
        x = np.random.default_rng(7).standard_normal((64, 256)).astype(np.float32)
        (got,) = run_plan(func, [x])
        assert [p["block_size"] for p in seen] == [512]
        assert rel_error(got, np.exp(x.astype(np.float64))) <= 2e-6
    finally:
        dbm.device_info.cache_clear()


def test_an_hl_op_is_offered_the_one_kernel_its_whole_lowering_fuses_into(stand_in):
    """An hl op's decomposition is planned fully lowered (no hl op nested inside), so the
    fused kernels `fuse` forms after `lower-hl` (the fixed cuda route's) are among its options:
    a layernorm is one row-reduction kernel, not a mean kernel, a variance kernel and the rest."""
    from tgc.planner.options import PlanContext
    from tgc.planner.profile import instances
    from tgc.planner.select import prepare

    x, p = 'tensor<64x4096xf32, "cuda">', 'tensor<4096xf32, "cuda">'
    _, func = parse(
        f"""func.func @f(%x: {x}, %g: {p}, %b: {p}) -> {x} {{
  %y = hl.layernorm %x, %g, %b {{eps = 1.0e-05}} : ({x}, {p}, {p}) -> {x}
  func.return %y : {x}
}}"""
    )
    prepare(func)
    cuda_kernels = [k for k in KERNELS.values() if k.backend == "cuda"]
    regions = [i for i in instances(func, PlanContext(cuda_kernels, 1e-5)) if i.kernel.reference]
    ops = [[op.name for op in ck_ops(i.kernel)] for i in regions]
    assert not any(name.startswith("hl.") for names in ops for name in names)
    whole = [names for names in ops if names.count("atomic.reduce_sum") == 2]
    assert whole and whole[0][-1] == "atomic.add" and len(whole[0]) >= 10, ops


def ck_ops(kernel) -> list:
    from tgc.planner.kernel import canonical_references

    return [op for op in canonical_references(kernel)[0].body.ops][:-1]


def _heads_text(b: int = 2, s: int = 16, h: int = 2, d: int = 8) -> str:
    """q, k, v split from one buffer into heads, attention, heads merged back (GPT-2's)."""
    t, e = b * s, h * d
    x, qkv = f"tensor<{t}x{e}xf32>", f"tensor<{t}x{3 * e}xf32>"
    split, heads = f"tensor<{b}x{s}x{h}x{d}xf32>", f"tensor<{b}x{h}x{s}x{d}xf32>"
    lines = [f"func.func @f(%qkv: {qkv}) -> {x} {{"]
    lines.append(
        f"  %q, %k, %v = atomic.split %qkv {{axis = 1, sizes = [{e}, {e}, {e}]}} : ({qkv}) -> ({x}, {x}, {x})"
    )
    for n in "qkv":
        lines.append(f"  %{n}4 = atomic.reshape %{n} : ({x}) -> {split}")
        lines.append(
            f"  %{n}h = atomic.transpose %{n}4 {{perm = [0, 2, 1, 3]}} : ({split}) -> {heads}"
        )
    lines += [
        f"  %a = hl.attention %qh, %kh, %vh {{causal = true}} : ({heads}, {heads}, {heads}) -> {heads}",
        f"  %at = atomic.transpose %a {{perm = [0, 2, 1, 3]}} : ({heads}) -> {split}",
        f"  %y = atomic.reshape %at : ({split}) -> {x}",
        f"  func.return %y : {x}",
        "}",
    ]
    return "\n".join(lines)


def test_attention_reads_its_heads_as_strided_views_of_one_buffer(stand_in):
    """As on the fixed cuda route: the attention region reads q, k and v through strides from
    the one qkv buffer (split, reshapes and transposes recomputed by value, not run), and may
    write its output merged back; the plan then has one kernel and no transpose kernels."""
    text = _heads_text()
    _, func = parse(text)
    attention = [op for op in ops_of(func) if op.name == "hl.attention"][0]
    qkv = func.body.args[0]
    offered = [m for ms in options_by_root(func).values() for m in ms]
    regions = [m for m in offered if m.kernel.name == "cuda.attention"]
    assert {tuple(m.inputs) for m in regions} == {(qkv,)}
    assert {tuple(op.name for op in m.ops) for m in regions} == {
        ("hl.attention",),
        ("hl.attention", "atomic.transpose", "atomic.reshape"),
    }
    assert all(attention in m.ops for m in regions)
    device = text.replace("xf32>", 'xf32, "cuda">')
    planned, _ = _selected(device, "", backends=("cuda",))
    assert _callees(planned) == ["cuda.attention"]
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, 11)
    (want,) = run_function(reference, inputs, "f64")
    (got,) = run_plan(planned, inputs)
    assert rel_error(got, want) <= 1e-5


def test_region_kernels_for_sm_90_measure_the_wgmma_attention_first(stand_in):
    """Registered for an sm_90 GPU, a region kernel names its `arch` (one value) and offers the
    generator's defaults for it first: for bf16 attention at head dim 64, the wgmma kernel; for
    no arch (the stand-in), the portable one."""
    text = _heads_text(b=1, s=130, h=2, d=64).replace("xf32>", "xbf16>")
    _, func = parse(text)

    def attention_params() -> dict:
        regions = [
            m
            for ms in options_by_root(func).values()
            for m in ms
            if m.kernel.name == "cuda.attention"
        ]
        assert regions
        return ck.template_params(regions[0].kernel.params)

    portable = attention_params()
    assert "arch" not in portable and portable["wgmma"][0] is False
    ck.TARGET["arch"] = "sm_90"  # as register(..., arch="sm_90") sets it
    try:
        hopper = attention_params()
    finally:
        ck.TARGET["arch"] = None
    assert hopper["arch"] == ("sm_90",)
    assert hopper["wgmma"][0] is True and hopper["swizzle"][0] is True
    assert set(hopper["wgmma"]) == {True, False}  # tuning may still try the mma.sync kernel


# -- small sibling kernels in one launch (planner/horizontal.py) ----------------------------------

ROTARY_LIKE = """func.func @f(%q: tensor<1x4x1x16xf32>, %k: tensor<1x2x1x16xf32>, %cos: tensor<16xf32>, %n: tensor<i64>) -> (tensor<1x4x1x16xf32>, tensor<1x2x1x16xf32>, tensor<i64>) {
  %qc = atomic.mul %q, %cos : (tensor<1x4x1x16xf32>, tensor<16xf32>) -> tensor<1x4x1x16xf32>
  %kc = atomic.mul %k, %cos : (tensor<1x2x1x16xf32>, tensor<16xf32>) -> tensor<1x2x1x16xf32>
  %one = atomic.constant {value = dense<1> : tensor<i64>} : () -> tensor<i64>
  %n1 = atomic.add %n, %one : (tensor<i64>, tensor<i64>) -> tensor<i64>
  func.return %qc, %kc, %n1 : tensor<1x4x1x16xf32>, tensor<1x2x1x16xf32>, tensor<i64>
}"""


def test_small_independent_elementwise_kernels_run_as_one_launch(stand_in):
    """A decoding step's rotary on q and on k and its position counter: three small siblings of
    three shapes, one call of the elementwise template yielding all three, in one launch; its
    results those of float64."""
    func, _ = _selected(ROTARY_LIKE, "", backends=("cuda",))
    calls = [op for op in func.body.ops if isinstance(op, CallOp)]
    elementwise = [c for c in calls if c.attr("callee") == "cuda.elementwise"]
    assert len(elementwise) == 1 and len(elementwise[0].results) == 3, _callees(func)
    assert elementwise[0].attr("plan.source") == "merged"
    reference = tgc.parse(ROTARY_LIKE).funcs[0]
    inputs = random_inputs(reference, 11)
    got = run_plan(func, inputs)
    for g, w in zip(got, run_function(reference, inputs, "f64")):
        assert np.allclose(np.asarray(g, np.float64), w, rtol=1e-6, atol=1e-6)
    assert stand_in["regions"] == 1  # one launch for the three
    kernel = generate_kernel(ck.fused_from_call(elementwise[0]))
    assert kernel.source.count("__device__ __forceinline__ void") == 3
    assert "3 elementwise kernels as one launch" in kernel.source


def _call(name: str, operand: str, shape: str, extra: str = "") -> str:
    """A planned elementwise call `%name = exp(%operand)` on the device, as select-kernels
    writes one."""
    t = f'tensor<{shape}xf32, "cuda">'
    return f"""  %{name} = kernel.call %{operand} {{callee = "cuda.elementwise", plan.backend = "cuda", plan.seconds = 1.0e-06, plan.source = "measured"{extra}}} : ({t}) -> {t} {{
  ^bb0(%{name}_in: {t}):
    %{name}_e = atomic.exp %{name}_in : ({t}) -> {t}
    kernel.yield %{name}_e : {t}
  }}"""


def test_siblings_merge_in_runs_that_end_where_one_reads_another(stand_in):
    """b reads a: a stays alone, b and c (independent) become one call where c stood; d is
    computed once (plan.once) and e is large: each keeps its own call. The merged function
    computes what the unmerged one did."""
    from tgc.planner.horizontal import MAX_ELEMENTS, merge_siblings

    big = MAX_ELEMENTS + 8
    dev = 'tensor<4x8xf32, "cuda">'
    text = "\n".join(
        [
            f"func.func @f(%x: tensor<4x8xf32>, %y: tensor<8xf32>, %z: tensor<{big}xf32>) -> "
            f"(tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<{big}xf32>) {{",
            f'  %x0 = kernel.copy %x {{plan.backend = "cuda", plan.seconds = 1.0e-05, plan.source = "roofline"}} : (tensor<4x8xf32>) -> {dev}',
            '  %y0 = kernel.copy %y {plan.backend = "cuda", plan.seconds = 1.0e-05, plan.source = "roofline"} : (tensor<8xf32>) -> tensor<8xf32, "cuda">',
            f'  %z0 = kernel.copy %z {{plan.backend = "cuda", plan.seconds = 1.0e-05, plan.source = "roofline"}} : (tensor<{big}xf32>) -> tensor<{big}xf32, "cuda">',
            _call("a", "x0", "4x8"),
            _call("b", "a", "4x8"),
            _call("c", "y0", "8"),
            _call("d", "y0", "8", ", plan.once"),
            _call("e", "z0", str(big)),
            f'  %r0 = kernel.copy %b {{plan.backend = "numpy", plan.seconds = 1.0e-05, plan.source = "roofline"}} : ({dev}) -> tensor<4x8xf32>',
            '  %r1 = kernel.copy %c {plan.backend = "numpy", plan.seconds = 1.0e-05, plan.source = "roofline"} : (tensor<8xf32, "cuda">) -> tensor<8xf32>',
            '  %r2 = kernel.copy %d {plan.backend = "numpy", plan.seconds = 1.0e-05, plan.source = "roofline"} : (tensor<8xf32, "cuda">) -> tensor<8xf32>',
            f'  %r3 = kernel.copy %e {{plan.backend = "numpy", plan.seconds = 1.0e-05, plan.source = "roofline"}} : (tensor<{big}xf32, "cuda">) -> tensor<{big}xf32>',
            f"  func.return %r0, %r1, %r2, %r3 : tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<{big}xf32>",
            "}",
        ]
    )
    module, _ = parse(text)
    func = module.funcs[0]
    inputs = random_inputs(tgc.parse(text).funcs[0], 13)
    want = run_plan(tgc.parse(text).funcs[0], inputs)
    assert merge_siblings(func) == 1
    tgc.verify(module)
    calls = [op for op in func.body.ops if isinstance(op, CallOp)]
    assert [len(c.results) for c in calls] == [1, 2, 1, 1]  # a; b and c; d; e
    merged = calls[1]
    assert [r.name_hint for r in merged.results] == ["b", "c"]
    assert merged.attr("plan.source") == "merged" and merged.attr("plan.seconds") == 2e-6
    assert "plan.once" in calls[2].attributes
    for g, w in zip(run_plan(func, inputs), want):
        assert np.array_equal(np.asarray(g), np.asarray(w))


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc is not installed")
def test_a_launch_of_parts_compiles_without_warnings(tmp_path, stand_in):
    """The merged call of the rotary-like siblings: its kernel (a device function a part, the
    blocks dealt out in order, every input passed to every part) compiles with nvcc for sm_80
    and sm_90 with warnings as errors."""
    from test_attention_tc import compile_kernels

    func, _ = _selected(ROTARY_LIKE, "", backends=("cuda",))
    (call,) = [op for op in func.body.ops if op.name == "kernel.call"]
    kernel = generate_kernel(ck.fused_from_call(call))
    assert kernel.grid == (3, 1, 1)  # a block a part: 64, 32 and 1 elements
    assert (
        "if (blockIdx.x < 1) tgc_" in kernel.source and "else if (blockIdx.x < 3)" in kernel.source
    )
    flags = [("-cubin", f"-arch={arch}", "-Werror", "all-warnings") for arch in ("sm_80", "sm_90")]
    compile_kernels(tmp_path, [(kernel, f) for f in flags])
