"""The PyTorch backends (issue 12, items 1 and 6): every torch kernel computes its op within its
stated error, and a plan mixing numpy and torch-cpu kernels runs and matches float64.

Skipped as a whole where PyTorch does not import (CI has none); torch-cuda kernels are checked
here too where a GPU is visible. For each kernel, instances of its op on random shapes and
attribute variants (f32 and f64), fresh random inputs (magnitudes in [0.5, 2), random signs,
positive where the op needs it), and the bound of planner/kernel.py:
- against the op's numpy meaning in the same element types: rel_error <= max_rel_error;
- against the float64 interpreter: rel_error <= the numpy evaluation's own + max_rel_error.
Both through the kernel's `run` (host arrays) and through the backend's `call` on tensors (what
the executor runs). A wrong kernel fails the same check (test_a_wrong_torch_kernel_is_caught).
"""

from __future__ import annotations

import numpy as np
import pytest
from test_planner_kernels import check_kernel_on, random_inputs

import tgc
from tgc.planner.backends import BACKENDS, SPACES
from tgc.planner.kernel import KERNELS, Kernel, rel_error
from tgc.runtime.interpreter import run_function

torch = pytest.importorskip(
    "torch", reason="PyTorch is not installed (the torch backend is optional)"
)

from tgc.planner.backends import torch as torch_backend  # noqa: E402  (needs torch)

POSITIVE = {"atomic.log", "atomic.sqrt", "atomic.rsqrt", "atomic.pow", "hl.batch_norm"}
SEEDS = (0, 1, 2)


@pytest.fixture(scope="module", autouse=True)
def torch_kernels():
    """The torch kernels registered for this module only (the other test modules plan with
    numpy's alone)."""
    torch_backend.register()
    yield
    torch_backend.unregister()


def backends_here() -> list[str]:
    return torch_backend.available_backends()


# -- instances: the op on random shapes and attributes ------------------------------------------


def _t(shape, element: str) -> str:
    dims = "x".join(str(d) for d in shape)
    return f"tensor<{dims}x{element}>" if dims else f"tensor<{element}>"


def _func(operands: list[tuple[str, tuple, str]], line: str, result: tuple) -> str:
    """A function of the named operands running `line` (which defines %y of type `result`)."""
    args = ", ".join(f"%{n}: {_t(s, e)}" for n, s, e in operands)
    ins = ", ".join(_t(s, e) for _, s, e in operands)
    out = _t(*result)
    return (
        f"func.func @f({args}) -> {out} {{\n  %y = {line} : ({ins}) -> {out}\n"
        f"  func.return %y : {out}\n}}\n"
    )


def _shape(rng, min_rank=0, max_rank=3, low=1, high=6) -> tuple:
    return tuple(int(d) for d in rng.integers(low, high, size=rng.integers(min_rank, max_rank + 1)))


def _suffix_with_ones(rng, shape: tuple) -> tuple:
    tail = shape[rng.integers(0, len(shape) + 1) :]
    return tuple(1 if rng.random() < 0.3 else d for d in tail)


def _axes_attr(axes) -> str:
    return "[" + ", ".join(str(a) for a in axes) + "]"


