"""Run a selected (placed) function, mixing backends: one executor for every plan.

`run_plan(func, inputs)` (host arrays in and out) and `run_planned(func, values)` (values in
their spaces in and out, for a caller that keeps them on the device) walk the function once,
in order:

- `kernel.call`: the kernel named by `callee` (in `KERNELS`) runs on its backend (`BACKENDS`,
  see planner/backends/__init__.py): the operands, kept in their memory space's representation,
  are adopted by the backend, `call(kernel, inputs, attrs, result_types)` runs it (attrs: the
  op attributes of an op kernel's call, `{}` for a graph kernel's), and the results are released
  back to the space's representation. A callee naming a generated-kernel family (`TEMPLATES`,
  e.g. "cuda.elementwise") runs through its backend's `run_region(op, inputs)`, which makes the
  kernel from the call's region;
- `kernel.copy`: the value moves to the result type's space (through the host);
- `kernel.fused`: on the host, its region interpreted; in another space, compiled and run by
  the backend of that space that runs generated kernels (cuda);
- any other op left in the function (`atomic.constant`, `atomic.reshape`, ...): its numpy
  meaning on the host, as the interpreter's "native" precision computes it.

So one run mixes numpy, torch and CUDA kernels, with copies between host and device where the
plan has them. `PlannedFunction(func)` resolves every op once (kernel, backend, attributes,
spaces, value slots) and is then called like `run_planned`: a run does little on the host
beyond the kernels' own calls, which matters where the GPU's work per kernel takes a few µs.
It also runs the steps that read only values fixed by the `{tgc.param}` arguments and
constants (once steps, planner/fixed.py `runs_once`: packing weights, copying them and
constants made on the host to the device) only when some parameter array
is not, by identity, the one of the previous call, and otherwise reuses their results; a new
array object for any parameter runs them all again (`forget_params` after changing one in
place). `run_plan` and `run_planned` make a new `PlannedFunction` each time: they run every
step. For `run_plan`, inputs and results are host numpy arrays; a function argument typed in another
space is moved there first, and results are brought back. Errors (a callee no kernel has, a
backend that is not available here, a kernel whose operands live in another space) are
TgcErrors at the op.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

import numpy as np

from tgc.builtin import FuncOp, ReturnOp
from tgc.diagnostics import UNKNOWN_LOC, TgcError
from tgc.dialects.kernel import CallOp, CopyOp, FusedOp
from tgc.evaluate import allocating, evaluate_block, evaluate_op
from tgc.ir import Operation
from tgc.planner import family_of, load_backends
from tgc.planner.backends import BACKENDS, SPACES, TEMPLATES, Backend, Space, Template
from tgc.planner.fixed import Fixed
from tgc.planner.kernel import BACKEND_SPACE, KERNELS, Kernel
from tgc.runtime.interpreter import check_inputs


def run_plan(
    func: FuncOp, inputs: list[np.ndarray], backends: Mapping[str, Backend] | None = None
) -> list[np.ndarray]:
    """Run `func` (ops left as they are, kernel calls, copies) on host inputs; host results.

    `backends` replaces the registered backends (name -> Backend), e.g. to run without one;
    without it, the backends `func` calls are loaded."""
    if backends is None:
        load_backends(_families_called(func))
    values = [
        _space(arg.type.encoding, func).from_host(value, arg.type)
        for arg, value in zip(func.body.args, check_inputs(func, inputs, "native"))
    ]
    results = run_planned(func, values, backends, loaded=True)
    types = func.function_type.results
    return [_space(t.encoding, func).to_host(x) for t, x in zip(types, results)]


def run_planned(
    func: FuncOp,
    values: list,
    backends: Mapping[str, Backend] | None = None,
    loaded: bool = False,
) -> list:
    """Run `func` on values already in its arguments' spaces (device arrays for arguments typed
    in device memory); its results stay in their spaces. Nothing here waits for the device: a
    caller that keeps its values on the GPU queues the plan's kernels and goes on (as a
    benchmark timing the plan with CUDA events does). Without `backends` and `loaded`, the
    backends `func` calls are loaded first. A caller that runs one function many times makes
    it a `PlannedFunction` once instead."""
    return PlannedFunction(func, backends, loaded)(values)


class PlannedFunction:
    """A planned function made ready to run many times: every op is resolved once (its kernel,
    backend, attributes, the memory spaces involved, the value slots it reads and writes), so a
    call does no more on the host than the kernels themselves need. What can be found wrong
    without running (a callee no kernel has, a backend not available here, values in the wrong
    space) is a located TgcError when the function is made ready; a kernel's own error and
    running out of memory are located at the op when it runs.

    Once steps (planner/fixed.py) run on the first call and whenever some `{tgc.param}`
    argument is another object than the previous call's; otherwise the values they made that
    other steps read are reused (a result that is such a value is the same object each time, as
    an argument returned is). `once_runs` counts how often they ran."""

    def __init__(
        self,
        func: FuncOp,
        backends: Mapping[str, Backend] | None = None,
        loaded: bool = False,
    ) -> None:
        if backends is None and not loaded:
            load_backends(_families_called(func))
        table = dict(BACKENDS) if backends is None else dict(backends)
        self.func = func
        slots = {arg: i for i, arg in enumerate(func.body.args)}
        self.steps: list[_Step] = []
        self.returned: tuple[int, ...] | None = None
        fixed = Fixed()
        compile_regions(func.body.ops, table)
        for op in func.body.ops:
            operands = tuple(slots[v] for v in op.operands)
            if isinstance(op, ReturnOp):
                self.returned = operands
                break
            results = tuple(range(len(slots), len(slots) + len(op.results)))
            slots.update(zip(op.results, results))
            step = _Step(op, _prepare_op(op, table), operands, results, fixed.runs_once(op))
            self.steps.append(step)
        self.slot_count = len(slots)
        self._plan_once(func)

    def _plan_once(self, func: FuncOp) -> None:
        """The steps run once per set of parameter arrays (planner/fixed.py) and the slots of
        their results that the other steps (or the return) read: those are kept between calls;
        the values only once steps read are not."""
        self.param_slots = tuple(i for i in range(len(func.body.args)) if func.is_param(i))
        self.per_call = [s for s in self.steps if not s.once]
        once_slots = {i for s in self.steps if s.once for i in s.results}
        read = {i for s in self.per_call for i in s.operands} | set(self.returned or ())
        self.kept = tuple(sorted(once_slots & read))
        self.once_runs = 0  # how many times the once steps ran (a new set of parameters)
        self._params: list | None = None  # the parameter arrays the kept values were made from
        self._kept_values: list = []

    def forget_params(self) -> None:
        """Run the once steps again on the next call: for a caller that changed a parameter
        array in place (the same object, other contents), which identity cannot see."""
        self._params, self._kept_values = None, []

    def __call__(self, values: list) -> list:
        env = self.run_keeping(values)
        return [env[i] for i in self.returned]

    def run_keeping(self, values: list) -> list:
        """Run on `values` (as a call does) and return every value of the run, slot by slot: a
        caller that replays the run's device work (planner/graphs.py) keeps its buffers."""
        func = self.func
        if len(values) != len(func.body.args):
            raise TgcError(
                f"@{func.sym_name} takes {len(func.body.args)} argument(s), {len(values)} given",
                func.loc,
            )
        if self.returned is None:
            raise TgcError(f"@{func.sym_name} has no 'func.return'", func.loc)
        env = list(values) + [None] * (self.slot_count - len(values))
        steps = self.steps
        if len(steps) != len(self.per_call):
            params = [values[i] for i in self.param_slots]
            known = self._params
            if known is not None and all(a is b for a, b in zip(params, known)):
                steps = self.per_call
                for i, value in zip(self.kept, self._kept_values):
                    env[i] = value
            else:
                self._params = None  # until every step has run on these parameters
        self._run(steps, env)
        if steps is self.steps and len(steps) != len(self.per_call):
            # holding the arrays keeps their identities from being reused by new objects
            self._params = [values[i] for i in self.param_slots]
            self._kept_values = [env[i] for i in self.kept]
            self.once_runs += 1
        return env

    def on_device_per_call(self) -> bool:
        """Whether every step a call runs (once steps aside) works on device values alone: no
        host op, no copy through the host. Such a call can be captured as a CUDA graph."""
        return self.host_step() is None

    def host_step(self) -> str | None:
        """The first step a call runs (once steps aside) that is not on device values alone,
        described with its place (None: there is none)."""
        for step in self.per_call:
            op = step.op
            values = (*op.operands, *op.results)
            if isinstance(op, CopyOp) or any(v.type.encoding is None for v in values):
                what = op.attr("callee") if isinstance(op, CallOp) else op.name
                return f"'{what}' at {op.loc}" if op.loc is not None else f"'{what}'"
        return None

    @staticmethod
    def _run(steps: list[_Step], env: list) -> None:
        for step in steps:
            outs = _run_located(step, [env[i] for i in step.operands])
            for i, value in zip(step.results, outs):
                env[i] = value


