"""Import and display items of issue 23 (item 10): each crafted input is one located line (never
an internal error), names from models are printed with control characters escaped, an
initializer named like a graph input keeps that input, and an opset newer than the installed
onnx package defines is refused."""

from __future__ import annotations

import os

import numpy as np
import pytest

from tgc.diagnostics import printable
from tgc.runtime.interpreter import run_function
from tgc.tools import import_ as import_tool
from tgc.tools import opt as opt_tool

HOSTILE = "x\n error: forged\x1b[2J\x00"  # a newline that forges a line, ESC, NUL


def one_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert "internal error" not in err and "Traceback" not in err
    assert "\x1b" not in err and "\x00" not in err
    return lines[0]


# -- dense_file paths (no onnx needed) -------------------------------------------------------------


def constant_module(path: str) -> str:
    return (
        "func.func @f() -> tensor<2xf32> {\n"
        f'  %w = atomic.constant {{value = dense_file<"{path}"> : tensor<2xf32>}} : () -> '
        "tensor<2xf32>\n"
        "  func.return %w : tensor<2xf32>\n"
        "}\n"
    )


@pytest.mark.parametrize(
    "path, why",
    [
        ("a\\00b.npy", "data file path 'a\\x00b.npy' holds a NUL character"),
        ("loop1", "data file path 'loop1' cannot be resolved: a symbolic-link loop"),
        ("loop1/w.npy", "data file path 'loop1/w.npy' cannot be resolved: a symbolic-link loop"),
    ],
)
def test_dense_file_nul_and_symlink_loop_are_located_errors(tmp_path, capsys, path, why):
    os.symlink("loop2", tmp_path / "loop1")
    os.symlink("loop1", tmp_path / "loop2")
    src = tmp_path / "m.tg"
    src.write_text(constant_module(path))
    assert opt_tool.main([str(src)]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"{src}:2:44: error: {why}"), err
    assert "internal error" not in err


def test_printable_escapes_controls_and_keeps_the_rest():
    assert printable(HOSTILE) == "x\\n error: forged\\x1b[2J\\x00"
    assert printable("ünïcode ok\t\u2028") == "ünïcode ok\\t\\u2028"
    assert printable("plain 'quoted' name") == "plain 'quoted' name"


# -- ONNX --------------------------------------------------------------------------------------------

onnx = pytest.importorskip("onnx")
from onnx import TensorProto, helper, numpy_helper  # noqa: E402
from onnx_testing import make_model  # noqa: E402

vi = helper.make_tensor_value_info


def save(tmp_path, model, name="m.onnx"):
    path = tmp_path / name
    path.write_bytes(model.SerializeToString())
    return path


def import_error(tmp_path, model, capsys) -> str:
    path = save(tmp_path, model)
    assert import_tool.main([str(path), "-o", "-"]) == 1
    return one_line(capsys.readouterr().err)


def relu(x_info, opset=17, initializers=()):
    y = vi("y", TensorProto.FLOAT, [2, 3])
    node = helper.make_node("Relu", [x_info.name], ["y"])
    g = helper.make_graph([node], "g", [x_info], [y], list(initializers))
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", opset)])


def test_negative_dimension(tmp_path, capsys):
    x = vi("x", TensorProto.FLOAT, [2, 3])
    x.type.tensor_type.shape.dim[1].dim_value = -3
    line = import_error(tmp_path, relu(x), capsys)
    assert line == f"{tmp_path / 'm.onnx'}: error: graph input 'x' has a negative dim -3"


def test_rank_300_input(tmp_path, capsys):
    line = import_error(tmp_path, relu(vi("x", TensorProto.FLOAT, [1] * 300)), capsys)
    assert line.endswith("error: graph input 'x' has rank 300; tgc tensors have at most 64 dims")


def test_opset_newer_than_onnx_knows_is_refused(tmp_path, capsys):
    from onnx.defs import onnx_opset_version

    line = import_error(tmp_path, relu(vi("x", TensorProto.FLOAT, [2, 3]), opset=10000), capsys)
    assert (
        f"the model uses ONNX opset 10000; tgc-import reads opsets 13 to {onnx_opset_version()}"
        in line
    )


@pytest.mark.parametrize("rows", [4, 200])
@pytest.mark.parametrize("known", [False, True])
def test_gather_with_int8_indices(tmp_path, capsys, rows, known):
    """int8 indices into a table of 200 rows: i + 200 does not fit int8 (it was `internal
    error: OverflowError`); they are widened to i64. Checked against np.take on fresh values."""
    rng = np.random.default_rng()
    idx = rng.integers(-min(rows, 128), min(rows, 128), 5).astype(np.int8)
    inputs = [vi("t", TensorProto.FLOAT, [rows, 3])]
    inits = [numpy_helper.from_array(idx, "i")] if known else []
    if not known:
        inputs.append(vi("i", TensorProto.INT8, [5]))
    node = helper.make_node("Gather", ["t", "i"], ["y"])
    model = make_model(
        [node],
        [
            (
                i.name,
                i.type.tensor_type.elem_type,
                [d.dim_value for d in i.type.tensor_type.shape.dim],
            )
            for i in inputs
        ],
        [("y", TensorProto.FLOAT, [5, 3])],
        inits,
        opset=17,
    )
    path, out = save(tmp_path, model), tmp_path / "m.tg"
    assert import_tool.main([str(path), "-o", str(out)]) == 0, capsys.readouterr().err
    import tgc

    func = tgc.parse_file(str(out)).funcs[0]
    table = rng.standard_normal((rows, 3)).astype(np.float32)
    (got,) = run_function(func, [table] if known else [table, idx])
    np.testing.assert_array_equal(got, np.take(table, idx.astype(np.int64), axis=0))


