"""Vendor names may appear only under portachat/device/: everything else asks the device layer."""

from __future__ import annotations

import re
from pathlib import Path

VENDOR = re.compile(
    r"torch\.cuda|torch\.npu|torch_npu|torch\.xpu|torch\.mps|torch\.version\.hip|nvidia-smi|npu-smi|hy-smi"
    r"|rocm-smi|amd-smi|ASCEND_|HCCL_|CUDA_VISIBLE"
)
PACKAGE = Path(__file__).resolve().parents[1] / "portachat"


def vendor_mentions(root: Path) -> list[str]:
    hits = []
    for path in sorted(root.rglob("*.py")):
        if (root / "device") in path.parents:
            continue
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if VENDOR.search(line):
                hits.append(f"{path.relative_to(root.parent)}:{lineno}: {line.strip()}")
    return hits


def test_no_vendor_names_outside_device_package():
    hits = vendor_mentions(PACKAGE)
    assert not hits, (
        "vendor-specific names outside portachat/device/ (ask the device layer instead):\n" + "\n".join(hits)
    )


def test_seam_check_catches_a_violation(tmp_path):
    (tmp_path / "device").mkdir()
    (tmp_path / "device" / "ok.py").write_text("import torch_npu\n")
    (tmp_path / "model.py").write_text("x = 1\nif torch.cuda.is_available():\n    pass\n")
    assert vendor_mentions(tmp_path) == [f"{tmp_path.name}/model.py:2: if torch.cuda.is_available():"]
