"""Parse .tg text into a `builtin.module`.

Two stages. Lark's LALR parser, with the callbacks of `_ToTuples` applied while it parses (no
parse tree is built), turns the text into small tuples. `_IRBuilder` then walks those tuples,
resolving SSA names through nested scopes and creating ops from the registry. Every error is a
`TgcError` at a file:line:col, with Lark's expected terminals turned into words.
"""

from __future__ import annotations

import ast
import difflib
import math
import re
import struct
from functools import cache
from pathlib import Path

import lark
import numpy as np
from lark import Token, Transformer

from tgc.attributes import DenseAttr, FunctionTypeAttr, SymbolRef
from tgc.builtin import FuncOp, ModuleOp
from tgc.diagnostics import SOURCES, Location, TgcError
from tgc.ir import Block, Operation, Region, Value, paused_gc
from tgc.opdef import ISOLATED, OPS
from tgc.types import TensorType, TypeSyntaxError, parse_type

# -- stage 1: text -> tuples -----------------------------------------------------------------------

# Words for Lark's terminal names in "expected ..." messages.
_TERMINAL_WORDS = {
    "COLON": "':'",
    "COMMA": "','",
    "EQUAL": "'='",
    "LPAR": "'('",
    "RPAR": "')'",
    "LBRACE": "'{'",
    "RBRACE": "'}'",
    "LSQB": "'['",
    "RSQB": "']'",
    "LESSTHAN": "'<'",
    "MORETHAN": "'>'",
    "__ANON_0": "'->'",
    "MODULE_KW": "'module'",
    "FUNC_KW": "'func.func'",
    "ATTRIBUTES_KW": "'attributes'",
    "DENSE_KW": "'dense'",
    "TYPE": "a type",
    "SIGNATURE": "':'",
    "VALUE_ID": "an SSA value",
    "BLOCK_ID": "a block label",
    "SYMBOL": "a symbol",
    "BARE_ID": "an op name",
    "STRING": "a string",
    "INT": "an integer",
    "FLOAT": "a float",
    "HEX_F64": "a float",
    "TRUE": "'true'",
    "FALSE": "'false'",
    "INF": "'inf'",
    "NEG_INF": "'-inf'",
    "NAN": "'nan'",
    "$END": "end of input",
}


def _loc(tok: Token, file: str) -> Location:
    return Location(file, tok.line, tok.column)


class _ToTuples(Transformer):
    """Lark callbacks: each grammar rule becomes a tuple or a plain value."""

    # Tokens stay tokens (they carry line/column); only structure is built here.

    def start(self, items):
        return items

    def module(self, c):
        kw, sym, _attrs_kw, attr_dict, *items = c
        return ("module", kw, sym, attr_dict or [], items)

    def func(self, c):
        kw, sym, args, results, _attrs_kw, attr_dict, *ops = c
        return ("func", kw, sym, args or [], results or [], attr_dict or [], ops)

    def func_args(self, c):
        return list(c)

    def func_arg(self, c):
        return ("arg", c[0], c[1])

    def custom_op(self, c):
        results, name, operands, attr_dict, signature, region = c
        if isinstance(signature, Token):
            signature = ("sigtok", signature)
        regions = [region] if region is not None else []
        return ("op", name, results or [], operands or [], attr_dict or [], signature, regions)

    def bare_op(self, c):
        """An op with no operands, results or attributes, e.g. `func.return`."""
        return ("op", c[0], [], [], [], ("types", []), [])

    def generic_op(self, c):
        results, name, operands, props, regions, attr_dict, signature = c
        if isinstance(signature, Token):
            signature = ("sigtok", signature)
        entries = (props or []) + (attr_dict or [])
        return ("op", name, results or [], operands or [], entries, signature, regions or [])

    def op_results(self, c):
        return list(c)

    value_list = op_results
    region_list = op_results

    def type_list(self, c):
        return ("types", list(c))

    def signature(self, c):
        return c[0]

    def function_type(self, c):
        ins, outs = c
        return ("ftype", ins or [], outs)

    def result_types(self, c):
        if len(c) == 1 and isinstance(c[0], Token):
            return [c[0]]
        return c[0] or []

    def type_seq(self, c):
        return list(c)

    def region(self, c):
        ops = [x for x in c if x[0] == "op"]
        blocks = [x for x in c if x[0] == "block"]
        if ops or not blocks:
            blocks.insert(0, ("block", None, [], ops))
        return ("region", blocks)

    def block(self, c):
        label, *rest = c
        args = [x for x in rest if x is not None and x[0] == "arg"]
        ops = [x for x in rest if x is not None and x[0] == "op"]
        return ("block", label, args, ops)

    block_arg = func_arg

    def properties(self, c):
        return c[0]

    def attr_dict(self, c):
        return [e for e in c if e is not None]

    def attr_entry(self, c):
        return (c[0], c[1])

    def array(self, c):
        return ("array", [x for x in c if x is not None])

    def dense(self, c):
        return ("dense", c[0], c[1], c[2])

    def dense_list(self, c):
        return ("dense_list", [x for x in c if x is not None])


