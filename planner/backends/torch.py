"""The PyTorch backends: "torch-cpu" (wherever `import torch` works) and "torch-cuda" (where
`torch.cuda.is_available()`), so that the planner can pick a library kernel where it is faster.

Op kernels, "<backend>.<op>" (e.g. "torch-cpu.hl.softmax"): the elementwise atomic ops,
the reductions, matmul (transpose attributes), hl.tanh/sigmoid/relu/silu, hl.gelu (both
approximations), hl.softmax/log_softmax, hl.mean, hl.layernorm (`F.layer_norm` over the dims
from `axis` to the end), hl.rmsnorm (`F.rms_norm`, where torch has it), hl.linear and
hl.attention (`F.scaled_dot_product_attention`: scale, causal, additive mask), and the vision
ops (convolutions, pools, group and batch norm, resize: planner/backends/torch_vision.py). They
accept f32 and f64 values (i1 for a comparison's result and a select's condition), and on
torch-cuda f16 and bf16 too (what the GPU route plans models in: the library's own kernels
beside tgc's); the stated errors are for f32 and f64, and a 16-bit kernel is allowed its type's rounding on top, as
every kernel is (planner/profile.py checks each measured instance so). Each kernel's `max_rel_error` is its normwise distance from the op's numpy meaning
in the same element type (planner/kernel.py), by class:

- 0 for correctly rounded IEEE operations (add, sub, mul, div, neg, abs, recip, max, min,
  compare, select, cast, relu, reduce_max, reduce_min): bit-identical results (tested);
- 1e-6 (a few f32 ulp) for the functions torch computes with its own vectorised code: exp,
  log, sqrt, rsqrt, erf, sin, cos, pow and the activations built on them (tanh, sigmoid, silu,
  gelu) differ from numpy's by 1-2 ulp in f32 (measured at most 1.1e-7 on the test inputs of
  test/test_planner_torch.py; f64: 2e-16);
- 1e-5 for kernels that sum (reduce_sum, mean, softmax, log_softmax, layernorm, rmsnorm,
  matmul, linear, attention): torch sums in another order (blocked, vectorised, Welford for
  the variance, online softmax in attention), a difference that grows with the length of the
  sum and with cancellation; measured at most 6e-7 on order-1 data with sums of up to 256
  terms. Much longer sums of data that cancel may exceed it.

Values: the executor keeps host values as numpy arrays and device values as objects with
`__cuda_array_interface__`. torch-cpu adopts a numpy array with `torch.from_numpy` and releases
a tensor with `.numpy()` (zero-copy both ways); torch-cuda adopts a device buffer with
`torch.as_tensor(..., device="cuda")` (zero-copy through `__cuda_array_interface__`) and
releases its contiguous result tensor as it is (a torch CUDA tensor exposes the interface). A
kernel's `run` (host arrays in and out) converts the same way, moving values to the GPU and
back for torch-cuda.

Nothing is registered on import: `register()` (called by `tgc.planner.load_backends`) adds the
kernels and backends, `unregister()` removes them (tests).
"""

from __future__ import annotations

import math
from collections.abc import Callable

import ml_dtypes
import numpy as np

try:
    import torch
    import torch.nn.functional as F
except ImportError as e:  # the planner runs without PyTorch: load_backends records why
    raise ImportError(f"PyTorch is not installed ({e})") from None

from tgc.ir import Operation, Value
from tgc.opdef import OPS
from tgc.planner.backends import BACKENDS, SPACES, Backend, Space, register_backend, register_space
from tgc.planner.backends.torch_vision import OP_FUNCTIONS as VISION_FUNCTIONS
from tgc.planner.kernel import KERNELS, Kernel, register_kernel
from tgc.types import TensorType

FLOATS = ("f32", "f64")
CUDA_FLOATS = ("f16", "bf16", "f32", "f64")  # torch-cuda's: PyTorch's 16-bit GPU kernels
TORCH_DTYPE = {
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "f32": torch.float32,
    "f64": torch.float64,
    "i1": torch.bool,
}
ELEMENT_TYPE = {v: k for k, v in TORCH_DTYPE.items()}
BF16 = np.dtype(ml_dtypes.bfloat16)

EXACT, ULPS, SUMS = 0.0, 1e-6, 1e-5  # see the module docstring

# -- the kernels: op -> (function of the op and its operand tensors, max_rel_error) ------------

TensorFn = Callable[..., "torch.Tensor"]


def _unary(fn: Callable) -> TensorFn:
    return lambda op, x: fn(x)


def _binary(fn: Callable) -> TensorFn:
    return lambda op, a, b: fn(a, b)


