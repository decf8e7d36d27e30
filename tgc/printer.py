"""Print IR as .tg text: the uniform custom form, or MLIR's generic form (`generic=True`).

Printing is deterministic: attribute keys are sorted, and value names are chosen per function in
program order: the source name (`name_hint`) when it is free, else the next free number. Reading
the output back and printing it again gives the same text.
"""

from __future__ import annotations

import re

from tgc.attributes import (
    UNIT,
    DenseAttr,
    DictAttr,
    FunctionTypeAttr,
    SymbolRef,
    escape_string,
    format_dense_body,
    format_float,
    format_symbol,
)
from tgc.builtin import FuncOp, ModuleOp
from tgc.ir import Block, Operation, Value
from tgc.types import TensorType

_BARE_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_$.]*\Z")
_VALUE_NAME = re.compile(r"[A-Za-z0-9_$.\-]+\Z")

# MLIR's string spelling (tgc.attributes keeps the rules, shared with the parser).
format_string = escape_string


def format_attribute(value, generic: bool = False) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if generic and (value != value or value in (float("inf"), float("-inf"))):
            return _mlir_hex_float(value)
        return format_float(value)
    if isinstance(value, str):
        return format_string(value)
    if isinstance(value, tuple):
        return "[" + ", ".join(format_attribute(v, generic) for v in value) + "]"
    if isinstance(value, DenseAttr):
        if value.file is not None:
            return f"dense_file<{format_string(value.file)}> : {value.type}"
        return f"dense<{format_dense_body(value)}> : {value.type}"
    if isinstance(value, (SymbolRef, TensorType)):
        return str(value)
    if isinstance(value, FunctionTypeAttr):
        return format_function_type(value.inputs, value.results)
    if isinstance(value, DictAttr):
        return format_attr_dict(value.as_dict(), generic) or "{}"
    raise TypeError(f"cannot print attribute {value!r}")


def _mlir_hex_float(value: float) -> str:
    """MLIR has no inf/nan literal; it writes the f64 bit pattern."""
    import struct

    bits = struct.unpack("<Q", struct.pack("<d", value))[0]
    return f"0x{bits:016X} : f64"


def format_attr_dict(attributes: dict, generic: bool = False) -> str:
    if not attributes:
        return ""
    parts = []
    for key in sorted(attributes):
        shown = key if _BARE_KEY.match(key) else format_string(key)
        value = attributes[key]
        parts.append(shown if value is UNIT else f"{shown} = {format_attribute(value, generic)}")
    return "{" + ", ".join(parts) + "}"


def format_function_type(inputs, results) -> str:
    ins = ", ".join(str(t) for t in inputs)
    if len(results) == 1:
        return f"({ins}) -> {results[0]}"
    return f"({ins}) -> (" + ", ".join(str(t) for t in results) + ")"


