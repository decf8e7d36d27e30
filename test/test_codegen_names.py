"""IR names in generated source (issue 10, items 1 and 4): whatever a function, kernel or
argument is called, `tgc-translate --emit=cuda` writes a .cu that nvcc compiles, that holds no
IR text raw, and whose symbols are distinct (its kernels are named after their functions); DOT
output stays well formed; a zero-size tensor is refused by the standalone emitter with a located
diagnostic."""

from __future__ import annotations

import re
import shutil
import subprocess

import pytest

from tgc.codegen.dot import emit_dot
from tgc.codegen.kernels import module_names
from tgc.codegen.names import (
    COMMENT_LIMIT,
    LABEL_LIMIT,
    MAX_IDENTIFIER,
    NameAllocator,
    c_identifier,
    c_string_literal,
    comment_text,
    display_name,
    dot_string,
)
from tgc.diagnostics import TgcError
from tgc.parser import parse_module
from tgc.pass_manager import PassManager
from tgc.planner.standalone import emit_standalone_cuda as emit_planned
from tgc.verifier import verify

NVCC = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")
CC = shutil.which("cc") or shutil.which("gcc")
DOT = shutil.which("dot")


def emit_standalone_cuda(module, source_name: str = "<module>") -> str:
    """`tgc-translate --emit=cuda`: `lower-for-planning`, then the emitter (which plans)."""
    PassManager.from_text("lower-for-planning").run(module)
    return emit_planned(module, source_name)


HOSTILE = {
    "injection": 'f\n#define X\nstatic int x = system("echo owned");\n//',
    "quote": "say \"hi\" 'there'",
    "comment_end": "a*/b/*c*/",
    "backslash": "back\\slash\\",
    "line_splice": "splice\\\nnext",
    "percent": "p%s%n%d%%",
    "nul": "nul\x00byte",
    "long": "y" * 10_000,
    "non_ascii": "ünïcødé→名前😀",
    "trigraph": "t??/??=??'",
    "controls": "\r\t\v\f\x1b[31m\x7f",
    "digit_first": "0starts",
    "keyword": "int",
    "reserved": "__global__",
    "only_symbols": "!!!",
}
# Names whose raw text must not appear in a generated file: those with a character that means
# something in C (a plain word like "int" or "!!!" may stand in a comment), and the long one.
UNSAFE = [n for n in HOSTILE.values() if display_name(n) != n or len(n) > COMMENT_LIMIT]

FUNC = """func.func @{fname}(%x: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4xf32>) {{
  %c = atomic.constant {{value = dense<[1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0]> : tensor<8xf32>}} : () -> tensor<8xf32>
  %e = atomic.exp %x : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %y = atomic.mul %e, %c : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %s = atomic.reduce_sum %y {{axes = [-1]}} : (tensor<4x8xf32>) -> tensor<4xf32>
  func.return %y, %s : tensor<4x8xf32>, tensor<4xf32>
}}
"""
# The kernel the plan makes of FUNC's body (one row reduction writing both results), named
# after its function: `<function>_<ops>`.
OPS = "_exp_mul_reduce_sum"


def named_module(func_names: list[str]):
    """One function per name (a constant, elementwise ops and a reduction the plan makes one
    kernel of), names set after parsing so that any string works; argument name hints are the
    function's name too."""
    text = "\n".join(FUNC.format(fname=f"f{i}") for i in range(len(func_names)))
    module = parse_module(text)
    for func, name in zip(module.funcs, func_names):
        func.attributes["sym_name"] = name
        func.body.args[0].name_hint = name
    verify(module)
    return module