def instances(op: str, rng, e: str) -> list[str]:
    """Texts of functions running `op` on element type `e` (f32 or f64)."""
    short = op.split(".", 1)[1]
    unary = {"neg", "abs", "sqrt", "recip", "exp", "log", "rsqrt", "erf", "sin", "cos"}
    unary |= {"floor", "ceil", "round"}
    binary = {"add", "sub", "mul", "div", "max", "min", "pow"}
    hl_unary = {"tanh", "sigmoid", "relu", "silu"}
    out = []
    if op.startswith("atomic.") and short in unary or op.startswith("hl.") and short in hl_unary:
        s = _shape(rng)
        out.append(_func([("x", s, e)], f"{op} %x", (s, e)))
    elif short in binary:
        s = _shape(rng, 1)
        a, b = s, _suffix_with_ones(rng, s)
        if rng.random() < 0.5:
            a, b = b, a
        out.append(_func([("a", a, e), ("b", b, e)], f"{op} %a, %b", (s, e)))
    elif short == "mod":
        for fmod in ("false", "true"):
            s = _shape(rng, 1)
            b = _suffix_with_ones(rng, s)
            out.append(_func([("a", s, e), ("b", b, e)], f"{op} %a, %b {{fmod = {fmod}}}", (s, e)))
    elif short == "cmp":
        for pred in ("lt", "le", "gt", "ge", "eq", "ne"):
            s = _shape(rng, 1)
            out.append(
                _func(
                    [("a", s, e), ("b", _suffix_with_ones(rng, s), e)],
                    f'{op} %a, %b {{pred = "{pred}"}}',
                    (s, "i1"),
                )
            )
    elif short == "where":
        s = _shape(rng, 1)
        ops = [
            ("c", _suffix_with_ones(rng, s), "i1"),
            ("a", s, e),
            ("b", _suffix_with_ones(rng, s), e),
        ]
        out.append(_func(ops, f"{op} %c, %a, %b", (s, e)))
    elif short == "cast":
        s = _shape(rng)
        other = "f64" if e == "f32" else "f32"
        out.append(_func([("x", s, e)], f"{op} %x", (s, other)))
    elif short.startswith("reduce_") or short == "mean":
        s = _shape(rng, 1)
        axes = sorted(rng.choice(len(s), size=rng.integers(1, len(s) + 1), replace=False).tolist())
        keep = bool(rng.random() < 0.5)
        r = (
            tuple(1 if i in axes else d for i, d in enumerate(s))
            if keep
            else tuple(d for i, d in enumerate(s) if i not in axes)
        )
        attrs = f"{{axes = {_axes_attr(axes)}, keepdims = {str(keep).lower()}}}"
        out.append(_func([("x", s, e)], f"{op} %x {attrs}", (r, e)))
    elif short == "matmul":
        for ta, tb in ((False, False), (True, False), (False, True), (True, True)):
            m, n = (int(d) for d in rng.integers(1, 40, size=2))
            k = int(rng.integers(1, 257))
            batch = _shape(rng, 0, 2, 1, 4)
            a_batch = batch if rng.random() < 0.7 else tuple(1 for _ in batch)
            b_batch = batch if rng.random() < 0.5 else ()
            a = a_batch + ((k, m) if ta else (m, k))
            b = b_batch + ((n, k) if tb else (k, n))
            r = tuple(np.broadcast_shapes(a_batch, b_batch)) + (m, n)
            attrs = f"{{transpose_a = {str(ta).lower()}, transpose_b = {str(tb).lower()}}}"
            out.append(_func([("a", a, e), ("b", b, e)], f"{op} %a, %b {attrs}", (r, e)))
    elif short == "gelu":
        s = _shape(rng, 1)
        for approx in ("none", "tanh"):
            out.append(_func([("x", s, e)], f'{op} %x {{approximate = "{approx}"}}', (s, e)))
    elif short in ("softmax", "log_softmax"):
        s = _shape(rng, 1, 3, 1, 9)
        for axis in (-1, 0):
            out.append(_func([("x", s, e)], f"{op} %x {{axis = {axis}}}", (s, e)))
    elif short in ("layernorm", "rmsnorm"):
        s = (int(rng.integers(1, 5)), int(rng.integers(1, 5)), int(rng.integers(2, 65)))
        for axis, param in ((-1, s[2:]), (1, s[1:]), (-1, ()), (1, (1, s[2]))):
            ps = [("g", param, e)] + ([("b", param, e)] if short == "layernorm" else [])
            names = ", ".join(f"%{n}" for n, _, _ in ps)
            eps = "1.0e-05" if short == "layernorm" else "1.0e-06"
            out.append(
                _func(
                    [("x", s, e)] + ps, f"{op} %x, {names} {{axis = {axis}, eps = {eps}}}", (s, e)
                )
            )
    elif short == "linear":
        k, n = int(rng.integers(1, 65)), int(rng.integers(1, 33))
        for x, bias in (((3, 5, k), (n,)), ((k,), None), ((4, k), (1, n))):
            ops = [("x", x, e), ("w", (k, n), e)] + ([("b", bias, e)] if bias else [])
            names = ", ".join(f"%{name}" for name, _, _ in ops)
            out.append(_func(ops, f"{op} {names}", (x[:-1] + (n,), e)))
    elif short == "attention":
        out += _attention_instances(op, rng, e)
    elif op in VISION:
        for shapes, attrs, result in VISION[op]:
            names = "xwbmv"[: len(shapes)]
            ops = [(n, s, e) for n, s in zip(names, shapes)]
            line = f"{op} " + ", ".join(f"%{n}" for n in names) + (f" {{{attrs}}}" if attrs else "")
            out.append(_func(ops, line, (result, e)))
    return out


