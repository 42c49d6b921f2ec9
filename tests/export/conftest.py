from __future__ import annotations

import pytest
from export_testing import make_checkpoint


@pytest.fixture
def checkpoint(tmp_path, small_tokenizer):
    return make_checkpoint(tmp_path / "ckpt", small_tokenizer)
