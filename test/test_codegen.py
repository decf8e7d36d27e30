"""CUDA code generation without a GPU: the op table covers every elementwise op, identifiers are
sanitised, templates render with StrictUndefined, and every example's standalone .cu compiles
with `nvcc -arch=sm_90 -c` (skipped where nvcc is absent; where the toolkit has no cuBLAS
headers, the file's own declarations of the entry points it calls are compiled)."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from nvcc_batch import compile_unit, unit_source

from tgc.codegen.cuda_ops import CODE_FOR_OP
from tgc.codegen.kernels import generate_kernel
from tgc.codegen.standalone import standalone_inputs
from tgc.dialects.kernel import FusedOp
from tgc.opdef import ELEMENTWISE, OPS
from tgc.parser import parse_module
from tgc.pass_manager import PassManager
from tgc.planner.standalone import emit_standalone_cuda

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.tg"))
NVCC = shutil.which("nvcc") or (shutil.which("nvcc", path="/usr/local/cuda/bin"))


def test_every_elementwise_op_has_c_code():
    missing = []
    for name, cls in OPS.items():
        if ELEMENTWISE not in cls.traits:
            continue
        variants = [k for k in CODE_FOR_OP if k == name or k.startswith(name + "[")]
        if not variants:
            missing.append(name)
    assert not missing, f"no CODE_FOR_OP entry for {missing}"


def test_table_keys_name_registered_ops():
    for key in CODE_FOR_OP:
        assert key.split("[")[0] in OPS, key


def test_hostile_kernel_name_is_sanitised():
    text = """func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = kernel.fused %x {name = "x(); system(\\"rm -rf /\\"); //", template = "elementwise"} : (tensor<4xf32>) -> tensor<4xf32> {
  ^bb0(%a: tensor<4xf32>):
    %e = atomic.exp %a : (tensor<4xf32>) -> tensor<4xf32>
    kernel.yield %e : tensor<4xf32>
  }
  func.return %y : tensor<4xf32>
}"""
    module = parse_module(text)
    op = next(o for o in module.walk() if isinstance(o, FusedOp))
    kernel = generate_kernel(op)
    assert re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", kernel.name)
    assert "system" not in kernel.source.replace(kernel.name, "")


def test_standalone_inputs_are_reproducible_and_in_range():
    module = parse_module((ROOT / "examples" / "mlp.tg").read_text())
    a = standalone_inputs(module.funcs[0], 0)
    b = standalone_inputs(module.funcs[0], 0)
    for x, y in zip(a, b):
        np.testing.assert_array_equal(x, y)
        assert x.min() >= -1 and x.max() < 1


GATHER = """func.func @emb(%table: tensor<50x8xf32>, %ids: tensor<64xi32>) -> tensor<64x8xf32> {
  %y = atomic.gather %table, %ids {axis = 0} : (tensor<50x8xf32>, tensor<64xi32>) -> tensor<64x8xf32>
  func.return %y : tensor<64x8xf32>
}"""


def test_standalone_gather_indices_follow_the_table_after_planning():
    """main() draws gather indices below the gathered axis (50) although a kernel reads the
    argument as a block argument of its region, and standalone_inputs draws the same on the
    planned or the unplanned function."""
    before = standalone_inputs(parse_module(GATHER).funcs[0], 0)
    module = parse_module(GATHER)
    src = emit_standalone_cuda(module)  # plans the module's function in place
    assert "(tgc_hash((unsigned int) i, seed) % 50u)" in src and "% 4u" not in src
    after = standalone_inputs(module.funcs[0], 0)
    for x, y in zip(before, after):
        np.testing.assert_array_equal(x, y)
    assert 4 <= after[1].max() < 50 and after[1].min() >= 0


def fused_kernels(text: str) -> list[FusedOp]:
    """The `kernel.fused` regions `fuse` makes of what the planner plans."""
    module = parse_module(text)
    PassManager.from_text("lower-for-planning,fuse").run(module)
    return [o for o in module.funcs[0].body.ops if isinstance(o, FusedOp)]


def test_template_parameters_reach_the_source():
    op = fused_kernels((ROOT / "examples" / "gelu_scale.tg").read_text())[0]
    k = generate_kernel(op, {"block_size": 128, "vector_width": 2})
    assert "__launch_bounds__(128)" in k.source and "TgcVec<float, 2>" in k.source
    assert k.block == (128, 1, 1)


def nvcc_compiles(path: Path, *flags: str) -> None:
    """`nvcc -arch=sm_90 -c flags path` succeeds."""
    proc = subprocess.run(
        [NVCC, "-arch=sm_90", "-c", *flags, str(path), "-o", str(path.with_suffix(".o"))],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
@pytest.mark.parametrize("name", EXAMPLES)
def test_standalone_cu_compiles_with_nvcc(name, tmp_path):
    """Each example's file, with its main. Without the main (the library form) the examples
    compile together, in one file (the next test): the file is the same prelude and
    declarations, then each function's kernels and host code."""
    src = tmp_path / f"{name}.cu"
    module = parse_module((ROOT / "examples" / name).read_text())
    PassManager.from_text("lower-for-planning").run(module)
    src.write_text(emit_standalone_cuda(module, name))
    nvcc_compiles(src, "-DTGC_STANDALONE_MAIN")


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_examples_library_file_compiles_with_nvcc(tmp_path):
    """Every example's function in one module: its standalone file without the main (one nvcc
    run instead of one per example: nvcc's fixed cost is most of a small file's)."""
    module = parse_module("\n".join((ROOT / "examples" / n).read_text() for n in EXAMPLES))
    assert len(module.funcs) == len(EXAMPLES)
    PassManager.from_text("lower-for-planning").run(module)
    src = tmp_path / "examples.cu"
    src.write_text(emit_standalone_cuda(module, "examples"))
    for func in module.funcs:
        assert f"tgc_run_{func.sym_name}(" in src.read_text()
    nvcc_compiles(src)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_a_group_norm_with_its_affine_and_silu_in_one_kernel_compiles_with_nvcc(tmp_path):
    """The row reduction whose output is its rows reshaped back to [n, c, h, w], with the
    per-channel affine and the SiLU on them (test/lit/emit-cuda/group-norm.tg shows the code)."""
    module = parse_module((ROOT / "test" / "lit" / "emit-cuda" / "group-norm.tg").read_text())
    PassManager.from_text("lower-for-planning").run(module)
    src = tmp_path / "gn.cu"
    src.write_text(emit_standalone_cuda(module, "gn", libraries=False))
    assert src.read_text().count("__global__") == 1
    nvcc_compiles(src)


