"""DPO step time: portachat's preference loss vs TRL's DPOTrainer, same model, same batch, same run.

Both sides start from one Hugging Face directory (a random Llama of SmolLM2-135M's shape, or `--model
HF_DIR`, or with --tiny a 2-layer toy) and train all weights on the same P pairs of random prompt and
reply tokens, with the reference log-probs precomputed (portachat's full fine-tuning default; TRL's
`precompute_ref_log_probs=True`), AdamW at the same settings. A step is forward of the 2P rows, the
sigmoid DPO loss, backward, the optimizer step and zero_grad:
  ours  portachat's GPT loaded by the fine-tuning loader, `PreferenceObjective` (per-sequence log-probs
        through the chunked loss) under the device's autocast, then AdamW (what `train dpo` runs per step);
  peer  TRL's `DPOTrainer.training_step` (its fused LM head, accelerate's autocast), then its optimizer.
Steps alternate in blocks (ours, peer, peer, ours, ...) so background load hits both alike; medians are
reported and the ratio is peer / ours median step time (above 1.00x portachat is faster).

    python benchmarks/dpo.py --tiny                       # seconds, any machine (the smoke run)
    python benchmarks/dpo.py --pairs 8 --prompt-len 128 --reply-len 128 --steps 10
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

import torch
from alternate import alternating_medians  # benchmarks/ is on sys.path when run as a script

REPO = Path(__file__).resolve().parent.parent


def make_model_dir(path: Path, tiny: bool) -> None:
    import transformers

    sys.path.insert(0, str(REPO))
    from tests.model.hf_families import save_tokenizer, train_bpe

    shape = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                 num_key_value_heads=2) if tiny else dict(hidden_size=576, intermediate_size=1536,
                                                          num_hidden_layers=30, num_attention_heads=9,
                                                          num_key_value_heads=3)  # SmolLM2-135M
    cfg = transformers.LlamaConfig(vocab_size=320, max_position_embeddings=2048, bos_token_id=1, eos_token_id=2,
                                   tie_word_embeddings=True, **shape)
    torch.manual_seed(0)
    transformers.AutoModelForCausalLM.from_config(cfg, dtype=torch.float32).save_pretrained(str(path))
    save_tokenizer(train_bpe(), path)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", default=None, help="Hugging Face model directory (default: a random SmolLM2-135M shape)")
    ap.add_argument("--tiny", action="store_true", help="a 2-layer toy model and small sizes (smoke run)")
    ap.add_argument("--pairs", type=int, default=4, help="pairs per step (2x rows) (default 4)")
    ap.add_argument("--prompt-len", type=int, default=64, help="prompt tokens (default 64)")
    ap.add_argument("--reply-len", type=int, default=64, help="reply tokens, chosen and rejected (default 64)")
    ap.add_argument("--steps", type=int, default=6, help="timed steps per side (default 6)")
    ap.add_argument("--warmup", type=int, default=1, help="untimed steps per side (default 1)")
    ap.add_argument("--device", default=None, help="cpu|cuda|... (default: auto-detect)")
    ap.add_argument("--dtype", default=None, help="bf16|fp32 (default: the device's)")
    ap.add_argument("--json", action="store_true", help="also print one JSON line")
    args = ap.parse_args()
    if args.tiny:
        args.pairs, args.prompt_len, args.reply_len, args.steps = 2, 8, 8, min(args.steps, 2)

    import datasets
    from trl import DPOConfig, DPOTrainer

    from portachat.data.preference_data import pairs_to_batch
    from portachat.device import get_device
    from portachat.train.base_model import load_base
    from portachat.train.dpo import PreferenceObjective
    from portachat.train.finetune_optim import finetune_optimizer
    from portachat.train.preference_loss import PreferenceMetrics, sequence_logps

    dev = get_device(args.device, dtype=args.dtype, compile=False)
    tmp = Path(tempfile.mkdtemp(prefix="dpo-bench-"))
    model_dir = Path(args.model) if args.model else tmp / "model"
    if args.model is None:
        make_model_dir(model_dir, args.tiny)
    g = torch.Generator().manual_seed(0)
    vocab = 300
    examples = [{"prompt_ids": torch.randint(3, vocab, (args.prompt_len,), generator=g).tolist(),
                 "chosen_ids": torch.randint(3, vocab, (args.reply_len,), generator=g).tolist(),
                 "rejected_ids": torch.randint(3, vocab, (args.reply_len,), generator=g).tolist()}
                for _ in range(args.pairs)]

    # ours: the fine-tuning loader's model, the batch `train dpo` builds, reference log-probs computed once
    base = load_base(model_dir, dev)
    model = base.model
    rows = [((e["prompt_ids"] + e["chosen_ids"], [0] * args.prompt_len + [1] * args.reply_len),
             (e["prompt_ids"] + e["rejected_ids"], [0] * args.prompt_len + [1] * args.reply_len)) for e in examples]
    seq = args.prompt_len + args.reply_len
    batch = pairs_to_batch(rows, 0, seq, lambda n, _m: n).to(dev.torch_device)
    with torch.no_grad(), dev.autocast():
        ref, _n = sequence_logps(model, batch)
    batch.ref_logps = ref.float()
    objective = PreferenceObjective("dpo", 0.1, 0.5, model, PreferenceMetrics(dev.torch_device))
    opt = finetune_optimizer(model, 5e-6, 0.0, dev.fused_optimizer)

    def ours_step() -> None:
        with dev.autocast():
            loss = objective(model, batch) / batch.num_pairs
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)

    # peer: TRL's DPOTrainer on the same weights and tokens, reference log-probs precomputed the same way
    import transformers

    hf = transformers.AutoModelForCausalLM.from_pretrained(str(model_dir), dtype=torch.float32)
    bf16 = dev.dtype == torch.bfloat16
    cfg = DPOConfig(output_dir=str(tmp / "trl"), beta=0.1, per_device_train_batch_size=args.pairs, report_to=[],
                    use_cpu=dev.type == "cpu", bf16=bf16, fp16=False, max_length=None, learning_rate=5e-6,
                    precompute_ref_log_probs=True, weight_decay=0.0)
    rows_text = [{"prompt": "a", "chosen": "b", "rejected": "c"}] * args.pairs
    trainer = DPOTrainer(model=hf, args=cfg, processing_class=transformers.AutoTokenizer.from_pretrained(str(model_dir)),
                         train_dataset=datasets.Dataset.from_list(rows_text))
    trainer.create_optimizer_and_scheduler(num_training_steps=args.warmup + args.steps + 1)
    trainer.current_gradient_accumulation_steps = 1  # what train() sets before its first training_step
    p = args.pairs
    inputs = trainer.data_collator([{**e, "ref_chosen_logps": ref[i].item(), "ref_rejected_logps": ref[p + i].item()}
                                    for i, e in enumerate(examples)])
    trainer.model.train()

    def peer_step() -> None:
        trainer.training_step(trainer.model, inputs)
        trainer.optimizer.step()
        trainer.optimizer.zero_grad(set_to_none=True)

    sides = {"ours": ours_step, "peer": peer_step}
    def timed(name: str) -> float:
        dev.synchronize()
        t0 = time.perf_counter()
        sides[name]()
        dev.synchronize()
        return time.perf_counter() - t0

    medians = alternating_medians(timed, args.warmup, args.steps)
    ours_ms, peer_ms = (1e3 * medians[k] for k in ("ours", "peer"))
    ratio = peer_ms / ours_ms
    print(f"DPO step, {args.pairs} pairs x ({args.prompt_len} prompt + {args.reply_len} reply) tokens, "
          f"{model.num_params():,} params, {dev.kind} {dev.dtype_name}")
    print(f"  portachat: {ours_ms:.1f} ms   TRL DPOTrainer: {peer_ms:.1f} ms   (medians of {args.steps})")
    print(f"ratio (TRL / ours step time): {ratio:.2f}x")
    if args.json:
        print(json.dumps({"pairs": args.pairs, "prompt_len": args.prompt_len, "reply_len": args.reply_len,
                          "device": dev.kind, "dtype": dev.dtype_name, "ours_ms": ours_ms, "peer_ms": peer_ms,
                          "ratio": ratio}))


if __name__ == "__main__":
    main()
