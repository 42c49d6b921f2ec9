"""device/dtypes.py is the one table of dtype names; the rest of the package reads it."""

import re
from pathlib import Path

import pytest
import torch

from portachat.device.dtypes import DTYPES, canonical_dtype_name, dtype_name, parse_dtype

PACKAGE = Path(__file__).resolve().parents[2] / "portachat"


@pytest.mark.parametrize("name", ["fp32", "bf16", "fp16"])
def test_names_and_dtypes_round_trip(name):
    assert dtype_name(parse_dtype(name)) == name


def test_aliases_and_refusals():
    assert canonical_dtype_name(" BFloat16 ") == "bf16"
    assert canonical_dtype_name("int8") is None
    with pytest.raises(ValueError, match="fp32, bf16, fp16"):
        parse_dtype("fp64")
    with pytest.raises(ValueError, match="not a compute dtype"):
        dtype_name(torch.int8)


def test_no_other_module_spells_a_name_to_torch_dtype_table():
    # A second table drifts (one file once lacked fp16); everything outside the table asks it.
    pair = re.compile(r'"(bf16|fp16|fp32)"\s*:\s*torch\.(bfloat16|float16|float32)|"torch\.(bfloat16|float16|float32)"\s*:'
                      r'|torch\.(bfloat16|float16|float32)\s*:\s*"(bf16|fp16|fp32)"')
    offenders = [str(path.relative_to(PACKAGE)) for path in PACKAGE.rglob("*.py")
                 if path.name != "dtypes.py" and pair.search(path.read_text(encoding="utf-8"))]
    assert offenders == [], offenders
    assert set(DTYPES) == {"fp32", "bf16", "fp16"}
