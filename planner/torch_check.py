"""Checking a kernel instance with PyTorch on the kernel's own device (planner/profile.py
`measure`): the random inputs are drawn there, the reference is evaluated there in float64 and
the kernel's results are compared there, so nothing of the instance's size crosses to the host;
only the errors come back. On an H100 the host's numpy took about 8 s to check one instance of
GPT-2's LM head (2048 x 768 x 50257) this way, and about 30 s for a large attention.

`unsupported(ref, space)` says why an instance's reference function cannot be evaluated so
(None: it can); then the profiler checks it on the host with numpy, as it always did. It can be
where the torch backend of the kernel's space is registered ("torch-cpu" on the host, "torch-cuda"
on "cuda"), some float result is narrower than f64 (below), and every op of the reference is one
of:
- an op with a kernel of that torch backend ("torch-cuda.<op>") accepting the op's types with
  floats in f64: it is evaluated by the function that kernel runs (backends/torch.py
  `OP_FUNCTIONS`); `atomic.cmp` on integers too (comparing integers is exact in both);
- an op that only moves data (`MOVES`: reshape, transpose, broadcast, split, slice, concat), by
  its exact torch counterpart, whatever the element type;
- an op with no operands (a constant, an iota): its numpy value, made on the host at its own size
  (a splat, a mask's ramp) and moved to the device.
Anything else (gather, integer arithmetic, an op with regions) leaves the instance to numpy.

The evaluation is the interpreter's (tgc/evaluate.py) op by op: "f64" keeps every float in
float64; "native" computes 16-bit floats in f32 and rounds each result to its declared type. In
float64, torch's functions differ from numpy's by a few ulp (another summation order, another
libm): equal within 1e-12 relative (test/test_profile_check.py), nine orders of magnitude below
the least a narrower result is allowed (8 ulp of f32, 1e-6). A result in f64 is allowed 8 ulp of
f64 itself, about what torch and numpy differ by, so an instance whose float results are all f64
stays with numpy. f32 products run at f32 precision while evaluating (no TF32): a setting of the
user's must not round the native evaluation and so widen the allowance.

`rel_error` is planner/kernel.py's `rel_error` on tensors of one device, giving the same value.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import torch

from tgc.builtin import FuncOp
from tgc.dialects.atomic import gather_index_bound
from tgc.evaluate import evaluate_op
from tgc.ir import Operation, Value
from tgc.opdef import TERMINATOR
from tgc.planner.backends import BACKENDS, Backend
from tgc.planner.backends.torch import OP_FUNCTIONS, TORCH_DTYPE, from_numpy
from tgc.planner.kernel import KERNELS
from tgc.runtime.interpreter import contraction_fan_in
from tgc.types import TensorType

# space -> the torch backend whose kernels evaluate references there, and its device
TORCH_BACKEND: dict[str | None, str] = {None: "torch-cpu", "cuda": "torch-cuda"}
DEVICE: dict[str | None, str] = {None: "cpu", "cuda": "cuda"}
DTYPES = {**TORCH_DTYPE, "i8": torch.int8, "i32": torch.int32, "i64": torch.int64}
INTEGERS = ("i8", "i32", "i64")
WIDENED = (torch.float16, torch.bfloat16)  # computed in f32, as the interpreter does
CHUNK = 1 << 24  # elements per sweep of rel_error: 128 MiB of f64 differences


def _slice(op: Operation, x):
    index = tuple(
        slice(lo, hi, st) for lo, hi, st in zip(op.attr("start"), op.attr("stop"), op.attr("step"))
    )
    return x[index]


# Ops that move data, by their exact torch counterparts (the numpy references in
# dialects/atomic_shape.py): any element type, no rounding.
MOVES: dict[str, Callable] = {
    "atomic.reshape": lambda op, x: x.reshape(op.results[0].type.shape),
    "atomic.transpose": lambda op, x: x.permute(*op.attr("perm")),
    "atomic.broadcast": lambda op, x: x.expand(op.results[0].type.shape),
    "atomic.split": lambda op, x: tuple(torch.split(x, list(op.attr("sizes")), op.attr("axis"))),
    "atomic.slice": _slice,
    "atomic.concat": lambda op, *xs: torch.cat(xs, op.attr("axis")),
}
# Torch kernels whose function is exact on integers as numpy's meaning is (their constraints
# refuse integers: as planner kernels they are for floats).
INTEGER_EXACT = frozenset({"atomic.cmp"})


def _in_f64(t: TensorType) -> TensorType:
    return t.with_element_type("f64").with_encoding(None) if t.is_float else t.with_encoding(None)


def unsupported(ref: FuncOp, space: str | None) -> str | None:
    """Why `ref` (an instance's reference function) cannot be evaluated by PyTorch on the
    device of `space` (module doc); None when it can."""
    name = TORCH_BACKEND.get(space)
    if name is None or name not in BACKENDS:
        return f"no torch backend is registered for space {space!r}"
    floats = [t for t in ref.function_type.results if t.is_float]
    if floats and all(t.element_type == "f64" for t in floats):
        return "its float results are f64: torch's float64 differs from numpy's by their allowance"
    block = ref.body
    for op in block.ops:
        if op is block.last and op.has_trait(TERMINATOR):
            break
        if op.regions:
            return f"'{op.name}' has regions"
        if not op.operands or op.name in MOVES:
            continue
        kernel = KERNELS.get(f"{name}.{op.name}")
        if kernel is None:
            return f"'{op.name}' has no {name} kernel"
        ints = [v.type.element_type in INTEGERS for v in op.operands]
        if op.name in INTEGER_EXACT and all(ints):
            continue
        types = ([_in_f64(v.type) for v in op.operands], [_in_f64(r.type) for r in op.results])
        reason = kernel.constraints(types)
        if reason is not None:
            return f"{kernel.name} {reason}"
    return None


@contextmanager
def _float32_at_full_precision() -> Iterator[None]:
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    try:
        yield
    finally:
        torch.set_float32_matmul_precision(before)


def _f16(x: torch.Tensor) -> torch.Tensor:
    """`x` rounded once to f16, as numpy rounds float64: torch goes through f32, and rounding
    twice differs in about 1 value of 17,000 (by an ulp of f16). Rounded to odd in f32 first
    (toward zero, the last bit set where inexact), the second rounding is the one that counts:
    f32 keeps 13 more bits than f16. bf16 needs none of this: numpy (ml_dtypes) rounds float64
    to it through f32 as torch does."""
    if x.dtype != torch.float64:
        return x.to(torch.float16)
    near = x.to(torch.float32)
    inexact = torch.isfinite(near) & (near.to(torch.float64) != x)
    bits = near.view(torch.int32)
    away = near.to(torch.float64).abs() > x.abs()  # rounded away from zero: one step back
    bits = torch.where(inexact & away, bits - 1, bits)
    bits = torch.where(inexact, bits | 1, bits)
    return bits.view(torch.float32).to(torch.float16)


class TorchCheck:
    """One instance's check on its space's device (module doc): inputs drawn with a generator
    seeded with `seed` (as `random_inputs` draws them: normal floats, weights scaled by
    fan-in, i1 uniform, integers in range), the reference evaluated there, errors computed
    there. Values reach the kernel's backend through the torch backend of the space: its
    `release` gives the space's representation (a numpy view of a CPU tensor; a CUDA tensor
    itself), the kernel's backend adopts that, and the results come back the other way, all
    zero-copy."""

    def __init__(self, ref: FuncOp, space: str | None, seed: int) -> None:
        self.ref = ref
        self.torch_backend: Backend = BACKENDS[TORCH_BACKEND[space]]
        self.device = torch.device(DEVICE[space])
        generator = torch.Generator(device=self.device)
        generator.manual_seed(seed)
        self.inputs = [self._draw(generator, arg) for arg in ref.body.args]

    def _draw(self, generator: torch.Generator, arg: Value) -> torch.Tensor:
        t, device = arg.type, self.device
        if t.is_float:
            draw = torch.float64 if t.element_type == "f64" else torch.float32
            x = torch.randn(t.shape, generator=generator, device=device, dtype=draw)
            fan_in = contraction_fan_in(arg)
            if fan_in:
                x *= 1 / math.sqrt(fan_in)
            return x.to(DTYPES[t.element_type])
        if t.element_type == "i1":
            return torch.rand(t.shape, generator=generator, device=device) < 0.5
        high = gather_index_bound(arg) or 4
        x = torch.randint(0, high, t.shape, generator=generator, device=device)
        return x.to(DTYPES[t.element_type])  # wraps as numpy's astype does

    def operands(self, types: tuple[TensorType, ...], backend: Backend) -> list:
        """The inputs as the kernel's backend takes them."""
        return [backend.adopt(self.torch_backend.release(x)) for x in self.inputs]

    def results(self, outs: list, backend: Backend) -> list[torch.Tensor]:
        """The kernel's results as tensors on the device."""
        return [self.torch_backend.adopt(backend.release(v)) for v in outs]

    def reference(self, precision: str) -> list[torch.Tensor]:
        """The reference function on the inputs, at "f64" or "native" (module doc)."""
        block = self.ref.body
        env = {}
        for arg, x in zip(block.args, self.inputs):
            env[arg] = x.to(torch.float64) if precision == "f64" and x.is_floating_point() else x
        with _float32_at_full_precision(), torch.no_grad():
            for op in block.ops:
                ins = [env[v] for v in op.operands]
                if op is block.last and op.has_trait(TERMINATOR):
                    return ins
                env.update(zip(op.results, self._evaluate(op, ins, precision)))
        raise RuntimeError("internal error: the reference function has no terminator")

    def _evaluate(self, op: Operation, ins: list, precision: str) -> list[torch.Tensor]:
        if not op.operands:
            values = evaluate_op(op, [], precision)  # the op's own value (a constant, an iota)
            return [from_numpy(a).to(self.device) for a in values]
        if op.name == "atomic.cast" and op.results[0].type.element_type == "f16":
            return [_f16(ins[0]).to(self._stored(op.results[0].type, precision))]
        fn = MOVES.get(op.name) or OP_FUNCTIONS[op.name][0]
        raw = fn(op, *(x.float() if x.dtype in WIDENED else x for x in ins))
        outs = []
        for result, x in zip(op.results, raw if isinstance(raw, tuple) else (raw,)):
            t = result.type
            if tuple(x.shape) != t.shape:
                raise RuntimeError(
                    f"internal error: torch evaluated '{op.name}' to shape {tuple(x.shape)}, "
                    f"declared {t}"
                )
            outs.append(x.to(self._stored(t, precision)))
        return outs

    @staticmethod
    def _stored(t: TensorType, precision: str) -> torch.dtype:
        return torch.float64 if precision == "f64" and t.is_float else DTYPES[t.element_type]

    @staticmethod
    def error(got: torch.Tensor, want: torch.Tensor) -> float:
        return rel_error(got, want)


