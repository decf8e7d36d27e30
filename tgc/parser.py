"""Parse .tg text into a `builtin.module`.

Two stages. Lark's LALR parser, with the callbacks of `_ToTuples` applied while it parses (no
parse tree is built), turns the text into small tuples. `_IRBuilder` then walks those tuples,
resolving SSA names through nested scopes and creating ops from the registry. Every error is a
`TgcError` at a file:line:col, with Lark's expected terminals turned into words.

Limits (docs/ir.md): regions and attribute arrays nest at most `MAX_NESTING` deep, integers fit
their element type (i64 for a plain integer attribute), and a decimal float must be finite in
its type; `inf`/`nan` are written as keywords.
"""

from __future__ import annotations

import difflib
import hashlib
import math
import os
import re
import struct
import sys
from functools import cache
from pathlib import Path

try:
    import fcntl  # the parser cache's lock (POSIX)
except ImportError:
    fcntl = None

import lark
import ml_dtypes
import numpy as np
from lark import Token, Transformer

import tgc.datafiles as datafiles
from tgc.attributes import (
    DenseAttr,
    FunctionTypeAttr,
    StringSyntaxError,
    UNIT,
    DictAttr,
    SymbolRef,
    unescape_string,
)
from tgc.builtin import FuncOp, ModuleOp
from tgc.diagnostics import SOURCES, Location, TgcError
from tgc.ir import Block, Operation, Region, Value, paused_gc
from tgc.opdef import ISOLATED, OPS
from tgc.types import NUMPY_DTYPES, TensorType, TypeSyntaxError, parse_type

# How deep regions, and attribute arrays, may nest. Deeper input is refused with a diagnostic
# rather than let the recursive walks of the parser, verifier and printer hit Python's limit.
MAX_NESTING = 256

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
    "DENSE_FILE_KW": "'dense_file'",
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
        return ("arg", c[0], c[1], c[2] if len(c) > 2 and c[2] is not None else [])

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
        return (c[0], c[1] if len(c) > 1 else None)  # None: a unit attribute

    def dict_value(self, c):
        return ("dict", [e for e in c if e is not None])

    def array(self, c):
        return ("array", c[0], [x for x in c[1:] if x is not None])

    def dense(self, c):
        return ("dense", c[0], c[1], c[2])

    def dense_file(self, c):
        return ("dense_file", c[0], c[1], c[2])

    def dense_list(self, c):
        return ("dense_list", [x for x in c if x is not None])


# How the grammar is compiled; part of the parser cache's key.
_LARK_OPTIONS = {"parser": "lalr", "lexer": "contextual", "maybe_placeholders": True}


@cache
def _lark() -> lark.Lark:
    grammar = (Path(__file__).with_name("tg.lark")).read_text()
    return load_or_build_parser(grammar, parser_cache_dir())


def parser_cache_dir() -> Path | None:
    """Where the built parser is kept: $XDG_CACHE_HOME/tgc, else ~/.cache/tgc (None: no home)."""
    base = os.environ.get("XDG_CACHE_HOME", "")
    if not os.path.isabs(base):  # unset, empty or relative: the XDG spec says ignore it
        try:
            base = os.path.join(Path.home(), ".cache")
        except RuntimeError:
            return None
    return Path(base) / "tgc"


def load_or_build_parser(grammar: str, cache_dir: Path | None) -> lark.Lark:
    """The LALR parser of `grammar`, loaded from `cache_dir` when built there before.

    Building the LALR tables takes about as long as everything else a small run does, so the
    built parser is kept in a file (Lark's `cache=` option) named by a hash of the grammar, the
    options, Lark's version and Python's. It is only a speed cache: a directory that cannot be
    made or written means building every time, and a corrupt file is rebuilt and written anew
    (Lark checks the hash stored inside and ignores a file it cannot read); neither prints
    anything. Lark writes the file in place, so reading and writing it happen under an
    exclusive lock (`flock`): a tool started meanwhile never reads half a file, and two never
    write one at once. Without `flock` (not POSIX) there is no cache.
    """
    path = _parser_cache_file(grammar, cache_dir)
    if path is None or fcntl is None:
        return _new_lark(grammar, cache=False)
    try:
        lock = open(path.with_suffix(".lock"), "a")  # noqa: SIM115  (closed below)
    except OSError:
        return _new_lark(grammar, cache=False)
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes, or the process ends
        except OSError:  # e.g. a file system without locks
            return _new_lark(grammar, cache=False)
        return _new_lark(grammar, cache=str(path))


