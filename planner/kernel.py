"""Kernels: everything that runs, declared in one place, and the registry that collects them.

A kernel is either
- an *op kernel*: it runs one op of a given name with whatever attributes the program gives it
  (`op = "atomic.add"`); its reference graph is that op, or
- a *graph kernel*: it computes a small reference graph written as `.tg` text
  (`reference = "func.func @tanh(%x: tensor<8xf32>) -> ... { ... }"`), matched against the
  program's subgraphs after both are put in canonical form (see `planner.match`). The types in
  the reference text only make it parse; shapes and dtypes are bound from the program, and
  `constraints` says which ones the kernel accepts.

A graph kernel may list several equivalent reference graphs (alternatives): every `func.func`
of its text is one, and `reference` may be a tuple of texts. A text wrapped in `Lowered(...)`
stands for what `lower-hl` makes of it, so a kernel written against `hl.tanh` still applies
after the program was lowered. Each alternative must return one value computed by an op and use
every argument; the arguments are the kernel's inputs, in order (all alternatives of one kernel
take the same arguments). Registration parses, verifies and canonicalises every alternative
once (`canonical_references`).

Every kernel states its backend (whose memory space its operands and results live in, see
`BACKEND_SPACE`), its tunable parameters (name -> domain, the first value is the default) and
its error bound `max_rel_error`, so that `select-kernels{tolerance=...}` can refuse an
approximate kernel. The bound is how far the kernel's result may be from evaluating its
reference graph op by op in the program's own element types (the interpreter's "native"
precision), as a normwise relative difference (`rel_error`). An op kernel that is its op's numpy
meaning states 0; `np.tanh` standing for the exp formula states 1e-6 (a few f32 ulp). Hence its
error against the float64 reference is at most the native evaluation's own rounding error plus
`max_rel_error` (test/test_planner_kernels.py checks both on fresh random inputs). The bound is
stated for f32 and f64 operands: with 16-bit floats a graph kernel computes in f32 and rounds
once where the op-by-op evaluation rounds after every op, so it differs from that evaluation by
up to the 16-bit rounding of the intermediate values while being closer to float64 (the test
checks the float64 side only there).

How a kernel runs (`run`) is the backend's calling convention; the numpy backend's is
`run(inputs: list[np.ndarray], attrs: dict, result_types: list[TensorType]) -> list[np.ndarray]`
(see planner/backends/numpy.py). A kernel with parameters gets their values in `attrs` too,
beside the op's attributes (so a parameter is not named like an attribute of its op); a
`kernel.call` carries the values chosen for it as `param.<name>` attributes.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

import tgc.dialects  # registers the ops reference texts use
import tgc.passes  # noqa: F401  (registers the canonicalising passes)
from tgc.attributes import DenseAttr
from tgc.builder import Builder
from tgc.builtin import FuncOp, ModuleOp
from tgc.diagnostics import TgcError
from tgc.ir import BlockArgument
from tgc.opdef import create
from tgc.parser import parse_module
from tgc.passes.optimize import CLEANUP
from tgc.pass_manager import PassManager
from tgc.printer import print_op
from tgc.verifier import verify

# The memory space of each backend's operands and results: None is host memory. Two backends
# in the same space hand values over without a copy (numpy <-> torch CPU, PyCUDA <-> torch CUDA).
BACKEND_SPACE: dict[str, str | None] = {
    "numpy": None,
    "torch-cpu": None,
    "cuda": "cuda",
    "torch-cuda": "cuda",
}

# The canonical forms a reference graph is matched in, one per form a program is planned in:
# as written (select-kernels runs canonicalize, cse) and after `lower-for-planning` (the default
# of --backend auto, tgc-plan and tgc-profile), whose algebraic rewrites reshape some formulas
# (GELU's x*x*x*c becomes (x*x)*(x*c)). `Lowered` texts are lowered to atomic ops first.
CANONICAL_PIPELINES = ("canonicalize,cse", CLEANUP)
LOWERED_PIPELINES = ("lower-hl,canonicalize,cse", "lower-for-planning,canonicalize,cse")


def no_constraint(types) -> str | None:
    """Accepts every binding; a constraint returns why a binding is refused, or None."""
    return None


def no_param_constraint(types, params: dict) -> str | None:
    """Accepts every parameter point; a parameter constraint returns why `params` cannot run
    on `types` (operand and result types), or None. Tuning (planner/tune.py) skips refused
    points without running them."""
    return None


@dataclass(frozen=True)
class Lowered:
    """A reference text that stands for its `lower-hl` form (hl ops replaced by atomic ones)."""

    text: str


@dataclass(frozen=True, eq=False)
class Kernel:
    name: str  # unique, "<backend>.<what>", e.g. "numpy.tanh", "cuda.elementwise"
    backend: str  # a key of BACKEND_SPACE
    op: str | None = None  # op kernel: the op it runs
    # graph kernel: the .tg function(s) it computes (a text, a Lowered text, or a tuple of them)
    reference: str | Lowered | tuple[str | Lowered, ...] | None = None
    run: Callable | None = None  # how to run it (the backend's calling convention)
    constraints: Callable = no_constraint  # (operand and result types) -> reason refused | None
    params: dict[str, tuple] = field(default_factory=dict)  # name -> domain, first = default
    param_constraints: Callable = no_param_constraint  # (types, params) -> reason refused | None
    max_rel_error: float = 0.0  # stated bound, see the module docstring
    doc: str = ""
    # its results are views of its operands' memory: nothing runs on the device, nothing moves
    # (the cost models price it as such; cuda.split_view)
    view: bool = False
    # graph kernel: its reference's scalar float constants that are a function of a dimension of
    # its arguments (a mean's divisor, an attention scale) stand for that function, so that a
    # reference written at 4x8 matches a 768-wide program (`shape_constant`). Off by default: a
    # literal such as GELU's 0.5 would otherwise be read as 1/2 of a dimension of size 2.
    shape_constants: bool = False

    def __post_init__(self) -> None:
        if (self.op is None) == (self.reference is None):
            raise TypeError(f"kernel {self.name}: give exactly one of `op` and `reference`")
        if self.backend not in BACKEND_SPACE:
            raise TypeError(f"kernel {self.name}: unknown backend '{self.backend}'")

    @property
    def space(self) -> str | None:
        return BACKEND_SPACE[self.backend]

    @property
    def default_params(self) -> dict:
        return {k: domain[0] for k, domain in self.params.items()}

    def param_attributes(self, params: dict) -> dict:
        """The `param.<name>` attributes a call running with `params` carries: the parameters
        with a choice (a one-value domain, such as a generated kernel's region key, stays off
        the IR)."""
        return {f"param.{k}": v for k, v in params.items() if len(self.params[k]) > 1}

    @property
    def is_graph_kernel(self) -> bool:
        return self.reference is not None

    def reference_texts(self) -> tuple[str | Lowered, ...]:
        if self.reference is None:
            return ()
        if isinstance(self.reference, tuple):
            return self.reference
        return (self.reference,)


class _Registry(dict):
    """The kernel registry: a dict whose `version` changes with every mutation, so indexes
    built from it (graph kernels by root op, see `planner.match`) know when to rebuild."""

    def __init__(self) -> None:
        super().__init__()
        self.version = 0

    def _bump(self) -> None:
        self.version += 1

    def __setitem__(self, key, value) -> None:
        super().__setitem__(key, value)
        self._bump()

    def __delitem__(self, key) -> None:
        super().__delitem__(key)
        self._bump()

    def pop(self, *args):
        self._bump()
        return super().pop(*args)

    def popitem(self):
        self._bump()
        return super().popitem()

    def clear(self) -> None:
        super().clear()
        self._bump()

    def update(self, *args, **kwargs) -> None:
        super().update(*args, **kwargs)
        self._bump()

    def setdefault(self, key, default=None):
        self._bump()
        return super().setdefault(key, default)


KERNELS: dict[str, Kernel] = _Registry()


def registry_version() -> int:
    """Changes whenever a kernel is added or removed."""
    return KERNELS.version


def register_kernel(kernel: Kernel) -> Kernel:
    """Add `kernel`; a graph kernel's references are parsed and canonicalised here, once."""
    if kernel.name in KERNELS:
        raise TypeError(f"kernel '{kernel.name}' is registered twice")
    if kernel.is_graph_kernel:
        for func in canonical_references(kernel):
            # matching walks back from the one value a reference returns (a generated region
            # with several results is never registered: it is offered, not matched)
            if len(func.body.last.operands) != 1:
                raise TypeError(
                    f"kernel {kernel.name}, @{func.sym_name}: a registered graph kernel's "
                    "reference returns one op result"
                )
    KERNELS[kernel.name] = kernel
    return kernel