# The vision ops: each library path (pads PyTorch takes itself or applied first, ceil mode,
# dilations, groups, bias) and each resize mode (F.interpolate's and the gathers).
_C2 = [(2, 4, 7, 9), (6, 2, 3, 2), (6,)]
VISION = {
    "hl.conv1d": [([(2, 3, 9), (4, 3, 3)], "pads = [1, 2], strides = [2]", (2, 4, 5))],
    "hl.conv2d": [
        (_C2, "groups = 2, pads = [1, 0, 1, 0]", (2, 6, 7, 8)),
        (_C2, "dilations = [1, 2], groups = 2, pads = [1, 0, 2, 1], strides = [2, 1]", (2, 6, 4, 8)),
    ],
    "hl.conv3d": [([(1, 2, 4, 4, 4), (2, 2, 2, 2, 2)], "pads = [1, 0, 0, 0, 1, 0]", (1, 2, 4, 4, 3))],
    "hl.conv_transpose1d": [([(1, 4, 5), (4, 1, 2)], "groups = 2, strides = [3]", (1, 2, 14))],
    "hl.conv_transpose2d": [
        ([(2, 3, 4, 5), (3, 2, 3, 3), (2,)], "output_padding = [1, 0], pads = [1, 1, 1, 1], strides = [2, 2]", (2, 2, 8, 9)),
        ([(2, 3, 4, 5), (3, 2, 3, 3)], "pads = [2, 0, 1, 1], strides = [2, 1]", (2, 2, 6, 6)),
    ],
    "hl.conv_transpose3d": [([(1, 2, 2, 3, 2), (2, 1, 2, 2, 2)], "strides = [2, 1, 2]", (1, 1, 4, 4, 4))],
    "hl.max_pool1d": [([(2, 3, 9)], "kernel = [3], strides = [2]", (2, 3, 4))],
    "hl.max_pool2d": [
        ([(2, 3, 9, 8)], "ceil_mode = true, dilations = [1, 2], kernel = [3, 2], pads = [1, 1, 1, 1], strides = [2, 2]", (2, 3, 5, 5)),
        ([(2, 3, 9, 8)], "ceil_mode = true, kernel = [3, 3], pads = [2, 0, 0, 1], strides = [2, 2]", (2, 3, 5, 4)),
    ],
    "hl.max_pool3d": [([(1, 2, 4, 5, 4)], "ceil_mode = true, kernel = [2, 2, 2], strides = [2, 2, 2]", (1, 2, 2, 3, 2))],
    "hl.avg_pool1d": [([(2, 3, 9)], "count_include_pad = true, kernel = [3], pads = [1, 1]", (2, 3, 9))],
    "hl.avg_pool2d": [
        ([(2, 3, 9, 8)], "ceil_mode = true, kernel = [3, 2], pads = [1, 1, 1, 1], strides = [2, 2]", (2, 3, 5, 5)),
        ([(2, 3, 9, 8)], "count_include_pad = true, kernel = [3, 3], pads = [2, 0, 1, 1], strides = [2, 1]", (2, 3, 5, 7)),
        ([(2, 3, 9, 8)], "dilations = [2, 1], kernel = [2, 2]", (2, 3, 7, 7)),
        ([(2, 3, 5, 4)], "kernel = [5, 4]", (2, 3, 1, 1)),
    ],
    "hl.avg_pool3d": [([(1, 2, 4, 4, 4)], "kernel = [2, 2, 2], strides = [2, 2, 2]", (1, 2, 2, 2, 2))],
    "hl.group_norm": [([(2, 6, 4, 5), (6,), (6,)], "groups = 3", (2, 6, 4, 5))],
    "hl.batch_norm": [([(2, 6, 4, 5), (6,), (6,), (6,), (6,)], "eps = 1.0e-03", (2, 6, 4, 5))],
    "hl.resize": [
        ([(2, 3, 4, 5)], 'coordinate = "asymmetric", mode = "nearest"', (2, 3, 8, 10)),
        ([(2, 3, 4, 5)], 'mode = "nearest", nearest = "round_prefer_ceil"', (2, 3, 7, 3)),
        ([(2, 3, 4, 5)], 'mode = "nearest", nearest = "round_prefer_floor"', (2, 3, 7, 3)),
        ([(2, 3, 4, 5)], 'mode = "linear"', (2, 3, 8, 7)),
        ([(2, 3, 4, 5)], 'coordinate = "align_corners", mode = "linear"', (2, 3, 3, 9)),
        ([(2, 3, 4, 5)], 'coordinate = "asymmetric", mode = "linear"', (2, 3, 6, 9)),
    ],
}  # fmt: skip


