"""`compress`: prune -> heal -> evaluate -> report. The heal step (distillation from the unpruned
model by default, `--heal sft` for cross-entropy) gets the pruned student and its teacher through
the HealStep interface; the report holds before/pruned/healed numbers, the heal that ran and a plot."""

from __future__ import annotations

import json
import math

import pytest
import torch

from portachat.cli import main
from portachat.compress.heal import HEALS, HealRequest
from portachat.compress.prune import PruneError, PruneTargets
from portachat.compress.prune_run import PruneOptions
from portachat.compress.recipe import CompressOptions, run_compress
from portachat.device import get_device
from tests.model.hf_families import make_hf_dir, train_bpe

transformers = pytest.importorskip("transformers")


@pytest.fixture
def chats(tmp_path):
    """Short conversations in the tiny tokenizer's words, so rows hold whole replies."""
    path = tmp_path / "chats.jsonl"
    rows = [{"messages": [{"role": "user", "content": f"the quick brown fox {i}"},
                          {"role": "assistant", "content": "jumps over a lazy dog while seven wizards hex gnomes"}]}
            for i in range(120)]
    path.write_text("".join(json.dumps(r) + "\n" for r in rows), encoding="utf-8")
    return path


def _opts(source, output, data, **kwargs) -> CompressOptions:
    prune = PruneOptions(model=str(source), output="", targets=PruneTargets(num_layers=2, ffn_hidden_size=64),
                         data=str(data), calibration_samples=4, seq_len=48, depth_metric="cosine")
    return CompressOptions(prune=prune, output=str(output), eval_samples=4, decode_tokens=4, **kwargs)


@pytest.mark.parametrize("heal_name", [None, "sft"])  # None: compress's default, distillation
def test_compress_hands_the_student_and_teacher_to_the_heal_step_and_reports(tmp_path, chats, monkeypatch,
                                                                             heal_name):
    make_hf_dir(tmp_path / "src", "llama", tokenizer=train_bpe(), num_hidden_layers=3)
    seen: dict[str, list[HealRequest]] = {"distill": [], "sft": []}

    def recorder(name):  # a heal step that trains nothing: the student comes back as it is
        def heal(req, dev, print_fn):
            seen[name].append(req)
            return req.student
        return heal

    for name in seen:
        monkeypatch.setitem(HEALS, name, recorder(name))
    chosen = {} if heal_name is None else {"heal": heal_name}
    result = run_compress(_opts(tmp_path / "src", tmp_path / "out", chats, heal_steps=7, **chosen),
                          dev=get_device("cpu"), print_fn=lambda _m: None)
    ran = heal_name or "distill"
    (req,) = seen[ran]
    assert not seen["sft" if ran == "distill" else "distill"]
    assert req.student == tmp_path / "out" / "pruned" and req.teacher == str(tmp_path / "src")
    assert (req.data, req.steps, req.runs_root) == (str(chats), 7, tmp_path / "out" / "runs")
    body = json.loads((tmp_path / "out" / "report.json").read_text())
    report = body["columns"]
    assert body["heal"] == ran
    assert any(("distillation from " + str(tmp_path / "src") if ran == "distill" else "cross-entropy") in note
               for note in body["notes"])
    assert list(report) == ["before", "pruned", "healed"]
    assert report["before"]["params"] > report["pruned"]["params"] == report["healed"]["params"]
    assert report["pruned"]["perplexity"] == report["healed"]["perplexity"]  # the same weights
    assert report["before"]["layers"] == 3 and report["pruned"]["layers"] == 2
    assert all(math.isfinite(c["perplexity"]) and c["decode_tok_s"] > 0 for c in report.values())
    assert (tmp_path / "out" / "compress.png").stat().st_size > 0
    text = result.report.read_text()
    assert "| parameters" in text and "compress.png" in text


def test_compress_refuses_text_data_without_heal_data_before_any_work(tmp_path, shakespeare_path):
    with pytest.raises(PruneError, match="--heal-data"):
        run_compress(_opts(tmp_path / "missing-model", tmp_path / "out", shakespeare_path), dev=get_device("cpu"))
    assert not (tmp_path / "out").exists()


def test_compress_refuses_an_unknown_heal_step_before_any_work(tmp_path, chats):
    with pytest.raises(PruneError, match="--heal"):
        run_compress(_opts(tmp_path / "missing-model", tmp_path / "out", chats, heal="lora"), dev=get_device("cpu"))
    assert not (tmp_path / "out").exists()


def _trained_teacher(directory, chats, steps: int = 15):
    """A tiny qwen2 that has learnt the chats (AdamW on their ChatML rows), so pruning it costs
    perplexity that healing can win back."""
    hf = make_hf_dir(directory, "qwen2", tokenizer=train_bpe(), num_hidden_layers=3)
    tok = transformers.AutoTokenizer.from_pretrained(str(directory))
    convs = [json.loads(line)["messages"] for line in chats.read_text(encoding="utf-8").splitlines()]
    rows = [tok.apply_chat_template(m, tokenize=False) for m in convs]
    generator = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(hf.parameters(), lr=1e-2, weight_decay=0.0)
    hf.train()
    for _ in range(steps):
        picked = [rows[i] for i in torch.randint(len(rows), (8,), generator=generator).tolist()]
        batch = tok(picked, return_tensors="pt", padding=True)
        labels = batch["input_ids"].masked_fill(batch["attention_mask"] == 0, -100)
        loss = hf(**batch, labels=labels).loss
        opt.zero_grad()
        loss.backward()
        opt.step()
    hf.save_pretrained(str(directory))


@pytest.mark.slow
def test_compress_command_heals_by_distilling_from_the_unpruned_model(tmp_path, chats):
    _trained_teacher(tmp_path / "src", chats)
    code = main(["compress", "--model", str(tmp_path / "src"), "--output", str(tmp_path / "out"), "--data", str(chats),
                 "--target-num-layers", "2", "--target-ffn-hidden-size", "32", "--depth-metric", "cosine",
                 "--calibration-samples", "4",
                 "--seq-len", "48", "--heal-steps", "6", "--device-batch-size", "4", "--eval-samples", "4",
                 "--decode-tokens", "4", "--device", "cpu"])
    assert code == 0
    body = json.loads((tmp_path / "out" / "report.json").read_text())
    report = body["columns"]
    assert body["heal"] == "distill"  # the default
    assert report["before"]["perplexity"] < report["pruned"]["perplexity"]  # pruning cost quality ...
    assert report["healed"]["perplexity"] < report["pruned"]["perplexity"]  # ... and distillation won some back
    healed = sorted((tmp_path / "out" / "runs" / "compress" / "distill").glob("step_*"))[-1]
    assert json.loads((healed / "portachat.json").read_text())["teacher"].endswith("src")
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(healed), dtype=torch.float32)
    assert hf.config.num_hidden_layers == 2 and hf.config.intermediate_size == 32
