"""Constants in .npy files (`dense_file<"...">`, tgc/datafiles.py): written, read back, computed
with, and kept inside the .tg file's folder."""

from __future__ import annotations

import os

import numpy as np
import pytest

import tgc
from tgc import datafiles
from tgc.attributes import DenseAttr
from tgc.builder import tensor
from tgc.diagnostics import TgcError

RNG = np.random.default_rng()


def _module_text(path: str, ty: str) -> str:
    return (
        f"func.func @f(%x: tensor<{ty}>) -> tensor<{ty}> {{\n"
        f'  %c = atomic.constant {{value = dense_file<"{path}"> : tensor<{ty}>}} : () -> tensor<{ty}>\n'
        f"  %y = atomic.add %x, %c : (tensor<{ty}>, tensor<{ty}>) -> tensor<{ty}>\n"
        f"  func.return %y : tensor<{ty}>\n"
        "}\n"
    )


@pytest.mark.parametrize("elem", ["f32", "f16", "bf16", "i64"])
def test_written_constant_reads_back_and_computes(tmp_path, elem):
    """write() then the parser give the same values (bf16 through its uint16 bits), and the
    interpreter adds them exactly as the in-memory array."""
    ty = tensor(f"5x7x{elem}")
    values = (RNG.standard_normal(ty.shape) * 10).astype(ty.dtype)
    datafiles.write(DenseAttr.in_file(values, ty, "w/c.npy"), tmp_path)
    (tmp_path / "m.tg").write_text(_module_text("w/c.npy", f"5x7x{elem}"))
    module = tgc.parse_file(tmp_path / "m.tg")
    x = (RNG.standard_normal(ty.shape) * 10).astype(ty.dtype)
    (y,) = tgc.run(module, [x])
    expected = (x.astype(np.float64) + values.astype(np.float64)).astype(ty.dtype)
    np.testing.assert_array_equal(y, expected)
    # The module prints the reference, not the values.
    assert 'dense_file<"w/c.npy">' in tgc.print_ir(module)


def test_relative_to_the_file_not_the_working_directory(tmp_path, monkeypatch):
    ty = tensor("3xf32")
    datafiles.write(DenseAttr.in_file(np.ones(3, np.float32), ty, "c.npy"), tmp_path / "model")
    (tmp_path / "model" / "m.tg").write_text(_module_text("c.npy", "3xf32"))
    monkeypatch.chdir(tmp_path)  # c.npy is not here, only beside m.tg
    module = tgc.parse_file("model/m.tg")
    (y,) = tgc.run(module, [np.zeros(3, np.float32) + 2])
    np.testing.assert_array_equal(y, np.full(3, 3, np.float32))


def test_text_without_a_file_resolves_against_the_working_directory(tmp_path, monkeypatch):
    ty = tensor("2xf32")
    datafiles.write(DenseAttr.in_file(np.array([1, 2], np.float32), ty, "c.npy"), tmp_path)
    monkeypatch.chdir(tmp_path)
    module = tgc.parse(_module_text("c.npy", "2xf32"), "<stdin>")
    (y,) = tgc.run(module, [np.array([10, 20], np.float32)])
    np.testing.assert_array_equal(y, np.array([11, 22], np.float32))


def test_symbolic_link_out_of_the_folder_is_refused(tmp_path):
    outside = tmp_path / "outside.npy"
    np.save(outside, np.ones(3, np.float32))
    (tmp_path / "model").mkdir()
    os.symlink(outside, tmp_path / "model" / "c.npy")
    (tmp_path / "model" / "m.tg").write_text(_module_text("c.npy", "3xf32"))
    with pytest.raises(TgcError) as e:
        tgc.parse_file(tmp_path / "model" / "m.tg")
    assert "resolves outside the folder of the .tg file" in str(e.value)
    assert e.value.render().startswith(f"{tmp_path / 'model' / 'm.tg'}:2:")


def test_writing_refuses_a_path_out_of_the_folder(tmp_path):
    ty = tensor("2xf32")
    with pytest.raises(datafiles.DataFileError, match="may not leave the folder"):
        datafiles.write(DenseAttr.in_file(np.ones(2, np.float32), ty, "../x.npy"), tmp_path)
    assert not (tmp_path.parent / "x.npy").exists()


def test_two_references_to_one_file_are_one_constant_for_cse(tmp_path):
    ty = tensor("4xf32")
    datafiles.write(
        DenseAttr.in_file(RNG.standard_normal(4).astype(np.float32), ty, "c.npy"), tmp_path
    )
    text = (
        "func.func @f() -> (tensor<4xf32>, tensor<4xf32>) {\n"
        '  %a = atomic.constant {value = dense_file<"c.npy"> : tensor<4xf32>} : () -> tensor<4xf32>\n'
        '  %b = atomic.constant {value = dense_file<"c.npy"> : tensor<4xf32>} : () -> tensor<4xf32>\n'
        "  func.return %a, %b : tensor<4xf32>, tensor<4xf32>\n"
        "}\n"
    )
    (tmp_path / "m.tg").write_text(text)
    module = tgc.run_pipeline(tgc.parse_file(tmp_path / "m.tg"), "cse")
    assert tgc.print_ir(module).count("dense_file") == 1


def test_file_constants_lists_each_file_once(tmp_path):
    ty = tensor("4xf32")
    datafiles.write(DenseAttr.in_file(np.ones(4, np.float32), ty, "c.npy"), tmp_path)
    (tmp_path / "m.tg").write_text(_module_text("c.npy", "4xf32"))
    module = tgc.parse_file(tmp_path / "m.tg")
    assert [a.file for a in datafiles.file_constants(module)] == ["c.npy"]
