"""The standalone .cu's program (planner/standalone.py, codegen/standalone.py) without a GPU.

`HostModel` runs a function's `DeviceProgram` on the host byte for byte as the C file runs it:
every buffer is bytes at an offset of the caller's input or output memory or of the scratch
memory laid out for the file (views and constants included); outputs and scratch are poisoned
with NaN bytes first. Each generated kernel computes its region with the ops' numpy meaning,
cuBLAS and cuBLASLt steps compute their GEMMs with numpy from the memory as the C calls read
it (strides, leading dimensions, epilogues). So what is checked against float64 numpy on random
inputs is the plan, the buffers each step reads and writes, the arena's reuse of bytes and the
copies into the caller's outputs; the C text itself is checked by test/lit/emit-cuda and nvcc.
Tolerances are `tgc-run --check`'s by element type (tgc.types.CHECK_TOLERANCE), relative to the
largest magnitude of the reference (at least 1).
"""

from __future__ import annotations

import math
from pathlib import Path

import ml_dtypes
import numpy as np
import pytest

from nvcc_batch import NVCC, compile_unit

import tgc
from tgc.codegen.kernels import module_names
from tgc.codegen.standalone import (
    Buffer,
    CublasGemm,
    CublasLt,
    DeviceCopy,
    DeviceProgram,
    Launch,
    write_file,
    lay_out,
)
from tgc.diagnostics import TgcError
from tgc.evaluate import evaluate_block
from tgc.pass_manager import PassManager
from tgc.planner.backends import cuda_kernels as ck
from tgc.planner.standalone import device_program, plan_standalone
from tgc.runtime.cublaslt import EPILOGUES
from tgc.runtime.interpreter import random_inputs, run_function
from tgc.types import CHECK_TOLERANCE

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = sorted(p.name for p in (ROOT / "examples").glob("*.tg"))
FIXED_KERNELS = ("compact_rows", "write_rows")  # launched beside the templates' kernels