def _reduction(fn: Callable) -> TensorFn:
    return lambda op, x: fn(x, dim=op.axes(), keepdim=bool(op.attr("keepdims")))


_PREDICATES = {
    "lt": torch.lt,
    "le": torch.le,
    "gt": torch.gt,
    "ge": torch.ge,
    "eq": torch.eq,
    "ne": torch.ne,
}


def _matmul(op: Operation, a, b):
    if op.attr("transpose_a"):
        a = a.transpose(-1, -2)
    if op.attr("transpose_b"):
        b = b.transpose(-1, -2)
    return torch.matmul(a, b)


def _mod(op: Operation, a, b):
    """fmod = true is torch.fmod; otherwise numpy's float algorithm, so that the bits are
    numpy's: the (exact) fmod moved to the divisor's sign, a zero taking the divisor's sign."""
    r = torch.fmod(a, b)
    if op.attr("fmod"):
        return r
    moved = torch.where((r != 0) & ((r < 0) != (b < 0)), r + b, r)
    return torch.where(r == 0, torch.copysign(torch.zeros_like(r), b), moved)


def _cast(op: Operation, x):
    return x.to(TORCH_DTYPE[op.results[0].type.element_type])


def _norm_shape(op: Operation, x) -> tuple[int, ...]:
    return tuple(x.shape[op.attr("axis") % x.dim() :])


def _layernorm(op: Operation, x, gamma, beta):
    shape = _norm_shape(op, x)
    return F.layer_norm(x, shape, gamma.expand(shape), beta.expand(shape), op.attr("eps"))


def _rmsnorm(op: Operation, x, gamma):
    shape = _norm_shape(op, x)
    return F.rms_norm(x, shape, gamma.expand(shape), op.attr("eps"))


def _linear(op: Operation, x, w, b=None):
    y = torch.matmul(x, w)
    return y if b is None else y + b


def _attention(op: Operation, q, k, v, mask=None):
    """hl.attention's causal mask is aligned to the end (query i sees key j <= i + seq_k -
    seq_q); torch's `is_causal` to the start, so it is used only where the two agree."""
    # numpy's broadcast_shapes, and only where the batches differ: torch's goes through its
    # Python reference implementation, 14 us a call on the host (and its first call imports
    # sympy, 0.6-1.5 s), where a GPU attention takes tens of us.
    batches = (q.shape[:-2], k.shape[:-2], v.shape[:-2])
    if len(set(batches)) > 1:
        batch = tuple(np.broadcast_shapes(*batches))
        q, k, v = (t.expand(batch + tuple(t.shape[-2:])) for t in (q, k, v))
    seq_q, seq_k = q.shape[-2], k.shape[-2]
    causal = bool(op.attr("causal"))
    if causal and (mask is not None or seq_q != seq_k):
        allowed = torch.ones(seq_q, seq_k, dtype=torch.bool, device=q.device).tril(seq_k - seq_q)
        blocked = torch.zeros(seq_q, seq_k, dtype=q.dtype, device=q.device)
        blocked = blocked.masked_fill(~allowed, -math.inf)
        mask = blocked if mask is None else mask + blocked
        causal = False
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, scale=op.scale()
    )


