"""Kernels from users: loaded from a Python file or module, checked, then offered to the planner.

A kernel plugin is a Python module with a function `tgc_kernels()` that returns a list of
`planner.kernel.Kernel`s (a numpy, torch or cuda `run`, and for a graph kernel its reference
graph in `.tg`; docs/kernels.md walks through one of each). The tools load one with
`--kernels FILE.py` or `--kernels package.module`, and every installed package that declares an
entry point in the group `tgc.kernels` (its value a module, or `module:function`; the tools find
them, tgc/tools/_common.py, and hand them here).

Nothing is used before it is checked: each kernel is registered (its reference graphs parsed,
verified and put in canonical form), then run on fresh random inputs at the shapes its reference
was written at and at two others made from them (each size s becomes s + 3 and 2s + 1, sizes of
1 kept, so that equal sizes stay equal), and compared with its reference evaluated in float64,
as `tgc-profile` checks a kernel before timing it (planner/profile.py: the stated
`max_rel_error` plus the rounding of the program's element type). A kernel that fails is
unregistered and refused with the first element that differs. An op kernel is checked on its
op's docstring example instead.

A plugin given with `--kernels` that cannot be loaded or checked is an error; one found through
an entry point is a warning, and the tool goes on without it (an installed package must not stop
every tool).
"""

from __future__ import annotations

import importlib
import importlib.util
import secrets
import sys
from pathlib import Path

import numpy as np

from tgc.builtin import FuncOp
from tgc.diagnostics import TgcError
from tgc.planner.kernel import (
    KERNELS,
    Kernel,
    canonical_references,
    instantiate_reference,
    register_kernel,
    unregister_kernel,
)

FUNCTION = "tgc_kernels"


def load_plugins(specs: list[str], entry_points=()) -> list[Kernel]:
    """Load, check and register the kernels of every plugin in `specs` (files or modules) and
    of every installed one in `entry_points` (importlib.metadata's entry points of the group the
    tools read, tgc.tools._common.KERNEL_ENTRY_POINTS); returns the kernels registered."""
    loaded: list[Kernel] = []
    for spec in specs:
        loaded += _install(_kernels_of(_import(spec), spec), spec)
    for point in entry_points:
        try:
            target = point.load()
            kernels = target() if callable(target) else _kernels_of(target, point.value)
            loaded += _install(list(kernels), point.value)
        except TgcError as e:
            _warn(f"kernels of '{point.value}' (entry point {point.name}) left out: {e}")
        except Exception as e:  # noqa: BLE001  (another package's bug: say it, go on)
            _warn(f"kernels of '{point.value}' left out: {type(e).__name__}: {e}")
    return loaded


def _warn(message: str) -> None:
    print(f"tgc: warning: {message}", file=sys.stderr)


def _import(spec: str):
    """The module a spec names: a .py file, else a module importable from the Python path."""
    if spec.endswith(".py"):
        path = Path(spec)
        if not path.is_file():
            raise TgcError(f"--kernels: no such file '{spec}'")
        name = f"tgc_kernel_plugin_{path.stem}"
        module_spec = importlib.util.spec_from_file_location(name, path)
        module = importlib.util.module_from_spec(module_spec)
        run = module_spec.loader.exec_module
    else:
        module, run = None, None
    try:
        if run is None:
            return importlib.import_module(spec)
        run(module)
        return module
    except ModuleNotFoundError as e:
        raise TgcError(f"--kernels: cannot import '{spec}': {e}") from None
    except Exception as e:  # noqa: BLE001  (the user's code: one line, not a traceback)
        raise TgcError(f"--kernels: '{spec}' failed to load: {type(e).__name__}: {e}") from None


def _kernels_of(module, spec: str) -> list:
    make = getattr(module, FUNCTION, None)
    if not callable(make):
        raise TgcError(f"--kernels: '{spec}' defines no function {FUNCTION}() returning kernels")
    try:
        kernels = list(make())
    except Exception as e:  # noqa: BLE001
        raise TgcError(f"--kernels: {spec}: {FUNCTION}() raised {type(e).__name__}: {e}") from None
    wrong = [k for k in kernels if not isinstance(k, Kernel)]
    if wrong:
        raise TgcError(
            f"--kernels: {spec}: {FUNCTION}() returned {type(wrong[0]).__name__}, not a Kernel"
        )
    return kernels


def _install(kernels: list[Kernel], spec: str) -> list[Kernel]:
    """Register each kernel and check it; a failing one is unregistered and refused."""
    done: list[Kernel] = []
    for kernel in kernels:
        if kernel.name in KERNELS:
            if KERNELS[kernel.name] is kernel:  # loaded twice (a file and an entry point)
                continue
            raise TgcError(f"--kernels: {spec}: a kernel named '{kernel.name}' exists already")
        try:
            register_kernel(kernel)
        except TypeError as e:  # a reference that does not parse, verify or fit the rules
            raise TgcError(f"--kernels: {spec}: {e}") from None
        try:
            check_kernel(kernel)
        except TgcError as e:
            unregister_kernel(kernel.name)
            raise TgcError(f"--kernels: {spec}: {e.message}") from None
        done.append(kernel)
    return done


# -- the check ---------------------------------------------------------------------------------


def check_kernel(kernel: Kernel) -> None:
    """Run `kernel` against its reference in float64 at the shapes it was written at and two
    more (module doc); raise TgcError naming the first element that differs."""
    from tgc.planner import family_of, load_backends
    from tgc.planner.backends import BACKENDS

    load_backends([family_of(kernel.backend)])  # only the family it needs (torch is slow)
    if kernel.backend not in BACKENDS:
        raise TgcError(f"kernel '{kernel.name}' runs on {kernel.backend}, not loaded here")
    cases = _cases(kernel)
    checked = sum(_check_at(kernel, ins, outs, ref) for ins, outs, ref in cases)
    if checked == 0:
        written = ", ".join(map(str, cases[0][0]))
        raise TgcError(
            f"kernel '{kernel.name}' accepts none of the types it was checked at ({written})"
        )


