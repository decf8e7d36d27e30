"""Passes, the pass registry, pipeline parsing and the pass manager.

A pass is a frozen dataclass whose fields are its options (kebab-case on the command line):

    @register_pass
    @dataclass(frozen=True)
    class CSE(Pass):
        '''Eliminate common subexpressions. Contract: ...'''
        name = "cse"
        summary = "Eliminate common subexpressions"
        def run_on_func(self, func, stats): ...

A pass overrides `run_on_func` (called once per function) or `run_on_module`. Pipelines come in
two spellings, both from MLIR: the flat `a,b{key=value}` and the nested
`builtin.module(func.func(a,b{key=value}))`. The module is verified after every pass.
"""

from __future__ import annotations

import dataclasses
import sys
import time
from collections import Counter
from dataclasses import dataclass
from typing import ClassVar

from tgc.builtin import FuncOp, ModuleOp
from tgc.diagnostics import TgcError
from tgc.ir import paused_gc
from tgc.verifier import verify


class PipelineError(TgcError):
    """A malformed pipeline or an unknown pass/option: a usage error (exit code 2)."""


class PassStatistics:
    """Named counters a pass bumps (`stats.bump("fold-add")`), printed by --pass-statistics."""

    def __init__(self) -> None:
        self.counters: Counter[str] = Counter()
        self.notes: list[str] = []

    def bump(self, key: str, n: int = 1) -> None:
        self.counters[key] += n

    def note(self, text: str) -> None:
        self.notes.append(text)


@dataclass(frozen=True)
class Pass:
    name: ClassVar[str] = ""
    summary: ClassVar[str] = ""
    # A pass that expands into others (e.g. `optimize`); run() runs these instead.
    pipeline: ClassVar[str | None] = None

    def run_on_module(self, module: ModuleOp, stats: PassStatistics) -> None:
        for func in module.funcs:
            self.run_on_func(func, stats)

    def run_on_func(self, func: FuncOp, stats: PassStatistics) -> None:
        raise NotImplementedError(
            f"pass '{self.name}' implements neither run_on_func nor run_on_module"
        )

    @property
    def display_name(self) -> str:
        return type(self).__name__

    def options_text(self) -> str:
        fields = dataclasses.fields(self)
        if not fields:
            return ""
        parts = [f"{kebab(f.name)}={format_option(getattr(self, f.name))}" for f in fields]
        return "{" + " ".join(parts) + "}"


def option(default, help: str):
    """A pass option: a dataclass field with its default and the one line `--list-passes` shows."""
    return dataclasses.field(default=default, metadata={"help": help})


def option_help(field: dataclasses.Field) -> str:
    return field.metadata.get("help", "")


PASSES: dict[str, type[Pass]] = {}


def register_pass(cls: type[Pass]) -> type[Pass]:
    if not cls.name:
        raise TypeError(f"{cls.__name__} has no name")
    if cls.name in PASSES and PASSES[cls.name] is not cls:
        raise TypeError(f"pass '{cls.name}' is registered twice")
    if not cls.summary or not cls.__doc__:
        raise TypeError(f"pass '{cls.name}' needs a summary and a docstring stating its contract")
    PASSES[cls.name] = cls
    return cls


def kebab(name: str) -> str:
    return name.replace("_", "-")


def format_option(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, tuple):
        return ",".join(map(str, value))
    return str(value)


def _convert_option(pass_name: str, field: dataclasses.Field, text: str):
    kind = field.type if isinstance(field.type, str) else getattr(field.type, "__name__", "")
    try:
        if kind == "bool":
            if text not in ("true", "false", "1", "0"):
                raise ValueError
            return text in ("true", "1")
        if kind == "int":
            return int(text)
        if kind == "float":
            return float(text)
        if kind.startswith("tuple"):
            return tuple(t for t in text.split(",") if t)
        return text
    except ValueError:
        raise PipelineError(
            f"invalid value '{text}' for option '{kebab(field.name)}' of pass '{pass_name}' "
            f"(expected {kind})"
        ) from None


def did_you_mean(name: str, known) -> str:
    """'; did you mean 'x'?' for the closest of `known` to a misspelt `name`, else ''."""
    import difflib

    close = difflib.get_close_matches(name, sorted(known), n=1)
    return f"; did you mean '{close[0]}'?" if close else ""


def make_pass(name: str, options: dict[str, str]) -> Pass:
    cls = PASSES.get(name)
    if cls is None:
        raise PipelineError(
            f"'{name}' does not refer to a registered pass or pass pipeline"
            f"{did_you_mean(name, PASSES)} (see --list-passes)"
        )
    fields = {kebab(f.name): f for f in dataclasses.fields(cls)}
    kwargs = {}
    for key, text in options.items():
        field = fields.get(key)
        if field is None:
            known = ", ".join(sorted(fields)) or "none"
            raise PipelineError(
                f"pass '{name}' has no option '{key}'{did_you_mean(key, fields)} (options: {known})"
            )
        kwargs[field.name] = _convert_option(name, field, text)
    return cls(**kwargs)


# -- pipeline text ---------------------------------------------------------------------------------


