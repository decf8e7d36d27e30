"""The registration check of hl decompositions: no decomposition may contain its own op.

Each hl op is built from the syntax examples in its docstring and decomposed all the way down to
ops without a decomposition; an expansion that meets the op it started from, returns values of
other types, or cannot be built is a TypeError (see `tgc.dialects.hl.register_hl`).
"""

from __future__ import annotations

import re

from tgc.builder import Builder
from tgc.diagnostics import VerifyError
from tgc.ir import Operation


def check_decomposition(cls: type[Operation]) -> None:
    """Build `cls` from each syntax example in its docstring and decompose it all the way down:
    raise TypeError when the expansion contains the op itself (directly or through other hl
    ops), when the decomposition returns values of other types, or when it cannot be built."""
    from tgc.parser import parse_module  # the Lark grammar is built once, then cached
    from tgc.verifier import verify

    examples = docstring_examples(cls)
    if not examples:
        raise TypeError(
            f"{cls.name}: the docstring has no syntax example to check its decomposition"
        )
    for text in examples:
        module = parse_module(example_function(cls.name, text), f"<{cls.name} docstring>")
        verify(module)
        (func,) = module.funcs
        for op in [op for op in func.body.ops if type(op) is cls]:
            _expand(op, (cls.name,))


# A syntax example in a docstring: `%y = dialect.op ...` in backquotes, on one line.
EXAMPLE = re.compile(r"`((?:%[\w.]+(?:, %[\w.]+)* = )?\w+\.\w+ [^`]*)`")


def docstring_examples(cls: type[Operation]) -> list[str]:
    """The syntax examples of `cls` itself in its docstring (those of other ops left out)."""
    found = [m.group(1) for m in map(EXAMPLE.search, (cls.__doc__ or "").splitlines()) if m]
    return [text for text in found if text.split(" = ", 1)[-1].startswith(cls.name + " ")]


def example_function(name: str, text: str) -> str:
    """A function around one docstring example: its operands become the arguments."""
    ins, outs = re.search(r": \((.*?)\) -> \(?(.*?)\)?$", text).groups()
    in_types = re.split(r",\s*(?=tensor<)", ins) if ins else []
    operands = re.findall(r"%[\w.]+", text.split(name, 1)[1].split("{")[0].split(":")[0])
    args = ", ".join(f"{v}: {t}" for v, t in zip(dict.fromkeys(operands), in_types))
    results = [r.strip() for r in text.split(" = ", 1)[0].split(",")]
    out_types = re.split(r",\s*(?=tensor<)", outs)
    ret = f"func.return {', '.join(results)} : {', '.join(out_types)}"
    return f"func.func @example({args}) -> ({', '.join(out_types)}) {{\n  {text}\n  {ret}\n}}\n"


def _expand(op: Operation, chain: tuple[str, ...]) -> None:
    """Decompose `op` in place (before it) and recursively every hl op that emits."""
    emitted: list[Operation] = []
    b = Builder(op.block, op, op.loc, on_insert=emitted.append)
    try:
        results = op.decompose(b)
    except NotImplementedError as e:
        raise TypeError(f"{chain[0]}: {e}") from None
    except VerifyError as e:
        raise TypeError(
            f"{chain[0]}: its decomposition builds an invalid op: {e.message}"
        ) from None
    got = [v.type for v in results]
    want = [r.type for r in op.results]
    if got != want:
        raise TypeError(f"{chain[0]}: the decomposition of '{op.name}' returns {got}, not {want}")
    for new in emitted:
        if new.name in chain:
            path = " -> ".join(chain + (new.name,))
            raise TypeError(f"{chain[0]}: the decomposition contains the op itself ({path})")
        if callable(getattr(new, "decompose", None)):  # an hl op: expand it in turn
            _expand(new, chain + (new.name,))