def rel_error(got: torch.Tensor, want: torch.Tensor) -> float:
    """planner/kernel.py's `rel_error` (normwise max|got - want| / max|want|, 0 for equal
    tensors, NaN and infinities included where they coincide, inf where they do not), computed
    on the tensors' device; two scalars come back. Differences are taken in float64: `want` is
    made f64 and any float `got` is promoted exactly by the subtraction."""
    if tuple(got.shape) != tuple(want.shape):
        return math.inf
    if got.numel() == 0:
        return 0.0
    if want.dtype != torch.float64:
        want = want.to(torch.float64)
    if not got.is_floating_point():
        got = got.to(torch.float64)
    # Where both are finite everywhere (the usual case) one sweep gives both numbers: equal
    # values are those whose difference is 0, and max|want| is over all of it. A NaN or an
    # infinity anywhere (or an overflowing difference) makes the largest difference non-finite
    # (max propagates NaN), and the general rule below decides. The sweep goes by chunks
    # through one buffer: the f64 differences of a 100M-element result would take 800 MB more.
    flat_got, flat_want = got.reshape(-1), want.reshape(-1)
    n = flat_want.numel()
    buffer = torch.empty(min(n, CHUNK), dtype=torch.float64, device=want.device)
    partial = []
    for start in range(0, n, CHUNK):
        g, w = flat_got[start : start + CHUNK], flat_want[start : start + CHUNK]
        diff = buffer[: w.numel()]
        torch.sub(g, w, out=diff).abs_()
        low, high = torch.aminmax(w)
        partial.append(torch.stack([diff.max(), -low, high]))
    largest, minus_low, high = torch.stack(partial).amax(0).tolist()
    if math.isfinite(largest):
        if largest == 0.0:
            return 0.0
        scale = max(minus_low, high)
        return largest / scale if scale > 0 else math.inf
    return _rel_error_general(got, want)


def _rel_error_general(got: torch.Tensor, want: torch.Tensor) -> float:
    same = (got == want) | (got.isnan() & want.isnan())
    got_finite, want_finite = got.isfinite() | same, want.isfinite() | same
    every, finite = torch.stack([same.all(), got_finite.all() & want_finite.all()]).tolist()
    if every:
        return 0.0
    if not finite:
        return math.inf
    diff = torch.where(same, 0.0, (got - want).abs())
    scale = torch.where(want.isfinite(), want, 0.0).abs().max()
    largest, scale = torch.stack([diff.max(), scale]).tolist()
    return largest / scale if scale > 0 else math.inf


__all__ = ["MOVES", "TorchCheck", "rel_error", "unsupported"]