@dataclass(frozen=True)
class _Step:
    """One op made ready: `run(operand values) -> result values`, the slots it reads and
    writes, and whether it runs once per set of parameters (planner/fixed.py)."""

    op: Operation
    run: Callable[[list], list]
    operands: tuple[int, ...]
    results: tuple[int, ...]
    once: bool = False


def _families_called(func: FuncOp) -> list[str]:
    """The backend families whose kernels `func` calls (numpy always): the plan loads those and
    no others. A callee is named "<backend>.<what>"; a copy names its backend in
    `plan.backend`."""
    found = ["numpy"]
    for op in func.body.ops:
        if isinstance(op, (CallOp, CopyOp)):
            name = str(op.attributes.get("plan.backend") or op.attr("callee") or "")
            family = family_of(name.split(".", 1)[0])
            if family is not None and family not in found:
                found.append(family)
    return found


def _run_located(step: _Step, values: list) -> list:
    """`step.run(values)`, its errors at the op: a kernel's own error (an index out of range)
    and running out of memory."""
    op = step.op
    try:
        return step.run(values)
    except MemoryError:
        _out_of_memory(op)
        raise
    except TgcError as e:
        if e.loc is None or e.loc == UNKNOWN_LOC:  # a kernel's own op has no place in the file
            e.loc = op.loc
        raise