def rounding_chain(e: str) -> str:
    """A fused chain of floor, ceil, round and both mods (a broadcast divisor) on element type
    `e`; integers take the mods only (rounding is float-only)."""
    t, r = f"tensor<37x5x{e}>", f"tensor<5x{e}>"
    if e.startswith("i"):
        body = f"""  %m = atomic.mod %x, %y : ({t}, {r}) -> {t}
  %f = atomic.mod %x, %y {{fmod = true}} : ({t}, {r}) -> {t}
  %s = atomic.add %m, %f : ({t}, {t}) -> {t}"""
    else:
        body = f"""  %a = atomic.floor %x : ({t}) -> {t}
  %b = atomic.ceil %x : ({t}) -> {t}
  %c = atomic.round %x : ({t}) -> {t}
  %m = atomic.mod %a, %y : ({t}, {r}) -> {t}
  %f = atomic.mod %c, %y {{fmod = true}} : ({t}, {r}) -> {t}
  %g = atomic.add %m, %b : ({t}, {t}) -> {t}
  %s = atomic.sub %g, %f : ({t}, {t}) -> {t}"""
    return f"""func.func @f(%x: {t}, %y: {r}) -> {t} {{
{body}
  func.return %s : {t}
}}"""


ROUNDING_CODE = {
    "f32": ["floorf(", "ceilf(", "rintf(", "tgc_modf(", "fmodf("],
    "f16": ["floorf(", "ceilf(", "rintf(", "tgc_modf(", "fmodf("],
    "bf16": ["floorf(", "ceilf(", "rintf(", "tgc_modf(", "fmodf("],
    "f64": ["floor(", "ceil(", "rint(", "tgc_mod(", "fmod("],
    "i8": ["tgc_imod(", "tgc_ifmod("],
    "i32": ["tgc_imod(", "tgc_ifmod("],
    "i64": ["tgc_imod(", "tgc_ifmod("],
}


@pytest.mark.parametrize("element_type", sorted(ROUNDING_CODE))
def test_rounding_and_mod_chain_is_one_kernel(element_type):
    """floor/ceil/round/mod fuse into one elementwise kernel that calls the device functions of
    CODE_FOR_OP for the element type (the next test compiles them)."""
    module = parse_module(rounding_chain(element_type))
    src = emit_standalone_cuda(module, "rounding")
    assert src.count("__global__") == 1
    body = src[src.index("__global__") :]  # the kernel, past the prelude's definitions
    for call in ROUNDING_CODE[element_type]:
        assert call in body, (call, element_type)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_rounding_and_mod_chains_of_every_element_type_compile(tmp_path):
    """The chain of each element type, a function each in one module: its standalone .cu, with
    its main, compiles with nvcc (one run instead of one per type; the file before the kernels
    is the same whatever the types)."""
    text = "\n".join(rounding_chain(e).replace("@f(", f"@f_{e}(", 1) for e in sorted(ROUNDING_CODE))
    module = parse_module(text)
    path = tmp_path / "rounding.cu"
    path.write_text(emit_standalone_cuda(module, "rounding"))
    assert path.read_text().count("__global__") == len(ROUNDING_CODE)
    nvcc_compiles(path, "-DTGC_STANDALONE_MAIN")