OP_FUNCTIONS: dict[str, tuple[TensorFn, float]] = {
    "atomic.neg": (_unary(torch.neg), EXACT),
    "atomic.abs": (_unary(torch.abs), EXACT),
    "atomic.sqrt": (_unary(torch.sqrt), ULPS),  # 1 ulp from numpy's in f32 (measured)
    "atomic.recip": (_unary(torch.reciprocal), EXACT),
    "atomic.exp": (_unary(torch.exp), ULPS),
    "atomic.log": (_unary(torch.log), ULPS),
    "atomic.rsqrt": (_unary(torch.rsqrt), ULPS),
    "atomic.erf": (_unary(torch.erf), ULPS),
    "atomic.sin": (_unary(torch.sin), ULPS),
    "atomic.cos": (_unary(torch.cos), ULPS),
    "atomic.floor": (_unary(torch.floor), EXACT),
    "atomic.ceil": (_unary(torch.ceil), EXACT),
    "atomic.round": (_unary(torch.round), EXACT),  # halves to even, as np.rint
    "atomic.add": (_binary(torch.add), EXACT),
    "atomic.sub": (_binary(torch.sub), EXACT),
    "atomic.mul": (_binary(torch.mul), EXACT),
    "atomic.div": (_binary(torch.div), EXACT),
    "atomic.max": (_binary(torch.maximum), EXACT),
    "atomic.min": (_binary(torch.minimum), EXACT),
    "atomic.pow": (_binary(torch.pow), ULPS),
    "atomic.mod": (_mod, EXACT),
    "atomic.cmp": (lambda op, a, b: _PREDICATES[op.attr("pred")](a, b), EXACT),
    "atomic.where": (lambda op, c, a, b: torch.where(c, a, b), EXACT),
    "atomic.cast": (_cast, EXACT),
    "atomic.reduce_sum": (_reduction(torch.sum), SUMS),
    "atomic.reduce_max": (_reduction(torch.amax), EXACT),
    "atomic.reduce_min": (_reduction(torch.amin), EXACT),
    "atomic.matmul": (_matmul, SUMS),
    "hl.tanh": (_unary(torch.tanh), ULPS),
    "hl.sigmoid": (_unary(torch.sigmoid), ULPS),
    "hl.relu": (_unary(torch.relu), EXACT),
    "hl.silu": (_unary(F.silu), ULPS),
    "hl.gelu": (lambda op, x: F.gelu(x, approximate=op.attr("approximate")), ULPS),
    "hl.softmax": (lambda op, x: torch.softmax(x, dim=op.attr("axis")), SUMS),
    "hl.log_softmax": (lambda op, x: torch.log_softmax(x, dim=op.attr("axis")), SUMS),
    "hl.mean": (_reduction(torch.mean), SUMS),
    "hl.layernorm": (_layernorm, SUMS),
    "hl.linear": (_linear, SUMS),
    "hl.attention": (_attention, SUMS),
}
if hasattr(F, "rms_norm"):  # torch >= 2.4
    OP_FUNCTIONS["hl.rmsnorm"] = (_rmsnorm, SUMS)
OP_FUNCTIONS.update(VISION_FUNCTIONS)  # convolutions, pools, group/batch norm, resize

# Ops with i1 values: a comparison's result, a select's condition.
_BOOLEAN_RESULT = {"atomic.cmp"}
_BOOLEAN_OPERAND_0 = {"atomic.where"}


def _types_accepted(op_name: str, floats: tuple[str, ...]) -> Callable:
    listed = ", ".join(floats)

    def constraint(types) -> str | None:
        operands, results = types
        for i, t in enumerate(operands):
            boolean = op_name in _BOOLEAN_OPERAND_0 and i == 0
            if t.element_type not in (("i1",) if boolean else floats):
                return f"takes {listed} values, not {t.element_type}"
        for t in results:
            if t.element_type not in (("i1",) if op_name in _BOOLEAN_RESULT else floats):
                return f"gives {listed} values, not {t.element_type}"
        return None

    return constraint


# -- running ---------------------------------------------------------------------------------


def _proxy(op_name: str, inputs: list, attrs: dict, result_types: list[TensorType]) -> Operation:
    """An unattached op typed like `inputs`: the kernel reads its attributes (defaults
    included) and derived values (`axes()`, `scale()`) from it."""
    operands = [Value(TensorType.get(tuple(t.shape), ELEMENT_TYPE[t.dtype])) for t in inputs]
    return OPS[op_name](operands, list(result_types), attrs)


def tensor_run(op_name: str, fn: TensorFn) -> Callable:
    """The kernel on tensors: (tensors, attrs, result_types) -> tensors of the result types."""

    def run(inputs: list, attrs: dict, result_types: list[TensorType]) -> list:
        out = fn(_proxy(op_name, inputs, attrs, result_types), *inputs)
        t = result_types[0]
        return [out.to(TORCH_DTYPE[t.element_type]).contiguous()]

    return run


def from_numpy(array) -> torch.Tensor:
    """A host array as a CPU tensor sharing its memory (a copy only where torch cannot share:
    read-only or negatively strided arrays, such as constants). bf16 (ml_dtypes' dtype, which
    torch does not know) goes through its bits."""
    array = np.asarray(array)
    if not array.flags.writeable:
        array = array.copy()
    bf16 = array.dtype == BF16
    if bf16:
        array = array.view(np.int16)
    try:
        tensor = torch.from_numpy(array)
    except ValueError:  # negative strides
        tensor = torch.from_numpy(np.ascontiguousarray(array))
    return tensor.view(torch.bfloat16) if bf16 else tensor


def to_numpy(tensor: torch.Tensor) -> np.ndarray:
    tensor = tensor.detach().cpu()
    if tensor.dtype == torch.bfloat16:
        return tensor.view(torch.int16).numpy().view(BF16)
    return tensor.numpy()


class _Bits:
    """A bf16 device value described as int16 (torch reads no bf16 from the interface)."""

    def __init__(self, value) -> None:
        interface = dict(value.__cuda_array_interface__)
        interface["typestr"] = "<i2"
        self.__cuda_array_interface__ = interface
        self.value = value  # kept alive while the tensor lives