def test_initializer_named_like_an_input_keeps_the_input(tmp_path, capsys):
    """ONNX: an initializer of a graph input is its default value. The input stays an argument
    (it was silently replaced by a constant); with --weights-as-args it is a {tgc.param}."""
    x = vi("x", TensorProto.FLOAT, [2, 3])
    w = numpy_helper.from_array(np.ones((2, 3), np.float32), "x")
    path, out = save(tmp_path, relu(x, initializers=[w])), tmp_path / "m.tg"
    assert import_tool.main([str(path), "-o", str(out)]) == 0, capsys.readouterr().err
    text = out.read_text()
    assert "func.func @g(%x: tensor<2x3xf32>)" in text and "atomic.constant" not in text
    assert import_tool.main([str(path), "--weights-as-args", "-o", str(out)]) == 0
    assert "%x: tensor<2x3xf32> {tgc.param}" in out.read_text()
    # a default that disagrees with the input's declared type is refused
    bad = numpy_helper.from_array(np.ones((3, 2), np.float32), "x")
    line = import_error(
        tmp_path, relu(vi("x", TensorProto.FLOAT, [2, 3]), initializers=[bad]), capsys
    )
    assert "graph input 'x' is declared tensor<2x3xf32>, but its initializer" in line


def test_names_from_the_model_are_escaped(tmp_path, capsys):
    x = vi(HOSTILE, TensorProto.FLOAT, [2, 3])
    x.type.tensor_type.shape.dim[0].dim_param = "b\x1b[2J"
    node = helper.make_node("Relu", [HOSTILE], ["y"])
    g = helper.make_graph([node], "g", [x], [vi("y", TensorProto.FLOAT, [2, 3])])
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    line = import_error(tmp_path, model, capsys)
    assert (
        "graph input 'x\\n error: forged\\x1b[2J\\x00' has a dynamic shape [b\\x1b[2J, 3]" in line
    )

    node = helper.make_node("NonMaxSuppression", ["b", "s"], ["y"], name="n\x1b[31mred\nline")
    g = helper.make_graph(
        [node],
        "g",
        [vi("b", TensorProto.FLOAT, [1, 2, 4]), vi("s", TensorProto.FLOAT, [1, 1, 2])],
        [vi("y", TensorProto.INT64, [1, 3])],
    )
    model = helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])
    line = import_error(tmp_path, model, capsys)
    assert "node 'n\\x1b[31mred\\nline' (NonMaxSuppression)" in line


# -- a crafted torch.export archive (PyTorch only) ---------------------------------------------------


@pytest.fixture(scope="module")
def saved_program(tmp_path_factory):
    torch = pytest.importorskip("torch")

    class AddOne(torch.nn.Module):
        def forward(self, x):
            return torch.relu(x) + 1

    path = tmp_path_factory.mktemp("pt2") / "m.pt2"
    torch.export.save(torch.export.export(AddOne(), (torch.randn(2, 3),)), path)
    return path


def _crafted(saved, out, edit):
    import zipfile

    with zipfile.ZipFile(saved) as z:
        entries = {i.filename: z.read(i.filename) for i in z.infolist()}
    (model,) = [n for n in entries if n.endswith("models/model.json")]
    entries[model] = edit(entries[model].decode()).encode()
    with zipfile.ZipFile(out, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return out


@pytest.mark.parametrize("craft", ["deep-json", "401-digit-shape", "401-digit-argument"])
def test_crafted_torch_export_is_one_line(saved_program, tmp_path, capsys, craft):
    import re

    def edit(text: str) -> str:
        if craft == "deep-json":
            return text[:-1] + ', "x": ' + "[" * 100_000 + "]" * 100_000 + "}"
        if craft == "401-digit-shape":
            return re.sub(r'("as_int": ?)2', lambda m: m.group(1) + "9" * 401, text, count=1)
        at = text.find('"as_int"', text.find('"other"'))
        return text[:at] + '"as_int": ' + "9" * 401 + text[text.find("}", at) :]

    path = _crafted(saved_program, tmp_path / "crafted.pt2", edit)
    assert import_tool.main([str(path), "-o", "-"]) == 1
    one_line(capsys.readouterr().err)
