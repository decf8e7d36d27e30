"""GPU tests (marker `cuda`): every kernel kind against the numpy interpreter on random inputs.

Each function is planned for the GPU as the route plans it with nothing measured (planner/
standalone.py: cuBLAS and cuBLASLt among the kernels, or tgc's generated kernels alone) and run
by the planner's executor. Sizes are odd (not multiples of the block size or the vector width),
every broadcast pattern appears, f32 and bf16 both run. (Poisoning memory with NaN bytes, so
that an element a kernel forgets to write shows, is the host model's: test/test_standalone.py.)
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from test_attention_tc import regions

from tgc.codegen.kernels import generate_kernel
from tgc.diagnostics import TgcError
from tgc.parser import parse_module
from tgc.pass_manager import PassManager
from tgc.planner.backends import cuda_kernels as ck
from tgc.planner.standalone import GENERATED, plan_standalone, set_template_params
from tgc.runtime.interpreter import random_inputs, run_function
from tgc.verifier import verify

pytestmark = pytest.mark.cuda
ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.tg"))
TOLERANCE = {"f32": 1e-4, "bf16": 3e-2, "f16": 1e-2, "f64": 1e-9}


def t(shape, dtype) -> str:
    dims = "".join(f"{d}x" for d in shape)
    return f"tensor<{dims}{dtype}>"


def planned(text: str, library: bool = True, params: dict | None = None, name: str = "<string>"):
    """`text` (from file `name`) planned for this GPU (module doc): with `library`, cuBLAS and
    cuBLASLt among the kernels, else tgc's generated kernels alone; `params`, the template
    parameters of every generated kernel over the defaults for this GPU."""
    from tgc.planner import load_backends

    load_backends(("cuda",), required=True)
    module = parse_module(text, name)
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    plan_standalone(func, library)
    if params:
        set_template_params(func, {"arch": ck.TARGET["arch"], **params})
    return func


def kernels(func) -> list:
    """The KernelSource of each generated kernel of planned `func`, as the executor makes it."""
    calls = [op for op in func.body.ops if op.attributes.get("callee") in GENERATED]
    out = []
    for fused, call in zip(regions(func), calls):
        k = generate_kernel(fused, ck.call_params(call))
        k.loc = call.loc
        out.append(k)
    return out


def callees(func) -> list[str]:
    return [str(op.attributes.get("callee")) for op in func.body.ops if op.name == "kernel.call"]


def run_on_gpu(text: str, seed: int = 0, library: bool = True, params=None):
    from tgc.planner.executor import run_plan

    ref = parse_module(text)
    verify(ref)
    inputs = random_inputs(ref.funcs[0], seed)
    func = planned(text, library, params)
    got = run_plan(func, inputs)
    want = run_function(ref.funcs[0], inputs, "f64")
    return got, want, func


def check(text: str, seed: int = 0, library: bool = True, params=None):
    """The planned function, after its results matched float64 within TOLERANCE."""
    got, want, func = run_on_gpu(text, seed, library, params)
    for g, w in zip(got, want):
        elem = str(g.dtype)
        tol = TOLERANCE[
            "bf16"
            if elem == "bfloat16"
            else {"float32": "f32", "float64": "f64", "float16": "f16"}.get(elem, "f32")
        ]
        g64 = g.astype(np.float64)
        assert not np.isnan(g64).any() or np.isnan(w).any(), "NaN elements"
        scale = max(float(np.max(np.abs(w))) if w.size else 0.0, 1.0)
        np.testing.assert_allclose(g64, w.astype(np.float64), atol=tol * scale, rtol=tol)
    return func


# -- elementwise -----------------------------------------------------------------------------------

BROADCASTS = [
    ((1,), ()),
    ((7,), (7,)),
    ((1000003,), ()),
    ((257, 33), (33,)),
    ((257, 33), (257, 1)),
    ((257, 33), (1, 33)),
    ((3, 5, 7), (5, 1)),
    ((3, 5, 7), (3, 1, 7)),
    ((3, 1, 7), (5, 1)),  # both sides broadcast: result 3x5x7
    ((2, 3, 4, 5), (1, 3, 1, 5)),
]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("a,b", BROADCASTS, ids=[f"{a}+{b}" for a, b in BROADCASTS])
def test_elementwise_broadcast(a, b, dtype):
    from tgc.dialects._shapes import broadcast_shapes

    out = broadcast_shapes(a, b)
    text = f"""
