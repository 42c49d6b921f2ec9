"""Existing model families in our GPT: tiny random Llama (SmolLM2-style tied, Llama-3 rope scaling),
Qwen2 and Qwen3 models saved by transformers load through `load_for_inference` with equal logits
and identical greedy tokens."""

from __future__ import annotations

import json

import pytest
import torch
from hf_families import VOCAB, make_hf_dir, train_bpe
from safetensors.torch import load_file, save_file

from portachat.engine import SamplingParams
from portachat.engine.oneshot import generate_once
from portachat.model import GPT, UnsupportedConfigError, exportable, to_hf_config
from portachat.model.load import GenerationDefaults, load_for_inference
from portachat.storage.atomic import CheckpointError

transformers = pytest.importorskip("transformers")

LLAMA3_ROPE = {
    "rope_type": "llama3", "factor": 4.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
    "original_max_position_embeddings": 32,
}  # fmt: skip
CASES = {
    "llama": ("llama", {}),
    "smollm2-like llama (tied, llama3 rope)": ("llama", {"tie_word_embeddings": True, "rope_scaling": LLAMA3_ROPE}),
    "llama linear rope": ("llama", {"rope_scaling": {"rope_type": "linear", "factor": 2.0}, "rope_theta": 500.0}),
    "qwen2 (q/k/v biases)": ("qwen2", {}),
    "qwen3 (qk-norm)": ("qwen3", {"head_dim": 24, "tie_word_embeddings": True}),
}


@pytest.fixture(scope="module")
def bpe():
    return train_bpe()


@pytest.fixture(scope="module", params=list(CASES))
def family_dir(request, tmp_path_factory, bpe):
    family, overrides = CASES[request.param]
    directory = tmp_path_factory.mktemp("hf") / family
    hf = make_hf_dir(directory, family, seed=len(request.param), tokenizer=bpe, **overrides)
    return directory, hf, family, overrides