def _parser_cache_file(grammar: str, cache_dir: Path | None) -> Path | None:
    if cache_dir is None:
        return None
    try:
        cache_dir.mkdir(parents=True, exist_ok=True)
    except OSError:
        return None
    key = "\n".join([grammar, repr(sorted(_LARK_OPTIONS.items())), lark.__version__, sys.version])
    digest = hashlib.sha256(key.encode()).hexdigest()[:24]
    return cache_dir / f"tg-parser-{digest}.lark"


def _new_lark(grammar: str, cache: bool | str) -> lark.Lark:
    return lark.Lark(grammar, transformer=_ToTuples(), cache=cache, **_LARK_OPTIONS)


def _describe_expected(expected: set[str]) -> str:
    words = sorted({_TERMINAL_WORDS.get(t, t.lower()) for t in expected})
    if not words:
        return "something else"
    if len(words) == 1:
        return words[0]
    return ", ".join(words[:-1]) + " or " + words[-1]


def _syntax_error(e: lark.exceptions.LarkError, file: str, text: str) -> TgcError:
    if isinstance(e, lark.exceptions.UnexpectedCharacters):
        return _bad_character(e, file, text)
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
        found = _shorten("".join(c if c.isprintable() else f"U+{ord(c):04X}" for c in tok))
        return TgcError(
            f"expected {expected}, found '{found}'", Location(file, tok.line, tok.column)
        )
    return TgcError(f"syntax error: {e}", None)


_SIGILS = {"%": "a value name", "^": "a block label", "@": "a symbol name"}


def _bad_character(e: lark.exceptions.UnexpectedCharacters, file: str, text: str) -> TgcError:
    """Where no token starts: say what is wrong at the very character that is wrong."""
    loc = Location(file, e.line, e.column)
    if e.char == '"':
        return TgcError("unterminated string literal (a string must end on its line)", loc)
    if e.char in _SIGILS:
        after = text[e.pos_in_stream + 1 : e.pos_in_stream + 2]
        what = _SIGILS[e.char]
        if not after or after.isspace():
            return TgcError(f"expected {what} after '{e.char}'", loc)
        after_loc = Location(file, e.line, e.column + 1)
        if after == '"':
            return TgcError(
                "unterminated string literal (a string must end on its line)", after_loc
            )
        hint = ' or a quoted name: @"..."' if e.char == "@" else ""
        if e.char == "@" and after in "0123456789$.-":
            return TgcError(
                f"a bare symbol name starts with a letter or '_', not '{after}' (quote other "
                'names: @"...")',
                after_loc,
            )
        return TgcError(
            f"invalid character {_show_char(after)} in {what} (allowed: ASCII letters, digits and "
            f"'_', '$', '.', '-'{hint})",
            after_loc,
        )
    if e.char == "\ufeff":
        return TgcError(
            "unexpected byte order mark U+FEFF (allowed only at the start of input)", loc
        )
    return TgcError(f"unexpected character {_show_char(e.char)}", loc)


def _show_char(ch: str) -> str:
    """A character for a message: quoted when visible, else its code point (U+0000)."""
    if ch == "\n":
        return "end of line"
    if ch.isprintable() and not ch.isspace():
        return f"'{ch}'"
    return f"U+{ord(ch):04X}"


# -- stage 2: tuples -> IR -------------------------------------------------------------------------