def _out_of_memory(op: Operation) -> None:
    """Raise the located error that says how much memory `op`'s results needed."""

    def fail():
        raise MemoryError

    allocating(fail, [r.type for r in op.results], _what(op), "native", op.loc)


def _what(op: Operation) -> str:
    return f"the result of '{op.attr('callee') if isinstance(op, CallOp) else op.name}'"


def compile_regions(ops, backends: Mapping[str, Backend]) -> None:
    """The generated kernels of `ops` compiled at once, by each backend that compiles many at
    once (Backend.compile_regions); what cannot be found here is left to `_prepare_op`, which
    says what is wrong with it."""
    batches: dict[str, list[Operation]] = {}
    for op in ops:
        backend = None
        if isinstance(op, CallOp) and op.regions:
            template = TEMPLATES.get(op.attr("callee"))
            backend = backends.get(template.backend) if template is not None else None
        elif isinstance(op, FusedOp):
            spaces = _spaces(op)
            if spaces != {None}:  # on the host a kernel.fused is evaluated, not compiled
                backend = _fused_backend(spaces, backends)
        if backend is not None and backend.compile_regions is not None:
            batches.setdefault(backend.name, []).append(op)
    for name, batch in batches.items():
        backends[name].compile_regions(batch)


def _prepare_op(op: Operation, backends: dict[str, Backend]) -> Callable[[list], list]:
    """How to run `op` on its operand values (module doc), checked now for what can be."""
    # results no address can hold are refused before anything runs
    allocating(lambda: None, [r.type for r in op.results], _what(op), "native", op.loc)
    if isinstance(op, CallOp):
        return _prepare_call(op, backends)
    if isinstance(op, CopyOp):
        source = _space(op.operands[0].type.encoding, op)
        target_type = op.results[0].type
        target = _space(target_type.encoding, op)
        return lambda values: [target.from_host(source.to_host(values[0]), target_type)]
    spaces = _spaces(op)
    if isinstance(op, FusedOp) and spaces - {None}:
        return _prepare_fused_on_device(op, backends, spaces)
    if spaces - {None}:
        raise TgcError(
            f"'{op.name}' on values in {', '.join(sorted(s for s in spaces if s))} memory has no "
            f"kernel here (select-kernels makes it a kernel.call)",
            op.loc,
        )
    if isinstance(op, FusedOp):
        return lambda values: evaluate_block(op.body, values, "native")
    # A plain op on the host runs its numpy meaning, on itself (nothing built per call).
    return lambda values: evaluate_op(op, [np.asarray(v) for v in values], "native")


def _prepare_call(op: CallOp, backends: dict[str, Backend]) -> Callable[[list], list]:
    kernel = _kernel(op)
    backend = _backend(kernel, backends, op)
    space = BACKEND_SPACE[kernel.backend]
    spaces = _spaces(op)
    if spaces - {space}:
        where = ", ".join(sorted(str(s or "host") for s in spaces))
        raise TgcError(
            f"kernel '{kernel.name}' works in {space or 'host'} memory, but the call's "
            f"values are in {where} memory (insert kernel.copy)",
            op.loc,
        )
    prepared = None if backend.prepare is None else backend.prepare(kernel, op)
    if prepared is not None:
        return lambda values: _checked(op, kernel, prepared(values))
    adopt, release = backend.adopt, backend.release
    if isinstance(kernel, Template):
        run_region = backend.run_region

        def run(values: list) -> list:
            outs = run_region(op, [adopt(v) for v in values])
            return _checked(op, kernel, [release(v) for v in outs])

        return run
    attrs = op.op_attributes() if kernel.op is not None else {}
    # its parameters beside the attributes (planner/kernel.py): those select-kernels chose
    # (`param.<name>`), else the defaults
    attrs.update(kernel.default_params)
    attrs.update({k[6:]: v for k, v in op.attributes.items() if k.startswith("param.")})
    types = [r.type for r in op.results]
    call = backend.call

    def run(values: list) -> list:
        outs = call(kernel, [adopt(v) for v in values], dict(attrs), types)
        return _checked(op, kernel, [release(v) for v in outs])

    return run