@cache
def _lark() -> lark.Lark:
    grammar = (Path(__file__).with_name("tg.lark")).read_text()
    return lark.Lark(
        grammar,
        parser="lalr",
        lexer="contextual",
        transformer=_ToTuples(),
        maybe_placeholders=True,
        cache=False,
    )


def _describe_expected(expected: set[str]) -> str:
    words = sorted({_TERMINAL_WORDS.get(t, t.lower()) for t in expected})
    if not words:
        return "something else"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _syntax_error(e: lark.exceptions.LarkError, file: str) -> TgcError:
    if isinstance(e, lark.exceptions.UnexpectedCharacters):
        ch = e.char if e.char != "\n" else "end of line"
        return TgcError(f"unexpected character '{ch}'", Location(file, e.line, e.column))
    if isinstance(e, lark.exceptions.UnexpectedEOF):
        return TgcError(
            f"unexpected end of input, expected {_describe_expected(set(e.expected))}",
            Location(file, max(e.line, 1), max(e.column, 1)),
        )
    if isinstance(e, lark.exceptions.UnexpectedToken):
        tok = e.token
        if tok.type == "$END":
            return TgcError(
                f"unexpected end of input, expected {_describe_expected(set(e.expected))}",
                Location(file, max(e.line, 1), max(e.column, 1)),
            )
        expected = _describe_expected(set(e.expected))
        return TgcError(f"expected {expected}, found '{tok}'", Location(file, tok.line, tok.column))
    return TgcError(f"syntax error: {e}", None)


# -- stage 2: tuples -> IR -------------------------------------------------------------------------