def _attention_instances(op: str, rng, e: str) -> list[str]:
    b, h, d, dv = 2, int(rng.integers(1, 4)), int(rng.integers(1, 33)), int(rng.integers(1, 17))
    seq = int(rng.integers(1, 12))
    longer = seq + int(rng.integers(1, 6))
    cases = [
        ((b, h, seq, d), (b, h, seq, d), (b, h, seq, dv), None, ""),
        ((b, h, seq, d), (b, h, seq, d), (b, h, seq, dv), None, "{causal = true}"),
        ((b, h, seq, d), (b, h, longer, d), (b, h, longer, dv), None, "{causal = true}"),
        ((h, seq, d), (h, longer, d), (h, longer, dv), (seq, longer), "{scale = 0.3}"),
        ((b, h, seq, d), (h, seq, d), (1, h, seq, dv), (b, 1, seq, seq), "{causal = true}"),
        ((seq, d), (longer, d), (longer, dv), (1, longer), ""),
    ]
    out = []
    for q, k, v, mask, attrs in cases:
        ops = [("q", q, e), ("k", k, e), ("v", v, e)] + ([("m", mask, e)] if mask else [])
        names = ", ".join(f"%{n}" for n, _, _ in ops)
        batch = tuple(np.broadcast_shapes(q[:-2], k[:-2], v[:-2]))
        out.append(_func(ops, f"{op} {names} {attrs}".rstrip(), (batch + (q[-2], dv), e)))
    return out


def parse(text: str):
    return tgc.parse(text).funcs[0]


def kernel_instances(kernel: Kernel, seed: int):
    rng = np.random.default_rng(seed)
    for e in ("f32", "f64"):
        for text in instances(kernel.op, rng, e):
            func = parse(text)
            yield func, random_inputs(func, rng, positive=kernel.op in POSITIVE)


def torch_kernel_names() -> list[str]:
    names = []
    for backend in backends_here():
        names += [f"{backend}.{op}" for op in torch_backend.OP_FUNCTIONS]
    return sorted(names)


# -- every kernel within its stated error -------------------------------------------------------


@pytest.mark.parametrize("name", torch_kernel_names())
@pytest.mark.parametrize("seed", SEEDS)
def test_torch_kernel_computes_its_op_within_its_stated_error(name, seed):
    kernel = KERNELS[name]
    checked = 0
    for func, inputs in kernel_instances(kernel, seed):
        types = ([a.type for a in func.args], [r for r in func.function_type.results])
        assert kernel.constraints(types) is None, f"{name} refuses its own test instance"
        check_kernel_on(kernel, func, inputs)
        check_through_the_backend(kernel, func, inputs)
        checked += 1
    assert checked >= 2


def check_through_the_backend(kernel: Kernel, func, inputs) -> None:
    """The executor's path: the backend adopts host arrays, calls the kernel on tensors, and
    releases the results; the same values as `run`."""
    backend = BACKENDS[kernel.backend]
    root = func.body.last.operands[0].defining_op
    result_types = [v.type for v in func.body.last.operands]
    outs = backend.call(
        kernel, [backend.adopt(a) for a in inputs], dict(root.attributes), result_types
    )
    assert all(isinstance(o, torch.Tensor) for o in outs), "the backend computes on tensors"
    got = [SPACES[kernel.space].to_host(backend.release(o)) for o in outs]
    want = kernel.run(inputs, dict(root.attributes), result_types)
    for g, w in zip(got, want):
        np.testing.assert_array_equal(g, w)


