"""Kernel plugins (planner/plugins.py): installed ones come through the `tgc.kernels` entry
point group, a broken one is a warning and the tool goes on; every kernel is checked at the
shapes its reference was written at and at two others before it is registered."""

from __future__ import annotations

import types
from pathlib import Path

import numpy as np
import pytest

import tgc
from tgc.diagnostics import TgcError
from tgc.planner import plugins
from tgc.planner.kernel import KERNELS, Kernel, unregister_kernel

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "kernels" / "layernorm_numpy.py"

SCALE = """func.func @twice(%x: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %c = atomic.constant {value = dense<2.0> : tensor<f32>} : () -> tensor<f32>
  %y = atomic.mul %x, %c : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  func.return %y : tensor<4x8xf32>
}"""


class EntryPoint:
    """What importlib.metadata gives for one entry point: name, value, load()."""

    def __init__(self, name: str, value: str, target) -> None:
        self.name, self.value, self._target = name, value, target

    def load(self):
        if isinstance(self._target, Exception):
            raise self._target
        return self._target


def twice_kernel(name: str, run) -> Kernel:
    return Kernel(name, "numpy", reference=SCALE, run=run, max_rel_error=0.0)


@pytest.fixture(autouse=True)
def clean_registry():
    tgc.load_all()
    before = set(KERNELS)
    yield
    for name in set(KERNELS) - before:
        unregister_kernel(name)


def test_an_installed_plugin_is_loaded_and_checked():
    module = types.SimpleNamespace(
        tgc_kernels=lambda: [twice_kernel("pkg.twice", lambda ins, a, outs: [ins[0] * 2])]
    )
    loaded = plugins.load_plugins([], [EntryPoint("twice", "pkg.kernels", module)])
    assert [k.name for k in loaded] == ["pkg.twice"] and "pkg.twice" in KERNELS


def test_a_broken_installed_plugin_is_a_warning(capsys):
    wrong = types.SimpleNamespace(
        tgc_kernels=lambda: [twice_kernel("pkg.thrice", lambda ins, a, outs: [ins[0] * 3])]
    )
    points = [
        EntryPoint("gone", "pkg.gone", ImportError("No module named 'pkg.gone'")),
        EntryPoint("wrong", "pkg.wrong", wrong),
    ]
    assert plugins.load_plugins([], points) == []
    err = capsys.readouterr().err.splitlines()
    assert (
        err[0]
        == "tgc: warning: kernels of 'pkg.gone' left out: ImportError: No module named 'pkg.gone'"
    )
    assert err[1].startswith("tgc: warning: kernels of 'pkg.wrong' (entry point wrong) left out: ")
    assert "kernel 'pkg.thrice' is wrong on tensor<4x8xf32>: result 0 [0, 0] is" in err[1]
    assert "pkg.thrice" not in KERNELS  # refused, not left registered


def test_a_kernel_wrong_only_at_other_sizes_is_refused():
    """Right on the 4x8 its reference was written at, wrong where a size grows: the check at
    sizes s + 3 and 2s + 1 finds it, at the first wrong element."""

    def right_up_to_8_wide(ins, attrs, outs):
        y = ins[0] * 2
        y[:, 8:] = 0
        return [y]

    kernel = twice_kernel("user.twice", right_up_to_8_wide)
    with pytest.raises(TgcError) as e:
        plugins._install([kernel], "mine.py")
    assert e.value.message.startswith(
        "--kernels: mine.py: kernel 'user.twice' is wrong on tensor<7x11xf32>: result 0 [0, 8] is 0 "
        "where the reference gives "
    )
    assert "user.twice" not in KERNELS


def test_the_example_plugin_loads_from_its_file():
    (kernel,) = plugins.load_plugins([str(EXAMPLE)])
    assert kernel.name == "user.layernorm" and kernel.shape_constants
    x = np.random.default_rng().standard_normal((3, 5)).astype(np.float32)
    g, b = np.ones(5, np.float32), np.zeros(5, np.float32)
    from tgc.types import TensorType

    (y,) = kernel.run([x, g, b], {}, [TensorType.get((3, 5), "f32")])
    want = (x - x.mean(-1, keepdims=True)) / np.sqrt(x.var(-1, keepdims=True) + 1e-5)
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-5)


def test_the_tools_read_the_entry_point_group(monkeypatch):
    """Every tool that plans hands the installed `tgc.kernels` entry points to the loader."""
    import argparse
    import importlib.metadata

    from tgc.tools import _common

    module = types.SimpleNamespace(
        tgc_kernels=lambda: [twice_kernel("pkg.twice2", lambda ins, a, outs: [ins[0] * 2])]
    )
    groups = []

    def entry_points(group):
        groups.append(group)
        return [EntryPoint("twice", "pkg.kernels", module)]

    monkeypatch.setattr(importlib.metadata, "entry_points", entry_points)
    seen = []
    assert _common.with_kernels(lambda a: seen.append(a) or 0, argparse.Namespace(kernels=[])) == 0
    assert groups == ["tgc.kernels"] and "pkg.twice2" in KERNELS and len(seen) == 1