def unregister_kernel(name: str) -> Kernel:
    """Remove a kernel (tests register temporary ones)."""
    return KERNELS.pop(name)


def kernels_for_op(op_name: str) -> list[Kernel]:
    return [k for k in KERNELS.values() if k.op == op_name]


def graph_kernels() -> list[Kernel]:
    return [k for k in KERNELS.values() if k.reference is not None]


# -- reference graphs --------------------------------------------------------------------------

# kernel -> its canonical alternatives (Kernel is frozen and hashed by identity).
_CANONICAL: dict[Kernel, tuple[FuncOp, ...]] = {}


def canonical_references(kernel: Kernel) -> tuple[FuncOp, ...]:
    """The kernel's reference graphs, parsed, verified and in canonical form (cached).

    Raises TypeError (a broken kernel definition is a programming error) when a text does not
    parse or verify, when an alternative returns no op result (or an argument), leaves an
    argument unused, or takes other argument types than the first alternative."""
    cached = _CANONICAL.get(kernel)
    if cached is not None:
        return cached
    funcs: list[FuncOp] = []
    seen: set[str] = set()
    for text in kernel.reference_texts():
        for func in _parse_canonical(kernel, text):
            key = _printed(func)
            if key not in seen:  # a Lowered text may equal another alternative
                seen.add(key)
                funcs.append(func)
    for func in funcs:
        _check_alternative(kernel, func, funcs[0])
    _CANONICAL[kernel] = tuple(funcs)
    return _CANONICAL[kernel]


