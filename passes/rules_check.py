"""Numerical verification of rewrite rules (TASO's random testing).

`check_rule(rule)` instantiates the rule's left side on random shapes (size-1 dims, numpy
broadcasting between operands, random attributes with negative axes, random result shapes for
reshape and broadcast), random values and random dtypes (f64, sometimes i32), builds it as a
function, applies the rule alone with the greedy driver, verifies the module and compares the
float64 interpreter's results before and after:

- a rule that may fire without `fast-math` must agree bit for bit on NaN, infinities and the sign
  of zero (inputs include them: NaN, ±inf, ±0, ±1, denormals, huge values) and to 1e-9
  elsewhere;
- a `fast-math` rule is compared where the original result is finite, on ordinary inputs.

The check fails (RuleCheckError) on the first disagreement, on a module that no longer verifies,
and on a rule that fires fewer than `min_fires` times in `max_trials` instances: a rule nobody
could instantiate is not verified. test/test_rules.py runs it on every rule of every table.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from tgc.builder import FunctionBuilder
from tgc.diagnostics import TgcError, VerifyError
from tgc.evaluate import evaluate_block, storage_dtype
from tgc.pass_manager import PassStatistics
from tgc.passes.rules import AttrVar, Const, Fold, Op, Rule, RulePattern, Splat, Var
from tgc.patterns import apply_patterns_greedily
from tgc.printer import print_module
from tgc.types import TensorType
from tgc.verifier import verify

SPECIAL_FLOATS = (np.nan, np.inf, -np.inf, 0.0, -0.0, 1.0, -1.0, 1e-310, 1e300, -1e300)
NICE_CONSTANTS = (1.0, -1.0, 2.0, -2.0, 0.5, 0.25, 4.0, 3.0, 0.0, -0.0)


class RuleCheckError(AssertionError):
    """A rule that is wrong, or that the checker could not instantiate often enough."""


@dataclass
class CheckReport:
    rule: Rule
    trials: int = 0
    built: int = 0
    fired: int = 0
    examples: list[str] = field(default_factory=list)


def check_rule(
    r: Rule, seed: int = 0, min_fires: int = 8, max_trials: int = 3000, enough: int = 40
) -> CheckReport:
    """Instantiate and check `r` until it fired `enough` times (or `max_trials` were tried)."""
    rng = np.random.default_rng(seed)
    report = CheckReport(r)
    while report.trials < max_trials and report.fired < enough:
        report.trials += 1
        instance = _Instance(rng, fast_math=r.fast_math)
        module = instance.build(r.lhs)
        if module is None:
            continue
        report.built += 1
        _check_instance(r, module, instance, report)
    if report.fired < min_fires:
        raise RuleCheckError(
            f"rule '{r.name}' fired in only {report.fired} of {report.trials} random instances "
            f"({report.built} built); the checker cannot verify it (teach passes/rules_check.py "
            f"to build such instances, or fix the guard)"
        )
    return report


def _check_instance(r: Rule, module, instance: _Instance, report: CheckReport) -> None:
    func = module.funcs[0]
    text = print_module(module)
    inputs = instance.inputs(func)
    with np.errstate(all="ignore"):
        before = _run_f64(func, inputs)
    stats = PassStatistics()
    apply_patterns_greedily(func, [RulePattern(r)], max_iterations=4, stats=stats)
    if not stats.counters.get(r.name):
        return
    report.fired += 1
    try:
        verify(module)
    except TgcError as e:
        raise RuleCheckError(f"rule '{r.name}' produced invalid IR: {e.message}\n{text}") from None
    with np.errstate(all="ignore"):
        after = _run_f64(func, inputs)
    for i, (a, b) in enumerate(zip(before, after)):
        problem = compare(a, b, r.fast_math)
        if problem is not None:
            shown = ", ".join(f"{arg.name_hint}={v!r}" for arg, v in zip(func.args, inputs))
            raise RuleCheckError(
                f"rule '{r.name}' changes result #{i}: {problem}\n"
                f"instance:\n{text}\ninputs: {shown}\nafter:\n{print_module(module)}"
                f"before: {a!r}\nafter:  {b!r}"
            )
    if len(report.examples) < 3:
        report.examples.append(text)


def _run_f64(func, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """The function's results, every float computed in float64 (the interpreter's "f64")."""
    args = [
        np.asarray(a, dtype=storage_dtype(arg.type, "f64")) for arg, a in zip(func.args, inputs)
    ]
    return evaluate_block(func.body, args, "f64")


def compare(before: np.ndarray, after: np.ndarray, fast_math: bool) -> str | None:
    """Why `after` does not stand for `before` (None when it does)."""
    if before.shape != after.shape or before.dtype != after.dtype:
        return f"{before.dtype}{list(before.shape)} became {after.dtype}{list(after.shape)}"
    if before.dtype.kind in "biu":
        return None if np.array_equal(before, after) else "integer values differ"
    if fast_math:
        keep = np.isfinite(before)
        if np.allclose(before[keep], after[keep], rtol=1e-9, atol=1e-12):
            return None
        return "values differ where the original is finite"
    if not np.array_equal(np.isnan(before), np.isnan(after)):
        return "NaN positions differ"
    if not (
        np.array_equal(np.isposinf(before), np.isposinf(after))
        and np.array_equal(np.isneginf(before), np.isneginf(after))
    ):
        return "infinities differ"
    zero = (before == 0) & (after == 0)
    if not np.array_equal(np.signbit(before[zero]), np.signbit(after[zero])):
        return "the sign of a zero differs"
    finite = np.isfinite(before) & np.isfinite(after)
    if not np.allclose(before[finite], after[finite], rtol=1e-9, atol=1e-12):
        return "values differ"
    return None


# -- random instances ------------------------------------------------------------------------------


class _Instance:
    """One random instantiation of a pattern: shapes, dtype, attributes, values."""

    def __init__(self, rng: np.random.Generator, fast_math: bool) -> None:
        self.rng = rng
        self.fast_math = fast_math
        self.element_type = "i32" if rng.random() < 0.2 else "f64"
        rank = int(rng.integers(0, 4))
        self.universe = tuple(int(d) for d in rng.choice([1, 2, 3], size=rank))
        self.var_types: dict[str, TensorType] = {}
        self.attrs: dict[str, object] = {}

    # shapes

    def subshape(self) -> tuple[int, ...]:
        """A shape that broadcasts to the universe: a suffix, some dims set to 1."""
        keep = int(self.rng.integers(0, len(self.universe) + 1))
        shape = self.universe[len(self.universe) - keep :]
        return tuple(1 if self.rng.random() < 0.25 else d for d in shape)

    def tensor(self, shape) -> TensorType:
        return TensorType.get(tuple(shape), self.element_type)

    # building

    def build(self, lhs: Op):
        """A module computing `lhs` (None when this draw does not make valid IR)."""
        names: dict[str, str | None] = {}
        _collect_vars(lhs, names)
        self.plain = self.fast_math or _contains(lhs, ORDER_DEPENDENT)
        for name, element_type in names.items():
            t = self.tensor(self.subshape())
            self.var_types[name] = t.with_element_type(element_type) if element_type else t
        names = list(names)
        fb = FunctionBuilder("rule", [self.var_types[n] for n in names], names)
        self.args = dict(zip(names, fb.args))
        try:
            root = self.node(lhs, fb)
            return fb.ret(root)
        except (VerifyError, TgcError):
            return None

    def node(self, p, fb):
        if isinstance(p, Const):
            if p.name not in self.args:
                self.args[p.name] = fb.atomic.constant(**self.constant(self.subshape()))
            return self.args[p.name]
        if isinstance(p, Var):
            return self.args[p.name]
        if isinstance(p, Splat):
            shape = self.subshape() if self.rng.random() < 0.7 else self.universe
            value = np.full(shape, p.value).astype(self.tensor(shape).dtype)
            return fb.atomic.constant(**self._dense(value, shape))
        if isinstance(p, Fold) or not isinstance(p, Op):
            raise TypeError(f"cannot instantiate {p!r} on a rule's left side")
        operands = [self.node(o, fb) for o in p.operands]
        types = [v.type for v in operands]
        attrs = {}
        for key in p.cls.attr_defs:
            if key in p.attributes and not isinstance(p.attributes[key], AttrVar):
                attrs[key] = p.attributes[key]
                continue
            var = p.attributes.get(key)
            if isinstance(var, AttrVar) and var.name in self.attrs:
                attrs[key] = self.attrs[var.name]
                continue
            if var is None and not p.cls.attr_defs[key].required and self.rng.random() < 0.5:
                continue
            value = sample_attribute(p.name, key, types, self.rng)
            attrs[key] = value
            if isinstance(var, AttrVar):
                self.attrs[var.name] = value
        result_type = sample_result_type(p.name, types, self.rng)
        build = getattr(getattr(fb, p.name.split(".")[0]), p.name.split(".")[1])
        return build(*operands, result_type=result_type, **attrs)

    def constant(self, shape) -> dict:
        t = self.tensor(shape)
        if self.rng.random() < 0.4:
            value = np.full(shape, self.rng.choice(NICE_CONSTANTS))
        else:
            value = self.values(t)
        return self._dense(value.astype(t.dtype), shape)

    def _dense(self, value: np.ndarray, shape) -> dict:
        from tgc.attributes import DenseAttr

        t = self.tensor(shape)
        return {"value": DenseAttr(value, t), "result_type": t}

    def values(self, t: TensorType) -> np.ndarray:
        if t.element_type == "i1":
            return self.rng.random(t.shape) < 0.5
        if not t.is_float:
            magnitude = self.rng.integers(1, 6, size=t.shape)
            return (magnitude * self.rng.choice([-1, 1], size=t.shape)).astype(t.dtype)
        out = self.rng.standard_normal(t.shape)
        if not self.plain:
            special = self.rng.random(t.shape) < 0.2
            picks = self.rng.choice(np.array(SPECIAL_FLOATS), size=t.shape)
            out = np.where(special, picks, out)
        return np.asarray(out, dtype=t.dtype)

    def inputs(self, func) -> list[np.ndarray]:
        return [self.values(arg.type) for arg in func.args]


# Operands that must have a given element type (the rest take the instance's).
OPERAND_ELEMENT_TYPES = {("atomic.where", 0): "i1", ("atomic.gather", 1): "i32"}
# Ops whose numpy reference is not bit-exact on NaN/inf across memory layouts (BLAS may skip
# zeros, reorder sums): instances containing them get ordinary finite inputs.
ORDER_DEPENDENT = frozenset({"atomic.matmul"})


def _collect_vars(p, names: dict[str, str | None], element_type: str | None = None) -> None:
    if isinstance(p, Const):
        return
    if isinstance(p, Var):
        if names.get(p.name) is None:
            names[p.name] = element_type
        return
    if isinstance(p, Op):
        for i, o in enumerate(p.operands):
            _collect_vars(o, names, OPERAND_ELEMENT_TYPES.get((p.name, i)))


def _contains(p, op_names: frozenset[str]) -> bool:
    if not isinstance(p, Op):
        return False
    return p.name in op_names or any(_contains(o, op_names) for o in p.operands)


def sample_attribute(op_name: str, key: str, types: list[TensorType], rng: np.random.Generator):
    """A random valid-looking value for attribute `key` of `op_name` (validity is checked when
    the op is built; invalid draws are skipped)."""
    rank = types[0].rank if types else 0
    if key == "perm":
        choice = rng.random()
        if choice < 0.25 or rank < 2:
            return (
                tuple(range(rank)) if choice < 0.5 else tuple(int(i) for i in rng.permutation(rank))
            )
        if choice < 0.6:
            return tuple(range(rank - 2)) + (rank - 1, rank - 2)
        return tuple(int(i) for i in rng.permutation(rank))
    if key == "axes":
        if rank == 0:
            return (0,)
        count = int(rng.integers(1, rank + 1))
        axes = rng.choice(rank, size=count, replace=False)
        return tuple(int(a) - rank if rng.random() < 0.5 else int(a) for a in axes)
    if key == "axis":
        return int(rng.integers(-max(rank, 1), max(rank, 1)))
    if key in ("keepdims", "transpose_a", "transpose_b"):
        return bool(rng.random() < 0.5)
    if key == "pred":
        return str(rng.choice(["lt", "le", "gt", "ge", "eq", "ne"]))
    raise RuleCheckError(
        f"the rule checker cannot sample attribute '{key}' of '{op_name}': "
        f"add a sampler in passes/rules_check.py"
    )


def sample_result_type(op_name: str, types: list[TensorType], rng: np.random.Generator):
    """Result types for ops that do not infer them (reshape, broadcast, cast); None otherwise."""
    if op_name not in ("atomic.reshape", "atomic.broadcast", "atomic.cast"):
        return None
    t = types[0]
    if rng.random() < 0.35 or op_name == "atomic.cast":
        return t
    shape = list(t.shape)
    if op_name == "atomic.reshape":
        options = [
            [t.num_elements],
            shape[::-1],
            [d for d in shape if d != 1],
            shape[: (i := int(rng.integers(0, len(shape) + 1)))] + [1] + shape[i:],
        ]
        return t.with_shape(options[int(rng.integers(0, len(options)))])
    expanded = [int(rng.choice([2, 3])) if d == 1 and rng.random() < 0.5 else d for d in shape]
    if rng.random() < 0.5:
        expanded.insert(0, int(rng.choice([1, 2, 3])))
    return t.with_shape(expanded)