def test_logits_and_greedy_tokens_match_transformers(family_dir):
    directory, hf, family, overrides = family_dir
    loaded = load_for_inference(directory, device="cpu", dtype=torch.float32)
    model, cfg = loaded.model, loaded.model.config
    assert loaded.source == "huggingface" and cfg.architecture == family and not model.training
    assert (cfg.qk_norm, cfg.attention_bias) == {"llama": (False, False), "qwen2": (False, True), "qwen3": (True, False)}[
        family
    ]
    assert cfg.tie_embeddings == overrides.get("tie_word_embeddings", False)
    assert (model.lm_head.weight is model.model.embed_tokens.weight) == cfg.tie_embeddings
    # Long enough that llama3 / linear scaling changes the rotation of later positions.
    idx = torch.randint(0, VOCAB, (2, 70), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        ours, theirs = model(idx), hf(idx).logits
    assert ours.abs().max() > 1.0
    torch.testing.assert_close(ours, theirs, atol=1e-4, rtol=0)

    prompt = [1, 17, 42, 99, 5, 260]
    mine = generate_once(model, [prompt], SamplingParams(max_tokens=10, temperature=0.0))[0].token_ids
    with torch.no_grad():
        out = hf.generate(torch.tensor([prompt]), max_new_tokens=10, do_sample=False, eos_token_id=None, pad_token_id=0)
    assert mine == out[0, len(prompt) :].tolist()
    assert len(set(mine)) > 1


def test_rope_scaling_changes_the_tables_as_transformers_does():
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    from portachat.model.gpt import rope_inv_freq

    hf_cfg = transformers.LlamaConfig(
        hidden_size=64, num_attention_heads=4, rope_scaling=dict(LLAMA3_ROPE), rope_theta=10000.0
    )
    theirs, _ = ROPE_INIT_FUNCTIONS["llama3"](hf_cfg, "cpu")
    ours = rope_inv_freq(16, 10000.0, {**LLAMA3_ROPE, "original_max_position_embeddings": 32})
    torch.testing.assert_close(ours, theirs.float(), atol=0, rtol=1e-6)
    assert not torch.allclose(ours, rope_inv_freq(16, 10000.0))  # the scaling did something


def test_weights_load_in_the_requested_dtype(tmp_path, bpe):
    make_hf_dir(tmp_path, "qwen2", tokenizer=bpe)
    loaded = load_for_inference(tmp_path, device="cpu", dtype="bf16")
    assert loaded.dtype == torch.bfloat16
    assert {p.dtype for p in loaded.model.parameters()} == {torch.bfloat16}
    assert loaded.model.rope_cos.dtype == torch.float32
    logits = loaded.model(torch.tensor([[1, 2, 3]]))
    assert logits.dtype == torch.float32 and torch.isfinite(logits).all()


def test_sharded_safetensors_and_pytorch_bin_load_the_same_weights(tmp_path, bpe, capfd):
    hf = make_hf_dir(tmp_path / "one", "llama", tokenizer=bpe)
    hf.save_pretrained(str(tmp_path / "sharded"), max_shard_size="40KB")
    assert (tmp_path / "sharded" / "model.safetensors.index.json").is_file()
    idx = torch.tensor([[5, 9, 200, 31, 7]])
    expected = hf(idx).logits
    for name in ("sharded", "bin"):
        directory = tmp_path / name
        if name == "bin":
            directory.mkdir()
            torch.save(load_file(str(tmp_path / "one" / "model.safetensors")), directory / "pytorch_model.bin")
        for f in ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
            (directory / f).write_bytes((tmp_path / "one" / f).read_bytes())
        loaded = load_for_inference(directory, device="cpu", dtype=torch.float32)
        torch.testing.assert_close(loaded.model(idx), expected, atol=1e-4, rtol=0)
    assert "weights_only=True" in capfd.readouterr().err


def test_pytorch_bin_with_code_is_refused(tmp_path, bpe):
    make_hf_dir(tmp_path, "llama", tokenizer=bpe)
    state = load_file(str(tmp_path / "model.safetensors"))
    (tmp_path / "model.safetensors").unlink()
    torch.save({"weights": state, "hook": GenerationDefaults}, tmp_path / "pytorch_model.bin")  # a class: pickled code
    with pytest.raises(CheckpointError, match="never unpickles code; convert the model to safetensors"):
        load_for_inference(tmp_path, device="cpu", dtype=torch.float32)


def test_unsupported_architecture_names_the_supported_ones(tmp_path, bpe):
    cfg = transformers.GPT2Config(vocab_size=VOCAB, n_embd=32, n_layer=1, n_head=2, n_positions=64)
    transformers.GPT2LMHeadModel(cfg).save_pretrained(str(tmp_path))
    with pytest.raises(UnsupportedConfigError, match=r"model_type='gpt2'.*supported families: llama .*qwen2, qwen3"):
        load_for_inference(tmp_path, device="cpu", dtype=torch.float32)


def test_weights_that_do_not_match_the_config_are_one_clear_error(tmp_path, bpe):
    make_hf_dir(tmp_path, "llama", tokenizer=bpe)
    state = load_file(str(tmp_path / "model.safetensors"))
    del state["lm_head.weight"]
    save_file(state, str(tmp_path / "model.safetensors"))
    with pytest.raises(CheckpointError, match="tie_word_embeddings=false but the weights have no lm_head"):
        load_for_inference(tmp_path, device="cpu", dtype=torch.float32)


def test_missing_paths_say_what_to_pass(tmp_path):
    with pytest.raises(CheckpointError, match="no model at .*nope: pass a checkpoint directory, .* or a .gguf file"):
        load_for_inference(tmp_path / "nope", device="cpu", dtype=torch.float32)
    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_for_inference(tmp_path, device="cpu", dtype=torch.float32)


def test_generation_config_gives_stop_ids_and_sampling_defaults(tmp_path, bpe):
    make_hf_dir(tmp_path, "qwen3", tokenizer=bpe)
    gen = {"eos_token_id": [0, 2], "do_sample": True, "temperature": 0.6, "top_p": 0.95, "top_k": 20}
    (tmp_path / "generation_config.json").write_text(json.dumps(gen))
    loaded = load_for_inference(tmp_path, device="cpu", dtype=torch.float32)
    assert loaded.generation == GenerationDefaults(do_sample=True, temperature=0.6, top_k=20, top_p=0.95)
    assert loaded.tokenizer.stop_ids == {0, 2}  # both eos ids; <|im_end|> (2) is also the template's end of turn
    assert loaded.tokenizer.tool_tokens is None and loaded.tokenizer.bos_id == 1


def test_imported_family_exports_as_itself(tmp_path, bpe):
    """A fine-tuned Llama/Qwen2 saves as a Llama/Qwen2 that transformers loads with equal logits."""
    for family, overrides in (("llama", {"rope_scaling": LLAMA3_ROPE}), ("qwen2", {})):
        make_hf_dir(tmp_path / family, family, tokenizer=bpe, **overrides)
        model: GPT = load_for_inference(tmp_path / family, device="cpu", dtype=torch.float32).model
        hf_class = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM"}[family]
        assert exportable(model.config) == (True, f"maps onto {hf_class}")
        out = tmp_path / f"{family}-out"
        out.mkdir()
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(out / "model.safetensors"))
        (out / "config.json").write_text(json.dumps(to_hf_config(model.config, bos_id=1, eos_id=2)))
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
        assert type(hf).__name__ == hf_class
        idx = torch.randint(0, VOCAB, (1, 60), generator=torch.Generator().manual_seed(1))  # past 32: scaled rope
        with torch.no_grad():
            torch.testing.assert_close(model(idx), hf(idx).logits, atol=1e-4, rtol=0)