@pytest.mark.parametrize(
    "op,helper",
    [
        ("softmax", "tgc_online_add"),
        ("log_softmax", "tgc_online_add"),
        ("layernorm", "tgc_moments_add"),
    ],
)
def test_merged_single_pass_variants(op, helper):
    """The online-softmax and one-pass mean/variance forms (template option merge_passes; the
    next test compiles them)."""
    kernel = merged_single_pass_kernel(op)
    assert helper in kernel.source and "// pass 2" not in kernel.source


def merged_single_pass_kernel(op: str):
    x, p = "tensor<37x4096xf32>", "tensor<4096xf32>"
    args, types = ("%x, %g, %b", f"({x}, {p}, {p})") if op == "layernorm" else ("%x", f"({x})")
    sig = f"%x: {x}, %g: {p}, %b: {p}" if op == "layernorm" else f"%x: {x}"
    text = f"func.func @f({sig}) -> {x} {{\n  %y = hl.{op} {args} : {types} -> {x}\n  func.return %y : {x}\n}}"
    (fused,) = fused_kernels(text)
    return generate_kernel(fused, {"merge_passes": True})


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_merged_single_pass_variants_compile(tmp_path):
    """The three kernels after the prelude, renamed apart, in one nvcc run."""
    from tgc.codegen.kernels import prelude

    kernels = [merged_single_pass_kernel(op) for op in ("softmax", "log_softmax", "layernorm")]
    unit, _ = unit_source(prelude(), [(k.name, k.source) for k in kernels])
    ok, log = compile_unit(tmp_path, unit, ["-arch=sm_90", "-c"])
    assert ok, log[-3000:]


def test_verifier_rejects_a_kernel_mixing_memory_spaces():
    from tgc.diagnostics import TgcError
    from tgc.verifier import verify

    text = """func.func @f(%a: tensor<4xf32>) -> tensor<4xf32> {
  %d = kernel.copy %a : (tensor<4xf32>) -> tensor<4xf32, "cuda">
  %y = kernel.fused %a, %d {name = "k"} : (tensor<4xf32>, tensor<4xf32, "cuda">) -> tensor<4xf32> {
  ^bb0(%p: tensor<4xf32>, %q: tensor<4xf32, "cuda">):
    kernel.yield %p : tensor<4xf32>
  }
  func.return %y : tensor<4xf32>
}"""
    with pytest.raises(TgcError, match="different memory spaces"):
        verify(parse_module(text))


def test_a_long_elementwise_chain_translates(tmp_path, capsys):
    """Issue 27: `tgc-translate --emit=cuda` on a 10,000-op chain was `internal error:
    RecursionError` (the expression emitter recursed once per op). 3,000 ops here, three times
    Python's recursion limit (10,000 took 7 s of the suite). The chain is one fused kernel whose
    body computes every op once per code path (vector and scalar), in order."""
    from tgc.tools.translate import main

    assert sys.getrecursionlimit() < 3_000 / 2
    n = 3_000
    lines = ["func.func @f(%x: tensor<8x8xf32>, %y: tensor<8xf32>) -> tensor<8x8xf32> {"]
    prev = "%x"
    for i in range(n):
        if i % 2:
            op = f"atomic.add {prev}, %y : (tensor<8x8xf32>, tensor<8xf32>) -> tensor<8x8xf32>"
        else:
            op = f"atomic.sin {prev} : (tensor<8x8xf32>) -> tensor<8x8xf32>"
        lines.append(f"  %v{i} = {op}")
        prev = f"%v{i}"
    lines += [f"  func.return {prev} : tensor<8x8xf32>", "}"]
    src, out = tmp_path / "chain.tg", tmp_path / "chain.cu"
    src.write_text("\n".join(lines) + "\n")
    assert main([str(src), "--emit=cuda", "-o", str(out)]) == 0, capsys.readouterr().err
    cu = out.read_text()
    assert cu.count("__global__") == 1
    sins = re.findall(r"const float v(\d+) = sinf\(v(\d+)\);", cu)
    adds = re.findall(r"const float v(\d+) = \(v(\d+) \+ v\d+\);", cu)
    paths = len(sins) // (n // 2)
    assert paths >= 1 and len(sins) == paths * (n // 2) and len(adds) == len(sins)
    # in order: each sin reads the value just before it
    first = [(int(a), int(b)) for a, b in sins[: n // 2]]
    assert all(b < a for a, b in first) and [a for a, _ in first] == sorted(a for a, _ in first)


@pytest.mark.parametrize(
    "dtype, call", [("bf16", "__expf("), ("f16", "__expf("), ("f32", " expf(")]
)
def test_an_exp_of_16_bit_floats_takes_the_fast_form(dtype, call):
    """An exp whose result is f16 or bf16 is `__expf` (accurate to a few f32 ulps, far below
    16-bit rounding); an f32 one keeps `expf`."""
    t = f"tensor<64x128x{dtype}>"
    text = (
        f"func.func @f(%x: {t}) -> {t} {{\n"
        f"  %y = atomic.exp %x : ({t}) -> {t}\n"
        f"  func.return %y : {t}\n}}\n"
    )
    (op,) = fused_kernels(text)
    source = generate_kernel(op, {}).source
    assert call in source
    if dtype == "f32":
        assert "__expf(" not in source