def as_cuda_tensor(value) -> torch.Tensor:
    """A device value as a CUDA tensor: itself, or a zero-copy view of any object with
    `__cuda_array_interface__` (a PyCUDA buffer of the cuda backend)."""
    if isinstance(value, torch.Tensor):
        return value
    owner = getattr(value, "owner", None)  # a cuda-backend view of a tensor: the tensor itself
    if (
        isinstance(owner, torch.Tensor)
        and owner.data_ptr() == getattr(value, "ptr", None)
        and tuple(owner.shape) == tuple(value.shape)
    ):
        return owner
    # bf16 by its typestr, which numpy reads back as a void type, not ml_dtypes' bfloat16
    if value.__cuda_array_interface__["typestr"] == BF16.str:
        return torch.as_tensor(_Bits(value), device="cuda").view(torch.bfloat16)
    return torch.as_tensor(value, device="cuda")


def host_run(op_name: str, fn: TensorFn, device: str) -> Callable:
    """The kernel's `run`: host arrays in and out (on "cuda", through the GPU)."""
    on_tensors = tensor_run(op_name, fn)

    def run(inputs: list, attrs: dict, result_types: list[TensorType]) -> list[np.ndarray]:
        tensors = [from_numpy(a).to(device) for a in inputs]
        outs = on_tensors(tensors, attrs, result_types)
        return [to_numpy(o).astype(t.dtype, copy=False) for o, t in zip(outs, result_types)]

    return run


# tensor-level run of each torch kernel, by kernel name (what Backend.call runs)
TENSOR_RUN: dict[str, Callable] = {}


def _call(kernel: Kernel, inputs: list, attrs: dict, result_types: list[TensorType]) -> list:
    return TENSOR_RUN[kernel.name](inputs, attrs, result_types)


def make_kernels(backend: str) -> list[Kernel]:
    """The op kernels of one torch backend ("torch-cpu" or "torch-cuda"), not registered."""
    device = "cuda" if backend == "torch-cuda" else "cpu"
    out = []
    for op_name, (fn, error) in OP_FUNCTIONS.items():
        name = f"{backend}.{op_name}"
        TENSOR_RUN[name] = tensor_run(op_name, fn)
        kernel = Kernel(
            name,
            backend,
            op=op_name,
            run=host_run(op_name, fn, device),
            constraints=_types_accepted(op_name, CUDA_FLOATS if device == "cuda" else FLOATS),
            max_rel_error=error,
            doc=f"{op_name} by PyTorch on {device}",
        )
        out.append(kernel)
    return out


def _cuda_space() -> Space:
    """The device space when no PyCUDA backend defines it: values are torch CUDA tensors."""
    return Space(
        "cuda",
        lambda v: to_numpy(as_cuda_tensor(v)),
        lambda a, t: from_numpy(a).to("cuda"),
    )


def available_backends() -> list[str]:
    return ["torch-cpu"] + (["torch-cuda"] if torch.cuda.is_available() else [])


_REGISTERED: list[Kernel] = []
_OWN_SPACE: list[Space] = []  # the "cuda" space registered here (when no PyCUDA backend did)


def register() -> list[Kernel]:
    """Register the kernels and backends that can run here (idempotent); the new kernels."""
    if _REGISTERED:
        return []
    for backend in available_backends():
        kernels = [register_kernel(k) for k in make_kernels(backend)]
        _REGISTERED.extend(kernels)
    register_backend(Backend("torch-cpu", call=_call, adopt=from_numpy, release=to_numpy))
    if torch.cuda.is_available():
        # Results are released as they are, with no synchronisation: the cuda backend's
        # kernels run on the same queue (the legacy default stream, PyTorch's default), so the
        # next kernel starts after this one finished.
        register_backend(Backend("torch-cuda", call=_call, adopt=as_cuda_tensor))
        if "cuda" not in SPACES:
            _OWN_SPACE.append(register_space(_cuda_space()))
    return list(_REGISTERED)


def unregister() -> None:
    """Remove what `register` added."""
    for kernel in _REGISTERED:
        if KERNELS.get(kernel.name) is kernel:
            del KERNELS[kernel.name]
    _REGISTERED.clear()
    for name in ("torch-cpu", "torch-cuda"):
        BACKENDS.pop(name, None)
    for space in _OWN_SPACE:
        if SPACES.get("cuda") is space:  # not the cuda backend's, registered since
            del SPACES["cuda"]
    _OWN_SPACE.clear()


__all__ = [
    "OP_FUNCTIONS",
    "TENSOR_RUN",
    "as_cuda_tensor",
    "from_numpy",
    "make_kernels",
    "register",
    "to_numpy",
    "unregister",
]
