"""nvcc's fixed cost paid once for many generated kernels.

Each nvcc run spends much of its time on what every file shares: the CUDA headers through the
preprocessor, cudafe++ and cicc, and for `-c` the host compiler (about 0.4 s of CPU a `-cubin`
run, more than 1 s a `-c` run, measured on a 2-core machine). Tests that compile many kernels the same way
compile them in one translation unit (`unit_source`: the prelude once, each kernel renamed
apart) and read each kernel's part of ptxas's messages (`entry_sections`): ptxas compiles each
entry function on its own, so its registers, spills and warnings are those it gets alone.
"""

from __future__ import annotations

import re
import shutil
import subprocess
from collections.abc import Sequence
from pathlib import Path

NVCC = shutil.which("nvcc") or shutil.which("nvcc", path="/usr/local/cuda/bin")

ENTRY = re.compile(r"^ptxas info\s*: Compiling entry function '([^']+)'", re.MULTILINE)


def unit_source(prelude: str, kernels: Sequence[tuple[str, str]]) -> tuple[str, list[str]]:
    """One translation unit: the prelude, then each (kernel name, source) with its kernel
    renamed `<name>__k<i>`; the unit and the new names, in order."""
    names, parts = [], [prelude]
    for i, (name, source) in enumerate(kernels):
        new = f"{name}__k{i}"
        parts.append(re.sub(rf"\b{re.escape(name)}\b", new, source))
        names.append(new)
    return "\n".join(parts), names


def entry_sections(log: str) -> dict[str, str]:
    """ptxas -v's messages split by entry function: {name: its lines, up to the next entry}."""
    marks = list(ENTRY.finditer(log))
    ends = [m.start() for m in marks[1:]] + [len(log)]
    return {m.group(1): log[m.start() : end] for m, end in zip(marks, ends)}


def compile_unit(work: Path, source: str, flags: Sequence[str]) -> tuple[bool, str]:
    """`nvcc flags unit.cu -o unit.out` in `work`; (it succeeded, nvcc's messages)."""
    path = work / "unit.cu"
    path.write_text(source)
    proc = subprocess.run(
        [NVCC, *flags, str(path), "-o", str(work / "unit.out")],
        capture_output=True,
        text=True,
        check=False,
    )
    return proc.returncode == 0, proc.stdout + proc.stderr


def compile_each(
    work: Path, prelude: str, kernels: Sequence[tuple[str, str]], flags: Sequence[str]
) -> list[tuple[bool, str]]:
    """(it compiled, its messages) for each (kernel name, source) after the prelude, with
    `flags`: one nvcc run for all where they all compile, a kernel's messages then being its
    part of ptxas's (with `-Xptxas -v`) after every message that precedes the first kernel's
    part (cicc's warnings); where the unit does not compile, each kernel alone, so that a
    failure is that kernel's own."""
    unit, names = unit_source(prelude, kernels)
    ok, log = compile_unit(work, unit, flags)
    if ok:
        sections = entry_sections(log)
        first = ENTRY.search(log)
        shared = log[: first.start()] if first else log
        return [(True, shared + sections.get(name, "")) for name in names]
    results = []
    for i, (_, source) in enumerate(kernels):
        alone = work / f"kernel{i}"
        alone.mkdir()
        results.append(compile_unit(alone, prelude + "\n" + source, flags))
    return results
