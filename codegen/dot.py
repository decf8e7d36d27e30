"""Graphviz DOT for a module: one node per op, edges for values, regions as clusters. Node ids
are tgc's own (`n12`); every IR string (names, types, op names) is a label made by
`codegen/names.dot_string`, which shows control characters as escapes."""

from __future__ import annotations

from tgc.builtin import FuncOp, ModuleOp
from tgc.codegen.names import dot_string as _quote
from tgc.ir import Block, Operation


def emit_dot(module: ModuleOp) -> str:
    ids: dict[object, str] = {}
    lines = ["digraph tgc {", "  node [shape=box, fontname=monospace];"]

    def node_id(key) -> str:
        if key not in ids:
            ids[key] = f"n{len(ids)}"
        return ids[key]

    def emit_args(block: Block, indent: str) -> None:
        """Block arguments are nodes of their own (edges from them would otherwise name nodes
        that Graphviz makes up, labelled with their ids)."""
        for arg in block.args:
            label = _quote("%" + (arg.name_hint or "") + " : " + str(arg.type))
            lines.append(f"{indent}{node_id(arg)} [label={label}, shape=ellipse];")

    def emit_op(op: Operation, indent: str) -> None:
        if op.regions:
            lines.append(f"{indent}subgraph cluster_{node_id(op)} {{")
            lines.append(f"{indent}  label={_quote(op.name + ' ' + str(op.attr('name') or ''))};")
            for region in op.regions:
                for block in region.blocks:
                    emit_args(block, indent + "  ")
                    for inner in block.ops:
                        emit_op(inner, indent + "  ")
            lines.append(f"{indent}}}")
        lines.append(f"{indent}{node_id(op)} [label={_quote(op.name)}];")
        for v in op.operands:
            src = v.defining_op if v.defining_op is not None else v
            lines.append(f"{indent}{node_id(src)} -> {node_id(op)} [label={_quote(str(v.type))}];")

    for func in module.funcs:
        assert isinstance(func, FuncOp)
        lines.append(f"  subgraph cluster_{node_id(func)} {{")
        lines.append(f"    label={_quote('@' + func.sym_name)};")
        emit_args(func.body, "    ")
        for op in func.body.ops:
            emit_op(op, "    ")
        lines.append("  }")
    lines.append("}")
    return "\n".join(lines) + "\n"