def test_every_op_the_backend_lists_has_instances():
    rng = np.random.default_rng(0)
    for op in torch_backend.OP_FUNCTIONS:
        assert instances(op, rng, "f32"), op


def test_bounds_are_needed_where_stated():
    """Where a kernel states 0, torch gives numpy's bits; where it states more, it differs
    somewhere on these inputs (the bound is not decoration)."""
    differing = set()
    for name in torch_kernel_names():
        kernel = KERNELS[name]
        if not name.startswith("torch-cpu."):
            continue
        for seed in SEEDS:
            for func, inputs in kernel_instances(kernel, seed):
                root = func.body.last.operands[0].defining_op
                result_types = [v.type for v in func.body.last.operands]
                (got,) = kernel.run(inputs, dict(root.attributes), result_types)
                (native,) = run_function(func, inputs, "native")
                if rel_error(got, native) > 0:
                    differing.add(kernel.op)
    stated = {op for op, (_, error) in torch_backend.OP_FUNCTIONS.items() if error > 0}
    assert differing <= stated
    # the transcendental functions and the sums do differ from numpy (a few of them at least)
    assert {"atomic.exp", "atomic.reduce_sum", "atomic.matmul", "hl.layernorm"} <= differing


def _wrong_gelu(op, x):
    """The tanh approximation where the exact (erf) GELU is asked: up to 5e-4 off."""
    return torch.nn.functional.gelu(x, approximate="tanh")


def _softmax_on_axis_0(op, x):
    return torch.softmax(x, dim=0)


@pytest.mark.parametrize(
    "op, fn, text",
    [
        ("hl.gelu", _wrong_gelu, 'hl.gelu %x {approximate = "none"}'),
        ("hl.softmax", _softmax_on_axis_0, "hl.softmax %x {axis = -1}"),
    ],
)
def test_a_wrong_torch_kernel_is_caught(op, fn, text):
    kernel = Kernel(
        "torch-cpu.test_wrong",
        "torch-cpu",
        op=op,
        run=torch_backend.host_run(op, fn, "cpu"),
        max_rel_error=torch_backend.OP_FUNCTIONS[op][1],
    )
    func = parse(_func([("x", (4, 16), "f32")], text, ((4, 16), "f32")))
    inputs = random_inputs(func, np.random.default_rng(0))
    with pytest.raises(AssertionError, match="torch-cpu.test_wrong"):
        check_kernel_on(kernel, func, inputs)


def test_host_values_are_handed_to_torch_and_back_without_a_copy():
    a = np.arange(12, dtype=np.float32).reshape(3, 4)
    t = torch_backend.from_numpy(a)
    assert t.data_ptr() == a.ctypes.data
    back = torch_backend.to_numpy(t)
    assert back.ctypes.data == a.ctypes.data
    # a read-only array (a constant's value) is copied: torch may not alias it
    a.flags.writeable = False
    assert torch_backend.from_numpy(a).data_ptr() != a.ctypes.data


def test_types_outside_f32_and_f64_are_refused():
    from tgc.types import TensorType

    kernel = KERNELS["torch-cpu.atomic.add"]
    f16, i32 = TensorType.get((4,), "f16"), TensorType.get((4,), "i32")
    assert "not f16" in kernel.constraints(([f16, f16], [f16]))
    assert "not i32" in kernel.constraints(([i32, i32], [i32]))
    f32 = TensorType.get((4,), "f32")
    assert kernel.constraints(([f32, f32], [f32])) is None


# -- a plan mixing numpy and torch-cpu kernels ---------------------------------------------------

X, W, B = "tensor<8x32xf32>", "tensor<32x32xf32>", "tensor<32xf32>"
MIXED = f"""
func.func @f(%x: {X}, %w: {W}, %b: {B}, %g: {B}) -> {X} {{
  %m = atomic.matmul %x, %w : ({X}, {W}) -> {X}
  %s = atomic.add %m, %b : ({X}, {B}) -> {X}
  %a = hl.gelu %s : ({X}) -> {X}
  %n = hl.layernorm %a, %g, %b {{axis = -1, eps = 1.0e-05}} : ({X}, {B}, {B}) -> {X}
  %t = hl.tanh %n : ({X}) -> {X}
  %r = hl.softmax %t {{axis = -1}} : ({X}) -> {X}
  %y = atomic.mul %r, %x : ({X}, {X}) -> {X}
  func.return %y : {X}
}}
"""


