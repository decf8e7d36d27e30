"""The lit/FileCheck suite as pytest runs it (test/test_lit.py): one lit process for every
selected folder of test/lit/, started in the background as soon as pytest has collected the tests
(test/conftest.py), so that lit's tool processes and the Python tests share the machine's cores
instead of taking turns. The per-folder tests wait for it and report their folder's failures.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET
from pathlib import Path

LIT_ROOT = Path(__file__).parent / "lit"
FOLDERS = sorted(p.name for p in LIT_ROOT.iterdir() if p.is_dir() and p.name != "Output")

_run: dict = {}


def start(folders: list[str], workers: int | None = None) -> None:
    """Start lit on `folders` (once per session; nothing for none), with `workers` parallel
    tests (default: one per core)."""
    if _run or not folders:
        return
    work = Path(tempfile.mkdtemp(prefix="tgc-lit-"))
    log = open(work / "lit.log", "w+")  # noqa: SIM115  (read back by results())
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import lit.main; lit.main.main()",
            "-sv",
            *([f"-j{workers}"] if workers else []),
            f"--xunit-xml-output={work / 'lit.xml'}",
            *(str(LIT_ROOT / f) for f in folders),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
        text=True,
    )
    _run.update(proc=proc, log=log, report=work / "lit.xml", folders=folders, results=None)


def stop() -> None:
    """End a lit run still going (pytest interrupted)."""
    proc = _run.get("proc")
    if proc is not None and proc.poll() is None:
        proc.kill()
        proc.wait()


def results(folders: list[str]) -> tuple[dict[str, tuple[int, list]], str]:
    """({folder: (number of tests, [(test, lit's output)] of its failures)}, lit's log tail)."""
    start(folders)
    if _run["results"] is None:
        _run["proc"].wait()
        log = _run["log"]
        log.seek(0)
        tail = log.read()[-5000:]
        found: dict[str, tuple[int, list]] = {f: (0, []) for f in _run["folders"]}
        report = _run["report"]
        if report.exists():
            for case in ET.parse(report).getroot().iter("testcase"):
                # classname "tgc.<folder>[.<subfolder>...]", name "<file>"
                folder = case.get("classname").split(".", 1)[1].split(".", 1)[0]
                count, failures = found.setdefault(folder, (0, []))
                problem = case.find("failure")
                if problem is None:
                    problem = case.find("error")
                if problem is not None:
                    failures.append((case.get("name"), problem.text or problem.get("message", "")))
                found[folder] = (count + 1, failures)
        _run["results"] = (found, tail)
    return _run["results"]
