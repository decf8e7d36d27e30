"""Write generated rules as a `.tg` rule table (the format passes/rule_file.py reads).

Each rule is two functions over the same arguments, `@<name>_src` and `@<name>_tgt`, preceded
by comments: the rule in words and the evidence that verified it. Argument dims are the rule's
shape symbols written as distinct sizes (2, 3, 5, 7, ...: `verify.TABLE_SIZES`); element types
are f64 and stand for any float type.
"""

from __future__ import annotations

from tgc.passes.rulegen.generate import Generation, GeneratedRule
from tgc.passes.rulegen.verify import TABLE_SIZES, Shapes, arg_types_for, build_function
from tgc.printer import print_op


def rule_functions(rule: GeneratedRule, name: str):
    """(src function, tgt function) at the table's sizes."""
    ev = rule.evidence
    symbols = sorted({d for shape in ev.arg_shapes for d in shape})
    sizes = dict(zip(symbols, TABLE_SIZES))
    args = dict(zip(ev.inputs, ev.arg_shapes))
    types = arg_types_for(Shapes(), args, sizes)
    return build_function(rule.src, f"{name}_src", types), build_function(
        rule.tgt, f"{name}_tgt", types
    )


def evidence_text(rule: GeneratedRule) -> str:
    ev = rule.evidence
    per = ev.draws // max(1, len(ev.instantiations))
    shapes = "; ".join(",".join(map(str, inst)) for inst in ev.instantiations)
    return (
        f"{ev.draws} draws of N(0,1) float64 inputs, {per} on each of "
        f"{len(ev.instantiations)} shape instantiations (symbol sizes {shapes}), "
        f"max relative error {ev.max_rel_error:.2g}"
        + ("; exact: equal on random integers in exact arithmetic" if ev.exact else "")
    )


def write_table(gen: Generation, header: list[str]) -> str:
    lines = [f"// {h}" if h else "//" for h in header]
    for i, rule in enumerate(gen.rules, 1):
        name = f"r{i}"
        src, tgt = rule_functions(rule, name)
        lines += [
            "",
            f"// {name}: {rule.src} = {rule.tgt}",
            f"// evidence: {evidence_text(rule)}",
            print_op(src),
            print_op(tgt),
        ]
    return "\n".join(lines) + "\n"
