"""tgc-run: run one function of a module on numpy (or, where there is one, the GPU)."""

from __future__ import annotations

import argparse
import os
import sys

import numpy as np

from tgc.diagnostics import TgcError
from tgc.tools._common import EXIT_OK, guarded, read_input


def build_arg_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="tgc-run", description="Run a function of a .tg module.")
    ap.add_argument("input", help="input .tg file ('-' for stdin)")
    ap.add_argument("--func", default=None, help="function to run (default: the only one)")
    ap.add_argument("--input", dest="inputs", action="append", default=[], metavar="NAME=FILE.npy",
                    help="bind argument NAME (its name without '%%', or its index) to a .npy file")
    ap.add_argument("--random-inputs", type=int, default=None, metavar="SEED",
                    help="seeded random values for arguments not bound by --input (default 0)")
    ap.add_argument("--backend", choices=["numpy", "cuda"], default="numpy")
    ap.add_argument("--precision", choices=["native", "f64"], default="native",
                    help="f64: compute every float in float64 (reference runs)")
    ap.add_argument("-p", "--passes", default="", help="pipeline to run before executing")
    ap.add_argument("--check", action="store_true",
                    help="compare the results with the float64 numpy reference")
    ap.add_argument("-o", dest="output_dir", default=None, help="write DIR/result_<i>.npy")
    ap.add_argument("--debug", action="store_true", help="show Python tracebacks for errors")
    return ap


def load_npy(path: str) -> np.ndarray:
    try:
        return np.load(path, allow_pickle=False)
    except FileNotFoundError:
        raise TgcError(f"could not open input file '{path}': no such file or directory") from None
    except (ValueError, OSError, EOFError) as e:
        raise TgcError(f"'{path}' is not a readable .npy file: {e}") from None


def bind_inputs(func, specs: list[str], seed: int | None) -> list[np.ndarray]:
    from tgc.runtime.interpreter import random_inputs

    args = func.body.args
    bound: dict[int, np.ndarray] = {}
    for spec in specs:
        key, eq, path = spec.partition("=")
        if not eq:
            raise TgcError(f"--input expects NAME=FILE.npy, got '{spec}'")
        key = key.lstrip("%")
        index = next((i for i, a in enumerate(args) if a.name_hint == key), None)
        if index is None and key.isdigit() and int(key) < len(args):
            index = int(key)
        if index is None:
            names = ", ".join(f"%{a.name_hint}" for a in args)
            raise TgcError(f"@{func.sym_name} has no argument '{key}' (arguments: {names})")
        bound[index] = load_npy(path)
    missing = [i for i in range(len(args)) if i not in bound]
    if missing and seed is None and specs:
        names = ", ".join(f"%{args[i].name_hint or i}" for i in missing)
        raise TgcError(f"no value for argument(s) {names}: give --input or --random-inputs")
    randoms = random_inputs(func, seed or 0)
    return [bound.get(i, randoms[i]) for i in range(len(args))]


def summarize(i: int, a: np.ndarray) -> str:
    head = f"result {i}: shape {tuple(a.shape)} dtype {a.dtype}"
    if a.size == 0:
        return head + " (empty)"
    if a.dtype == np.bool_:
        return head + f" true={int(a.sum())}/{a.size}"
    f = a.astype(np.float64)
    return (head + f" mean={f.mean():.6g} std={f.std():.6g} min={f.min():.6g} max={f.max():.6g}"
            + f" first={f.reshape(-1)[:4].round(6).tolist()}")


def execute(module, func, inputs, backend: str, precision: str) -> list[np.ndarray]:
    if backend == "cuda":
        try:
            from tgc.runtime.cuda_executor import run_on_cuda
        except ImportError as e:
            raise TgcError(f"the cuda backend is not available here: {e}") from None
        return run_on_cuda(module, func, inputs)
    from tgc.runtime.interpreter import run_function

    return run_function(func, inputs, precision)


def run(args) -> int:
    from tgc.runtime.interpreter import run_function, select_function
    from tgc.parser import parse_module
    from tgc.pass_manager import PassManager, parse_pipeline
    from tgc.verifier import verify

    pipeline = parse_pipeline(args.passes)
    text, name = read_input(args.input)
    module = parse_module(text, name)
    verify(module)
    reference_module = None
    if args.check:
        reference_module = parse_module(text, name)
    PassManager(pipeline).run(module)
    func = select_function(module, args.func)
    inputs = bind_inputs(func, args.inputs, args.random_inputs)
    results = execute(module, func, inputs, args.backend, args.precision)
    if args.check:
        ref_func = select_function(reference_module, args.func)
        expected = run_function(ref_func, inputs, "f64")
        report_check(results, expected, func)
    if args.output_dir is not None:
        os.makedirs(args.output_dir, exist_ok=True)
        for i, r in enumerate(results):
            np.save(os.path.join(args.output_dir, f"result_{i}.npy"), r, allow_pickle=False)
    else:
        for i, r in enumerate(results):
            print(summarize(i, r))
    return EXIT_OK


# Tolerances for --check: relative to the largest magnitude of the reference, by element type.
CHECK_TOLERANCE = {"f64": 1e-9, "f32": 2e-4, "f16": 2e-2, "bf16": 3e-2}


def report_check(results, expected, func) -> None:
    types = func.function_type.results
    for i, (got, want, t) in enumerate(zip(results, expected, types)):
        tol = CHECK_TOLERANCE.get(t.element_type, 0)
        scale = max(float(np.max(np.abs(want))) if want.size else 0.0, 1.0)
        err = float(np.max(np.abs(got.astype(np.float64) - want.astype(np.float64)))) if want.size else 0.0
        if not err <= tol * scale:
            raise TgcError(
                f"check failed: result {i} differs from the float64 reference by {err:.3g} "
                f"(tolerance {tol * scale:.3g})"
            )
        print(f"check: result {i} ok (max abs error {err:.3g}, tolerance {tol * scale:.3g})")


def main(argv: list[str] | None = None) -> int:
    args = build_arg_parser().parse_args(argv)
    return guarded("tgc-run", lambda: run(args), args.debug)


if __name__ == "__main__":
    sys.exit(main())
