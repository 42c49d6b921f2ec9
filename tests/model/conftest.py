from __future__ import annotations

import pytest
import torch
from gpt_testing import randomized, tiny_config

from portachat.model import GPT


@pytest.fixture
def tiny_model() -> GPT:
    torch.manual_seed(0)
    return randomized(GPT(tiny_config()))
