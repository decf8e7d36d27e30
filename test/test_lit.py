"""Runs the lit/FileCheck suite from pytest, one test per folder of test/lit/.

One lit process runs every selected folder, started in the background when collection ends
(test/lit_runner.py, test/conftest.py); each folder's test waits for it and reports that folder's
failures with lit's output for them. `pytest -k 'test_lit_folder and fuse'` runs lit on the
selected folders only.
"""

import pytest
from lit_runner import FOLDERS, results


@pytest.mark.parametrize("folder", FOLDERS)
def test_lit_folder(folder):
    found, log = results([folder])
    count, failures = found.get(folder, (0, []))
    assert count > 0, f"lit found no tests in {folder}:\n{log}"
    text = "\n".join(f"FAIL: {name}\n{output[-8000:]}" for name, output in failures)
    assert not failures, text[-20000:]
