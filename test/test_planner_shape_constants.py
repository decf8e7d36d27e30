"""A graph kernel whose reference is written at one size matches programs of other sizes where
its constants are functions of a dimension (`Kernel.shape_constants`; planner/kernel.py
`shape_constant`, planner/match.py): issue 27's layernorm written at 4x8 never matched a
768-wide model, its mean's divisor (8, written as `* 0.125` by canonicalize) compared by value
with the program's `/ 768`."""

from __future__ import annotations

import numpy as np
import pytest

import tgc
from tgc.attributes import DenseAttr
from tgc.pass_manager import PassManager
from tgc.planner import load_backends
from tgc.planner.blocks import localize_sources
from tgc.planner.kernel import KERNELS, Kernel, Lowered, register_kernel, unregister_kernel
from tgc.planner.match import find_matches
from tgc.planner.options import live_ops
from tgc.planner.profile import Instance, measure, reference_function
from tgc.planner.select import prepare

load_backends(["numpy"])

LAYERNORM_4x8 = """func.func @ln(%x: tensor<4x8xf32>, %g: tensor<8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
  %y = hl.layernorm %x, %g, %b {axis = -1, eps = 1.0e-05} : (tensor<4x8xf32>, tensor<8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  func.return %y : tensor<4x8xf32>
}"""  # noqa: E501


def program(width: int, rows: int = 16) -> str:
    t, v = f"tensor<{rows}x{width}xf32>", f"tensor<{width}xf32>"
    return f"""func.func @f(%x: {t}, %g: {v}, %b: {v}) -> {t} {{
  %y = hl.layernorm %x, %g, %b {{axis = -1, eps = 1.0e-05}} : ({t}, {v}, {v}) -> {t}
  func.return %y : {t}
}}"""


def layernorm(inputs, attrs, result_types):
    x, g, b = (a.astype(np.float64) for a in inputs)
    m = x.mean(-1, keepdims=True)
    v = ((x - m) ** 2).mean(-1, keepdims=True)
    return [((x - m) / np.sqrt(v + 1e-5) * g + b).astype(result_types[0].dtype)]


def registered(shape_constants: bool):
    k = register_kernel(
        Kernel(
            "test.layernorm",
            "numpy",
            reference=Lowered(LAYERNORM_4x8),
            run=layernorm,
            max_rel_error=1e-6,
            shape_constants=shape_constants,
        )
    )
    yield k
    unregister_kernel(k.name)


@pytest.fixture(params=[True, False], ids=["shape-constants", "by-value"])
def kernel(request):
    yield from registered(request.param)


@pytest.fixture
def sized_kernel():
    yield from registered(True)


def planned(text: str):
    """The function as select-kernels matches it: lowered, canonical, constants localized."""
    module = tgc.parse(text)
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    prepare(func)
    localize_sources(func.body, live_ops(func.body))
    return func


def matched(func, kernel) -> list:
    return [m for ms in find_matches(func.body, [kernel]).values() for m in ms]


@pytest.mark.parametrize("width", [768, 12, 8, 1000])
def test_a_reference_written_at_4x8_matches_other_widths_with_shape_constants(kernel, width):
    found = matched(planned(program(width)), kernel)
    if kernel.shape_constants or width == 8:
        assert len(found) == 1 and len(found[0].ops) == 11  # the whole lowered layernorm
        assert [v.name_hint for v in found[0].inputs] == ["x", "g", "b"]
    else:
        assert found == []  # compared by value, 8 is not 768


def test_a_divisor_that_is_not_the_width_does_not_match(kernel):
    """The program divides by 700 over a 768-wide axis: not a mean, not the kernel."""
    text = program(768).replace("hl.layernorm", "hl.layernorm")
    func = planned(text)
    divisor = next(
        op
        for op in func.body.ops
        if op.name == "atomic.constant" and op.attr("value").array.reshape(-1)[0] == 768
    )
    t = divisor.results[0].type
    divisor.attributes["value"] = DenseAttr(np.full(t.shape, 700.0, np.float32), t)
    assert matched(func, kernel) == []


def test_the_instance_is_checked_against_its_reference_at_the_program_size(sized_kernel):
    """The reference instantiated at 16x768 scales by 1/768 where it was written with 1/8
    (else the right kernel would fail its check); the measurement of the kernel passes that
    check on fresh inputs."""
    (m,) = matched(planned(program(768)), sized_kernel)
    inst = Instance(sized_kernel, tuple(v.type for v in m.inputs), (m.outputs[0].type,))
    constants = [
        op.attr("value").array.reshape(-1)[0]
        for op in reference_function(inst).body.ops
        if op.name == "atomic.constant"
    ]
    assert np.float32(1 / 768) in constants and np.float32(0.125) not in constants
    result = measure(inst, 0.001)
    assert result.ok, result.message
    assert result.max_error < 1e-5


def test_literal_constants_are_not_shape_constants_by_default():
    """numpy.gelu_tanh's 0.5 is a literal (1/2 of a size-2 dimension only by chance): the
    built-in kernels compare constants by value."""
    assert not any(k.shape_constants for k in KERNELS.values())