def test_fine_tuned_import_saves_with_its_own_tokenizer_and_template(tmp_path, bpe):
    from portachat.model.model_dir import save_model_files

    make_hf_dir(tmp_path / "src", "llama", tokenizer=bpe, tie_word_embeddings=True)
    src = load_for_inference(tmp_path / "src", device="cpu", dtype=torch.float32)
    with torch.no_grad():  # "fine-tune": change a weight so the comparison is with the new model
        src.model.model.layers[0].mlp.up_proj.weight.mul_(1.5)
    out = tmp_path / "out"
    out.mkdir()
    save_model_files(out, src.model, src.tokenizer, {"stage": "sft", "step": 1}, generation_defaults={"temperature": 0.3})

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(out), dtype=torch.float32).eval()
    assert type(hf).__name__ == "LlamaForCausalLM"
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(out))
    messages = [{"role": "user", "content": "the quick brown fox?"}]
    theirs = hf_tok.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    theirs = list(theirs["input_ids"]) if hasattr(theirs, "keys") else list(theirs)
    assert src.tokenizer.render_prompt(messages) == theirs
    idx = torch.tensor([theirs])
    with torch.no_grad():
        torch.testing.assert_close(src.model(idx), hf(idx).logits, atol=1e-4, rtol=0)

    back = load_for_inference(out, device="cpu", dtype=torch.float32)
    assert back.source == "huggingface" and back.generation.temperature == 0.3
    assert back.tokenizer.stop_ids == src.tokenizer.stop_ids
    torch.testing.assert_close(back.model(idx), src.model(idx), atol=0, rtol=0)


def test_damaged_or_incomplete_weights_are_clear_errors(tmp_path, bpe):
    hf = make_hf_dir(tmp_path / "one", "qwen3", tokenizer=bpe)
    (tmp_path / "one" / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(CheckpointError, match="model.safetensors cannot be read .* damaged or incomplete"):
        load_for_inference(tmp_path / "one", device="cpu", dtype=torch.float32)
    hf.save_pretrained(str(tmp_path / "sharded"), max_shard_size="40KB")
    shards = sorted((tmp_path / "sharded").glob("model-*.safetensors"))
    shards[-1].unlink()
    for f in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        (tmp_path / "sharded" / f).write_bytes((tmp_path / "one" / f).read_bytes())
    with pytest.raises(CheckpointError, match=f"is incomplete: shard {shards[-1].name} named in"):
        load_for_inference(tmp_path / "sharded", device="cpu", dtype=torch.float32)