func.func @f(%x: {t(a, dtype)}, %y: {t(b, dtype)}) -> {t(out, dtype)} {{
  %s = atomic.mul %x, %y : ({t(a, dtype)}, {t(b, dtype)}) -> {t(out, dtype)}
  %e = hl.gelu %s {{approximate = "tanh"}} : ({t(out, dtype)}) -> {t(out, dtype)}
  %c = atomic.constant {{value = dense<1.5> : tensor<{dtype}>}} : () -> tensor<{dtype}>
  %r = atomic.add %e, %c : ({t(out, dtype)}, tensor<{dtype}>) -> {t(out, dtype)}
  func.return %r : {t(out, dtype)}
}}"""
    check(text)


@pytest.mark.parametrize("n", [1, 3, 4, 5, 1023, 4097, 65537])
def test_elementwise_vector_tail_and_two_outputs(n):
    text = f"""
func.func @f(%x: {t((n,), "f32")}) -> ({t((n,), "f32")}, {t((n,), "f32")}) {{
  %e = atomic.exp %x : ({t((n,), "f32")}) -> {t((n,), "f32")}
  %s = atomic.sin %e : ({t((n,), "f32")}) -> {t((n,), "f32")}
  func.return %e, %s : {t((n,), "f32")}, {t((n,), "f32")}
}}"""
    check(text)


def test_elementwise_views_casts_where_iota():
    text = """
func.func @f(%x: tensor<33x17xf32>, %y: tensor<17x33xbf16>) -> (tensor<17x33xf32>, tensor<17x16xbf16>) {
  %t = atomic.transpose %x {perm = [1, 0]} : (tensor<33x17xf32>) -> tensor<17x33xf32>
  %yc = atomic.cast %y : (tensor<17x33xbf16>) -> tensor<17x33xf32>
  %i = atomic.iota {axis = 1} : () -> tensor<17x33xi32>
  %j = atomic.iota {axis = 0} : () -> tensor<17x33xi32>
  %m = atomic.cmp %i, %j {pred = "le"} : (tensor<17x33xi32>, tensor<17x33xi32>) -> tensor<17x33xi1>
  %s = atomic.add %t, %yc : (tensor<17x33xf32>, tensor<17x33xf32>) -> tensor<17x33xf32>
  %w = atomic.where %m, %s, %t : (tensor<17x33xi1>, tensor<17x33xf32>, tensor<17x33xf32>) -> tensor<17x33xf32>
  %sl = atomic.slice %y {start = [0, 1], stop = [17, 33], step = [1, 2]} : (tensor<17x33xbf16>) -> tensor<17x16xbf16>
  %n = atomic.neg %sl : (tensor<17x16xbf16>) -> tensor<17x16xbf16>
  func.return %w, %n : tensor<17x33xf32>, tensor<17x16xbf16>
}"""
    check(text)


@pytest.mark.parametrize("dtype", ["f32", "bf16", "f16", "f64", "i8", "i32", "i64"])
def test_rounding_and_mod(dtype):
    """floor, ceil, round (halves to even) and both mods in one kernel against numpy. Floats
    are scaled by powers of two (exact) so that integer parts and halves occur; integers are
    shifted to [-2, 2), so that divisors of both signs and 0 occur (x mod 0 is 0). Float divisors
    are multiples of 1/4 plus 1/2, exact in bf16: a divisor rounded in the kernel's type but not
    in the float64 reference would move the jumps of mod, and the test would compare round-off."""
    x, y = t((37, 5), dtype), t((5,), dtype)
    if dtype.startswith("i"):
        prologue = f"""  %k = atomic.constant {{value = dense<2> : tensor<{dtype}>}} : () -> tensor<{dtype}>
  %a = atomic.sub %x, %k : ({x}, tensor<{dtype}>) -> {x}
  %b = atomic.sub %y, %k : ({y}, tensor<{dtype}>) -> {y}"""
        rounded = "%a"
    else:
        prologue = f"""  %k = atomic.constant {{value = dense<8.0> : tensor<{dtype}>}} : () -> tensor<{dtype}>
  %a = atomic.mul %x, %k : ({x}, tensor<{dtype}>) -> {x}
  %h = atomic.constant {{value = dense<0.5> : tensor<{dtype}>}} : () -> tensor<{dtype}>
  %q = atomic.constant {{value = dense<0.25> : tensor<{dtype}>}} : () -> tensor<{dtype}>
  %y4 = atomic.mul %y, %k : ({y}, tensor<{dtype}>) -> {y}
  %yr = atomic.round %y4 : ({y}) -> {y}
  %yq = atomic.mul %yr, %q : ({y}, tensor<{dtype}>) -> {y}
  %b = atomic.add %yq, %h : ({y}, tensor<{dtype}>) -> {y}
  %fl = atomic.floor %a : ({x}) -> {x}
  %ce = atomic.ceil %a : ({x}) -> {x}
  %ro = atomic.round %fl : ({x}) -> {x}
  %hf = atomic.mul %ce, %h : ({x}, tensor<{dtype}>) -> {x}
  %r2 = atomic.round %hf : ({x}) -> {x}
  %s1 = atomic.add %ro, %r2 : ({x}, {x}) -> {x}"""
        rounded = "%s1"
    text = f"""
