"""Runs the lit/FileCheck suite from pytest, one test per folder of test/lit/.

One lit process runs every folder (its workers share the whole suite, with no start-up and no
idle tail per folder); each folder's pytest test then reports that folder's failures with lit's
output for them. `pytest -k 'test_lit_folder and fuse'` runs lit on the selected folders only.
"""

import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

LIT_ROOT = Path(__file__).parent / "lit"
FOLDERS = sorted(p.name for p in LIT_ROOT.iterdir() if p.is_dir() and p.name != "Output")


@pytest.fixture(scope="session")
def lit_results(request, tmp_path_factory):
    """{folder: (number of tests, [(test, lit's output)] of failures)} for the selected folders,
    from one lit run."""
    selected = sorted(
        {
            item.callspec.params["folder"]
            for item in request.session.items
            if item.originalname == "test_lit_folder"
        }
    )
    report = tmp_path_factory.mktemp("lit") / "lit.xml"
    proc = subprocess.run(
        [
            sys.executable,
            "-c",
            "import lit.main; lit.main.main()",
            "-sv",
            f"--xunit-xml-output={report}",
            *(str(LIT_ROOT / f) for f in selected),
        ],
        capture_output=True,
        text=True,
    )
    results: dict[str, tuple[int, list]] = {f: (0, []) for f in selected}
    if not report.exists():
        pytest.fail(f"lit did not run (exit {proc.returncode}):\n{proc.stdout[-5000:]}")
    for case in ET.parse(report).getroot().iter("testcase"):
        # classname "tgc.<folder>[.<subfolder>...]", name "<file>"
        folder = case.get("classname").split(".", 1)[1].split(".", 1)[0]
        count, failures = results.setdefault(folder, (0, []))
        problem = case.find("failure")
        if problem is None:
            problem = case.find("error")
        if problem is not None:
            failures.append((case.get("name"), problem.text or problem.get("message", "")))
        results[folder] = (count + 1, failures)
    return results, proc


@pytest.mark.parametrize("folder", FOLDERS)
def test_lit_folder(folder, lit_results):
    results, proc = lit_results
    count, failures = results[folder]
    assert count > 0, f"lit found no tests in {folder}:\n{proc.stdout[-5000:]}{proc.stderr[-2000:]}"
    text = "\n".join(f"FAIL: {name}\n{output[-8000:]}" for name, output in failures)
    assert not failures, text[-20000:]
