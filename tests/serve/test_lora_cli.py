"""`portachat serve --lora NAME=PATH` and adapters under --models-dir: which entries the command makes,
its refusals, and (slow) a real `serve` process answering the `openai` client per adapter."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import openai
import pytest
from api_testing import free_port, tiny_model, wait_healthy

from portachat.cli import build_parser
from portachat.commands.run.serve import model_specs
from portachat.model.model_dir import save_model_files
from tests.lora_files import write_random_adapter

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture()
def layout(tmp_path, small_tokenizer) -> Path:
    """models/base (a checkpoint), models/tuned (an adapter naming it), loose/extra (an adapter elsewhere)."""
    model = tiny_model(small_tokenizer.vocab_size, seed=4)
    base = tmp_path / "models" / "base"
    base.mkdir(parents=True)
    save_model_files(base, model, small_tokenizer, meta={"stage": "test"})
    write_random_adapter(tmp_path / "models" / "tuned", model, rank=4, alpha=8, seed=1, base=str(base))
    write_random_adapter(tmp_path / "models" / "stranger", model, rank=4, alpha=8, seed=1, base="someone/else")
    write_random_adapter(tmp_path / "loose" / "extra", model, rank=2, alpha=2, seed=2)
    return tmp_path


def specs_of(*argv: str) -> dict:
    return {s.name: s for s in model_specs(build_parser().parse_args(["serve", *argv]))}


def test_named_loras_and_models_dir_adapters_become_entries(layout):
    found = specs_of("--models-dir", str(layout / "models"), "--lora", f"extra={layout / 'loose' / 'extra'}")
    assert sorted(found) == ["base", "extra", "tuned"]  # "stranger" names no served model: left out
    assert found["tuned"].base == found["extra"].base == "base" and not found["tuned"].pinned
    with pytest.raises(SystemExit, match="names none of the served models"):  # two models, no base named
        specs_of("--model", f"one={layout / 'models' / 'base'}", "--model", f"two={layout / 'models' / 'base'}",
                 "--lora", f"extra={layout / 'loose' / 'extra'}")
    one = specs_of("--model", str(layout / "models" / "base"), "--lora", f"extra={layout / 'loose' / 'extra'}",
                   "--lora", f"t={layout / 'models' / 'tuned'}")
    assert one["extra"].base == one["t"].base == "base" and one["extra"].pinned  # loaded with its base
    with pytest.raises(SystemExit, match="no LoRA adapter there"):
        specs_of("--model", str(layout / "models" / "base"), "--lora", f"x={layout}")
    with pytest.raises(SystemExit, match="only one --lora PATH"):
        specs_of("--model", str(layout / "models" / "base"), "--lora", str(layout / "loose" / "extra"),
                 "--lora", str(layout / "models" / "tuned"))


@pytest.mark.slow
def test_serve_process_answers_each_adapter_as_its_merged_model(layout):
    port = free_port()
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    base = layout / "models" / "base"
    proc = subprocess.Popen([sys.executable, "-m", "portachat", "serve", "--models-dir", str(layout / "models"),
                             "--model", f"base={base}", "--lora", f"extra={layout / 'loose' / 'extra'}",
                             "--lora", f"merged={layout / 'loose' / 'extra'}", "--port", str(port), "--dtype", "fp32",
                             "--kv-cache-gb", "0.01", "--max-model-len", "256"],
                            cwd=REPO, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_healthy(url, timeout_s=180)
        client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
        cards = {m.id: m.model_extra for m in client.models.list().data}
        assert cards["extra"]["parent"] == "base" and cards["tuned"]["parent"] == "base"

        def text(model: str) -> str:
            return client.completions.create(model=model, prompt="the king", max_tokens=8, temperature=0
                                             ).choices[0].text

        answers = {m: text(m) for m in ("base", "extra", "tuned")}
        assert len(set(answers.values())) == 3
        assert text("merged") == answers["extra"]  # two names, one adapter: the same answer
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=60)
    assert "Traceback" not in err, err