def test_a_plan_mixing_numpy_and_torch_runs_and_matches_float64():
    from tgc.planner.cost import DictCostSource, RooflineCostSource
    from tgc.planner.executor import run_plan
    from tgc.planner.select import select_kernels

    # torch made cheap for three ops, numpy (by the roofline) for the rest
    costs = DictCostSource(
        {
            "torch-cpu.atomic.matmul": 1e-9,
            "torch-cpu.hl.layernorm": 1e-9,
            "torch-cpu.hl.softmax": 1e-9,
        },
        fallback=RooflineCostSource(),
    )
    module = tgc.parse(MIXED)
    func = module.funcs[0]
    selection = select_kernels(func, costs, tolerance=1e-5, backends=("numpy", "torch"))
    tgc.verify(module)
    callees = [op.attr("callee") for op in func.body.ops if op.name == "kernel.call"]
    assert {"torch-cpu.atomic.matmul", "torch-cpu.hl.layernorm", "torch-cpu.hl.softmax"} <= set(
        callees
    )
    assert any(c.startswith("numpy.") for c in callees), callees
    assert selection.seconds > 0

    calls = []

    def counting(kernel, inputs, attrs, result_types):
        assert all(isinstance(t, torch.Tensor) for t in inputs)
        calls.append(kernel.name)
        return torch_backend.TENSOR_RUN[kernel.name](inputs, attrs, result_types)

    torch_cpu = BACKENDS["torch-cpu"]
    backends = {
        **BACKENDS,
        "torch-cpu": type(torch_cpu)("torch-cpu", counting, torch_cpu.adopt, torch_cpu.release),
    }
    reference = tgc.parse(MIXED).funcs[0]
    for seed in SEEDS:
        inputs = random_inputs(reference, np.random.default_rng(seed))
        (want,) = run_function(reference, inputs, "f64")
        (got,) = run_plan(func, inputs, backends)
        assert got.dtype == np.float32
        assert rel_error(got, want) <= 1e-5
    assert sorted(set(calls)) == sorted(c for c in set(callees) if c.startswith("torch-cpu."))


def test_a_wrong_torch_kernel_makes_the_mixed_plan_wrong():
    """The check above can fail: the same plan with torch's softmax over the wrong axis."""
    from tgc.planner.cost import DictCostSource, RooflineCostSource
    from tgc.planner.executor import run_plan
    from tgc.planner.select import select_kernels

    module = tgc.parse(MIXED)
    func = module.funcs[0]
    costs = DictCostSource({"torch-cpu.hl.softmax": 1e-9}, fallback=RooflineCostSource())
    select_kernels(func, costs, tolerance=1e-5, backends=("numpy", "torch"))
    name = "torch-cpu.hl.softmax"
    good = torch_backend.TENSOR_RUN[name]
    torch_backend.TENSOR_RUN[name] = torch_backend.tensor_run("hl.softmax", _softmax_on_axis_0)
    try:
        reference = tgc.parse(MIXED).funcs[0]
        inputs = random_inputs(reference, np.random.default_rng(3))
        (want,) = run_function(reference, inputs, "f64")
        (got,) = run_plan(func, inputs)
    finally:
        torch_backend.TENSOR_RUN[name] = good
    assert rel_error(got, want) > 1e-2


def test_attention_broadcasts_its_batches_without_torchs_python_reference(monkeypatch):
    """torch.broadcast_shapes runs PyTorch's Python reference implementation (14 us a call on
    the host, where a GPU attention takes tens of us; its first call imports sympy, about 1 s):
    the kernel broadcasts with numpy's, and only where the batches differ."""

    def refused(*shapes):
        raise AssertionError("torch.broadcast_shapes called")

    monkeypatch.setattr(torch, "broadcast_shapes", refused)
    rng = np.random.default_rng(0)
    for text in _attention_instances("hl.attention", rng, "f32"):
        func = parse(text)
        check_kernel_on(KERNELS["torch-cpu.hl.attention"], func, random_inputs(func, rng))
