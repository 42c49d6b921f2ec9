"""Our struct-based GGUF header parser agrees with the gguf package's reader, and refuses damaged files."""

from __future__ import annotations

import gguf
import numpy as np
import pytest
from gguf import GGMLQuantizationType
from test_gguf import random_hf_state, tiny_hf_config, train_byte_bpe, write_gguf

from portachat.model.gguf import GGUFError, read_gguf
from portachat.model.gguf_file import GGUFFile, GGUFFormatError


@pytest.fixture(scope="module")
def q8_file(tmp_path_factory):
    bpe = train_byte_bpe()
    cfg = tiny_hf_config("qwen3", bpe.get_vocab_size())
    path = tmp_path_factory.mktemp("gguf") / "q.gguf"
    return write_gguf(path, "qwen3", cfg, random_hf_state("qwen3", cfg), bpe, GGMLQuantizationType.Q8_0)


def test_matches_gguf_reader(q8_file):
    reader = gguf.GGUFReader(q8_file)
    with GGUFFile(q8_file) as f:
        expected = {k: fld.contents() for k, fld in reader.fields.items() if not k.startswith("GGUF.")}
        assert f.metadata == expected
        assert list(f.tensors) == [t.name for t in reader.tensors]
        for t in reader.tensors:
            info = f.tensors[t.name]
            assert info.shape == tuple(int(d) for d in reversed(t.shape))
            assert info.ggml_type == t.tensor_type
            assert np.array_equal(f.raw(t.name).reshape(-1), np.asarray(t.data).view(np.uint8).reshape(-1))


def test_truncated_file_is_refused(q8_file, tmp_path):
    data = q8_file.read_bytes()
    cut = tmp_path / "cut.gguf"
    cut.write_bytes(data[: len(data) - 100])  # tensor data missing
    with pytest.raises(GGUFFormatError, match="runs past the end of the file"):
        GGUFFile(cut)
    with pytest.raises(GGUFError, match="not a readable GGUF"):
        read_gguf(cut)
    header_only = tmp_path / "header.gguf"
    header_only.write_bytes(data[:200])  # cut inside the metadata
    with pytest.raises(GGUFError, match="truncated or damaged header"):
        read_gguf(header_only)


def test_other_versions_are_refused(q8_file, tmp_path):
    data = bytearray(q8_file.read_bytes())
    data[4:8] = (1).to_bytes(4, "little")
    old = tmp_path / "v1.gguf"
    old.write_bytes(bytes(data))
    with pytest.raises(GGUFError, match="GGUF version 1 is not supported"):
        read_gguf(old)
