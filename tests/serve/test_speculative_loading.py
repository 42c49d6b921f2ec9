"""--speculative-model from the command line to the engine: ngram, a draft checkpoint, a wrong vocabulary."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from portachat.cli import build_parser
from portachat.commands.run.inference import load_options
from portachat.engine import SamplingParams
from portachat.engine.loading import LoadOptions, SpeculativeOptions, load_served_model
from portachat.model import GPT, GPTConfig
from portachat.model.model_dir import save_model_files
from portachat.tokenizer import train_tokenizer
from tests.e2e.helpers import run_cli


def _checkpoint(root: Path, tokenizer, seed: int) -> Path:
    torch.manual_seed(seed)
    cfg = GPTConfig(vocab_size=tokenizer.vocab_size, n_layer=1, n_embd=64, n_head=4, n_kv_head=2,
                    head_dim=16, intermediate_size=128, max_seq_len=128)  # fmt: skip
    model = GPT(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0, 0.5)
    path = root / f"model_{seed}"
    path.mkdir()
    save_model_files(path, model, tokenizer, {"stage": "sft", "step": 1})
    return path


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, small_tokenizer) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("ckpt"), small_tokenizer, seed=0)


def _options(model: Path, speculative: SpeculativeOptions | None) -> LoadOptions:
    return LoadOptions(model=str(model), device="cpu", dtype="fp32", compile=False, max_num_seqs=4,
                       speculative=speculative)  # fmt: skip


def test_ngram_and_draft_checkpoint_keep_greedy_output(checkpoint, small_tokenizer):
    prompt = [small_tokenizer.bos_id, *small_tokenizer.encode("the king the king the king the")]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    plain = load_served_model(_options(checkpoint, None)).engine.generate([prompt], params)[0]
    for spec in (SpeculativeOptions(model="[ngram]", prompt_lookup_min=1),
                 SpeculativeOptions(model=str(checkpoint), num_speculative_tokens=3)):  # fmt: skip
        served = load_served_model(_options(checkpoint, spec))
        assert "speculative decoding" in served.description
        got = served.engine.generate([prompt], params)[0]
        assert got.token_ids == plain.token_ids
        assert served.engine.stats()["spec_decode_num_drafts"] > 0


def test_a_draft_vocabulary_from_the_flag_cuts_the_head_and_keeps_greedy_output(checkpoint, small_tokenizer):
    args = build_parser().parse_args(["serve", "--model", str(checkpoint), "--speculative-model", str(checkpoint),
                                      "--speculative-draft-vocab", "100"])  # fmt: skip
    assert load_options(args).speculative.draft_vocab_size == 100
    prompt = [small_tokenizer.bos_id, *small_tokenizer.encode("the king the king the king the")]
    params = SamplingParams(max_tokens=16, temperature=0.0, ignore_eos=True)
    plain = load_served_model(_options(checkpoint, None)).engine.generate([prompt], params)[0]
    served = load_served_model(_options(checkpoint, SpeculativeOptions(model=str(checkpoint), draft_vocab_size=100)))
    draft = served.engine.speculator.draft
    stops = sorted(served.tokenizer.stop_ids)
    assert draft.token_ids.tolist() == sorted({*range(100), *stops})  # the stop tokens are always kept
    assert served.engine.generate([prompt], params)[0].token_ids == plain.token_ids


def test_a_draft_with_another_vocabulary_is_refused(checkpoint, tmp_path, shakespeare_path):
    text = shakespeare_path.read_text(encoding="utf-8")[:40_000]
    other = _checkpoint(tmp_path, train_tokenizer(text.split("\n\n"), vocab_size=300), seed=1)
    with pytest.raises(ValueError, match="does not share the target model's vocabulary"):
        load_served_model(_options(checkpoint, SpeculativeOptions(model=str(other))))


def test_flags(checkpoint):
    parse = build_parser().parse_args
    args = parse(["serve", "--model", "m", "--speculative-model", "ngram", "--num-speculative-tokens", "6",
                  "--ngram-prompt-lookup-max", "3", "--speculative_max_batch", "2"])  # fmt: skip
    assert load_options(args).speculative == SpeculativeOptions(model="ngram", num_speculative_tokens=6,
                                                                prompt_lookup_max=3, max_batch=2)  # fmt: skip
    assert load_options(parse(["chat", "--model", "m"])).speculative is None
    with pytest.raises(ValueError, match="--num-speculative-tokens need --speculative-model"):
        load_options(parse(["generate", "--model", "m", "--input", "i", "--output", "o",
                            "--num-speculative-tokens", "3"]))  # fmt: skip
    with pytest.raises(ValueError, match="ngram_prompt_lookup_min"):
        load_served_model(_options(checkpoint, SpeculativeOptions(model="ngram", prompt_lookup_min=5,
                                                                  prompt_lookup_max=3)))  # fmt: skip


@pytest.mark.slow
def test_generate_command_with_prompt_lookup(tmp_path, checkpoint):
    inp = tmp_path / "in.jsonl"
    inp.write_text(json.dumps({"prompt": "the king the king the king"}) + "\n", encoding="utf-8")
    outputs = []
    for extra in ([], ["--speculative-model", "ngram", "--ngram-prompt-lookup-min", "1"]):
        out = tmp_path / f"out{len(outputs)}.jsonl"
        proc = run_cli(["generate", "--model", str(checkpoint), "--input", str(inp), "--output", str(out),
                        "--max-tokens", "12", "--dtype", "fp32", *extra], tmp_path / "home", timeout=300)  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        outputs.append(json.loads(out.read_text(encoding="utf-8"))["output"])
    assert outputs[0] == outputs[1]