def nvcc(tmp_path, source: str, *flags: str, link: bool = False) -> None:
    src = tmp_path / "m.cu"
    src.write_text(source)
    out = ["-o", str(tmp_path / "m")] if link else ["-c", "-o", str(tmp_path / "m.o")]
    proc = subprocess.run(
        [NVCC, "-arch=sm_90", *flags, str(src), *out], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, proc.stderr[-4000:]


def function_symbols(source: str) -> dict[str, str]:
    """The comment form of each function's IR name -> its host function's C symbol."""
    found = re.findall(
        r"^// ---- @(.*): .*\n(?:.*\n)*?extern \"C\" cudaError_t (\w+)\(", source, re.MULTILINE
    )
    return dict(found)


def kernel_symbols(source: str) -> list[str]:
    return re.findall(r'extern "C" __global__ void __launch_bounds__\(\d+\) (\w+)\(', source)


def undisplay(text: str) -> str:
    """The inverse of display_name (without a limit): proves that it loses nothing."""
    return re.sub(
        r"\\x([0-9a-f]{2})|\\u([0-9a-f]{4})|\\U([0-9a-f]{8})",
        lambda m: chr(int(next(g for g in m.groups() if g), 16)),
        text,
    )


# -- the escapers ---------------------------------------------------------------------------------


@pytest.mark.parametrize("key", sorted(HOSTILE))
def test_c_identifier_is_a_plain_short_identifier(key):
    for prefix in ("tgc_", "tgc_run_"):
        ident = c_identifier(HOSTILE[key], prefix)
        assert re.fullmatch(r"[A-Za-z][A-Za-z0-9]*(_[A-Za-z0-9]+)*", ident), ident
        assert ident.startswith(prefix) and len(ident) <= MAX_IDENTIFIER


def test_long_names_sharing_a_prefix_stay_distinct():
    a, b = "n" * 120 + "a" * 10, "n" * 120 + "b" * 10
    ia, ib = c_identifier(a), c_identifier(b)
    assert ia != ib and len(ia) == len(ib) == MAX_IDENTIFIER
    assert c_identifier(a) == ia  # the hash is of the name: the same name, the same symbol


@pytest.mark.parametrize("key", sorted(HOSTILE))
def test_display_name_is_inert_ascii_and_loses_nothing(key):
    name = HOSTILE[key]
    shown = display_name(name)
    assert undisplay(shown) == name
    assert all(" " <= c <= "~" for c in shown)
    assert not set('"%?*') & set(shown)
    assert re.fullmatch(r"([^\\]|\\[xuU])*", shown), "a backslash that is not an escape"
    comment = comment_text(name)
    assert "\n" not in comment and "*/" not in comment and not comment.endswith("\\")
    assert len(comment) <= COMMENT_LIMIT * 10 + 40


def test_comment_text_says_how_long_a_cut_name_was():
    assert comment_text("z" * 500) == "z" * COMMENT_LIMIT + "... (500 characters)"


@pytest.mark.skipif(CC is None, reason="no C compiler")
def test_c_string_literal_holds_exactly_the_utf8_bytes(tmp_path):
    """A C program prints each literal (sizeof - 1 bytes, so NUL counts): the bytes must be the
    UTF-8 of the text."""
    texts = list(HOSTILE.values()) + ["\\x41B", "??/", "\\", '"']
    body = "\n".join(
        f"  {{ static const char s[] = {c_string_literal(t)}; fwrite(s, 1, sizeof s - 1, stdout); "
        'fputs("\\n--sep--\\n", stdout); }'
        for t in texts
    )
    src = tmp_path / "lit.c"
    src.write_text(f"#include <stdio.h>\nint main(void) {{\n{body}\n  return 0;\n}}\n")
    subprocess.run([CC, str(src), "-o", str(tmp_path / "lit")], check=True, capture_output=True)
    out = subprocess.run([str(tmp_path / "lit")], check=True, capture_output=True).stdout
    got = out.split(b"\n--sep--\n")[:-1]
    assert got == [t.encode("utf-8") for t in texts]


def test_dot_string_escapes_what_a_dot_label_interprets():
    assert dot_string('a"b%') == '"a\\"b%"'
    assert dot_string("l\\N\n名") == '"l\\\\x5cN\\\\x0a名"'


# -- the name allocator ---------------------------------------------------------------------------


def test_allocator_suffixes_names_that_sanitise_alike():
    names = NameAllocator()
    got = [names.allocate(n) for n in ("f.x", "f_x", "f x", "f_x_1")]
    assert got == ["tgc_f_x", "tgc_f_x_1", "tgc_f_x_2", "tgc_f_x_1_1"]


def test_allocator_keeps_derived_names_free():
    """A function whose `<f>_scratch_bytes` is already a symbol moves aside, and the reverse."""
    names = NameAllocator()
    first = names.allocate("f_scratch_bytes", "tgc_run_")
    f = names.allocate("f", "tgc_run_", ["{}_scratch_bytes"])
    assert first == "tgc_run_f_scratch_bytes" and f == "tgc_run_f_1"
    assert names.allocate("f_1_scratch_bytes", "tgc_run_") != "tgc_run_f_1_scratch_bytes"


def test_allocator_never_reuses_a_prelude_name():
    names = module_names()
    for taken in ("max", "min", "hash", "uniform", "cvt", "warp_reduce", "vload"):
        assert names.allocate(taken) != f"tgc_{taken}"


# -- whole files ----------------------------------------------------------------------------------


def hostile_cuda() -> str:
    return emit_standalone_cuda(named_module(list(HOSTILE.values())), "in\nput*/.tg")


def test_hostile_names_never_reach_the_cu_raw():
    src = hostile_cuda()
    for name in UNSAFE:
        assert name not in src, f"raw IR name {name[:40]!r} in the .cu"
    assert "in\nput" not in src and "*/" not in src  # the source name goes through comment_text
    assert not re.search(r"^\s*#\s*define\s+X\b", src, re.MULTILINE)
    assert not re.search(r"^\s*static int x", src, re.MULTILINE)
    # Every printf the functions' main()s make has a fixed format; the name is an argument.
    prints = [
        line.strip() for line in src.splitlines() if "printf(" in line and "fprintf" not in line
    ]
    assert len(prints) == 2 * len(HOSTILE)
    fixed = re.compile(
        r'printf\("%s result [01]: sum=%\.9e abs_sum=%\.9e\\n", "[^"\\]*(\\.[^"\\]*)*", sum, abs_sum\);'
    )
    assert all(fixed.fullmatch(p) for p in prints), prints
    # Each function has its own host function and kernel; no symbol is defined twice.
    funcs = function_symbols(src)
    assert sorted(funcs) == sorted(comment_text(n) for n in HOSTILE.values())
    symbols = list(funcs.values()) + kernel_symbols(src)
    assert len(set(symbols)) == len(symbols) == 2 * len(HOSTILE)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_hostile_names_compile_and_link_with_nvcc(tmp_path):
    src = hostile_cuda()
    nvcc(tmp_path, src)
    nvcc(tmp_path, src, "-DTGC_STANDALONE_MAIN", link=True)
    # After preprocessing (comments gone), the injected code is nowhere outside string literals.
    proc = subprocess.run(
        [NVCC, "-arch=sm_90", "-E", "-DTGC_STANDALONE_MAIN", str(tmp_path / "m.cu")],
        capture_output=True,
        text=True,
        check=True,
    )
    code = re.sub(r'"([^"\\\n]|\\.)*"', '""', proc.stdout)
    assert "echo owned" in proc.stdout and "echo owned" not in code
    assert not re.search(r"=\s*system\s*\(", code)


@pytest.mark.skipif(DOT is None, reason="Graphviz is not installed")
def test_hostile_names_give_dot_that_graphviz_lays_out():
    text = emit_dot(named_module(list(HOSTILE.values())))
    proc = subprocess.run([DOT, "-Tplain"], input=text, capture_output=True, text=True, check=False)
    assert proc.returncode == 0 and not proc.stderr, proc.stderr[-2000:]
    nodes = re.findall(r"^\s*n\d+ \[label=", text, re.MULTILINE)
    assert len(nodes) > len(HOSTILE) and proc.stdout.count("\nnode ") == len(nodes)


def test_hostile_names_give_well_formed_dot():
    """Outside its quoted strings the DOT text is tgc's own tokens only; no string holds a raw
    control character or an unescaped quote, and no label is longer than LABEL_LIMIT plus the
    note that says how long the text was."""
    text = emit_dot(named_module(list(HOSTILE.values())))
    assert "y" * (LABEL_LIMIT + 1) not in text
    string = r'"(?:[^"\\\n]|\\.)*"'
    assert all(s.isprintable() for s in re.findall(string, text))
    rest = re.sub(string, " STRING ", text)
    assert re.fullmatch(r"[A-Za-z0-9_\s{}\[\];,=>-]*", rest), "stray characters outside strings"
    words = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", rest))
    ours = {"digraph", "subgraph", "tgc", "node", "label", "shape", "fontname", "box"}
    ours |= {"monospace", "ellipse", "STRING"}
    assert {w for w in words if not re.fullmatch(r"(cluster_)?n\d+", w)} <= ours
    for name in HOSTILE.values():
        if any(not c.isprintable() or c in '"\\' for c in name):
            assert name not in text


def collisions() -> list[str]:
    """Function names whose symbols (host functions, their derived names, kernels named after
    them) sanitise alike or would take another's."""
    long_a, long_b = "n" * 120 + "a" * 10, "n" * 120 + "b" * 10
    return [
        "f.x",
        "f_x",
        long_a,
        long_b,
        "g",
        "g_scratch_bytes",  # g's derived tgc_run_g_scratch_bytes
        "h",
        "g" + OPS,  # host function tgc_run_g_exp_mul_reduce_sum ...
        "run_g",  # ... which run_g's kernel would be
        "x" + OPS,  # main() helper tgc_main_tgc_run_x_exp_mul_reduce_sum ...
        "main_tgc_run_x",  # ... which this function's kernel would be
    ]


def test_colliding_names_get_distinct_symbols():
    funcs = collisions()
    src = emit_standalone_cuda(named_module(funcs))
    symbols = function_symbols(src)
    assert len(set(symbols.values())) == len(funcs)
    assert symbols["f.x"] != symbols["f_x"]
    long_syms = [s for n, s in symbols.items() if n.startswith("nnn")]
    assert len(set(long_syms)) == 2 and all(len(s) <= MAX_IDENTIFIER + 2 for s in long_syms)
    ks = kernel_symbols(src)
    assert len(set(ks)) == len(ks) == len(funcs)
    every = [*symbols.values(), *ks]
    every += [f"{s}_scratch_bytes" for s in symbols.values()] + [
        f"tgc_main_{s}" for s in symbols.values()
    ]
    assert len(set(every)) == len(every)
    # Host functions keep `tgc_run_<f>` (the file's interface); the kernels move aside.
    assert symbols["g"] == "tgc_run_g" and symbols["h"] == "tgc_run_h"
    assert symbols["g" + OPS] == "tgc_run_g" + OPS
    assert "tgc_run_g" + OPS not in ks and "tgc_main_tgc_run_x" + OPS not in ks
    assert {"tgc_run_g" + OPS + "_1", "tgc_main_tgc_run_x" + OPS + "_1"} <= set(ks)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_colliding_names_compile_with_nvcc(tmp_path):
    src = emit_standalone_cuda(named_module(collisions()))
    nvcc(tmp_path, src)
    nvcc(tmp_path, src, "-DTGC_STANDALONE_MAIN", link=True)


# -- zero-size tensors ----------------------------------------------------------------------------

ZERO = """func.func @f(%x: tensor<0x8xf32>) -> tensor<0x8xf32> {
  %y = hl.softmax %x : (tensor<0x8xf32>) -> tensor<0x8xf32>
  func.return %y : tensor<0x8xf32>
}
"""
ZERO_ELEMENTWISE = """func.func @f(%x: tensor<4xf32>) -> tensor<0x4xf32> {
  %e = atomic.exp %x : (tensor<4xf32>) -> tensor<4xf32>
  %b = atomic.broadcast %e : (tensor<4xf32>) -> tensor<0x4xf32>
  func.return %b : tensor<0x4xf32>
}
"""


@pytest.mark.parametrize(
    "text,line,col",
    [(ZERO, 2, 8), (ZERO_ELEMENTWISE, 3, 8)],
    ids=["softmax", "broadcast"],
)
def test_zero_size_is_refused_at_the_op(text, line, col):
    with pytest.raises(TgcError) as e:
        emit_standalone_cuda(parse_module(text, "z.tg"))
    assert "zero-size tensors are not supported on the cuda backend" in str(e.value)
    assert (e.value.loc.line, e.value.loc.col) == (line, col)