class _IRBuilder:
    def __init__(self, file: str, data_dir: Path) -> None:
        self.file = file
        self.data_dir = data_dir  # where `dense_file<"...">` paths start
        # A stack of scopes; None marks an isolated-from-above boundary.
        self.scopes: list[dict[str, Value] | None] = []
        self.region_depth = 0  # regions around the op being built, module and func bodies too

    def error(self, message: str, tok: Token) -> TgcError:
        return TgcError(message, _loc(tok, self.file))

    # literals

    def string(self, tok: Token, skip: int = 1) -> str:
        """The value of a string token whose body starts `skip` characters in (after `"` or `@"`)."""
        try:
            return unescape_string(tok[skip:-1])
        except StringSyntaxError as e:
            loc = Location(self.file, tok.line, tok.column + skip + e.offset)
            raise TgcError(str(e), loc) from None

    def symbol(self, tok: Token) -> str:
        """The name of `@name` or `@"any name"`."""
        return self.string(tok, 2) if tok[1] == '"' else tok[1:]

    def integer(self, tok: Token, elem: str = "i64") -> int:
        """An integer literal that must fit `elem` (a plain integer attribute is an i64)."""
        if elem == "i64" and len(tok) < 19:  # the common case: 18 characters always fit
            return int(tok)
        text = str(tok)
        digits = text.lstrip("-").lstrip("0") or "0"  # int() refuses over 4300 digits: check first
        lo, hi = _INT_RANGES[elem]
        value = int(digits) * (-1 if text.startswith("-") else 1) if len(digits) <= 20 else None
        if value is None or not lo <= value <= hi:
            allowed = "true, false, 0 or 1" if elem == "i1" else f"{lo} to {hi}"
            raise self.error(f"integer {_shorten(text)} out of range for {elem} ({allowed})", tok)
        return value

    def real(self, tok: Token, elem: str = "f64") -> float:
        """A decimal float (or integer) literal that must be finite in `elem` once rounded."""
        value = float(tok)
        if math.isinf(value) or abs(value) >= _FLOAT_OVERFLOW[elem]:
            raise self.error(f"value {_shorten(str(tok))} out of range for {elem}", tok)
        return value

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
        self.region_depth += 1
        for item in items:
            module.body.append(self.build_item(item))
        self.region_depth -= 1
        self.scopes.pop()
        return module

    def build_module(self, item) -> ModuleOp:
        _, kw, sym, attr_entries, items = item
        module = ModuleOp.empty(_loc(kw, self.file))
        if sym is not None:
            module.attributes["sym_name"] = self.symbol(sym)
        module.attributes.update(self.attributes(attr_entries))
        self.scopes.append({})
        self.region_depth += 1
        for sub in items:
            module.body.append(self.build_item(sub))
        self.region_depth -= 1
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
        arg_types = [self.type_of(arg[2]) for arg in args]
        result_types = [self.type_of(t) for t in (results or [])]
        func = FuncOp.build(self.symbol(sym), arg_types, result_types, loc=_loc(kw, self.file))
        func.attributes.update(self.attributes(attr_entries))
        arg_attrs = [self.attributes(arg[3]) for arg in args]
        if any(arg_attrs):
            if "arg_attrs" in func.attributes:
                raise self.error("argument attributes are given both inline and as 'arg_attrs'", kw)
            func.attributes["arg_attrs"] = tuple(DictAttr(a) for a in arg_attrs)
        self.enter_region(kw)
        self.scopes.append(None)
        self.scopes.append({})
        for (_, name_tok, *_), arg in zip(args, func.body.args):
            self.define(name_tok, arg)
        for op in ops:
            func.body.append(self.build_op(op))
        self.scopes.pop()
        self.scopes.pop()
        self.region_depth -= 1
        return func

    def enter_region(self, owner: Token) -> None:
        """Count one more enclosing region; refuse one nested past MAX_NESTING."""
        if self.region_depth >= MAX_NESTING:
            raise self.error(
                f"regions nested too deeply (the limit is {MAX_NESTING} levels)", owner
            )
        self.region_depth += 1

    def build_op(self, item) -> Operation:
        _, name_tok, result_toks, operand_toks, attr_entries, signature, regions = item
        name = self.string(name_tok) if name_tok.startswith('"') else str(name_tok)
        cls = OPS.get(name)
        if cls is None:
            raise self.error(_unknown_op_message(name), name_tok)
        loc = _loc(name_tok, self.file)
        operands = [self.lookup(t) for t in operand_toks]
        kind = signature[0]
        if kind == "sigtok":
            in_types, out_types = self.signature_token(signature[1])
        else:
            in_toks, out_toks = (
                (signature[1], signature[2]) if kind == "ftype" else (signature[1], [])
            )
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
        built_regions = [self.build_region(r, isolated, name_tok) for r in regions]
        op = cls(operands, out_types, self.attributes(attr_entries), built_regions, loc)
        for tok, result in zip(result_toks, op.results):
            self.define(tok, result)
        return op

    def build_region(self, item, isolated: bool, owner: Token) -> Region:
        _, blocks = item
        self.enter_region(owner)
        region = Region()
        if isolated:
            self.scopes.append(None)
        self.scopes.append({})
        for _, label, args, ops in blocks:
            block = Block([self.type_of(a[2]) for a in args], label=label and label[1:])
            for (_, name_tok, *_), arg in zip(args, block.args):
                self.define(name_tok, arg)
            for op in ops:
                block.append(self.build_op(op))
            region.add_block(block)
        self.scopes.pop()
        if isolated:
            self.scopes.pop()
        self.region_depth -= 1
        return region

    # attributes

    def attributes(self, entries, depth: int = 0) -> dict:
        out = {}
        for key_tok, value in entries:
            key = self.string(key_tok) if key_tok.startswith('"') else str(key_tok)
            if key in out:
                raise self.error(f"duplicate attribute '{key}'", key_tok)
            out[key] = UNIT if value is None else self.attr_value(value, depth)
        return out

    def attr_value(self, v, depth: int = 0):
        if isinstance(v, Token):
            t = v.type
            if t == "INT":
                return self.integer(v)
            if t == "FLOAT":
                return self.real(v)
            if t == "HEX_F64":
                return struct.unpack("<d", struct.pack("<Q", int(v.split(":")[0], 16)))[0]
            if t == "STRING":
                return self.string(v)
            if t == "SYMBOL":
                return SymbolRef(self.symbol(v))
            if t == "TYPE":
                return self.type_of(v)
            if t in _KEYWORD_VALUES:
                return _KEYWORD_VALUES[t]
            raise self.error(f"unexpected attribute value '{v}'", v)
        kind = v[0]
        if kind == "array":
            if depth >= MAX_NESTING:
                limit = f"the limit is {MAX_NESTING} levels"
                raise self.error(f"attribute arrays nested too deeply ({limit})", v[1])
            return tuple(self.attr_value(x, depth + 1) for x in v[2])
        if kind == "ftype":
            return FunctionTypeAttr(
                tuple(self.type_of(t) for t in v[1]), tuple(self.type_of(t) for t in v[2])
            )
        if kind == "dense":
            return self.dense(v)
        if kind == "dense_file":
            return self.dense_file(v)
        if kind == "dict":
            if depth >= MAX_NESTING and v[1]:
                limit = f"the limit is {MAX_NESTING} levels"
                raise self.error(f"attribute dictionaries nested too deeply ({limit})", v[1][0][0])
            return DictAttr(self.attributes(v[1], depth + 1))
        raise TypeError(f"unhandled attribute form {kind}")

    def dense(self, v) -> DenseAttr:
        _, kw, body, type_tok = v
        ty = self.type_of(type_tok)
        if not (isinstance(body, tuple) and body[0] == "dense_list"):
            return DenseAttr.splat(self.dense_scalar(body, ty), ty)
        if not body[1] and ty.num_elements == 0:  # `[]` is every zero-size constant
            return DenseAttr(np.zeros(ty.shape, dtype=ty.dtype), ty)
        shape_error = self.error(f"dense literal does not have the shape of {ty}", kw)
        try:
            # Every element is checked against the element type first, so only a ragged or
            # wrongly sized literal can fail here.
            array = np.array(self.dense_nested(body, ty, 1, shape_error), dtype=ty.dtype)
        except ValueError:
            raise shape_error from None
        if array.shape != ty.shape:
            raise shape_error
        return DenseAttr(array, ty)

    def dense_file(self, v) -> DenseAttr:
        """`dense_file<"w.npy"> : T`: resolved against the .tg file's folder, read and checked."""
        _, kw, path_tok, type_tok = v
        ty = self.type_of(type_tok)
        try:
            return datafiles.load(self.data_dir, self.string(path_tok), ty)
        except datafiles.DataFileError as e:
            raise self.error(str(e), path_tok) from None

    def dense_nested(self, body, ty: TensorType, depth: int, shape_error: TgcError):
        """Nested lists of checked elements; lists deeper than the rank are a shape error (this
        also bounds the recursion, as a rank is at most 64)."""
        if isinstance(body, tuple) and body[0] == "dense_list":
            if depth > ty.rank:
                raise shape_error
            return [self.dense_nested(x, ty, depth + 1, shape_error) for x in body[1]]
        return self.dense_scalar(body, ty)

    def dense_scalar(self, v: Token, ty: TensorType):
        """One element of a dense literal, checked against the element type."""
        elem = ty.element_type
        if v.type in ("TRUE", "FALSE"):
            if elem != "i1":
                raise self.error(f"'{v}' is only valid for i1 elements, not {elem}", v)
            return v.type == "TRUE"
        if ty.is_float:
            found = _KEYWORD_VALUES.get(v.type)
            return found if found is not None else self.real(v, elem)
        if v.type != "INT":
            raise self.error(f"float literal '{v}' in an integer constant {ty}", v)
        value = self.integer(v, elem)
        return bool(value) if elem == "i1" else value