func.func @f(%x: {x}, %y: {y}) -> ({x}, {x}) {{
{prologue}
  %m = atomic.mod {rounded}, %b : ({x}, {y}) -> {x}
  %f = atomic.mod %a, %b {{fmod = true}} : ({x}, {y}) -> {x}
  func.return %m, %f : {x}, {x}
}}"""
    check(text)


def test_concat_gather_split_reshape():
    text = """
func.func @f(%a: tensor<5x7xf32>, %b: tensor<3x7xf32>, %idx: tensor<4xi32>) -> (tensor<8x7xf32>, tensor<4x7xf32>, tensor<7x5xf32>) {
  %c = atomic.concat %a, %b {axis = 0} : (tensor<5x7xf32>, tensor<3x7xf32>) -> tensor<8x7xf32>
  %g = atomic.gather %c, %idx {axis = 0} : (tensor<8x7xf32>, tensor<4xi32>) -> tensor<4x7xf32>
  %p, %q = atomic.split %a {axis = 1, sizes = [2, 5]} : (tensor<5x7xf32>) -> (tensor<5x2xf32>, tensor<5x5xf32>)
  %r = atomic.reshape %q : (tensor<5x5xf32>) -> tensor<25xf32>
  %r2 = atomic.reshape %r : (tensor<25xf32>) -> tensor<5x5xf32>
  %tq = atomic.transpose %r2 {perm = [1, 0]} : (tensor<5x5xf32>) -> tensor<5x5xf32>
  %z = atomic.concat %tq, %p {axis = 1} : (tensor<5x5xf32>, tensor<5x2xf32>) -> tensor<5x7xf32>
  %zt = atomic.transpose %z {perm = [1, 0]} : (tensor<5x7xf32>) -> tensor<7x5xf32>
  func.return %c, %g, %zt : tensor<8x7xf32>, tensor<4x7xf32>, tensor<7x5xf32>
}"""
    check(text)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
def test_rotary_embedding_is_one_kernel_computing_the_negation_in_the_concat_branch(dtype):
    """Llama's rotary embedding on 8 heads of 77 positions, head dim 64: the concat, the
    negation only it reads and the products around it are one generated kernel (fuse's concat
    branches), matching float64."""
    x, half, cs = t((2, 8, 77, 64), dtype), t((2, 8, 77, 32), dtype), t((77, 64), dtype)
    text = f"""
