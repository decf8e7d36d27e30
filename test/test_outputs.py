"""Outputs never overwrite inputs (issue 23, item 8): tgc-translate, tgc-import, tgc-opt and
tgc-run refuse an `-o` that is their input (by path, by symbolic or hard link) in one line,
before anything is written, and check an `-o` that cannot be a file (a folder) before writing
weights; tgc-db refuses to export or plot onto the measurement database (or a file sqlite keeps
beside it) and to import the database into itself. `-o /dev/null` still discards."""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import numpy as np
import pytest

from tgc.tools import db as dbtool
from tgc.tools import import_ as import_tool
from tgc.tools import opt, run, translate

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


# -- tgc-opt, tgc-run ------------------------------------------------------------------------------


@pytest.mark.parametrize("spelling", ["same", "dot-slash", "symlink", "hardlink"])
def test_opt_refuses_to_write_over_its_input(program, spelling, capsys, monkeypatch):
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
    assert opt.main(["s.tg", "-p", "optimize", "-o", out]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"refusing to write output file '{out}': it is the input 's.tg'" in line
    assert snapshot(folder) == before


def test_opt_refuses_a_weights_file_and_a_database_it_reads(tmp_path, capsys):
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
    (tmp_path / "m.sqlite").write_bytes(b"")
    before = snapshot(tmp_path)
    assert opt.main([str(src), "-o", str(tmp_path / "w.npy")]) == 1
    assert "it is the input" in one_error_line(capsys.readouterr().err)
    db = tmp_path / "m.sqlite"
    pipeline = f"select-kernels{{db={db} backends=numpy}}"
    assert opt.main([str(src), "-p", pipeline, "-o", str(db)]) == 1
    assert f"it is the input '{db}'" in one_error_line(capsys.readouterr().err)
    assert snapshot(tmp_path) == before


@pytest.mark.parametrize("tool", ["opt", "translate"])
def test_dev_null_still_discards_the_output(program, tool, capsys):
    argv = [str(program), "-o", os.devnull]
    if tool == "translate":
        argv.append("--emit=dot")
    assert {"opt": opt, "translate": translate}[tool].main(argv) == 0


def test_run_refuses_a_result_file_that_is_an_input(program, capsys):
    folder = program.parent
    x = np.ones((8, 768), np.float32)  # examples/mlp.tg's %x
    np.save(folder / "result_0.npy", x)
    before = snapshot(folder)
    code = run.main(
        [str(program), "--input", f"x={folder / 'result_0.npy'}", "--random-inputs", "0",
         "-o", str(folder)]
    )  # fmt: skip
    assert code == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"refusing to write result file '{folder / 'result_0.npy'}': it is the input" in line
    assert snapshot(folder) == before
    out = folder / "out"
    code = run.main(
        [str(program), "--input", f"x={folder / 'result_0.npy'}", "--random-inputs", "0",
         "-o", str(out)]
    )  # fmt: skip
    assert code == 0 and (out / "result_0.npy").exists()


# -- tgc-db ----------------------------------------------------------------------------------------


@pytest.fixture
def database(tmp_path):
    """A measurement database with one record, and its bytes."""
    from tgc.planner import load_backends
    from tgc.planner.db import Database
    from tgc.tools import profile as profiletool

    load_backends(["numpy"])
    path = tmp_path / "m.sqlite"
    exp = ROOT / "test" / "lit" / "tgc-db" / "Inputs" / "exp.tg"
    argv = [
        str(exp),
        "--db",
        str(path),
        "--kernel-backend",
        "numpy",
        "--min-time",
        "0.001",
        "--quiet",
    ]
    assert profiletool.main(argv) == 0
    with Database.open(str(path), readonly=True) as db:
        assert len(db.rows()) == 1
    return path


@pytest.mark.parametrize(
    "spelling, which",
    [
        ("same", "the measurement database"),
        ("dot-slash", "the measurement database"),
        ("symlink", "the measurement database"),
        ("hardlink", "the measurement database"),
        ("journal", "a file sqlite keeps beside the database"),
        ("wal", "a file sqlite keeps beside the database"),
    ],
)
@pytest.mark.parametrize("command", ["export", "plot"])
def test_tgc_db_refuses_to_write_over_the_database(
    database, spelling, which, command, capsys, monkeypatch
):
    folder = database.parent
    monkeypatch.chdir(folder)
    out = {
        "same": "m.sqlite",
        "dot-slash": "./m.sqlite",
        "symlink": "link.sqlite",
        "hardlink": "hard.sqlite",
        "journal": "m.sqlite-journal",
        "wal": "m.sqlite-wal",
    }[spelling]
    if spelling == "symlink":
        os.symlink("m.sqlite", "link.sqlite")
    if spelling == "hardlink":
        os.link("m.sqlite", "hard.sqlite")
    before = snapshot(folder)
    argv = ["--db", "m.sqlite", "export", "-o", out]
    if command == "plot":
        argv = ["--db", "m.sqlite", "plot", "numpy.atomic.exp", "-o", out]
    assert dbtool.main(argv) == 1
    line = one_error_line(capsys.readouterr().err)
    assert f"refusing to write {command} file '{out}': it is {which} 'm.sqlite'" in line
    assert snapshot(folder) == before
    assert dbtool.main(["--db", "m.sqlite", "list"]) == 0  # every record still there
    assert "1 record(s)" in capsys.readouterr().out


def test_tgc_db_export_to_a_file_and_to_dev_null_still_works(database, capsys):
    out = database.parent / "e.json"
    assert dbtool.main(["--db", str(database), "export", "-o", str(out)]) == 0
    assert '"tgc-measurements"' in out.read_text()
    assert dbtool.main(["--db", str(database), "export", "-o", os.devnull]) == 0


@pytest.mark.parametrize("spelling", ["same", "symlink"])
def test_tgc_db_refuses_to_import_the_database_into_itself(database, spelling, capsys):
    folder = database.parent
    source = database
    if spelling == "symlink":
        source = folder / "link.sqlite"
        os.symlink(database, source)
    before = snapshot(folder)
    assert dbtool.main(["--db", str(database), "import", str(source)]) == 1
    line = one_error_line(capsys.readouterr().err)
    assert (
        f"refusing to import '{source}': it is the measurement database '{database}', the one "
        "being imported into" in line
    )
    assert snapshot(folder) == before


def test_tgc_db_list_and_show_escape_names_from_the_database(database, capsys):
    """A record imported with a newline and ESC in its kernel name, signature and device
    description is listed escaped: no forged line, no control reaching the terminal."""
    import json

    export = database.parent / "e.json"
    assert dbtool.main(["--db", str(database), "export", "-o", str(export)]) == 0
    data = json.loads(export.read_text())
    evil = "evil\x1b[2J\nforged line"
    data["kernels"][0]["name"] = evil
    data["measurements"][0]["kernel"][0] = evil
    data["measurements"][0]["signature"] = "sig\x1b[31m\nX"
    data["devices"][0]["description"]["cpu"] = "cpu\x07\nforged"
    export.write_text(json.dumps(data))
    other = database.parent / "n.sqlite"
    assert dbtool.main(["--db", str(other), "import", str(export)]) == 0
    capsys.readouterr()
    assert dbtool.main(["--db", str(other), "list"]) == 0
    assert dbtool.main(["--db", str(other), "show", evil]) == 0
    out = capsys.readouterr().out
    assert "\x1b" not in out and "\x07" not in out
    assert "forged" not in "".join(line[:7] for line in out.splitlines())  # no line starts so
    assert "evil\\x1b[2J\\nforged line" in out
    assert "sig\\x1b[31m\\nX" in out
    assert "cpu\\x07\\nforged" in out