def _parse_canonical(kernel: Kernel, text: str | Lowered) -> list[FuncOp]:
    """The text's functions in each canonical form (equal forms are dropped by the caller)."""
    lowered = isinstance(text, Lowered)
    source = text.text if lowered else text
    funcs: list[FuncOp] = []
    for pipeline in LOWERED_PIPELINES if lowered else CANONICAL_PIPELINES:
        try:
            module: ModuleOp = parse_module(source, _buffer_name(kernel, source))
            verify(module)
            PassManager.from_text(pipeline).run(module)
        except TgcError as e:
            raise TypeError(f"kernel {kernel.name}: bad reference graph: {e}") from None
        if not module.funcs:
            raise TypeError(f"kernel {kernel.name}: the reference text holds no function")
        funcs += module.funcs
    return funcs


def _buffer_name(kernel: Kernel, source: str) -> str:
    """The name a reference text is parsed (and its lines quoted) under: one per text. The
    regions of one template are kernels of one name, and a kernel's alternatives are texts of
    one kernel; a shared name would quote another text's line in a diagnostic."""
    if len(kernel.reference_texts()) == 1 and not kernel.params:
        return f"<kernel {kernel.name}>"
    digest = hashlib.blake2b(source.encode(), digest_size=4).hexdigest()
    return f"<kernel {kernel.name} {digest}>"


def _printed(func: FuncOp) -> str:
    text = print_op(func)
    return text.split("(", 1)[1]  # without the function's name


def _check_alternative(kernel: Kernel, func: FuncOp, first: FuncOp) -> None:
    where = f"kernel {kernel.name}, @{func.sym_name}"
    returned = func.body.last.operands
    if not returned or any(isinstance(v, BlockArgument) for v in returned):
        raise TypeError(f"{where}: a reference graph returns op results")
    unused = [i for i, a in enumerate(func.body.args) if not a.uses]
    if unused:
        raise TypeError(f"{where}: argument #{unused[0]} is unused after canonicalisation")
    if len(func.body.args) != len(first.body.args):
        raise TypeError(
            f"{where}: takes {len(func.body.args)} arguments, the first takes "
            f"{len(first.body.args)}"
        )


def reference_root(func: FuncOp):
    """The op whose result a canonical reference graph returns."""
    return func.body.last.operands[0].defining_op


def instantiate_reference(func: FuncOp, arg_types, shape_constants: bool = False) -> FuncOp:
    """A copy of reference graph `func` on other argument types, every result type inferred
    again. An op that cannot infer its result types (a constant, reshape, iota, broadcast)
    keeps the graph's, a float one taking the element type of the first float argument (as a
    float constant does), except on the graph's own argument types: a region kernel's graph,
    instantiated on its own types, is itself. With `shape_constants` (the kernel's), a constant
    that is a function of a dimension takes its value on `arg_types`.
    Raises TypeError when the types do not fit (verification fails)."""
    new = FuncOp.build(func.sym_name, list(arg_types), [], [a.name_hint for a in func.args])
    b = Builder.at_end(new.body)
    env = dict(zip(func.args, new.args))
    # on its own types the graph keeps its declared types: re-typed, a region that mixes float
    # types (an f32 residual cast to bf16 before a bf16 weight) would not verify
    own = [a.type.with_encoding(None) for a in func.args]
    retyped = own != [t.with_encoding(None) for t in arg_types]
    floats = [t.element_type for t in arg_types if t.is_float and retyped]
    try:
        for op in func.body.ops:
            operands = [env[v] for v in op.operands]
            if op is func.body.last:
                b.create(op.name, operands, result_types=[])
                new.set_result_types([v.type for v in operands])
                break
            attributes, declared = op.attributes, None
            if op.name == "atomic.constant":
                attributes, declared = _constant_like(op, floats[0] if floats else None)
                resized = shape_constant(func, op, arg_types) if shape_constants else None
                if resized is not None:
                    t = declared[0]
                    value = np.full(t.shape, resized, dtype=t.dtype)
                    attributes = {**attributes, "value": DenseAttr(value, t)}
            elif op.infer() is None:
                declared = [_float_like(r.type, floats[0] if floats else None) for r in op.results]
            made = b.insert(create(type(op), operands, attributes, declared, loc=op.loc))
            env.update(zip(op.results, made.results))
        verify(new)
    except TgcError as e:
        raise TypeError(f"@{func.sym_name} does not fit {list(map(str, arg_types))}: {e}") from None
    return new