class HostModel:
    """A DeviceProgram run on the host (module doc)."""

    def __init__(self, func, program: DeviceProgram, inputs: list[np.ndarray]) -> None:
        self.scratch = bytearray(b"\xff" * max(lay_out(program), 1))
        self.inputs = [bytearray(np.ascontiguousarray(x).tobytes()) for x in inputs]
        self.outputs = [bytearray(b"\xff" * t.nbytes) for t in program.outputs]
        self.program = program
        generated = {t.name for t in ck.TEMPLATE_OF_KIND.values()}
        calls = [op for op in func.body.ops if op.attributes.get("callee") in generated]
        launches = [
            s
            for s in program.steps
            if isinstance(s, Launch) and s.kernel.template not in FIXED_KERNELS
        ]
        assert len(calls) == len(launches)
        self.regions = {id(s): call for s, call in zip(launches, calls)}

    def place(self, b: Buffer) -> tuple[bytearray, int]:
        root, offset = b.root, (b.view_offset if b.base is not None else 0)
        if root.kind == "input":
            return self.inputs[root.index], offset
        if root.kind == "output":
            return self.outputs[root.index], offset
        return self.scratch, root.offset + offset

    def flat(self, b: Buffer, count: int, start: int = 0) -> np.ndarray:
        """`count` elements of b's type from element `start` of its memory."""
        memory, offset = self.place(b)
        item = b.type.dtype.itemsize
        return np.frombuffer(memory, b.type.dtype, count, offset + start * item).copy()

    def read(self, b: Buffer) -> np.ndarray:
        return self.flat(b, b.type.num_elements).reshape(b.type.shape)

    def write(self, b: Buffer, value: np.ndarray, byte_offset: int = 0) -> None:
        memory, offset = self.place(b)
        raw = np.ascontiguousarray(np.asarray(value, b.type.dtype)).tobytes()
        start = offset + byte_offset
        assert start + len(raw) <= len(memory), "a write past the end of its memory"
        memory[start : start + len(raw)] = raw

    def run(self) -> list[np.ndarray]:
        for b in self.program.buffers:  # the file copies its constants in first
            if b.kind == "const":
                self.scratch[b.offset : b.offset + len(b.data)] = b.data
        for step in self.program.steps:
            getattr(self, type(step).__name__)(step)
        return [
            np.frombuffer(memory, t.dtype).reshape(t.shape)
            for memory, t in zip(self.outputs, self.program.outputs)
        ]

    def Launch(self, step: Launch) -> None:
        if step.kernel.template in FIXED_KERNELS:  # codegen/compact.py's, write_rows.py's
            getattr(self, step.kernel.template)(step)
            return
        call = self.regions[id(step)]
        outs = evaluate_block(call.body, [self.read(b) for b in step.reads()], "native")
        for b, value in zip(step.writes(), outs):
            self.write(b, value)

    def CublasGemm(self, step: CublasGemm) -> None:
        g = step.gemm
        a_shape = (g.k, g.m) if g.transpose_a else (g.m, g.k)
        b_shape = (g.n, g.k) if g.transpose_b else (g.k, g.n)
        item = step.c.type.dtype.itemsize
        for i in range(g.batch):
            a = self.flat(step.a, g.m * g.k, i * g.stride_a).reshape(a_shape).astype(np.float64)
            b = self.flat(step.b, g.k * g.n, i * g.stride_b).reshape(b_shape).astype(np.float64)
            c = (a.T if g.transpose_a else a) @ (b.T if g.transpose_b else b)
            for row in range(g.m):  # rows `ldc` elements apart
                self.write(step.c, c[row], ((i * g.m + row) * step.ldc) * item)

    def CublasLt(self, step: CublasLt) -> None:
        g = step.gemm
        x = self.flat(step.x, g.m * g.k).reshape(g.m, g.k).astype(np.float64)
        if g.transpose_b:  # stored n x k, as nn.Linear's weight
            w = self.flat(step.w, g.k * g.n).reshape(g.n, g.k).T.astype(np.float64)
        else:
            w = self.flat(step.w, g.k * g.n).reshape(g.k, g.n).astype(np.float64)
        y = x @ w
        if step.bias is not None:
            y += self.flat(step.bias, g.n).astype(np.float64)
        if step.residual is not None:
            y += self.flat(step.residual, g.m * g.n).reshape(g.m, g.n).astype(np.float64)
        if step.epilogue == EPILOGUES["gelu_bias"]:
            y = 0.5 * y * (1 + np.tanh(math.sqrt(2 / math.pi) * (y + 0.044715 * y**3)))
        else:
            # cuBLASLt's bias epilogue adds the vector; its plain one ("none") reads none
            assert step.epilogue == EPILOGUES["bias" if step.bias is not None else "none"]
        self.write(step.out, y)
        self.write(step.workspace, np.full(16, 7, np.int8))  # the library's use of it

    def DeviceCopy(self, step: DeviceCopy) -> None:
        self.write(step.dst, self.read(step.src))

    def compact_rows(self, step: Launch) -> None:
        """dst[r, c] = src[r * ld + c] (codegen/compact.py), read from the kernel's source."""
        src, dst = step.args
        rows, n = math.prod(dst.type.shape[:-1]), dst.type.shape[-1]
        ld = src.type.num_elements // rows
        assert f"row * {ld} + col" in step.kernel.source
        padded = self.flat(src, rows * ld).reshape(rows, ld)
        self.write(dst, padded[:, :n])

    def write_rows(self, step: Launch) -> None:
        """out's rows at indices along the kernel's axis written from values' (the last row
        given for an index wins), the rest of out as it is (codegen/write_rows.py)."""
        values, indices, out = step.args
        assert "__syncthreads_or(later)" in step.kernel.source
        x, axis = self.read(out), step.kernel.params["axis"]
        for j, row in enumerate(self.read(indices)):
            np.moveaxis(x, axis, 0)[row] = np.moveaxis(self.read(values), axis, 0)[j]
        self.write(out, x)


def planned(text: str, libraries: bool = True, arch: str | None = None):
    """The module parsed, lowered for planning, and its first function planned as the
    standalone file plans it; the function and its program."""
    module = tgc.parse(text)
    PassManager.from_text("lower-for-planning").run(module)
    func = module.funcs[0]
    with ck.planning_kernels(arch):
        plan_standalone(func, libraries)
        program = device_program(func, module_names(), arch)
    return func, program