func.func @rotary(%x: {x}, %cos: {cs}, %sin: {cs}) -> {x} {{
  %x1 = atomic.slice %x {{start = [0, 0, 0, 0], step = [1, 1, 1, 1], stop = [2, 8, 77, 32]}} : ({x}) -> {half}
  %x2 = atomic.slice %x {{start = [0, 0, 0, 32], step = [1, 1, 1, 1], stop = [2, 8, 77, 64]}} : ({x}) -> {half}
  %n = atomic.neg %x2 : ({half}) -> {half}
  %r = atomic.concat %n, %x1 {{axis = 3}} : ({half}, {half}) -> {x}
  %a = atomic.mul %x, %cos : ({x}, {cs}) -> {x}
  %b = atomic.mul %r, %sin : ({x}, {cs}) -> {x}
  %y = atomic.add %a, %b : ({x}, {x}) -> {x}
  func.return %y : {x}
}}"""
    func = check(text, seed=3)
    assert callees(func) == ["cuda.elementwise"]


GROUP_NORMS = [(3, 12, 7, 9, 4), (2, 64, 40, 40, 8)]  # n, c, h, w, groups: rows of 189, 12800


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("n,c,h,w,groups", GROUP_NORMS)
def test_group_norm_with_its_affine_and_silu_is_one_kernel(n, c, h, w, groups, dtype):
    """The reduction over each group's rows, the reshape back to [n, c, h, w], the affine per
    channel and the SiLU: one generated kernel (a warp per row, and a block per row), matching
    float64."""
    x, v = t((n, c, h, w), dtype), t((c,), dtype)
    text = f"""
func.func @gn(%x: {x}, %g: {v}, %b: {v}) -> {x} {{
  %y = hl.group_norm %x, %g, %b {{groups = {groups}, eps = 1.0e-05}} : ({x}, {v}, {v}) -> {x}
  %s = hl.silu %y : ({x}) -> {x}
  func.return %s : {x}
}}"""
    func = check(text, seed=5, library=False)
    assert callees(func) == ["cuda.row_reduction"]


# -- row reductions --------------------------------------------------------------------------------

ROW_SIZES = [1, 3, 31, 32, 33, 100, 768, 1024, 1025, 3000, 4096, 5001, 70000]


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("n", ROW_SIZES)
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layernorm", "rmsnorm"])
def test_row_reduction(op, n, dtype):
    rows = 37
    x, p = t((rows, n), dtype), t((n,), dtype)
    if op == "layernorm":
        sig, args = f"%x: {x}, %g: {p}, %b: {p}", "%x, %g, %b"
        types = f"({x}, {p}, {p})"
    elif op == "rmsnorm":
        sig, args, types = f"%x: {x}, %g: {p}", "%x, %g", f"({x}, {p})"
    else:
        sig, args, types = f"%x: {x}", "%x", f"({x})"
    text = f"""
func.func @f({sig}) -> {x} {{
  %y = hl.{op} {args} : {types} -> {x}
  func.return %y : {x}
}}"""
    check(text, seed=n)


def test_row_reduction_with_row_outputs_and_leading_dims():
    text = """
func.func @f(%x: tensor<3x5x77xf32>) -> (tensor<3x5x77xf32>, tensor<3x5xf32>, tensor<3x5x1xf32>) {
  %m = atomic.reduce_max %x {axes = [2], keepdims = true} : (tensor<3x5x77xf32>) -> tensor<3x5x1xf32>
  %d = atomic.sub %x, %m : (tensor<3x5x77xf32>, tensor<3x5x1xf32>) -> tensor<3x5x77xf32>
  %s = atomic.reduce_sum %d {axes = [2]} : (tensor<3x5x77xf32>) -> tensor<3x5xf32>
  %mn = atomic.reduce_min %x {axes = [2], keepdims = true} : (tensor<3x5x77xf32>) -> tensor<3x5x1xf32>
  func.return %d, %s, %mn : tensor<3x5x77xf32>, tensor<3x5xf32>, tensor<3x5x1xf32>
}"""
    check(text)


@pytest.mark.parametrize("axes", [[0], [0, 2], [1]])
def test_reduction_over_other_axes(axes):
    from tgc.dialects._shapes import reduced_shape

    shape = (9, 130, 7)
    out = reduced_shape(shape, axes, False)
    text = f"""