def _backend(kernel: Kernel | Template, backends: dict[str, Backend], op: Operation) -> Backend:
    backend = backends.get(kernel.backend)
    if backend is None:
        raise TgcError(
            f"kernel '{kernel.name}' runs on the {kernel.backend} backend, which is not "
            f"available here",
            op.loc,
        )
    if isinstance(kernel, Template) and backend.run_region is None:
        raise TgcError(
            f"the {kernel.backend} backend here runs no generated kernel ('{kernel.name}')", op.loc
        )
    return backend


def _prepare_fused_on_device(
    op: FusedOp, backends: dict[str, Backend], spaces: set
) -> Callable[[list], list]:
    """A `kernel.fused` in device memory: compiled and run by that space's generated kernels."""
    backend = _fused_backend(spaces, backends)
    if backend is None:
        where = ", ".join(sorted(str(s or "host") for s in spaces))
        raise TgcError(f"no backend here runs a 'kernel.fused' on values in {where} memory", op.loc)

    def run(values: list) -> list:
        outs = backend.run_region(op, [backend.adopt(v) for v in values])
        return [backend.release(v) for v in outs]

    return run


def _spaces(op: Operation) -> set:
    """The memory spaces of `op`'s operands and results (None: the host)."""
    return {v.type.encoding for v in op.operands} | {r.type.encoding for r in op.results}


def _fused_backend(spaces: set, backends: Mapping[str, Backend]) -> Backend | None:
    """The backend whose generated kernels run a `kernel.fused` on values in `spaces`."""
    return next(
        (
            b
            for b in backends.values()
            if b.run_region is not None and {BACKEND_SPACE.get(b.name)} == spaces
        ),
        None,
    )


def _kernel(op: CallOp) -> Kernel | Template:
    template = TEMPLATES.get(op.attr("callee"))
    if template is not None:
        if not op.regions:
            raise TgcError(
                f"generated kernel '{template.name}' needs the code it runs in a region", op.loc
            )
        return template
    kernel = KERNELS.get(op.attr("callee"))
    if kernel is None:
        raise TgcError(f"'kernel.call' names no registered kernel '{op.attr('callee')}'", op.loc)
    if kernel.op is not None and kernel.op != op.attr("op"):
        raise TgcError(
            f"kernel '{kernel.name}' runs '{kernel.op}', but the call means "
            f"'{op.attr('op') or 'its region'}'",
            op.loc,
        )
    return kernel


def _checked(op: CallOp, kernel: Kernel | Template, outs: list) -> list:
    """`outs`, checked: a kernel that returns the wrong number or shapes of results is a broken
    kernel: say so here rather than let a later op fail on it."""
    if len(outs) != len(op.results):
        raise TgcError(
            f"internal error: kernel '{kernel.name}' returned {len(outs)} result(s), the call "
            f"has {len(op.results)}",
            op.loc,
        )
    for result, out in zip(op.results, outs):
        shape = getattr(out, "shape", None)
        if shape is not None and tuple(shape) != result.type.shape:
            raise TgcError(
                f"internal error: kernel '{kernel.name}' returned shape {tuple(shape)}, the "
                f"call declares {result.type}",
                op.loc,
            )
    return outs


def _space(name: str | None, where: Operation) -> Space:
    space = SPACES.get(name)
    if space is None:
        raise TgcError(f"no backend that can hold values in {name} memory is loaded", where.loc)
    return space


PLANNED_OPS = ("kernel.call", "kernel.copy")


def require_planned(func: FuncOp) -> None:
    """`tgc-run --backend auto` runs planned IR (what select-kernels writes: every op a
    kernel.call or a kernel.copy): a diagnostic at the first op of `func` that is not."""
    for op in func.body.ops:
        if op is func.body.last or op.name in PLANNED_OPS:
            continue
        raise TgcError(
            f"'{op.name}' is not planned: --backend auto runs planned IR (leave -p out, or end "
            "the pipeline with 'select-kernels')",
            op.loc if op.loc is not None else func.loc,
        )