class _IRBuilder:
    def __init__(self, file: str) -> None:
        self.file = file
        # A stack of scopes; None marks an isolated-from-above boundary.
        self.scopes: list[dict[str, Value] | None] = []

    def error(self, message: str, tok: Token) -> TgcError:
        return TgcError(message, _loc(tok, self.file))

    # scopes

    def define(self, tok: Token, value: Value) -> None:
        name = tok[1:]
        scope = self.scopes[-1]
        if name in scope:
            raise self.error(f"redefinition of SSA value '{tok}'", tok)
        value.name_hint = name
        scope[name] = value

    def lookup(self, tok: Token) -> Value:
        name = tok[1:]
        for scope in reversed(self.scopes):
            if scope is None:
                break
            found = scope.get(name)
            if found is not None:
                return found
        raise self.error(f"use of undeclared SSA value name '{tok}'", tok)

    def type_of(self, tok: Token) -> TensorType:
        try:
            return parse_type(str(tok))
        except TypeSyntaxError as e:
            raise TgcError(str(e), Location(self.file, tok.line, tok.column + e.column)) from None

    def signature_token(self, tok: Token) -> tuple[list[TensorType], list[TensorType]]:
        """Types of a one-token `: (T, T) -> T` signature (cached: signatures repeat a lot)."""
        found = _SIGNATURE_CACHE.get(str(tok))
        if found is not None:
            return found
        arrow = tok.index("->")
        ins, outs = [], []
        for m in _TYPE_IN_SIGNATURE.finditer(tok):
            try:
                t = parse_type(m.group())
            except TypeSyntaxError as e:
                col = tok.column + m.start() + e.column
                raise TgcError(str(e), Location(self.file, tok.line, col)) from None
            (ins if m.start() < arrow else outs).append(t)
        _SIGNATURE_CACHE[str(tok)] = (ins, outs)
        return ins, outs

    # structure

    def build_top(self, items: list) -> ModuleOp:
        modules = [it for it in items if it[0] == "module"]
        if modules and len(items) == 1:
            return self.build_module(modules[0])
        if modules:
            kw = modules[0][1]
            raise self.error("a 'module' must be the only top-level item of its input", kw)
        if len(items) == 1 and items[0][0] == "op" and str(items[0][1]) == '"builtin.module"':
            module = self.build_op(items[0])
            if isinstance(module, ModuleOp):
                return module
        module = ModuleOp.empty()
        self.scopes.append({})
        for item in items:
            module.body.append(self.build_item(item))
        self.scopes.pop()
        return module

    def build_module(self, item) -> ModuleOp:
        _, kw, sym, attr_entries, items = item
        module = ModuleOp.empty(_loc(kw, self.file))
        if sym is not None:
            module.attributes["sym_name"] = sym[1:]
        module.attributes.update(self.attributes(attr_entries))
        self.scopes.append({})
        for sub in items:
            module.body.append(self.build_item(sub))
        self.scopes.pop()
        return module

    def build_item(self, item) -> Operation:
        if item[0] == "func":
            return self.build_func(item)
        if item[0] == "module":
            raise self.error("nested modules are not supported", item[1])
        return self.build_op(item)

    def build_func(self, item) -> FuncOp:
        _, kw, sym, args, results, attr_entries, ops = item
        arg_types = [self.type_of(t) for _, _, t in args]
        result_types = [self.type_of(t) for t in (results or [])]
        func = FuncOp.build(sym[1:], arg_types, result_types, loc=_loc(kw, self.file))
        func.attributes.update(self.attributes(attr_entries))
        self.scopes.append(None)
        self.scopes.append({})
        for (_, name_tok, _), arg in zip(args, func.body.args):
            self.define(name_tok, arg)
        for op in ops:
            func.body.append(self.build_op(op))
        self.scopes.pop()
        self.scopes.pop()
        return func

    def build_op(self, item) -> Operation:
        _, name_tok, result_toks, operand_toks, attr_entries, signature, regions = item
        name = str(name_tok)
        if name.startswith('"'):
            name = ast.literal_eval(name)
        cls = OPS.get(name)
        if cls is None:
            raise self.error(_unknown_op_message(name), name_tok)
        loc = _loc(name_tok, self.file)
        operands = [self.lookup(t) for t in operand_toks]
        kind = signature[0]
        if kind == "sigtok":
            in_types, out_types = self.signature_token(signature[1])
        else:
            in_toks, out_toks = (signature[1], signature[2]) if kind == "ftype" else (signature[1], [])
            if kind == "types" and result_toks:  # `op %a : T1` lists operand types only
                raise self.error(
                    f"'{name}' defines results, so its signature needs '-> result types'", name_tok
                )
            in_types = [self.type_of(t) for t in in_toks]
            out_types = [self.type_of(t) for t in out_toks]
        if len(in_types) != len(operands):
            raise self.error(
                f"'{name}' has {len(operands)} operand(s) but its signature lists "
                f"{len(in_types)} type(s)",
                name_tok,
            )
        for tok, value, declared in zip(operand_toks, operands, in_types):
            if value.type is not declared:
                raise self.error(
                    f"'{tok}' has type {value.type} but the signature says {declared}", tok
                )
        if len(out_types) != len(result_toks):
            raise self.error(
                f"'{name}' defines {len(result_toks)} result(s) but its signature lists "
                f"{len(out_types)} result type(s)",
                name_tok,
            )
        isolated = ISOLATED in cls.traits
        built_regions = [self.build_region(r, isolated) for r in regions]
        op = cls(operands, out_types, self.attributes(attr_entries), built_regions, loc)
        for tok, result in zip(result_toks, op.results):
            self.define(tok, result)
        return op

    def build_region(self, item, isolated: bool) -> Region:
        _, blocks = item
        region = Region()
        if isolated:
            self.scopes.append(None)
        self.scopes.append({})
        for _, label, args, ops in blocks:
            block = Block([self.type_of(t) for _, _, t in args], label=label and label[1:])
            for (_, name_tok, _), arg in zip(args, block.args):
                self.define(name_tok, arg)
            for op in ops:
                block.append(self.build_op(op))
            region.add_block(block)
        self.scopes.pop()
        if isolated:
            self.scopes.pop()
        return region

    # attributes

    def attributes(self, entries) -> dict:
        out = {}
        for key_tok, value in entries:
            key = ast.literal_eval(key_tok) if key_tok.startswith('"') else str(key_tok)
            if key in out:
                raise self.error(f"duplicate attribute '{key}'", key_tok)
            out[key] = self.attr_value(value)
        return out

    def attr_value(self, v):
        if isinstance(v, Token):
            t = v.type
            if t == "INT":
                return int(v)
            if t == "FLOAT":
                return float(v)
            if t == "HEX_F64":
                return struct.unpack("<d", struct.pack("<Q", int(v.split(":")[0], 16)))[0]
            if t == "STRING":
                return ast.literal_eval(v)
            if t == "SYMBOL":
                return SymbolRef(v[1:])
            if t == "TYPE":
                return self.type_of(v)
            if t in _KEYWORD_VALUES:
                return _KEYWORD_VALUES[t]
            raise self.error(f"unexpected attribute value '{v}'", v)
        kind = v[0]
        if kind == "array":
            return tuple(self.attr_value(x) for x in v[1])
        if kind == "ftype":
            return FunctionTypeAttr(
                tuple(self.type_of(t) for t in v[1]), tuple(self.type_of(t) for t in v[2])
            )
        if kind == "dense":
            return self.dense(v)
        raise TypeError(f"unhandled attribute form {kind}")

    def dense(self, v) -> DenseAttr:
        _, kw, body, type_tok = v
        ty = self.type_of(type_tok)
        if not (isinstance(body, tuple) and body[0] == "dense_list"):
            return DenseAttr.splat(self.dense_scalar(body, ty), ty)
        try:
            array = np.array(self.dense_nested(body, ty), dtype=ty.dtype)
        except (ValueError, OverflowError):
            array = None
        if array is None or array.shape != ty.shape:
            raise self.error(f"dense literal does not have the shape of {ty}", kw)
        return DenseAttr(array, ty)

    def dense_nested(self, body, ty):
        if isinstance(body, tuple) and body[0] == "dense_list":
            return [self.dense_nested(x, ty) for x in body[1]]
        return self.dense_scalar(body, ty)

    def dense_scalar(self, v: Token, ty: TensorType):
        if v.type in ("FLOAT", "INF", "NEG_INF", "NAN") and not ty.is_float:
            raise self.error(f"float literal '{v}' in an integer constant {ty}", v)
        if v.type in _KEYWORD_VALUES:
            return _KEYWORD_VALUES[v.type]
        return float(v) if v.type == "FLOAT" else int(v)


