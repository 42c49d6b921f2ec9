"""Four LoRA adapters of the real SmolLM2-135M-Instruct served at once (slow), each trained here with
`train sft --lora-rank`'s library entry on its own rows. 32 concurrent chat requests
from the `openai` client spread over them run in shared batches (portachat:lora_mixed_steps), and
each reply equals greedy decoding of that adapter merged into the weights (fp32)."""

from __future__ import annotations

import copy
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
import torch

from portachat.device import get_device
from portachat.engine import SamplingParams
from portachat.engine.loading import LoadOptions, load_served_model
from portachat.engine.oneshot import engine_for
from portachat.model.load import load_for_inference
from portachat.model.lora import load_lora, merge_into
from portachat.serve.api import ServerSettings, create_app
from portachat.serve.registry import ModelRegistry, ModelSpec
from portachat.train.finetune import FinetuneOptions, run_finetune
from portachat.train.lora import LoraOptions
from portachat.train.trainer import TrainConfig
from tests.conftest import require_shared
from tests.serve.api_testing import metric, wait_healthy
from tests.serve.threaded_server import serve_in_thread
from tests.smollm2 import smollm2_gguf_path

pytestmark = pytest.mark.slow

QUESTIONS = ["What is 12 times 7?", "Name a colour.", "Say hello in French.", "What is the capital of Italy?",
             "Count to three.", "Is water wet?", "Give me a fruit.", "What day comes after Monday?"]
TOKENS = 6


@pytest.fixture(scope="module")
def adapters(tmp_path_factory):
    gguf = smollm2_gguf_path()
    rows = require_shared("gsm8k/train.jsonl").read_text(encoding="utf-8").splitlines(keepends=True)
    root = tmp_path_factory.mktemp("smollm2_adapters")
    paths = {}
    for i in range(4):  # four adapters, each trained here on its own rows
        data = root / f"rows{i}.jsonl"
        data.write_text("".join(rows[4 * i : 4 * i + 4]), encoding="utf-8")
        opts = FinetuneOptions(  # one LoRA SFT step at a high rate, so that it changes some answers
            init=str(gguf), data=[str(data)], num_iterations=1, max_seq_len=128, eval_examples=0, lr=2e-2,
            lora=LoraOptions(rank=4, alpha=8, targets=["q_proj", "v_proj", "down_proj"]),
            train=TrainConfig(run=f"t{i}", runs_root=str(root / "runs"), device_batch_size=2, eval_every=0,
                              log_every=1, warmdown_ratio=0.0),
        )
        paths[f"trained{i}"] = run_finetune(opts, dev=get_device("cpu", dtype="fp32", compile=False),
                                            print_fn=print).final_checkpoint
    base = load_for_inference(gguf, device="cpu", dtype=torch.float32)
    return gguf, base, paths


def test_four_adapters_served_at_once_share_batches_and_equal_their_merged_models(adapters):
    gguf, base, paths = adapters

    def load(spec: ModelSpec):
        return load_served_model(LoadOptions(model=spec.path, device="cpu", dtype="fp32", compile=False,
                                             max_num_seqs=40, max_model_len=160, max_num_batched_tokens=512))

    specs = [ModelSpec("smol", str(gguf), pinned=True),
             *(ModelSpec(name, str(path), pinned=True, base="smol") for name, path in paths.items())]
    server = serve_in_thread(create_app(ServerSettings(served_model_name="smol"), registry=ModelRegistry(specs, load)))
    try:
        wait_healthy(server.url, timeout_s=180)
        client = openai.OpenAI(base_url=f"{server.url}/v1", api_key="x", max_retries=0, timeout=300)
        jobs = [(name, q) for q in QUESTIONS for name in paths]  # 32 requests, 8 per adapter

        def ask(job: tuple[str, str]) -> str:
            out = client.chat.completions.create(model=job[0], messages=[{"role": "user", "content": job[1]}],
                                                 max_tokens=TOKENS, temperature=0,
                                                 extra_body={"repetition_penalty": 1.0})
            return out.choices[0].message.content

        with ThreadPoolExecutor(len(jobs)) as pool:
            got = dict(zip(jobs, pool.map(ask, jobs), strict=True))
        assert metric(server.url, "portachat:lora_mixed_steps") > 0  # several adapters in one batch
    finally:
        server.stop()

    tok = base.tokenizer
    prompts = [tok.render_prompt([{"role": "user", "content": q}]) for q in QUESTIONS]
    plain = None
    for name, path in paths.items():
        merged = merge_into(copy.deepcopy(base.model), load_lora(path)).requires_grad_(False)
        engine = engine_for(merged, tok, max_num_seqs=len(prompts), max_model_len=160)
        expected = [tok.decode(c.token_ids) for c in engine.generate(prompts, SamplingParams(max_tokens=TOKENS,
                                                                                              temperature=0.0))]
        assert [got[(name, q)] for q in QUESTIONS] == expected, name
        if plain is None:
            base_engine = engine_for(copy.deepcopy(base.model).requires_grad_(False), tok, max_num_seqs=len(prompts),
                                     max_model_len=160)
            plain = [tok.decode(c.token_ids) for c in base_engine.generate(prompts, SamplingParams(
                max_tokens=TOKENS, temperature=0.0))]
        assert expected != plain, f"{name} changes no answer"