func.func @f(%x: {t(shape, "f32")}) -> {t(out, "f32")} {{
  %s = atomic.reduce_sum %x {{axes = {axes}}} : ({t(shape, "f32")}) -> {t(out, "f32")}
  func.return %s : {t(out, "f32")}
}}"""
    check(text)


# -- matmul ----------------------------------------------------------------------------------------

MATMULS = [
    ((1, 1), (1, 1), False, False),
    ((7, 33), (33, 65), False, False),
    ((130, 70), (130, 31), True, False),
    ((65, 129), (17, 129), False, True),
    ((3, 33, 20), (20, 9), False, False),
    ((2, 3, 17, 20), (3, 20, 19), False, False),
    ((4, 40, 33), (4, 45, 33), False, True),
]


def _matmul_text(a, b, ta, tb, dtype, epilogue: bool):
    from tgc.dialects._shapes import matmul_shape

    out = matmul_shape(a, b, ta, tb)
    n = out[-1]
    body = f"""  %c = atomic.matmul %a, %b {{transpose_a = {str(ta).lower()}, transpose_b = {str(tb).lower()}}} : ({t(a, dtype)}, {t(b, dtype)}) -> {t(out, dtype)}"""
    if epilogue:
        body += f"""
  %cb = atomic.add %c, %bias : ({t(out, dtype)}, {t((n,), dtype)}) -> {t(out, dtype)}
  %r = hl.relu %cb : ({t(out, dtype)}) -> {t(out, dtype)}
  %y = atomic.add %r, %res : ({t(out, dtype)}, {t(out, dtype)}) -> {t(out, dtype)}"""
        result = "%y"
    else:
        result = "%c"
    return f"""
