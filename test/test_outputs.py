"""Outputs never overwrite inputs (issue 23, item 8): tgc-translate and tgc-import refuse an `-o`
that is their input (by path, by symbolic or hard link) in one line, before anything is written,
and check an `-o` that cannot be a file (a folder) before writing weights."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from tgc.tools import import_ as import_tool
from tgc.tools import translate

ROOT = Path(__file__).resolve().parent.parent


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, str]:
    return {str(p.relative_to(folder)): digest(p) for p in sorted(folder.rglob("*")) if p.is_file()}


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "Traceback" not in err and "internal error" not in err
    return lines[0]


@pytest.fixture
def program(tmp_path):
    src = tmp_path / "s.tg"
    src.write_text((ROOT / "examples" / "mlp.tg").read_text())
    return src


@pytest.mark.parametrize("emit", ["cuda", "dot"])
@pytest.mark.parametrize("spelling", ["same", "dot-slash", "symlink", "hardlink"])
def test_translate_refuses_to_write_over_its_input(program, emit, spelling, capsys, monkeypatch):
    folder = program.parent
    monkeypatch.chdir(folder)
    out = {"same": "s.tg", "dot-slash": "./s.tg", "symlink": "link.tg", "hardlink": "hard.tg"}[
        spelling
    ]
    if spelling == "symlink":
        os.symlink("s.tg", folder / "link.tg")
    if spelling == "hardlink":
        os.link("s.tg", folder / "hard.tg")
    before = snapshot(folder)
    assert translate.main(["s.tg", f"--emit={emit}", "-o", out]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"refusing to write output file '{out}': it is the input 's.tg'" in line
    assert snapshot(folder) == before


def test_translate_refuses_a_weights_file_it_reads(tmp_path, capsys):
    np.save(tmp_path / "w.npy", np.ones((4, 4), np.float32))
    src = tmp_path / "p.tg"
    src.write_text(
        "func.func @f(%x: tensor<4x4xf32>) -> tensor<4x4xf32> {\n"
        '  %w = atomic.constant {value = dense_file<"w.npy"> : tensor<4x4xf32>} : () -> '
        "tensor<4x4xf32>\n"
        "  %y = atomic.add %x, %w : (tensor<4x4xf32>, tensor<4x4xf32>) -> tensor<4x4xf32>\n"
        "  func.return %y : tensor<4x4xf32>\n"
        "}\n"
    )
    before = snapshot(tmp_path)
    assert translate.main([str(src), "--emit=dot", "-o", str(tmp_path / "w.npy")]) == 1
    assert "it is the input" in one_error_line(capsys.readouterr().err)
    assert snapshot(tmp_path) == before
    assert translate.main([str(src), "--emit=dot", "-o", str(tmp_path / "p.dot")]) == 0


def test_translate_refuses_a_folder_as_output(program, capsys):
    folder = program.parent / "out"
    folder.mkdir()
    assert translate.main([str(program), "--emit=cuda", "-o", str(folder)]) == 1
    assert "it is a directory" in one_error_line(capsys.readouterr().err)
    assert not any(folder.iterdir())


# -- tgc-import --------------------------------------------------------------------------------


@pytest.fixture
def model(tmp_path):
    """A one-node ONNX model with an 8x8 initializer (written to a .npy with --inline-limit 0)."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from onnx_testing import make_model

    w = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    m = make_model(
        [node],
        [("x", TensorProto.FLOAT, [2, 8])],
        [("y", TensorProto.FLOAT, [2, 8])],
        [w],
        opset=17,
    )
    path = tmp_path / "m.onnx"
    path.write_bytes(m.SerializeToString())
    return path


@pytest.mark.parametrize("spelling", ["same", "symlink"])
def test_import_refuses_to_write_over_its_model(model, spelling, capsys, monkeypatch):
    folder = model.parent
    monkeypatch.chdir(folder)
    out = "m.onnx"
    if spelling == "symlink":
        os.symlink("m.onnx", folder / "link.onnx")
        out = "link.onnx"
    before = snapshot(folder)
    assert import_tool.main(["m.onnx", "--inline-limit", "0", "-o", out]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"refusing to write output file '{out}': it is the input 'm.onnx'" in line
    assert snapshot(folder) == before


def test_import_checks_a_folder_output_before_writing_weights(model, capsys):
    folder = model.parent
    (folder / "out").mkdir()
    before = snapshot(folder)
    assert import_tool.main([str(model), "--inline-limit", "0", "-o", str(folder / "out")]) == 1
    assert "it is a directory" in one_error_line(capsys.readouterr().err)
    assert snapshot(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == ["m.onnx", "out"]  # no out.weights/


def test_import_refuses_a_weights_file_that_is_the_model(tmp_path, capsys):
    """-o x.tg writes x.weights/w.npy: if that path is (a link to) the model, it is refused
    before any weights file or the .tg is written."""
    pytest.importorskip("onnx")
    from onnx import TensorProto, helper, numpy_helper
    from onnx_testing import make_model

    w = numpy_helper.from_array(np.arange(64, dtype=np.float32).reshape(8, 8), "w")
    node = helper.make_node("MatMul", ["x", "w"], ["y"])
    m = make_model(
        [node],
        [("x", TensorProto.FLOAT, [2, 8])],
        [("y", TensorProto.FLOAT, [2, 8])],
        [w],
        opset=17,
    )
    weights = tmp_path / "x.weights"
    weights.mkdir()
    model = weights / "w.npy"  # the model itself sits where a weight would be written
    model.write_bytes(m.SerializeToString())
    before = snapshot(tmp_path)
    out = tmp_path / "x.tg"
    assert import_tool.main([str(model), "--inline-limit", "0", "-o", str(out)]) == 1
    assert "refusing to write weights file" in one_error_line(capsys.readouterr().err)
    assert snapshot(tmp_path) == before and not out.exists()


def test_import_to_a_new_file_still_works(model, capsys):
    out = model.parent / "m.tg"
    assert import_tool.main([str(model), "--inline-limit", "0", "-o", str(out)]) == 0
    assert 'dense_file<"m.weights/w.npy">' in out.read_text()
    assert np.array_equal(np.load(model.parent / "m.weights" / "w.npy").ravel(), np.arange(64))
