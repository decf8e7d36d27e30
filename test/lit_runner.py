"""The lit/FileCheck suite as pytest runs it (test/test_lit.py): one lit process for every
selected folder of test/lit/, started in the background as soon as the tests are known
(test/conftest.py), so that lit's tool processes and the Python tests share the machine's cores
instead of taking turns. The per-folder tests wait for it and report their folder's failures.

Under pytest-xdist the controller starts lit (it learns the selected tests from the first
worker's collection) and the workers, whose folder tests wait for it, read its results from the
shared folder the controller names (`attach`): lit runs once whatever the number of workers.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import xml.etree.ElementTree as ET
from pathlib import Path

LIT_ROOT = Path(__file__).parent / "lit"
FOLDERS = sorted(p.name for p in LIT_ROOT.iterdir() if p.is_dir() and p.name != "Output")

# The work folder: lit.log, lit.xml (its xunit report), folders.json (what it runs, written
# before it starts) and done (its exit status, written once it has ended).
_run: dict = {}


def work_dir() -> Path:
    """This session's work folder (made on first use, or the one `attach` named)."""
    if "work" not in _run:
        _run["work"] = Path(tempfile.mkdtemp(prefix="tgc-lit-"))
    return _run["work"]


def attach(work: str | Path) -> None:
    """Read results from the lit run another process (xdist's controller) starts in `work`."""
    _run.update(work=Path(work), attached=True)


def start(folders: list[str], workers: int | None = None) -> None:
    """Start lit on `folders` (once per session; nothing for none), with `workers` parallel
    tests (default: one per core)."""
    if "proc" in _run or _run.get("attached") or not folders:
        return
    work = work_dir()
    log = open(work / "lit.log", "w")  # noqa: SIM115  (closed when lit ends)
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
    (work / "folders.json").write_text(json.dumps(folders))

    def reap() -> None:  # `done` once lit has ended, however it ended
        code = proc.wait()
        log.close()
        (work / "done.part").write_text(str(code))
        os.replace(work / "done.part", work / "done")

    _run.update(proc=proc, reaper=threading.Thread(target=reap, daemon=True))
    _run["reaper"].start()


def stop() -> None:
    """End a lit run still going (pytest interrupted) and remove the work folder this process
    made (at the end of the session: every reader is done)."""
    proc = _run.get("proc")
    if proc is not None:
        if proc.poll() is None:
            proc.kill()
        _run["reaper"].join()
    if "work" in _run and not _run.get("attached"):
        shutil.rmtree(_run["work"], ignore_errors=True)


def results(folders: list[str]) -> tuple[dict[str, tuple[int, list]], str]:
    """({folder: (number of tests, [(test, lit's output)] of its failures)}, lit's log tail)."""
    start(folders)
    if _run.get("results") is None:
        work = work_dir()
        if not (work / "folders.json").exists():
            return {}, f"lit was not started (nothing in {work})"
        while not (work / "done").exists():
            time.sleep(0.2)
        tail = (work / "lit.log").read_text(errors="replace")[-5000:]
        ran = json.loads((work / "folders.json").read_text())
        found: dict[str, tuple[int, list]] = {f: (0, []) for f in ran}
        report = work / "lit.xml"
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
