"""Users' CUDA-source kernels (planner/cuda_source.py, docs/kernels.md): the template rendered
per instance and compiled by nvcc (no GPU needed), its mistakes said in one line naming the
kernel, and, on a GPU (marker `cuda`), the example plugin checked against float64 and run in a
plan."""

from __future__ import annotations

import importlib.util
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tgc.codegen.render import prelude
from tgc.diagnostics import TgcError
from tgc.planner.cuda_source import CudaSource, Entry, numeric_attrs

ROOT = Path(__file__).resolve().parent.parent
PLUGIN = ROOT / "examples" / "kernels" / "layernorm_cuda.py"
NVCC = shutil.which("nvcc")


def example():
    spec = importlib.util.spec_from_file_location("layernorm_cuda_example", PLUGIN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def example_source() -> CudaSource:
    m = example()
    return CudaSource("user.cuda_layernorm", m.TEMPLATE, "user_layernorm", m.launch)


def layernorm_entries(rows: int, width: int, dtype: str):
    x, v = Entry((rows, width), dtype), Entry((width,), dtype)
    return [x, v, v], [x]


@pytest.mark.parametrize("dtype, ctype", [("f32", "float"), ("bf16", "__nv_bfloat16")])
def test_the_template_is_rendered_with_the_instances_shapes_and_types(dtype, ctype):
    inputs, outputs = layernorm_entries(16, 768, dtype)
    k = example_source().kernel_source(inputs, outputs, {})
    assert "constexpr int WIDTH = 768;" in k.source
    assert f"const {ctype}* __restrict__ x" in k.source
    assert 'extern "C" __global__ void user_layernorm(' in k.source
    assert (k.name, k.grid, k.block, k.shared_bytes) == (
        "user_layernorm",
        (16, 1, 1),
        (256, 1, 1),
        0,
    )
    assert (k.num_inputs, k.num_outputs) == (3, 1)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_example_compiles_with_nvcc_for_every_float_type(tmp_path):
    """What the cuda backend compiles: tgc's prelude, then the rendered template."""
    source = example_source()
    for dtype in ("f32", "bf16", "f16"):
        inputs, outputs = layernorm_entries(5, 1000, dtype)
        path = tmp_path / f"layernorm_{dtype}.cu"
        path.write_text(prelude() + "\n" + source.kernel_source(inputs, outputs, {}).source)
        proc = subprocess.run(
            [NVCC, "-cubin", "-arch=sm_90", "-O3", "-std=c++17", str(path), "-o", str(path) + ".o"],
            capture_output=True,
            text=True,
            check=False,
        )
        assert proc.returncode == 0, proc.stderr[-3000:]


def test_only_numeric_attributes_reach_the_template():
    """No string (an IR name, a file path) is ever pasted into generated code."""
    attrs = {"axis": -1, "eps": 1e-5, "axes": [0, 1], "keep": True, "name": "x; system()", "f": {}}
    assert numeric_attrs(attrs) == {"axis": -1, "eps": 1e-5, "axes": [0, 1], "keep": True}
    shown = CudaSource("user.k", "{{ attrs | dictsort }}", "k", lambda i, o, a: (1, 1))
    text = shown.render([], [], attrs)
    assert "system" not in text and "axis" in text


@pytest.mark.parametrize(
    "template, entry, launch, message",
    [
        ("{% if %}", "k", None, "CUDA kernel 'user.k': its template line 1: "),
        ("x", "k; int y", None, "CUDA kernel 'user.k': entry 'k; int y' is not a C identifier"),
        ("{{ nothing }}", "k", None, "CUDA kernel 'user.k': its template: 'nothing' is undefined"),
        ("x", "k", lambda i, o, a: 7, "launch returned 7, not (grid, block) or (grid, block, sh"),
        ("x", "k", lambda i, o, a: ((0,), (32,)), "launch grid (0,) is not 1-3 ints >= 1"),
        ("x", "k", lambda i, o, a: (1, (1, 2, 3, 4)), "launch block (1, 2, 3, 4) is not 1-3 ints"),
        ("x", "k", lambda i, o, a: (1, 32, -1), "shared bytes -1 is not an int >= 0"),
    ],
)
def test_a_mistake_in_a_cuda_kernel_is_one_line_naming_it(template, entry, launch, message):
    inputs, outputs = layernorm_entries(2, 8, "f32")
    with pytest.raises(TgcError) as e:
        CudaSource("user.k", template, entry, launch or (lambda i, o, a: (1, 32))).kernel_source(
            inputs, outputs, {}
        )
    assert message in e.value.message and "\n" not in e.value.message


def test_without_a_gpu_the_plugin_is_refused_in_one_line(capsys):
    """A CUDA kernel is checked on the GPU before any use; a machine without one says so."""
    from conftest import cuda_unavailable_reason

    from tgc.tools import plan as plan_tool

    if cuda_unavailable_reason() is None:
        pytest.skip("a GPU is here: test_the_example_plugin_runs_in_a_plan_on_the_gpu runs")
    model = ROOT / "examples" / "kernels" / "model.tg"
    assert plan_tool.main([str(model), "--no-db", "--kernels", str(PLUGIN)]) == 1
    err = capsys.readouterr().err.strip()
    assert "kernel 'user.cuda_layernorm' runs on cuda, not loaded here" in err
    assert len(err.splitlines()) == 1


@pytest.mark.cuda
def test_the_example_plugin_runs_in_a_plan_on_the_gpu(tmp_path):
    """Checked in float64 at several widths when loaded, measured at model.tg's 768-wide
    layernorm (checked again, then timed), and a plan of model.tg that may choose it matches
    float64."""
    import tgc
    from tgc.planner import route
    from tgc.planner.kernel import unregister_kernel
    from tgc.planner.plugins import load_plugins
    from tgc.planner.profile import Instance, measure
    from tgc.runtime.interpreter import random_inputs, run_function
    from tgc.types import TensorType

    (kernel,) = load_plugins([str(PLUGIN)])
    try:
        x, v = TensorType.get((16, 768), "f32", "cuda"), TensorType.get((768,), "f32", "cuda")
        m = measure(Instance(kernel, (x, v, v), (x,)), min_time=0.01)
        assert m.ok and m.max_error <= kernel.max_rel_error, m.message
        text = (ROOT / "examples" / "kernels" / "model.tg").read_text()
        options = route.RouteOptions(db=str(tmp_path / "m.sqlite"), progress=False)
        compiled = route.compile_module(tgc.parse(text), None, options)
        reference = tgc.parse(text).funcs[0]
        inputs = random_inputs(reference, 5)
        (want,) = run_function(reference, inputs, "f64")
        (got,) = compiled.run_host(inputs)
        assert np.max(np.abs(np.asarray(got, np.float64) - want)) <= 1e-4 * np.max(np.abs(want))
    finally:
        unregister_kernel(kernel.name)
