"""Missing reference data skips on a laptop but FAILS under CI=true (a skipped check never ran)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import missing_reference, require_shared

REPO = Path(__file__).resolve().parent.parent


def test_missing_reference_fails_under_ci_and_skips_elsewhere(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI=true"):
        missing_reference("reference data /nowhere")
    with pytest.raises(pytest.fail.Exception):
        require_shared("no-such-file.txt")
    monkeypatch.delenv("CI")
    with pytest.raises(pytest.skip.Exception):
        require_shared("no-such-file.txt")


def test_other_modules_skips_for_missing_data_fail_under_ci(tmp_path):
    (tmp_path / "conftest.py").write_text((REPO / "tests" / "conftest.py").read_text())
    (tmp_path / "test_probe.py").write_text("import pytest\n\ndef test_a():\n    pytest.skip('reference data missing: /x')\n\n"
                                            "def test_b():\n    pytest.skip('not on this platform')\n")
    done = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--rootdir", str(tmp_path),
                           str(tmp_path)], cwd=tmp_path, capture_output=True, text=True, timeout=120,
                          env={"CI": "true", "PATH": "/usr/bin:/bin"})
    assert done.returncode == 1 and "1 failed, 1 skipped" in done.stdout, done.stdout