_SIGNATURE_CACHE: dict[str, tuple[list[TensorType], list[TensorType]]] = {}
_TYPE_IN_SIGNATURE = re.compile(r"tensor<[^>]*>")

_KEYWORD_VALUES = {"TRUE": True, "FALSE": False, "INF": math.inf, "NEG_INF": -math.inf, "NAN": math.nan}


def _unknown_op_message(name: str) -> str:
    close = difflib.get_close_matches(name, OPS.keys(), n=1)
    hint = f"; did you mean '{close[0]}'?" if close else ""
    return f"unknown op '{name}'{hint}"


# -- entry points ----------------------------------------------------------------------------------


def parse_module(text: str, file: str = "<string>") -> ModuleOp:
    """Parse text into a module (a file without `module` is wrapped in one). Not verified."""
    import tgc.dialects  # noqa: F401  (registers every dialect's ops)

    SOURCES.add(file, text)
    parser = _lark()
    with paused_gc():
        try:
            items = parser.parse(text)
        except lark.exceptions.VisitError as e:
            if isinstance(e.orig_exc, TgcError):
                raise e.orig_exc from None
            raise
        except lark.exceptions.LarkError as e:
            raise _syntax_error(e, file) from None
        return _IRBuilder(file).build_top(items)


def parse_file(path: str | Path) -> ModuleOp:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TgcError(f"could not open input file '{path}': no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TgcError(f"could not read input file '{path}': {e}") from None
    return parse_module(text, str(path))