def _cases(kernel: Kernel) -> list[tuple[list, list, FuncOp | None]]:
    """(operand types, result types, reference function) to check `kernel` at, on the host:
    each of a graph kernel's reference graphs (every one must mean what the kernel computes)
    at its written shapes and at two others (each size s as s + 3 and as 2s + 1, sizes of 1
    kept, so equal sizes stay equal); an op kernel at its op's docstring example (its reference
    made by `reference_function`: None)."""
    if kernel.op is None:
        cases = []
        for ref in canonical_references(kernel):
            written = [a.type for a in ref.body.args]
            for grow in (lambda s: s, lambda s: s + 3, lambda s: 2 * s + 1):
                ins = [
                    t.with_shape(tuple(s if s <= 1 else grow(s) for s in t.shape)) for t in written
                ]
                try:
                    func = instantiate_reference(ref, ins, kernel.shape_constants)
                except TypeError:
                    continue  # the graph holds sizes that do not follow its arguments
                cases.append((ins, list(func.function_type.results), func))
        return cases
    from tgc.dialects._decomposition_check import docstring_examples, example_function
    from tgc.opdef import OPS
    from tgc.parser import parse_module

    cls = OPS.get(kernel.op)
    if cls is None:
        raise TgcError(f"kernel '{kernel.name}' runs op '{kernel.op}', which is not registered")
    examples = docstring_examples(cls)
    if not examples:
        raise TgcError(f"kernel '{kernel.name}': op '{kernel.op}' has no example to check it on")
    func = parse_module(example_function(kernel.op, examples[0]), "<example>").funcs[0]
    return [([a.type for a in func.body.args], list(func.function_type.results), None)]


def _check_at(kernel: Kernel, ins: list, outs: list, ref: FuncOp | None) -> bool:
    """Whether the kernel was checked at these types against `ref` (None: the instance's own
    reference) (False: its constraints refuse them); raises TgcError where it is wrong."""
    from tgc.planner.backends import BACKENDS
    from tgc.planner.kernel import rel_error
    from tgc.planner.match import accepts
    from tgc.planner.profile import (
        HostCheck,
        Instance,
        _allowed_error,
        _invocation,
        reference_function,
    )

    ins = [t.with_encoding(kernel.space) for t in ins]
    outs = [t.with_encoding(kernel.space) for t in outs]
    if not accepts(kernel, ins, outs):
        return False
    inst = Instance(kernel, tuple(ins), tuple(outs))
    ref = ref if ref is not None else reference_function(inst)
    invoke = _invocation(inst, ref)
    if isinstance(invoke, str):
        raise TgcError(f"kernel '{kernel.name}' cannot be called: {invoke}")
    backend = BACKENDS[kernel.backend]
    check = HostCheck(ref, kernel.space, secrets.randbits(32))
    where = ", ".join(str(t.with_encoding(None)) for t in ins)
    with np.errstate(all="ignore"):
        want = check.reference("f64")
        try:
            got = check.results(invoke(check.operands(tuple(ins), backend)), backend)
        except Exception as e:  # noqa: BLE001  (the user's kernel: one line)
            raise TgcError(
                f"kernel '{kernel.name}' raised {type(e).__name__} on {where}: {e}"
            ) from None
        native = check.reference("native")
    host = [t.with_encoding(None) for t in outs]
    for i, (g, w, n) in enumerate(zip(got, want, native)):
        allowed = _allowed_error(kernel, rel_error(n, w), host)
        error = rel_error(g, w)
        if not error <= allowed:
            raise TgcError(
                f"kernel '{kernel.name}' is wrong on {where}: result {i} "
                f"{_first_difference(np.asarray(g), w, allowed)} (relative error {error:.3g} "
                f"against float64, allowed {allowed:.3g}){_size_hint(kernel, ins)}"
            )
    return True


def _size_hint(kernel: Kernel, ins: list) -> str:
    """Where the reference holds a constant that looks like a function of a size and the kernel
    does not say so, the likely cause: its reference means that number at every size."""
    if kernel.op is not None or kernel.shape_constants:
        return ""
    from tgc.planner.kernel import shape_constant

    host = [t.with_encoding(None) for t in ins]
    refs = [r for r in canonical_references(kernel) if len(r.body.args) == len(host)]
    constants = [(r, op) for r in refs for op in r.body.ops if op.name == "atomic.constant"]
    if any(shape_constant(r, c, host) is not None for r, c in constants):
        return (
            "; its reference holds a constant that is a function of a size (a mean's divisor?): "
            "if so, give the kernel shape_constants=True"
        )
    return ""


def _first_difference(got: np.ndarray, want: np.ndarray, allowed: float) -> str:
    """'[2, 5] is 0.51 where the reference gives 0.49' for the first element off by more than
    the allowance (scaled as rel_error scales), or the shape where the shapes differ."""
    if got.shape != want.shape:
        return f"its result has shape {got.shape}, the reference {want.shape}"
    g = got.astype(np.float64)
    scale = float(np.max(np.abs(want), initial=0.0)) or 1.0
    bad = ~((np.abs(g - want) <= allowed * scale) | (np.isnan(g) & np.isnan(want)))
    index = tuple(int(i) for i in np.argwhere(bad)[0]) if bad.any() else ()
    return f"{list(index)} is {g[index]:.6g} where the reference gives {want[index]:.6g}"