# The functions of one dimension a reference constant may stand for: a mean's divisor is the
# size of an axis (or its reciprocal), attention's scale 1/sqrt of the head dim.
SHAPE_FUNCTIONS = (
    lambda d: float(d),
    lambda d: 1.0 / d,
    lambda d: math.sqrt(d),
    lambda d: 1.0 / math.sqrt(d),
)


def shape_constant(func: FuncOp, const, arg_types) -> float | None:
    """What the scalar float constant `const` of reference graph `func` is on the arguments
    `arg_types`, where it is a function of a dimension of the reference's arguments (a mean's
    divisor written at 8 wide is 768 on a 768-wide program): every (argument, axis, function)
    that gives the written value from the written types must give one value on `arg_types`.
    None where the constant is no such function, or the candidates disagree: then it is a
    number, compared by value. A reference is best written at sizes no constant equals by
    chance (docs/kernels.md)."""
    array = const.attr("value").array
    if array.size != 1 or not const.results[0].type.is_float:
        return None
    written = float(array.reshape(-1)[0].astype(np.float64))
    if not math.isfinite(written) or written == 0.0:
        return None
    found: set[float] = set()
    for arg, new in zip(func.body.args, arg_types):
        for axis, size in enumerate(arg.type.shape):
            if size < 2 or axis >= len(new.shape) or new.shape[axis] < 1:
                continue
            for fn in SHAPE_FUNCTIONS:
                if math.isclose(fn(size), written, rel_tol=1e-6):
                    found.add(fn(new.shape[axis]))
    if len(found) != 1:
        return None
    return found.pop()


def _float_like(t, element_type: str | None):
    return t.with_element_type(element_type) if element_type and t.is_float else t


def _constant_like(op, element_type: str | None) -> tuple[dict, list]:
    t = op.results[0].type
    if element_type is None or not t.is_float:
        return op.attributes, [t]
    t = t.with_element_type(element_type)
    value = op.attr("value")
    return {**op.attributes, "value": DenseAttr(value.array.astype(t.dtype), t)}, [t]


# -- errors ----------------------------------------------------------------------------------


def rel_error(got: np.ndarray, want: np.ndarray) -> float:
    """Normwise relative difference max|got - want| / max|want| (0 for equal arrays, NaN and
    infinities included where they coincide; inf where they do not)."""
    got = np.asarray(got, dtype=np.float64)
    want = np.asarray(want, dtype=np.float64)
    if got.shape != want.shape:
        return float("inf")
    # Where both are finite everywhere (the usual case) two passes give the answer: equal
    # values are those whose difference is 0, and max|want| is over all of it. A NaN or an
    # infinity anywhere (or a difference that overflows) makes the largest difference
    # non-finite (max propagates NaN), and the general rule below decides. At GPT-2's LM head
    # (103M results) the general rule alone took 10 s per comparison on the host.
    with np.errstate(invalid="ignore", over="ignore"):
        diff = np.abs(got - want)
    largest = float(diff.max(initial=0.0))
    if math.isfinite(largest):
        if largest == 0.0:
            return 0.0
        scale = float(np.abs(want).max())
        return largest / scale if scale > 0 else float("inf")
    same = (got == want) | (np.isnan(got) & np.isnan(want))
    if same.all():
        return 0.0
    if not (np.isfinite(got) | same).all() or not (np.isfinite(want) | same).all():
        return float("inf")
    with np.errstate(invalid="ignore"):
        diff = np.where(same, 0.0, np.abs(got - want))
    scale = np.max(np.abs(np.where(np.isfinite(want), want, 0.0)), initial=0.0)
    return float(diff.max() / scale) if scale > 0 else float("inf")