class _PipelineParser:
    """Parses `a,b{k=v}` and `builtin.module(func.func(a,b))` into a flat list of passes.

    Anchors (`builtin.module`, `func.func`) only nest; every tgc pass runs over each function
    of the module, so the nesting does not change what runs.
    """

    ANCHORS = ("builtin.module", "func.func", "any")

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def fail(self, message: str) -> PipelineError:
        caret = " " * self.pos + "^"
        return PipelineError(f"invalid pass pipeline: {message}\n  {self.text}\n  {caret}")

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def parse(self) -> list[Pass]:
        passes = self.sequence(depth=0)
        if self.pos != len(self.text):
            if self.peek() == ")":
                raise self.fail("unbalanced ')'")
            raise self.fail(f"unexpected '{self.peek()}'")
        return passes

    def sequence(self, depth: int) -> list[Pass]:
        passes: list[Pass] = []
        while True:
            self.skip_space()
            passes += self.element(depth)
            self.skip_space()
            if self.peek() != ",":
                return passes
            self.pos += 1

    def skip_space(self) -> None:
        while self.peek().isspace():
            self.pos += 1

    def element(self, depth: int) -> list[Pass]:
        start = self.pos
        while self.peek() and (self.peek().isalnum() or self.peek() in "-_."):
            self.pos += 1
        name = self.text[start : self.pos]
        if not name:
            raise self.fail("expected a pass name")
        if self.peek() == "(":
            if name not in self.ANCHORS:
                raise self.fail(f"'{name}' is not an op anchor (use builtin.module or func.func)")
            self.pos += 1
            inner = self.sequence(depth + 1) if self.peek() != ")" else []
            if self.peek() != ")":
                raise self.fail("expected ')' (unbalanced parentheses)")
            self.pos += 1
            return inner
        options = self.options() if self.peek() == "{" else {}
        return [make_pass(name, options)]

    def options(self) -> dict[str, str]:
        self.pos += 1
        end = self.text.find("}", self.pos)
        if end < 0:
            raise self.fail("expected '}' to close the options")
        body = self.text[self.pos : end]
        self.pos = end + 1
        out: dict[str, str] = {}
        for item in body.replace(" ", "\n").split():
            key, eq, value = item.partition("=")
            if not eq:
                value = "true"  # `{fast-math}` means fast-math=true
            out[key] = value
        return out


def parse_pipeline(text: str) -> list[Pass]:
    """Parse pipeline text into passes (aliases such as `optimize` stay one pass). Only
    registered passes are known: `tgc.load_all()` registers tgc's own."""
    text = text.strip()
    if not text:
        return []
    return _PipelineParser(text).parse()


def expand(passes: list[Pass]) -> list[Pass]:
    out: list[Pass] = []
    for p in passes:
        if p.pipeline is not None:
            out += expand(parse_pipeline(p.pipeline))
        else:
            out.append(p)
    return out


# -- running ---------------------------------------------------------------------------------------


@dataclass
class Instrumentation:
    """What to report while running: MLIR's --print-ir-after*, --time-passes, --pass-statistics."""

    print_ir_after_all: bool = False
    print_ir_after: frozenset[str] = frozenset()
    time_passes: bool = False
    pass_statistics: bool = False
    verify_each: bool = True
    generic: bool = False
    stream: object = None

    def out(self):
        return self.stream or sys.stderr


class PassManager:
    def __init__(self, passes: list[Pass], instrumentation: Instrumentation | None = None):
        self.passes = expand(passes)
        self.inst = instrumentation or Instrumentation()
        self.timings: list[tuple[str, float]] = []
        self.statistics: list[tuple[Pass, PassStatistics]] = []

    @classmethod
    def from_text(cls, text: str, **kwargs) -> PassManager:
        return cls(parse_pipeline(text), Instrumentation(**kwargs))

    def run(self, module: ModuleOp) -> ModuleOp:
        with paused_gc():  # see tgc.ir.paused_gc: keeps every pass linear in module size
            self._run(module)
        return module

    def _run(self, module: ModuleOp) -> None:
        from tgc.printer import print_module

        for p in self.passes:
            stats = PassStatistics()
            start = time.perf_counter()
            p.run_on_module(module, stats)
            elapsed = time.perf_counter() - start
            self.timings.append((p.name, elapsed))
            self.statistics.append((p, stats))
            if self.inst.verify_each:
                try:
                    verify(module)
                except TgcError as e:
                    e.message = f"{e.message} (after pass '{p.name}')"
                    raise
            if self.inst.print_ir_after_all or p.name in self.inst.print_ir_after:
                banner = f"// -----// IR Dump After {p.display_name} ({p.name}) //----- //"
                print(banner, file=self.inst.out())
                print(print_module(module, self.inst.generic), file=self.inst.out())
        if self.inst.time_passes:
            self.report_timing()
        if self.inst.pass_statistics:
            self.report_statistics()

    def report_timing(self) -> None:
        out = self.inst.out()
        total = sum(t for _, t in self.timings) or 1e-12
        print("===" + "-" * 73 + "===", file=out)
        print("  ... Execution time report ...".ljust(79), file=out)
        print("===" + "-" * 73 + "===", file=out)
        print(f"  Total Execution Time: {total:.4f} seconds", file=out)
        print(file=out)
        print("  ----Wall Time----  ----Name----", file=out)
        for name, t in self.timings:
            print(f"  {t:.4f} ({100 * t / total:5.1f}%)  {name}", file=out)
        print(f"  {total:.4f} (100.0%)  Total", file=out)

    def report_statistics(self) -> None:
        out = self.inst.out()
        print("===" + "-" * 73 + "===", file=out)
        print("  ... Pass statistics report ...", file=out)
        print("===" + "-" * 73 + "===", file=out)
        for p, stats in self.statistics:
            print(f"{p.display_name} ({p.name})", file=out)
            for key in sorted(stats.counters):
                print(f"  ({stats.counters[key]}) {key}", file=out)
            for note in stats.notes:
                print(f"  {note}", file=out)