class Printer:
    def __init__(self, generic: bool = False) -> None:
        self.generic = generic
        self.names: dict[Value, str] = {}
        self.lines: list[str] = []

    # naming

    def assign_names(self, root: Operation) -> None:
        """Name every value defined under `root` (args, results, block args) in program order."""
        defined: list[Value] = []
        for op in root.walk():
            for region in op.regions:
                for block in region.blocks:
                    defined.extend(block.args)
            if op is not root:
                defined.extend(op.results)
        used: set[str] = set()
        unnamed: list[Value] = []
        for v in defined:
            hint = v.name_hint
            if hint is not None and hint not in used and _VALUE_NAME.match(hint):
                self.names[v] = hint
                used.add(hint)
            else:
                unnamed.append(v)
        counter = 0
        for v in unnamed:
            while str(counter) in used:
                counter += 1
            self.names[v] = str(counter)
            used.add(str(counter))

    def name(self, v: Value) -> str:
        found = self.names.get(v)
        return "%" + found if found is not None else "%<<UNKNOWN>>"

    # printing

    def module(self, module: ModuleOp) -> str:
        if self.generic:
            for f in module.funcs:
                self.assign_names(f)
            self.op(module, 0)
        elif module.attributes:
            sym = module.attributes.get("sym_name")
            rest = {k: v for k, v in module.attributes.items() if k != "sym_name"}
            head = "module" + (f" {format_symbol(sym)}" if sym is not None else "")
            if rest:
                head += " attributes " + format_attr_dict(rest)
            self.lines.append(head + " {")
            self.funcs(module, 1)
            self.lines.append("}")
        else:
            self.funcs(module, 0)
        return "\n".join(self.lines) + "\n"

    def funcs(self, module: ModuleOp, depth: int) -> None:
        for i, op in enumerate(module.body.ops):
            if i:
                self.lines.append("")
            if isinstance(op, FuncOp):
                self.assign_names(op)
                self.func(op, depth)
            else:
                self.op(op, depth)

    def func(self, func: FuncOp, depth: int) -> None:
        pad = "  " * depth
        inline_attrs = func.has_well_formed_arg_attrs()  # else shown as it is, in the dictionary
        args = ", ".join(
            f"{self.name(a)}: {a.type}"
            + (_spaced(format_attr_dict(func.arg_attrs(a.index))) if inline_attrs else "")
            for a in func.body.args
        )
        results = func.function_type.results
        head = f"{pad}func.func {format_symbol(func.sym_name)}({args})"
        if len(results) == 1:
            head += f" -> {results[0]}"
        elif results:
            head += " -> (" + ", ".join(map(str, results)) + ")"
        printed_inline = {"sym_name", "function_type"} | ({"arg_attrs"} if inline_attrs else set())
        extra = {k: v for k, v in func.attributes.items() if k not in printed_inline}
        if extra:
            head += " attributes " + format_attr_dict(extra)
        self.lines.append(head + " {")
        for op in func.body.ops:
            self.op(op, depth + 1)
        self.lines.append(pad + "}")

    def op(self, op: Operation, depth: int) -> None:
        pad = "  " * depth
        text = pad
        if op.results:
            text += ", ".join(self.name(r) for r in op.results) + " = "
        operands = ", ".join(self.name(v) for v in op.operands)
        in_types = [v.type for v in op.operands]
        out_types = [r.type for r in op.results]
        if self.generic:
            text += f'"{op.name}"({operands})'
            if op.regions:
                text += " ({"
                for i, region in enumerate(op.regions):
                    self.lines.append(text)
                    self.region_body(region, depth)
                    text = pad + ("}, {" if i + 1 < len(op.regions) else "})")
            attrs = format_attr_dict(op.attributes, generic=True)
            if attrs:
                text += " " + attrs
            text += " : " + format_function_type(in_types, out_types)
            self.lines.append(text)
            return
        text += op.name
        if operands:
            text += " " + operands
        attrs = format_attr_dict(op.attributes)
        if attrs:
            text += " " + attrs
        if not out_types and in_types:
            text += " : " + ", ".join(map(str, in_types))
        elif not out_types and not op.regions:
            pass  # `func.return` with nothing to return
        else:
            text += " : " + format_function_type(in_types, out_types)
        if not op.regions:
            self.lines.append(text)
            return
        self.lines.append(text + " {")
        self.region_body(op.regions[0], depth)
        self.lines.append(pad + "}")

    def region_body(self, region, depth: int) -> None:
        for i, block in enumerate(region.blocks):
            if block.args or i > 0:
                self.block_header(block, i, depth)
            for op in block.ops:
                self.op(op, depth + 1)

    def block_header(self, block: Block, index: int, depth: int) -> None:
        label = block.label if block.label and _VALUE_NAME.match(block.label) else f"bb{index}"
        args = ", ".join(f"{self.name(a)}: {a.type}" for a in block.args)
        self.lines.append("  " * depth + f"^{label}" + (f"({args})" if args else "") + ":")


def _spaced(text: str) -> str:
    return " " + text if text else ""


def print_module(module: ModuleOp, generic: bool = False) -> str:
    return Printer(generic).module(module)


def print_op(op: Operation, generic: bool = False) -> str:
    """One op (and its regions), for debugging and error notes; names are local to the op."""
    p = Printer(generic)
    root = op
    while root.parent_op is not None and not isinstance(root, FuncOp):
        root = root.parent_op
    p.assign_names(root)
    if isinstance(op, FuncOp) and not generic:
        p.func(op, 0)
    elif isinstance(op, ModuleOp):
        return p.module(op)
    else:
        p.op(op, 0)
    return "\n".join(p.lines)