func.func @f(%a: {t(a, dtype)}, %b: {t(b, dtype)}, %bias: {t((n,), dtype)}, %res: {t(out, dtype)}) -> {t(out, dtype)} {{
{body}
  func.return {result} : {t(out, dtype)}
}}"""


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("a,b,ta,tb", MATMULS)
def test_generated_matmul_with_epilogue(a, b, ta, tb, dtype):
    check(_matmul_text(a, b, ta, tb, dtype, True), library=False)


@pytest.mark.parametrize("dtype", ["f32", "bf16"])
@pytest.mark.parametrize("a,b,ta,tb", MATMULS)
def test_cublas_matmul(a, b, ta, tb, dtype):
    func = check(_matmul_text(a, b, ta, tb, dtype, False), library=True)
    assert any(c.startswith("cuda.cublas") for c in callees(func)) or len(a) > 3


# Shapes the tensor-core skeleton takes (k, and n unless B is transposed, multiples of 8), with
# sizes that end inside a tile, batches broadcast and not.
TC_MATMULS = [
    ((1, 8), (8, 8), False, False),
    ((130, 72), (72, 200), False, False),
    ((100, 40), (56, 40), False, True),
    ((3, 70, 48), (48, 24), False, False),
    ((2, 33, 64), (2, 64, 136), False, False),
    ((4, 40, 32), (4, 45, 32), False, True),
    # 128x128 tiles by default (128x256 with block_n=256); 9 (18) tile rows: a partial group
    # of the block order; more k steps than stages (the ring of stages wraps); k = 264 not a
    # multiple of 32 or 64
    ((1100, 264), (264, 520), False, False),
    ((2, 1100, 264), (520, 264), False, True),
]


@pytest.mark.parametrize(
    "tiles", [{}, {"block_n": 256}, {"block_m": 64, "block_n": 64, "block_k": 16}], ids=str
)
@pytest.mark.parametrize("dtype", ["bf16", "f16"])
@pytest.mark.parametrize("a,b,ta,tb", TC_MATMULS)
def test_tensor_core_matmul_matches_float64(a, b, ta, tb, dtype, tiles):
    """codegen/matmul_tc.cu.j2 with its epilogue (bias, relu, residual), outputs poisoned with
    NaN first."""
    text = _matmul_text(a, b, ta, tb, dtype, True)
    func = check(text, library=False, params={"tensor_cores": True, **tiles})
    (kernel,) = kernels(func)
    assert kernel.params["tensor_cores"] and "mma.sync" in kernel.source


def test_generated_matmul_tile_parameters():
    text = _matmul_text((70, 50), (50, 90), False, False, "f32", True)
    params = {"block_m": 32, "block_n": 128, "block_k": 8, "thread_m": 2, "thread_n": 8}
    (kernel,) = kernels(check(text, library=False, params=params))
    assert all(kernel.params[k] == v for k, v in params.items())


# -- examples, the executor, the standalone file ---------------------------------------------------


def route_check(path: Path, tmp_path: Path, *extra: str) -> None:
    """`tgc-run --backend cuda --check` on `path` (with `extra` options), measuring briefly into
    a database of the test's own: it succeeds and its result matches float64."""
    proc = subprocess.run(
        [sys.executable, "-m", "tgc.tools.run", str(path), "--backend", "cuda", "--check"]
        + ["--measure-budget", "2", "--db", str(tmp_path / "m.sqlite"), *extra],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "check: result 0 ok" in proc.stdout


@pytest.mark.parametrize("pipeline", [[], ["-p", "optimize"]])
@pytest.mark.parametrize("name", EXAMPLES)
def test_tgc_run_cuda_check(name, pipeline, tmp_path):
    """The GPU route (planner/route.py) on what lower-for-planning makes, and on what a user's
    -p makes (attention lowered), measuring briefly into a database of the test's own."""
    route_check(ROOT / "examples" / name, tmp_path, *pipeline)


@pytest.mark.parametrize("name", EXAMPLES)
def test_standalone_main_matches_float64(name, tmp_path):
    """The standalone file (tgc-translate --emit=cuda --arch of this GPU), built as its header
    says and run: the checksums its main() prints are those of the float64 reference on the
    inputs main() generates."""
    import re

    from tgc.codegen.standalone import checksums, standalone_inputs
    from tgc.planner.standalone import emit_standalone_cuda
    from tgc.runtime.cuda_compile import device_arch

    text = (ROOT / "examples" / name).read_text()
    module = parse_module(text)
    PassManager.from_text("lower-for-planning").run(module)
    source = emit_standalone_cuda(module, name, arch=device_arch())
    src, exe = tmp_path / "k.cu", tmp_path / "k"
    src.write_text(source)
    target, libs = re.search(
        r"nvcc (\S+) -DTGC_STANDALONE_MAIN FILE\.cu -o FILE(.*) &&", source
    ).groups()
    build = subprocess.run(
        ["nvcc", target, "-DTGC_STANDALONE_MAIN", str(src), "-o", str(exe), *libs.split()],
        capture_output=True,
        text=True,
        check=False,
    )
    assert build.returncode == 0, build.stderr
    out = subprocess.run([str(exe)], capture_output=True, text=True, check=True).stdout
    reference = parse_module(text).funcs[0]
    want = run_function(reference, standalone_inputs(reference, 0), "f64")
    for i, (s, a) in enumerate(checksums(want)):
        line = next(x for x in out.splitlines() if f"result {i}:" in x)
        got_s = float(line.split("sum=")[1].split()[0])
        got_a = float(line.split("abs_sum=")[1].split()[0])
        assert got_a == pytest.approx(a, rel=1e-3)
        assert got_s == pytest.approx(s, rel=1e-3, abs=1e-3 * a)


def test_compile_error_names_the_kernel_and_the_op():
    from tgc.runtime.cuda_compile import load_kernels

    text = """func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = atomic.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  func.return %y : tensor<4xf32>
}"""
    (k,) = kernels(planned(text, library=False, name="broken.tg"))
    k.source = k.source.replace("expf(", "no_such_function(")
    with pytest.raises(TgcError) as e:
        load_kernels([k])
    rendered = e.value.render()
    assert f"({k.name})" in rendered and "failed to compile" in rendered
    assert "broken.tg:2:" in rendered


def test_a_kernel_name_with_a_newline_stays_on_one_line_of_the_error():
    """IR names reach compile errors through display_name: the line naming the kernel is one
    line (nvcc's own lines follow it)."""
    from tgc.dialects.kernel import FusedOp
    from tgc.runtime.cuda_compile import load_kernels

    text = """func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = kernel.fused %x {name = "two\\nlines", template = "elementwise"} : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %e = atomic.exp %a : (tensor<4xf32>) -> tensor<4xf32>
    kernel.yield %e : tensor<4xf32>
  }
  func.return %y : tensor<4xf32>
}"""
    module = parse_module(text, "named.tg")
    (fused,) = [op for op in module.funcs[0].body.ops if isinstance(op, FusedOp)]
    k = generate_kernel(fused)
    assert "\n" in k.ir_name
    k.source = k.source.replace("expf(", "no_such_function(")
    with pytest.raises(TgcError) as e:
        load_kernels([k])
    first = e.value.message.splitlines()[0]
    assert first.startswith("kernel 'two\\x0alines' (") and first.endswith("failed to compile:")


@pytest.mark.parametrize("n", [1, 33, 1000, 4096, 5001])
@pytest.mark.parametrize("op", ["softmax", "log_softmax", "layernorm"])
@pytest.mark.parametrize(
    "params", [{"merge_passes": True}, {"streaming": True}, {"keep_in_registers": False}]
)
def test_row_reduction_template_options(op, n, params):
    x, p = t((19, n), "f32"), t((n,), "f32")
    args, types = ("%x, %g, %b", f"({x}, {p}, {p})") if op == "layernorm" else ("%x", f"({x})")
    sig = f"%x: {x}, %g: {p}, %b: {p}" if op == "layernorm" else f"%x: {x}"
    text = f"func.func @f({sig}) -> {x} {{\n  %y = hl.{op} {args} : {types} -> {x}\n  func.return %y : {x}\n}}"
    check(text, seed=n, params=params)


def test_elementwise_streaming_option():
    text = """func.func @f(%x: tensor<100003xf32>) -> tensor<100003xf32> {
  %y = hl.gelu %x {approximate = "tanh"} : (tensor<100003xf32>) -> tensor<100003xf32>
  func.return %y : tensor<100003xf32>
}"""
    check(text, params={"streaming": True, "block_size": 128})


# -- fused attention ----------------------------------------------------------------------------


def attention_text(q, k, v, mask=None, causal=False, dtype="f32", scale=None) -> str:
    out = tuple(np.broadcast_shapes(q[:-2], k[:-2], v[:-2])) + (q[-2], v[-1])
    args = [f"%q: {t(q, dtype)}", f"%k: {t(k, dtype)}", f"%v: {t(v, dtype)}"]
    operands, types = "%q, %k, %v", [t(q, dtype), t(k, dtype), t(v, dtype)]
    if mask is not None:
        args.append(f"%m: {t(mask, dtype)}")
        operands += ", %m"
        types.append(t(mask, dtype))
    attrs = []
    if causal:
        attrs.append("causal = true")
    if scale is not None:
        attrs.append(f"scale = {scale}")
    attr_text = f" {{{', '.join(attrs)}}}" if attrs else ""
    return (
        f"func.func @att({', '.join(args)}) -> {t(out, dtype)} {{\n"
        f"  %y = hl.attention {operands}{attr_text} : ({', '.join(types)}) -> {t(out, dtype)}\n"
        f"  func.return %y : {t(out, dtype)}\n}}"
    )


ATTENTION_CASES = [
    # q, k, v, mask, causal
    ((2, 3, 100, 64), (2, 3, 100, 64), (2, 3, 100, 64), None, True),  # odd seq, 2 tiles
    ((1, 70, 64), (1, 130, 64), (1, 130, 64), None, True),  # seq_q < seq_k, diagonal at the end
    ((3, 65, 32), (3, 65, 32), (3, 65, 48), (65, 65), False),  # mask, d != d_v
    ((5, 33, 17), (1, 129, 17), (5, 129, 80), (5, 1, 129), False),  # broadcast batch, odd d
    ((7, 64), (9, 64), (9, 128), (7, 9), True),  # rank 2, d_v 128
    ((2, 1, 128), (2, 200, 128), (2, 200, 128), (200,), True),  # one query, head dim 128
    ((1, 1, 1), (1, 1, 1), (1, 1, 1), None, False),
    ((2, 2, 129, 64), (2, 2, 129, 64), (2, 2, 129, 64), (2, 1, 129, 129), True),
]


@pytest.mark.parametrize("q,k,v,mask,causal", ATTENTION_CASES)
def test_fused_attention(q, k, v, mask, causal):
    text = attention_text(q, k, v, mask, causal)
    func = check(text, seed=len(q) + q[-2])
    templates = [kern.template for kern in kernels(func)]
    assert templates == ["attention"], templates


def test_fused_attention_bf16_and_scale():
    check(attention_text((2, 100, 64), (2, 100, 64), (2, 100, 64), (100, 100), True, "bf16"))
    check(attention_text((3, 50, 24), (3, 77, 24), (3, 77, 40), None, False, scale=0.3))


def test_fused_attention_with_minus_inf_mask_rows():
    """An additive -inf mask over a whole first key tile: the running max stays -inf there."""
    from tgc.planner.executor import run_plan

    text = attention_text((2, 80, 64), (2, 150, 64), (2, 150, 64), (80, 150), True)
    ref = parse_module(text)
    inputs = random_inputs(ref.funcs[0], 3)
    inputs[3][:, :70] = -np.inf  # keys 0..69 masked for every query
    inputs[3][5, :] = -np.inf  # query 5 sees no key: NaN, as in numpy
    (got,) = run_plan(planned(text, library=False), inputs)
    (want,) = run_function(ref.funcs[0], inputs, "f64")
    assert np.isnan(got[:, 5]).all() and np.isnan(want[:, 5]).all()
    keep = np.ones(80, bool)
    keep[5] = False
    np.testing.assert_allclose(got[:, keep], want[:, keep], rtol=1e-4, atol=1e-4)


def test_fused_attention_reads_head_views_without_copies():
    """GPT-2's head split (slice of qkv, reshape, transpose) is read through strides: the plan
    has no transpose kernel before the attention kernel."""
    s, h, d = 100, 3, 64
    w = h * d
    text = "\n".join(
        [
            f"func.func @heads(%qkv: {t((2, s, 3 * w), 'f32')}) -> {t((2, h, s, d), 'f32')} {{",
            f"  %q, %k, %v = atomic.split %qkv {{axis = 2, sizes = [{w}, {w}, {w}]}} : ({t((2, s, 3 * w), 'f32')}) -> ({t((2, s, w), 'f32')}, {t((2, s, w), 'f32')}, {t((2, s, w), 'f32')})",
        ]
        + [
            line
            for n in "qkv"
            for line in (
                f"  %{n}4 = atomic.reshape %{n} : ({t((2, s, w), 'f32')}) -> {t((2, s, h, d), 'f32')}",
                f"  %{n}h = atomic.transpose %{n}4 {{perm = [0, 2, 1, 3]}} : ({t((2, s, h, d), 'f32')}) -> {t((2, h, s, d), 'f32')}",
            )
        ]
        + [
            f"  %y = hl.attention %qh, %kh, %vh {{causal = true}} : ({t((2, h, s, d), 'f32')}, {t((2, h, s, d), 'f32')}, {t((2, h, s, d), 'f32')}) -> {t((2, h, s, d), 'f32')}",
            f"  func.return %y : {t((2, h, s, d), 'f32')}",
            "}",
        ]
    )
    func = check(text)
    assert [kern.template for kern in kernels(func)] == ["attention"]


def test_attention_fallback_for_large_head_dim():
    """Head dims over 128 are lowered (matmul, softmax, matmul) and still correct."""
    func = check(attention_text((2, 40, 160), (2, 40, 160), (2, 40, 160), None, True))
    assert "attention" not in [kern.template for kern in kernels(func)]
