"""The op reference, made from the op definitions themselves (tgc/opdef.py): each op's syntax
example, meaning (its docstring), operands, attributes with their kinds and defaults, traits and,
for an `hl` op, the lower ops its example decomposes into.

`tgc-opt --list-ops [DIALECT]` prints the short form, a line per op; `python -m
tgc.tools.ops_reference` writes docs/ops.md, which test/test_ops_reference.py checks against the
definitions, so the page cannot fall behind an op.
"""

from __future__ import annotations

import inspect
import re
import sys

from tgc.dialects._decomposition_check import EXAMPLE, docstring_examples, example_function
from tgc.opdef import OPS, REQUIRED, AttrDef, OperandDef
from tgc.printer import print_op

IR_LINE = re.compile(r"[%^} ]|\w+\.\w+ ")
OPERAND_FORMS = {"single": "{}", "optional": "[{}]", "variadic": "{}..."}


def dialects() -> list[str]:
    return sorted({name.split(".", 1)[0] for name in OPS})


def ops_of(dialect: str | None) -> list[str]:
    return sorted(n for n in OPS if dialect is None or n.split(".", 1)[0] == dialect)


def meaning(cls) -> str:
    """The docstring as Markdown: its one-line syntax examples left out (they are shown apart),
    indented blocks as code, other lines joined into paragraphs."""
    paragraphs: list[str] = []
    words: list[str] = []
    code: list[str] = []

    def flush() -> None:
        if words:
            paragraphs.append(" ".join(words))
            words.clear()
        if code:
            paragraphs.append("```mlir\n" + "\n".join(code) + "\n```")
            code.clear()

    for line in EXAMPLE.sub("", inspect.cleandoc(cls.__doc__ or "")).splitlines():
        # Code: an indented line, or IR that opens a paragraph (`%y = ...`) and what follows it
        # that reads as IR too (a region: `^bb0(...)`, indented ops, `}`).
        if line.startswith("    ") or (
            not words and (line.startswith("%") or (code and IR_LINE.match(line)))
        ):
            if words:
                flush()
            code.append(line[4:] if line.startswith("    ") else line)
        elif line.strip():
            if code:
                flush()
            words.append(line.strip())
        else:
            flush()
    flush()
    return "\n\n".join(paragraphs)


def operand_text(d: OperandDef) -> str:
    return OPERAND_FORMS[d.kind].format(d.name)


def attribute_text(d: AttrDef) -> str:
    if d.default is REQUIRED:
        return f"`{d.name}` ({d.kind.description}, required)"
    return f"`{d.name}` ({d.kind.description}, default {_value(d.default)})"


def _value(v) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, tuple):
        return "[" + ", ".join(map(str, v)) + "]"
    if v is None:
        return "none"
    return f'"{v}"' if isinstance(v, str) else str(v)


def one_line(name: str) -> str:
    """`--list-ops`: name, operands, attributes and the first sentence of the meaning."""
    cls = OPS[name]
    operands = ", ".join(operand_text(d) for d in cls.operand_defs)
    attributes = " ".join(
        f"{d.name}={_value(d.default)}" if d.default is not REQUIRED else d.name
        for d in cls.attr_defs.values()
    )
    signature = name + (f" {operands}" if operands else "")
    signature += f" {{{attributes}}}" if attributes else ""
    first = meaning(cls).split("\n", 1)[0]
    first = re.split(r"(?<=\.)\s", first, maxsplit=1)[0]
    return f"{signature:<48} {first}"


def list_ops(dialect: str | None) -> str:
    return "\n".join(one_line(name) for name in ops_of(dialect))


def decomposition(cls, example: str) -> str | None:
    """The ops `example` decomposes into, one level down, as the function body prints them; None
    where the example cannot be built alone."""
    from tgc.builder import Builder
    from tgc.diagnostics import TgcError
    from tgc.parser import parse_module

    try:
        (func,) = parse_module(example_function(cls.name, example), "<example>").funcs
    except (TgcError, ValueError, AttributeError):
        return None
    op = next(op for op in func.body.ops if type(op) is cls)
    results = op.decompose(Builder(op.block, op, op.loc))
    for old, new in zip(op.results, results):
        old.replace_all_uses_with(new)
    op.erase()
    return "\n".join(print_op(o) for o in func.body.ops if o.name != "func.return")


def section(name: str) -> str:
    cls = OPS[name]
    lines = [f"### `{name}`", "", meaning(cls), ""]
    examples = docstring_examples(cls)
    for example in examples:
        lines += ["```mlir", example, "```", ""]
    operands = ", ".join(f"`{operand_text(d)}`" for d in cls.operand_defs) or "none"
    lines.append(f"- operands: {operands}")
    attributes = [attribute_text(d) for d in cls.attr_defs.values()]
    lines.append(f"- attributes: {', '.join(attributes) if attributes else 'none'}")
    traits = ", ".join(sorted(cls.traits)) or "none"
    lines.append(f"- traits: {traits}")
    lines.append("")
    if callable(getattr(cls, "decompose", None)) and examples:
        lowered = decomposition(cls, examples[0])
        if lowered is not None:
            lines += ["Decomposes into (one level; `lower-hl` repeats it):", "", "```mlir"]
            lines += [lowered, "```", ""]
    return "\n".join(lines)


HEADER = """# Op reference

Made from the op definitions by `python -m tgc.tools.ops_reference > docs/ops.md` (checked by
test/test_ops_reference.py: do not edit by hand). `tgc-opt --list-ops [DIALECT]` prints the same
ops a line each. Syntax is described in docs/ir.md; a value's element type and memory space are
its tensor type's. `atomic` holds the primitives, `hl` what people write (each with its
decomposition into lower ops), `kernel` what runs; `func` and `builtin` hold functions and
modules.
"""


def reference() -> str:
    parts = [HEADER]
    for dialect in dialects():
        parts.append(f"## `{dialect}`\n")
        parts += [section(name) for name in ops_of(dialect)]
    return "\n".join(parts).rstrip() + "\n"


def main() -> int:
    import tgc

    tgc.load_all()
    sys.stdout.write(reference())
    return 0


if __name__ == "__main__":
    sys.exit(main())