_SIGNATURE_CACHE: dict[str, tuple[list[TensorType], list[TensorType]]] = {}
_TYPE_IN_SIGNATURE = re.compile(r"tensor<[^>]*>")

_KEYWORD_VALUES = {
    "TRUE": True,
    "FALSE": False,
    "INF": math.inf,
    "NEG_INF": -math.inf,
    "NAN": math.nan,
}

_INT_RANGES = {"i1": (0, 1)} | {
    name: (int(np.iinfo(NUMPY_DTYPES[name]).min), int(np.iinfo(NUMPY_DTYPES[name]).max))
    for name in ("i8", "i32", "i64")
}


def _overflow_threshold(elem: str) -> float:
    """The smallest magnitude that rounds to infinity in `elem`: its largest finite value plus
    half a unit in the last place (a tie rounds to even, which is the infinity)."""
    info = ml_dtypes.finfo(NUMPY_DTYPES[elem])
    return float(info.max) + math.ldexp(1.0, info.maxexp - info.nmant - 2)


_FLOAT_OVERFLOW = {
    "f16": _overflow_threshold("f16"),
    "bf16": _overflow_threshold("bf16"),
    "f32": _overflow_threshold("f32"),
    "f64": math.inf,
}


def _shorten(literal: str) -> str:
    """A literal for a message, cut short when it is very long."""
    return literal if len(literal) <= 40 else f"{literal[:30]}... ({len(literal)} characters)"


