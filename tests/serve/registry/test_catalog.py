"""What a multi-model server offers: --model NAME=PATH parsing, --models-dir discovery, keep-alive values."""

from __future__ import annotations

import pytest

from portachat.serve.registry import discover_models, parse_keep_alive, parse_model_arg
from portachat.serve.registry.catalog import estimate_bytes


def test_model_args_name_their_model_or_leave_it_to_the_path():
    assert parse_model_arg("small=/models/a.gguf") == ("small", "/models/a.gguf")
    assert parse_model_arg("qwen2.5-0.5b=runs/x") == ("qwen2.5-0.5b", "runs/x")
    assert parse_model_arg("/models/a.gguf") == (None, "/models/a.gguf")
    # '=' inside a folder name is part of the path, not a name
    assert parse_model_arg("/data/lr=3e-4/step_10") == (None, "/data/lr=3e-4/step_10")


@pytest.mark.parametrize(("text", "seconds"), [
    ("5m", 300.0), ("30s", 30.0), ("1h30m", 5400.0), ("250ms", 0.25), ("0", 0.0), (0, 0.0), ("90", 90.0),
    ("-1", None), (-1, None), ("-5m", None),
])
def test_keep_alive_reads_ollama_durations(text, seconds):
    assert parse_keep_alive(text) == seconds


@pytest.mark.parametrize("bad", ["5 minutes", "m5", "", "5x", True])
def test_keep_alive_refuses_what_it_cannot_read(bad):
    with pytest.raises(ValueError, match="keep_alive"):
        parse_keep_alive(bad)


def test_models_dir_finds_ggufs_checkpoints_and_hf_dirs_by_name(tmp_path):
    (tmp_path / "smol.gguf").write_bytes(b"x" * 10)
    (tmp_path / "qwen").mkdir()
    (tmp_path / "qwen" / "config.json").write_text("{}")
    (tmp_path / "qwen" / "model.safetensors").write_bytes(b"x" * 100)
    stage = tmp_path / "myrun" / "sft"
    for step, size in ((5, 30), (6, 70)):  # step_6 is newer on disk, but `latest` names step_5
        (stage / f"step_{step}").mkdir(parents=True)
        for name in ("config.json", "portachat.json"):
            (stage / f"step_{step}" / name).write_text("{}")
        (stage / f"step_{step}" / "model.safetensors").write_bytes(b"x" * size)
    (stage / "latest").write_text("step_5\n")
    unfinished = tmp_path / "unfinished" / "sft" / "step_1"  # no `latest` yet: not a model to serve
    unfinished.mkdir(parents=True)
    (unfinished / "config.json").write_text("{}")
    (tmp_path / "wrapped").mkdir()
    (tmp_path / "wrapped" / "model-q8.gguf").write_bytes(b"x")
    (tmp_path / "notes").mkdir()  # no model inside: not listed
    (tmp_path / "readme.txt").write_text("hi")
    (tmp_path / ".hidden.gguf").write_bytes(b"x")
    specs = discover_models(tmp_path)
    found = {s.name: s.path for s in specs}
    assert found == {"smol": str(tmp_path / "smol.gguf"), "qwen": str(tmp_path / "qwen"),
                     "myrun": str(tmp_path / "myrun"), "wrapped": str(tmp_path / "wrapped" / "model-q8.gguf")}
    sizes = {s.name: estimate_bytes(s) for s in specs}
    assert sizes["qwen"] == 100 and sizes["smol"] == 10 and sizes["myrun"] == 30
    assert {s.name: s.source.path for s in specs}["myrun"] == stage / "step_5"


def test_a_missing_models_dir_is_an_error(tmp_path):
    with pytest.raises(FileNotFoundError, match="no such directory"):
        discover_models(tmp_path / "typo")