def assert_matches_float64(text: str, func, program: DeviceProgram, seed: int = 0) -> None:
    reference = tgc.parse(text).funcs[0]
    inputs = random_inputs(reference, seed)
    want = run_function(reference, inputs, "f64")
    got = HostModel(func, program, inputs).run()
    for i, (g, w, t) in enumerate(zip(got, want, program.outputs)):
        g64 = np.asarray(g, np.float64)
        assert not np.isnan(g64).any(), f"result {i}: elements nothing wrote (NaN poison)"
        tol = CHECK_TOLERANCE.get(t.element_type, 0.0) * max(1.0, float(np.max(np.abs(w))))
        assert float(np.max(np.abs(g64 - w))) <= tol, f"result {i}"


@pytest.mark.parametrize("libraries", [True, False], ids=["libraries", "generated-only"])
@pytest.mark.parametrize("name", EXAMPLES)
def test_the_examples_standalone_programs_compute_the_float64_results(name, libraries):
    text = (ROOT / "examples" / name).read_text()
    func, program = planned(text, libraries)
    assert program.steps
    if not libraries:
        assert all(isinstance(s, (Launch, DeviceCopy)) for s in program.steps)
    assert_matches_float64(text, func, program, seed=3)


def test_the_gpt2_block_uses_every_kind_of_step_and_reuses_scratch_bytes():
    """cuBLASLt with the bias and the residual in its epilogue, cuBLAS, generated kernels; the
    arena is smaller than the intermediates it holds."""
    func, program = planned((ROOT / "examples" / "gpt2_block.tg").read_text())
    kinds = {type(s).__name__ for s in program.steps}
    assert {"Launch", "CublasGemm", "CublasLt"} <= kinds
    assert any(s.residual is not None for s in program.steps if isinstance(s, CublasLt))
    scratch = [b for b in program.buffers if b.kind == "scratch"]
    assert lay_out(program) < sum(-(-b.nbytes // 256) * 256 for b in scratch)


@pytest.mark.parametrize("transposed", [False, True])
def test_a_product_without_bias_adds_its_residual_in_cublaslts_gemm(transposed):
    """Llama's down projection with its residual: x + (a @ w), no bias, w stored k x n or (as
    torch.export writes nn.Linear) n x k: the file's cuBLASLt call passes NULL for the bias,
    the residual as C and whether w is transposed, and computes the float64 result."""
    w, attrs = ("32x80", " {transpose_b = true}") if transposed else ("80x32", "")
    text = f"""func.func @down(%x: tensor<24x32xbf16>, %a: tensor<24x80xbf16>, %w: tensor<{w}xbf16>) -> tensor<24x32xbf16> {{
  %y = atomic.matmul %a, %w{attrs} : (tensor<24x80xbf16>, tensor<{w}xbf16>) -> tensor<24x32xbf16>
  %r = atomic.add %x, %y : (tensor<24x32xbf16>, tensor<24x32xbf16>) -> tensor<24x32xbf16>
  func.return %r : tensor<24x32xbf16>
}}"""
    func, program = planned(text)
    (step,) = program.steps
    assert isinstance(step, CublasLt) and step.bias is None and step.residual is not None
    assert step.gemm.transpose_b is transposed
    source = write_file([program], ["tgc_run_down"], module_names(), "down.tg")
    (call,) = [line for line in source.splitlines() if "tgc_lt_matmul(CUDA_R_16BF" in line]
    # the epilogue, whether w is transposed, x and w, then NULL for the bias
    assert f"24, 32, 80, 1, {int(transposed)}, " in call and ", NULL, " in call
    assert_matches_float64(text, func, program, seed=5)


RESULTS = """func.func @f(%x: tensor<4x64xf32>, %y: tensor<8x16xf32>) -> (tensor<2x64xf32>, tensor<2x64xf32>, tensor<4x64xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<3xf32>) {
  %e = atomic.exp %x : (tensor<4x64xf32>) -> tensor<4x64xf32>
  %a, %b = atomic.split %e {axis = 0, sizes = [2, 2]} : (tensor<4x64xf32>) -> (tensor<2x64xf32>, tensor<2x64xf32>)
  %n = atomic.neg %y : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %c = atomic.constant {value = dense<[1.5, -2.0, 0.25]> : tensor<3xf32>} : () -> tensor<3xf32>
  func.return %a, %b, %e, %n, %n, %c : tensor<2x64xf32>, tensor<2x64xf32>, tensor<4x64xf32>, tensor<8x16xf32>, tensor<8x16xf32>, tensor<3xf32>
}
"""


def test_results_that_are_views_twice_returned_values_and_constants_are_copied_out():
    func, program = planned(RESULTS)
    copies = [s for s in program.steps if isinstance(s, DeviceCopy)]
    # the split's pieces (views of exp's result, itself written into output 2), the second %n
    # (written into output 3), the constant
    sources = [(s.src.kind, s.src.root.kind, s.src.root.index) for s in copies]
    assert sources == [
        ("view", "output", 2),
        ("view", "output", 2),
        ("output", "output", 3),
        ("const", "const", 0),
    ]
    assert [s.dst.index for s in copies] == [0, 1, 4, 5]
    assert_matches_float64(RESULTS, func, program)


PADDED = """func.func @f(%a: tensor<2x4x64xbf16>, %b: tensor<37x64xbf16>) -> tensor<2x4x37xbf16> {
  %c = atomic.matmul %a, %b {transpose_b = true} : (tensor<2x4x64xbf16>, tensor<37x64xbf16>) -> tensor<2x4x37xbf16>
  func.return %c : tensor<2x4x37xbf16>
}
"""


def padded_program(callee: str):
    """PADDED planned for the standalone file with its GEMM given to `callee`: (the function,
    its device program)."""
    func = tgc.parse(PADDED).funcs[0]
    with ck.planning_kernels(None):
        plan_standalone(func)
        (call,) = [op for op in func.body.ops if op.attributes.get("callee") == ck.CUBLAS_GEMM]
        call.attributes["callee"] = callee
        return func, device_program(func, module_names(), None)


def test_a_padded_gemm_writes_padded_rows_then_copies_them_compact():
    """cuda.cublas.gemm_padded (the plan's choice where measurements say so): rows of 37 bf16
    (74 bytes) written 40 elements apart, by one GEMM of the first 32 columns and one of the
    last 5 (B's rows from 32 on, the padded rows from column 32 on), then codegen/compact.py's
    kernel copying the 8 rows into the output."""
    func, program = padded_program(ck.CUBLAS_GEMM_PADDED)
    gemm, tail, copy = program.steps
    assert isinstance(gemm, CublasGemm) and isinstance(tail, CublasGemm)
    assert isinstance(copy, Launch) and copy.kernel.template == "compact_rows"
    assert (gemm.gemm.n, tail.gemm.n, gemm.ldc, tail.ldc) == (32, 5, 40, 40)
    assert (tail.b.view_offset, tail.c.view_offset) == (32 * 64 * 2, 32 * 2)
    padded, out = copy.args
    assert padded is gemm.c is tail.c.base and padded.type.shape == (8, 40)
    assert out.kind == "output"
    assert_matches_float64(PADDED, func, program)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_file_with_a_padded_gemm_and_its_compact_copy_compiles(tmp_path):
    """The C of PADDED's program (two cuBLAS calls, the compact-rows kernel's launch) with its
    main: nvcc compiles it (cuBLAS declared by the file where the toolkit has no headers)."""
    _, program = padded_program(ck.CUBLAS_GEMM_PADDED)
    source = write_file([program], ["tgc_run_f"], module_names(), "padded.tg")
    assert "compact_rows_8x37_ld40_bf16<<<" in source
    ok, log = compile_unit(tmp_path, source, ["-arch=sm_90", "-c", "-DTGC_STANDALONE_MAIN"])
    assert ok, log[-4000:]


ROWS = """
func.func @update(%cache: tensor<2x16x3xf32>, %i: tensor<5xi32>, %v: tensor<2x5x3xf32>) -> tensor<2x16x3xf32> {
  %new = atomic.write_rows %cache, %i, %v {axis = 1} : (tensor<2x16x3xf32>, tensor<5xi32>, tensor<2x5x3xf32>) -> tensor<2x16x3xf32>
  func.return %new : tensor<2x16x3xf32>
}
"""


def test_a_row_write_copies_its_input_then_writes_the_rows_into_the_copy():
    """The file never writes its caller's inputs: the cache is copied into the output, then
    codegen/write_rows.py's kernel writes the rows there (random indices in [0, 4): repeated
    ones, the last row given wins)."""
    func, program = planned(ROWS)
    copy, launch = program.steps
    assert isinstance(copy, DeviceCopy) and copy.src.kind == "input" and copy.dst.kind == "output"
    assert launch.kernel.template == "write_rows" and launch.args[2] is copy.dst
    for seed in range(3):
        assert_matches_float64(ROWS, func, program, seed)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_the_file_with_a_row_write_compiles(tmp_path):
    _, program = planned(ROWS)
    source = write_file([program], ["tgc_run_update"], module_names(), "rows.tg")
    assert "tgc_update_write_rows<<<" in source
    ok, log = compile_unit(tmp_path, source, ["-arch=sm_90", "-c", "-DTGC_STANDALONE_MAIN"])
    assert ok, log[-4000:]


def test_a_split_gemm_writes_its_parts_into_the_output():
    """cuda.cublas.gemm_split: the same two GEMMs, rows 37 apart, into the output; no copy."""
    func, program = padded_program(ck.CUBLAS_GEMM_SPLIT)
    gemm, tail = program.steps
    assert (gemm.gemm.n, tail.gemm.n, gemm.ldc, tail.ldc) == (32, 5, 37, 37)
    assert gemm.c.kind == "output" and tail.c.base is gemm.c and tail.c.view_offset == 32 * 2
    assert_matches_float64(PADDED, func, program)


def test_a_kernel_the_file_has_no_code_for_is_one_located_error():
    module = tgc.parse(
        "func.func @f(%x: tensor<4xf32>) -> tensor<4xf32> {\n"
        "  %y = atomic.exp %x : (tensor<4xf32>) -> tensor<4xf32>\n"
        "  func.return %y : tensor<4xf32>\n}\n",
        "k.tg",
    )
    func = module.funcs[0]
    with ck.planning_kernels(None):
        plan_standalone(func)
        (call,) = [op for op in func.body.ops if op.name == "kernel.call"]
        call.attributes["callee"] = "cuda.no_such_kernel"
        with pytest.raises(TgcError) as e:
            device_program(func, module_names(), None)
    assert e.value.message == "the standalone file has no code for kernel 'cuda.no_such_kernel'"
    assert (e.value.loc.line, e.value.loc.col) == (2, 8)


def test_a_copy_of_anything_but_a_constant_is_one_located_error():
    """The file's functions take device pointers: a plan that copies an argument from the host
    (one select-kernels makes for a host signature) has no place in it."""
    from tgc.planner.select import select_kernels

    module = tgc.parse(
        "func.func @f(%x: tensor<64x64xf32>) -> tensor<64x64xf32> {\n"
        "  %y = atomic.exp %x : (tensor<64x64xf32>) -> tensor<64x64xf32>\n"
        "  func.return %y : tensor<64x64xf32>\n}\n",
        "c.tg",
    )
    func = module.funcs[0]
    with ck.planning_kernels(None):
        select_kernels(func, None, backends=("cuda",))
        assert any(op.name == "kernel.copy" for op in func.body.ops)
        with pytest.raises(TgcError) as e:
            device_program(func, module_names(), None)
    assert e.value.message == "the standalone file copies only constants to the device"
    assert e.value.loc.file == "c.tg"


def test_planning_leaves_the_registered_kernels_as_they_were():
    """Without a device the CUDA kernels are registered for the emitter alone: afterwards a
    `load_backends` registers the device's own (with the runs that check them)."""
    from tgc.planner.kernel import KERNELS

    assert ck.CUBLAS_GEMM not in KERNELS
    planned((ROOT / "examples" / "mlp.tg").read_text())
    assert ck.CUBLAS_GEMM not in KERNELS and ck.TARGET["arch"] is None


def test_bf16_rounding_of_constants_follows_the_type():
    text = """func.func @f(%x: tensor<3xbf16>) -> tensor<3xbf16> {
  %c = atomic.constant {value = dense<[0.1, 3.0, -7.25]> : tensor<3xbf16>} : () -> tensor<3xbf16>
  %y = atomic.mul %x, %c : (tensor<3xbf16>, tensor<3xbf16>) -> tensor<3xbf16>
  func.return %y : tensor<3xbf16>
}
"""
    func, program = planned(text)
    (const,) = [b for b in program.buffers if b.kind == "const"]
    want = np.array([0.1, 3.0, -7.25]).astype(ml_dtypes.bfloat16)
    assert const.data == want.tobytes()
    assert_matches_float64(text, func, program)


def test_parameters_change_nothing_the_file_runs():
    """The file runs every step on every call (its caller passes every input each time), so
    arguments marked {tgc.param} give the same file."""
    from tgc.planner.standalone import emit_standalone_cuda

    text = (ROOT / "examples" / "mlp.tg").read_text()
    plain, params = tgc.parse(text), tgc.parse(text)
    for i in range(1, len(params.funcs[0].body.args)):
        params.funcs[0].set_arg_attr(i, "tgc.param")
    for module in (plain, params):
        PassManager.from_text("lower-for-planning").run(module)
    assert emit_standalone_cuda(params) == emit_standalone_cuda(plain)


@pytest.mark.skipif(NVCC is None, reason="nvcc is not installed")
def test_a_kernel_with_tma_tensor_maps_gets_them_made_before_its_launch(tmp_path):
    """The wgmma matmul with TMA copies takes A's and B's tensor maps as its first arguments:
    the file makes each from the operand's pointer (tgc_tensor_map, through the driver's
    entry point) before the launch, and nvcc compiles it with its main."""
    from test_matmul_wgmma import TMA, matmul_text

    from tgc.codegen.kernels import generate_kernel
    from tgc.planner.backends.cuda_kernels import fused_from_block

    text = matmul_text((300, 64), (64, 520), epilogue="none")
    func, program = planned(text, libraries=False, arch="sm_90")
    (launch,) = program.steps
    body = tgc.parse(text)
    PassManager.from_text("lower-for-planning").run(body)
    f = body.funcs[0]
    fused = fused_from_block(f.body, list(f.function_type.results), "matmul", "mm", f.loc)
    launch.kernel = generate_kernel(fused, TMA)  # as a plan choosing TMA copies would have it
    assert len(launch.kernel.tensor_maps) == 2
    source = write_file([program], ["tgc_run_f"], module_names(), "tma.tg")
    assert "const unsigned long long tgc_dims0[3] = {64, 300, 1};" in source
    assert "const unsigned long long tgc_strides0[2] = {128, 38400};" in source
    assert "const unsigned int tgc_box0[3] = {64, 128, 1};" in source
    assert (
        "tgc_tensor_map(&tgc_maps[0], 9, (const __nv_bfloat16*) inputs[0], 3, tgc_dims0, "
        "tgc_strides0, tgc_box0, 3, 3, 0)" in source
    )
    assert "const unsigned long long tgc_dims1[3] = {520, 64, 1};" in source
    assert (
        "tgc_tensor_map(&tgc_maps[1], 9, (const __nv_bfloat16*) inputs[1], 3, tgc_dims1" in source
    )
    assert f"{launch.kernel.name}<<<dim3(15, 1, 1), dim3(384, 1, 1), " in source
    assert "stream>>>(tgc_maps[0], tgc_maps[1], (const __nv_bfloat16*) inputs[0]" in source
    flags = [*launch.kernel.nvcc_target("sm_90"), "-DTGC_STANDALONE_MAIN"]
    ok, log = compile_unit(tmp_path, source, flags)
    assert ok, log[-4000:]
