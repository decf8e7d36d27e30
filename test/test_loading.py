"""Loading is explicit, and a tool starts without what it does not need.

The core (parser, builder, pass manager) knows only what is registered; `tgc.load_all()`
registers tgc's dialects and passes, the `tgc` API and the tools call it. Checks that need an
interpreter where nothing is loaded yet run in a fresh one. The built LALR parser is kept in a
cache file: these tests build it into temporary directories, and break the file on purpose.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import lark
import pytest

from tgc.parser import load_or_build_parser, parser_cache_dir

ROOT = Path(__file__).resolve().parent.parent
GRAMMAR = (ROOT / "tgc" / "tg.lark").read_text()
TOOL = Path(sys.executable).parent / "tgc-opt"

NEG = """func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {
  %y = atomic.neg %x : (tensor<4xf32>) -> tensor<4xf32>
  func.return %y : tensor<4xf32>
}
"""

# Modules a plain `tgc-opt` run must not import (third-party ones cost a third of its start;
# the planner beyond the select-kernels pass's registration, about 40 ms).
HEAVY = ("networkx", "jinja2", "tgc.codegen", "tgc.runtime", "pycuda", "torch", "tgc.planner.")


def fresh_python(code: str, env: dict[str, str] | None = None) -> list[str]:
    """Run `code` in a new interpreter; its stdout lines (it must succeed, printing nothing on
    stderr)."""
    proc = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code)],
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env=env,
    )
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return proc.stdout.splitlines()


# -- the core alone, load_all, the API ------------------------------------------------------------


def test_the_core_alone_knows_no_dialect_and_says_so_where():
    lines = fresh_python(
        f"""
        import sys
        from tgc.builder import FunctionBuilder, tensor
        from tgc.diagnostics import TgcError
        from tgc.parser import parse_module
        from tgc.pass_manager import parse_pipeline
        from tgc.verifier import verify

        verify(parse_module("func.func @f() {{\\n  func.return\\n}}\\n"))  # builtin: no dialect
        try:
            parse_module({NEG!r}, "f.tg")
        except TgcError as e:
            print(e.render().splitlines()[0])
        try:
            parse_pipeline("cse")
        except TgcError as e:
            print(e.message)
        try:
            FunctionBuilder("f", [tensor("4xf32")]).hl.softmax
        except AttributeError as e:
            print(e)
        above = ("tgc.dialects", "tgc.passes", "tgc.planner", "tgc.codegen", "tgc.runtime")
        print(sorted(m for m in sys.modules if m.startswith(above)))
        """
    )
    assert lines == [
        "f.tg:2:8: error: unknown op 'atomic.neg' (no dialect 'atomic' is loaded)",
        "'cse' does not refer to a registered pass or pass pipeline (see --list-passes)",
        "no op named 'hl.softmax' (no dialect 'hl' is loaded: tgc.load_all())",
        "[]",
    ]


def test_load_all_registers_everything_once():
    lines = fresh_python(
        """
        import sys
        import tgc
        from tgc.opdef import OPS
        from tgc.pass_manager import PASSES

        tgc.load_all()
        ops, passes, modules = dict(OPS), dict(PASSES), set(sys.modules)
        tgc.load_all()
        print(OPS == ops, PASSES == passes, set(sys.modules) == modules)
        print(sorted({name.partition(".")[0] for name in OPS}))
        print(all(p in PASSES for p in ("cse", "optimize", "lower-for-planning", "select-kernels")))
        """
    )
    assert lines == ["True True True", "['atomic', 'builtin', 'func', 'hl', 'kernel']", "True"]


@pytest.mark.parametrize(
    "call",
    [
        f"tgc.parse({NEG!r})",
        "tgc.parse_file(path)",
        "tgc.run_pipeline(tgc.parse_file(path), 'canonicalize,cse')",
        "tgc.FunctionBuilder('f', [tgc.tensor('4xf32')]).hl.relu",
    ],
)
def test_the_api_loads_what_it_needs(call, tmp_path):
    """Each entry point of the `tgc` API works first thing in a fresh interpreter."""
    path = tmp_path / "f.tg"
    path.write_text(NEG)
    lines = fresh_python(f"import tgc\npath = {str(path)!r}\nprint(type({call}).__name__)\n")
    assert lines and lines[0] in ("ModuleOp", "function")


def test_tgc_opt_starts_without_codegen_runtime_or_heavy_libraries(tmp_path):
    path = tmp_path / "f.tg"
    path.write_text(NEG)
    lines = fresh_python(
        f"""
        import contextlib, io, sys
        from tgc.tools.opt import main

        for argv in ([{str(path)!r}], [{str(path)!r}, "-p", "optimize"]):
            with contextlib.redirect_stdout(io.StringIO()):
                assert main(argv) == 0
        heavy = (m for m in sys.modules if m.startswith({HEAVY!r}))
        print(sorted(m for m in heavy if m != "tgc.planner.select"))
        """
    )
    assert lines == ["[]"]


# -- the parser cache -----------------------------------------------------------------------------

SAMPLE = NEG + '"atomic.exp"(%q) {a = [1, 2.5, "s", @g, dense<1.0> : tensor<2xf32>]} : () -> ()\n'
BAD = "func.func @f(%x: tensor<4xf32>) {\n  %y = atomic.neg %x : (tensor<4xf32>) ->\n}\n"


def from_cache(parser: lark.Lark) -> bool:
    """Whether Lark loaded `parser` from a file rather than building it."""
    return parser.source_path == "<deserialized>"


def cache_files(directory: Path) -> list[str]:
    """The parser files in `directory` (beside them is the lock file that guards them)."""
    return sorted(p.name for p in directory.iterdir() if p.suffix == ".lark")


def tokens(parsed) -> list:
    """Every token of a parse result with its type and position, in order (a Token compares
    equal to a plain string of its text)."""
    if isinstance(parsed, lark.Token):
        return [(parsed.type, str(parsed), parsed.line, parsed.column)]
    if isinstance(parsed, (list, tuple)):
        return [type(parsed).__name__] + [t for item in parsed for t in tokens(item)]
    return [parsed]


def same_behaviour(a: lark.Lark, b: lark.Lark) -> None:
    """Both parsers give the same tuples for good input and the same error for bad input."""
    assert tokens(a.parse(SAMPLE)) == tokens(b.parse(SAMPLE))
    errors = []
    for parser in (a, b):
        with pytest.raises(lark.exceptions.UnexpectedInput) as e:
            parser.parse(BAD)
        errors.append((type(e.value), e.value.line, e.value.column, sorted(e.value.expected)))
    assert errors[0] == errors[1]


def test_the_parser_is_built_once_then_loaded(tmp_path, capfd):
    built = load_or_build_parser(GRAMMAR, tmp_path)
    files = cache_files(tmp_path)
    assert len(files) == 1 and files[0].startswith("tg-parser-") and files[0].endswith(".lark")
    loaded = load_or_build_parser(GRAMMAR, tmp_path)
    assert not from_cache(built) and from_cache(loaded)
    same_behaviour(built, loaded)
    same_behaviour(loaded, load_or_build_parser(GRAMMAR, None))
    assert sorted(p.suffix for p in tmp_path.iterdir()) == [".lark", ".lock"]
    assert capfd.readouterr() == ("", "")


def test_another_grammar_gets_another_file(tmp_path):
    load_or_build_parser(GRAMMAR, tmp_path)
    changed = GRAMMAR + "\n// a comment changes the hash\n"
    assert not from_cache(load_or_build_parser(changed, tmp_path))
    assert len(cache_files(tmp_path)) == 2


@pytest.mark.parametrize("damage", ["garbage", "truncated", "empty"])
def test_a_damaged_cache_file_is_rebuilt_silently(damage, tmp_path, capfd):
    load_or_build_parser(GRAMMAR, tmp_path)
    (name,) = cache_files(tmp_path)
    file = tmp_path / name
    good = file.read_bytes()
    file.write_bytes(
        {"garbage": b"not a parser\n", "truncated": good[: len(good) // 2]}.get(damage, b"")
    )
    rebuilt = load_or_build_parser(GRAMMAR, tmp_path)
    assert not from_cache(rebuilt)
    same_behaviour(rebuilt, load_or_build_parser(GRAMMAR, None))
    assert from_cache(load_or_build_parser(GRAMMAR, tmp_path))  # the file was written anew
    assert capfd.readouterr() == ("", "")


def test_an_unusable_cache_dir_means_building_silently(tmp_path, capfd):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    for directory in (blocker / "tgc", blocker):  # cannot be made; is not a directory
        parser = load_or_build_parser(GRAMMAR, directory)
        assert not from_cache(parser)
        same_behaviour(parser, load_or_build_parser(GRAMMAR, None))
    assert [p.name for p in tmp_path.iterdir()] == ["a-file"]
    assert capfd.readouterr() == ("", "")


def test_the_cache_dir_follows_xdg(monkeypatch, tmp_path):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    assert parser_cache_dir() == tmp_path / "tgc"
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for ignored in ("", "relative/dir"):  # the XDG spec: unset, empty or relative means ~/.cache
        monkeypatch.setenv("XDG_CACHE_HOME", ignored)
        assert parser_cache_dir() == tmp_path / "home" / ".cache" / "tgc"


def test_tgc_opt_fills_the_cache_and_prints_the_same_without_one(tmp_path):
    path = tmp_path / "f.tg"
    path.write_text(NEG)
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    outputs = []
    for cache in (tmp_path / "cache", tmp_path / "cache", blocker):  # build, load, no cache
        env = dict(os.environ, XDG_CACHE_HOME=str(cache))
        proc = subprocess.run(
            [str(TOOL), str(path)], capture_output=True, text=True, check=False, env=env
        )
        assert proc.returncode == 0 and proc.stderr == "", proc.stderr
        outputs.append(proc.stdout)
    assert outputs[0] == outputs[1] == outputs[2] and "atomic.neg" in outputs[0]
    assert len(cache_files(tmp_path / "cache" / "tgc")) == 1


def test_tools_started_together_share_one_cache(tmp_path):
    """Started at once on an empty cache: all succeed with the same output, one file is left,
    and it loads."""
    path = tmp_path / "f.tg"
    path.write_text(NEG)
    env = dict(os.environ, XDG_CACHE_HOME=str(tmp_path / "cache"))
    procs = [
        subprocess.Popen(
            [str(TOOL), str(path)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env
        )
        for _ in range(6)
    ]
    results = [p.communicate() + (p.returncode,) for p in procs]
    assert {r[2] for r in results} == {0} and {r[1] for r in results} == {b""}
    assert len({r[0] for r in results}) == 1
    assert len(cache_files(tmp_path / "cache" / "tgc")) == 1
    assert from_cache(load_or_build_parser(GRAMMAR, tmp_path / "cache" / "tgc"))
