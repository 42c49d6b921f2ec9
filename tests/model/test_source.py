"""The one model resolver: every kind of spec, errors that name it, `latest` (never file times), and
one resolution per load however many parts of the load need the answer."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from gpt_testing import randomized, tiny_config

from portachat.model import GPT, UnsupportedConfigError
from portachat.model import source as source_module
from portachat.model.model_dir import save_model_files
from portachat.model.source import (
    ADAPTER,
    CHAT,
    EMBEDDING,
    GGUF,
    HUGGINGFACE,
    PEFT,
    PORTACHAT,
    resolve,
)
from portachat.serve.registry import discover_models
from portachat.serve.registry.catalog import estimate_bytes
from portachat.storage.atomic import CheckpointError
from portachat.tokenizer import train_tokenizer


@pytest.fixture(scope="module")
def our_tokenizer():
    return train_tokenizer(["the cat sat on the mat, 12 times; hello world!"] * 30, vocab_size=300, verbose=False)


def _checkpoint(directory: Path, tokenizer, step: int) -> Path:
    directory.mkdir(parents=True)
    save_model_files(directory, randomized(GPT(tiny_config(vocab_size=320))), tokenizer, {"step": step})
    return directory


def _files(directory: Path, files: dict[str, object]) -> Path:
    for name, content in files.items():
        (directory / name).parent.mkdir(parents=True, exist_ok=True)
        data = content if isinstance(content, bytes) else json.dumps(content).encode()
        (directory / name).write_bytes(data)
    return directory


def test_each_kind_of_spec_resolves(tmp_path, our_tokenizer):
    home = Path(os.environ["PORTACHAT_HOME"])
    stage = home / "runs" / "r1" / "sft"
    step = _checkpoint(stage / "step_3", our_tokenizer, 3)
    (stage / "latest").write_text("step_3\n")
    weights = (step / "model.safetensors").stat().st_size

    for spec in (step, stage, "r1/sft", "r1", str(home / "runs" / "r1")):  # a run: its furthest stage
        found = resolve(spec)
        assert (found.path, found.kind, found.format, found.size_bytes) == (step, CHAT, PORTACHAT, weights)
        assert found.spec == str(spec) and found.name == "r1-sft"
    assert resolve(resolve("r1")) == resolve("r1")  # a ModelSource passes through

    hf = _files(tmp_path / "llama", {"config.json": {"architectures": ["LlamaForCausalLM"]},
                                     "model.safetensors": b"x" * 100, "pytorch_model.bin": b"x" * 7})
    assert (resolve(hf).kind, resolve(hf).format, resolve(hf).size_bytes) == (CHAT, HUGGINGFACE, 100)

    bert = _files(tmp_path / "bert", {"config.json": {"model_type": "bert"}, "model.safetensors": b"x" * 5})
    st = _files(tmp_path / "st", {"config.json": {"architectures": ["Qwen3Model"]},
                                  "modules.json": [{"type": "sentence_transformers.models.Pooling"}]})
    assert resolve(bert).kind == EMBEDDING and resolve(st).kind == EMBEDDING

    gguf = tmp_path / "m.gguf"
    gguf.write_bytes(b"x" * 11)
    wrapped = tmp_path / "wrapped"
    wrapped.mkdir()
    (wrapped / "model-q8.gguf").write_bytes(b"x" * 3)
    assert (resolve(gguf).path, resolve(gguf).format, resolve(gguf).size_bytes) == (gguf, GGUF, 11)
    assert resolve(wrapped).path == wrapped / "model-q8.gguf"

    adapter = _files(tmp_path / "lora", {"adapter_config.json": {"base_model_name_or_path": str(step)},
                                         "adapter_model.safetensors": b"x" * 9})
    assert (resolve(adapter).kind, resolve(adapter).format, resolve(adapter).size_bytes) == (ADAPTER, PEFT, 9)


def test_errors_name_the_spec(tmp_path, our_tokenizer):
    with pytest.raises(CheckpointError, match="no model at nope/such-run"):
        resolve("nope/such-run")
    with pytest.raises(CheckpointError, match=f"no model at {tmp_path / 'absent'}"):
        resolve(tmp_path / "absent")
    home = Path(os.environ["PORTACHAT_HOME"])
    _checkpoint(home / "runs" / "r2" / "base" / "step_1", our_tokenizer, 1)  # no `latest` pointer yet
    with pytest.raises(CheckpointError, match="r2/base.*no `latest` checkpoint"):
        resolve("r2/base")
    (home / "runs" / "r2" / "base" / "latest").write_text("step_9\n")
    with pytest.raises(CheckpointError, match=r"r2/base/latest points to step_9.*\['step_1'\]"):
        resolve("r2/base")
    (tmp_path / "notes.txt").write_text("x")
    with pytest.raises(UnsupportedConfigError, match="notes.txt is a file but not a .gguf"):
        resolve(tmp_path / "notes.txt")


def test_latest_means_the_pointer_not_the_newest_files(tmp_path, our_tokenizer):
    stage = tmp_path / "models" / "run" / "sft"
    older = _checkpoint(stage / "step_1", our_tokenizer, 1)
    newer = _checkpoint(stage / "step_2", our_tokenizer, 2)
    (newer / "model.safetensors").write_bytes(b"x" * 3)  # newest on disk, and a different size
    later = time.time() + 60
    os.utime(newer / "model.safetensors", (later, later))
    (stage / "latest").write_text("step_1\n")
    assert resolve(stage).path == older
    assert resolve(stage / "latest").path == older  # the pointer file itself, as `<run>/<stage>/latest` reads
    [spec] = discover_models(tmp_path / "models")
    assert spec.name == "run" and spec.source.path == older
    assert estimate_bytes(spec) == (older / "model.safetensors").stat().st_size


class _StartUpOnly:
    """make_server's stand-in: runs the app's start-up (the pinned model loads) and returns."""

    started = True

    def __init__(self, app, *args, **kwargs) -> None:
        self.app = app

    def run(self) -> None:
        from fastapi.testclient import TestClient

        with TestClient(self.app, base_url="http://127.0.0.1") as client:  # a loopback Host, as a local client sends
            deadline = time.monotonic() + 120
            while client.get("/health").status_code != 200 and time.monotonic() < deadline:
                time.sleep(0.05)
            assert client.get("/health").status_code == 200

    def stop(self, failed: bool = False) -> None:
        raise AssertionError("the model failed to load")


def test_a_serve_start_up_resolves_its_model_once(our_tokenizer, monkeypatch):
    import portachat.commands.run.serve
    from portachat.cli import main

    home = Path(os.environ["PORTACHAT_HOME"])
    stage = home / "runs" / "r3" / "sft"
    _checkpoint(stage / "step_4", our_tokenizer, 4)
    (stage / "latest").write_text("step_4\n")
    calls: list[str] = []
    locate = source_module._locate
    monkeypatch.setattr(source_module, "_locate", lambda spec: calls.append(str(spec)) or locate(spec))
    monkeypatch.setattr(portachat.commands.run.serve, "make_server", _StartUpOnly)  # where serve calls it
    assert main(["serve", "--model", "r3/sft", "--device", "cpu", "--dtype", "fp32", "--max-model-len", "64"]) == 0
    assert calls == ["r3/sft"]


def test_a_load_is_handed_its_source(tmp_path, our_tokenizer, monkeypatch):
    from portachat.engine.loading import LoadOptions, load_served_model

    step = _checkpoint(tmp_path / "r" / "sft" / "step_1", our_tokenizer, 1)
    source = resolve(step)
    monkeypatch.setattr(source_module, "_locate", lambda spec: pytest.fail(f"resolved {spec} again"))
    served = load_served_model(LoadOptions(model="ignored: the source says", device="cpu", dtype="fp32",
                                           max_model_len=64), source=source)
    assert served.engine.model.config.vocab_size == 320 and str(step) in served.description