def _unknown_op_message(name: str) -> str:
    close = difflib.get_close_matches(name, OPS.keys(), n=1)
    if close:
        return f"unknown op '{name}'; did you mean '{close[0]}'?"
    dialect = name.partition(".")[0]
    if not any(known.startswith(dialect + ".") for known in OPS):
        # Also what the core says when used before `tgc.load_all()` registered the dialects.
        return f"unknown op '{name}' (no dialect '{dialect}' is loaded)"
    return f"unknown op '{name}'"


# -- entry points ----------------------------------------------------------------------------------


def parse_module(text: str, file: str = "<string>", data_dir: Path | None = None) -> ModuleOp:
    """Parse text into a module (a file without `module` is wrapped in one). Not verified.

    `dense_file<"w.npy">` paths are relative to `data_dir`: by default the folder of `file`, or
    the working directory for a text that is not a file (`<stdin>`, `<string>`).

    Only registered ops parse: whoever wires the parts together (the tools, the `tgc` API)
    registers the dialects first, with `tgc.load_all()`."""
    text = text.removeprefix("\ufeff")  # a UTF-8 byte order mark: columns count after it
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
            raise _syntax_error(e, file, text) from None
        if data_dir is None:
            data_dir = Path.cwd() if file.startswith("<") else Path(file).parent
        return _IRBuilder(file, data_dir).build_top(items)


def parse_file(path: str | Path) -> ModuleOp:
    path = Path(path)
    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TgcError(f"could not open input file '{path}': no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TgcError(f"could not read input file '{path}': {e}") from None
    return parse_module(text, str(path))
