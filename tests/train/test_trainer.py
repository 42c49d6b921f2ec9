"""The shared training loop, in process, on tiny models and data made here."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch

from portachat.device import dist_env, get_device
from portachat.device.flops import attention_flops_per_token
from portachat.model import GPT, GPTConfig
from portachat.train.hot_path import causal_flops_per_token
from portachat.train.trainer import Stage, TrainConfig, TrainingError, train


class RepeatingStream:
    """A deterministic stream of batches of a short repeating pattern (easy to learn)."""

    def __init__(self, vocab: int, batch: int, seq: int, offset: int) -> None:
        self.vocab, self.batch, self.seq, self.pos = vocab, batch, seq, offset

    def next_batch(self):
        base = torch.arange(self.seq + 1) + self.pos
        rows = torch.stack([(base + r) % 7 + 10 for r in range(self.batch)])
        self.pos += 1
        return rows[:, :-1], rows[:, 1:]

    def state_dict(self) -> dict:
        return {"pos": self.pos}

    def load_state_dict(self, state: dict) -> None:
        self.pos = state["pos"]


def _setup(small_tokenizer, steps: int, **overrides):
    vocab = small_tokenizer.vocab_size
    cfg = GPTConfig(vocab_size=vocab + (-vocab % 64), n_layer=1, n_embd=32, n_head=2, n_kv_head=2, head_dim=16,
                    intermediate_size=64, max_seq_len=16)
    torch.manual_seed(0)
    model = GPT(cfg)
    data = Stage(
        make_stream=lambda s, n: RepeatingStream(vocab, 4, 16, s * 1000),
        val_batches=lambda rank, world: iter([RepeatingStream(vocab, 4, 16, 99).next_batch()]),
        sample_prompts=["the"],
    )
    settings = dict(eval_every=steps, log_every=1, sample_tokens=4) | overrides
    tc = TrainConfig(device_batch_size=4, max_seq_len=16, num_iterations=steps, **settings)
    return model, data, tc


def test_loss_goes_down_and_checkpoint_is_written(small_tokenizer, tmp_path):
    model, data, tc = _setup(small_tokenizer, steps=30)
    lines: list[str] = []
    result = train(model, small_tokenizer, data, tc, get_device("cpu"), dist_env(), tmp_path / "base",
                   print_fn=lines.append)
    log = [json.loads(x) for x in (tmp_path / "base" / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert len(losses) == 30 and losses[-1] < 0.2 * losses[0]
    assert result.final_checkpoint == tmp_path / "base" / "step_000030"
    assert any("MFU" in x and "ETA" in x for x in lines)
    assert result.val_bpb is not None and result.samples and result.samples[0].startswith("the")


def test_grad_accumulation_reads_one_stream_per_micro_step(small_tokenizer, tmp_path):
    """Two micro-steps per optimizer step read two separate data streams, both saved for resume."""
    model, data, tc = _setup(small_tokenizer, steps=3, total_batch_size=2 * 4 * 16)
    train(model, small_tokenizer, data, tc, get_device("cpu"), dist_env(), tmp_path / "b", print_fn=lambda _: None)
    meta = json.loads((tmp_path / "b" / "step_000003" / "portachat.json").read_text())
    assert set(meta["data_position"]["streams"]) == {"0", "1"}  # two streams, one per micro-step
    assert meta["data_position"]["num_streams"] == 2


@pytest.mark.parametrize("dtype", ["fp32", "fp16"])
def test_nan_steps_are_skipped_then_abort_with_diagnosis(small_tokenizer, tmp_path, dtype):
    from portachat.device import reset_device_cache

    model, data, tc = _setup(small_tokenizer, steps=20, max_bad_steps=3)
    dev = get_device("cpu", dtype=dtype)
    real_forward = model.forward
    calls = {"n": 0}

    def flaky_forward(*args, **kwargs):
        out = real_forward(*args, **kwargs)
        if not model.training:  # validation and samples
            return out
        calls["n"] += 1
        # one bad step early (skipped, training goes on), then NaN for good from call 10
        return out * float("nan") if calls["n"] == 3 or calls["n"] >= 10 else out

    model.forward = flaky_forward
    lines: list[str] = []
    try:
        with pytest.raises(TrainingError, match="diverged: 3 steps in a row"):
            train(model, small_tokenizer, data, tc, dev, dist_env(), tmp_path / "n", print_fn=lines.append)
    finally:
        reset_device_cache()
    skipped = [x for x in lines if "update skipped" in x]
    assert len(skipped) == 4  # step 2 once, then three in a row
    assert all(torch.isfinite(p).all() for p in model.parameters())  # NaN never reached the weights


def test_batch_size_mismatch_is_explained():
    cfg = TrainConfig(device_batch_size=4, max_seq_len=16, total_batch_size=100)
    with pytest.raises(TrainingError, match="multiple of 64"):
        cfg.grad_accum_steps(1)


@pytest.mark.parametrize("dtype", ["fp16", "bf16"])
def test_mixed_precision_paths_train(small_tokenizer, tmp_path, dtype):
    """fp16 goes through GradScaler (unscale, clip, step, update) as on Ascend 910A / DCU gfx906;
    bf16 through plain autocast. Both must still learn, and the scaler state must be checkpointed."""
    from portachat.device import reset_device_cache

    model, data, tc = _setup(small_tokenizer, steps=25)
    dev = get_device("cpu", dtype=dtype)
    try:
        train(model, small_tokenizer, data, tc, dev, dist_env(), tmp_path / dtype, print_fn=lambda _: None)
    finally:
        reset_device_cache()
    log = [json.loads(x) for x in (tmp_path / dtype / "log.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in log if "loss" in r]
    assert losses[-1] < 0.5 * losses[0]
    saved = json.loads((tmp_path / dtype / "step_000025" / "trainer_state" / "optimizer.json").read_text())
    assert (saved["grad_scaler"] is not None) == (dtype == "fp16")


def test_resume_past_the_horizon_is_refused(small_tokenizer, tmp_path):
    model, data, tc = _setup(small_tokenizer, steps=6)
    dev = get_device("cpu")
    result = train(model, small_tokenizer, data, tc, dev, dist_env(), tmp_path / "h", print_fn=lambda _: None)
    model2, data2, tc2 = _setup(small_tokenizer, steps=4)
    with pytest.raises(TrainingError, match="past this run's horizon"):
        train(model2, small_tokenizer, data2, tc2, dev, dist_env(), tmp_path / "h",
              resume_from=result.final_checkpoint, print_fn=lambda _: None)


def test_samples_longer_than_the_context_do_not_break_training(small_tokenizer, tmp_path):
    """Generation past max_seq_len grows the rotary tables in inference mode; training must go on."""
    model, data, tc = _setup(small_tokenizer, steps=4, eval_every=2, sample_tokens=40)
    result = train(model, small_tokenizer, data, tc, get_device("cpu"), dist_env(), tmp_path / "s",
                   print_fn=lambda _: None)
    assert result.steps == 4 and result.samples


def test_checkpoint_carries_the_metrics_of_its_own_step(small_tokenizer, tmp_path):
    model, data, tc = _setup(small_tokenizer, steps=4, eval_every=2, save_every=2, keep_last=0)
    train(model, small_tokenizer, data, tc, get_device("cpu"), dist_env(), tmp_path / "m", print_fn=lambda _: None)
    log = [json.loads(x) for x in (tmp_path / "m" / "log.jsonl").read_text().splitlines()]
    for step in (2, 4):
        measured = [r["val/bpb"] for r in log if r["step"] == step and "val/bpb" in r]
        meta = json.loads((tmp_path / "m" / f"step_{step:06d}" / "portachat.json").read_text())
        assert measured and meta["metrics"]["val_bpb"] == measured[-1], step


class FailingStream(RepeatingStream):
    def next_batch(self):
        if self.pos >= 2:
            raise RuntimeError("disk gone")
        return super().next_batch()


def test_logger_is_closed_when_training_fails(small_tokenizer, tmp_path):
    from portachat.train.trainer import Trainer

    model, data, tc = _setup(small_tokenizer, steps=5, eval_every=0)
    data.make_stream = lambda s, n: FailingStream(small_tokenizer.vocab_size, 4, 16, 0)
    trainer = Trainer(model, small_tokenizer, data, tc, get_device("cpu"), dist_env(), tmp_path / "f",
                      print_fn=lambda _: None)
    trainer.setup()
    with pytest.raises(RuntimeError, match="disk gone"):
        trainer.fit()
    assert trainer.logger._jsonl.closed
    assert len([x for x in (tmp_path / "f" / "log.jsonl").read_text().splitlines() if '"loss"' in x]) == 2


def test_resume_keeps_this_devices_optimizer_implementation(small_tokenizer, tmp_path):
    """A checkpoint saved where fused AdamW ran (CUDA) resumes on a CPU with the CPU's choice."""
    model, data, tc = _setup(small_tokenizer, steps=2, eval_every=0)
    dev = get_device("cpu")
    result = train(model, small_tokenizer, data, tc, dev, dist_env(), tmp_path / "r", print_fn=lambda _: None)
    state = result.final_checkpoint / "trainer_state" / "optimizer.json"
    saved = json.loads(state.read_text())
    for group in saved["optimizers"][0]["param_groups"]:
        group["fused"], group["foreach"] = True, None
    state.write_text(json.dumps(saved))
    from portachat.train.trainer import Trainer

    model2, data2, tc2 = _setup(small_tokenizer, steps=3, eval_every=0)
    trainer = Trainer(model2, small_tokenizer, data2, tc2, dev, dist_env(), tmp_path / "r", print_fn=lambda _: None)
    trainer.setup(resume_from=result.final_checkpoint)
    adamw = trainer.optimizers[0]
    assert all(not g.get("fused") for g in adamw.param_groups)
    assert all(g.get("foreach") == (not dev.fused_optimizer) for g in adamw.param_groups)
    trainer.fit()  # and it trains on
    assert trainer.step_count == 3


def test_mfu_divides_by_the_peak_of_the_dtype_that_runs(small_tokenizer, tmp_path):
    """On a CPU with AVX512-BF16 (a simulated 2-core Zen 4, running on this machine's CPU) bf16 training is
    divided by the bf16 peak, twice the fp32 one: its MFU is half of what the fp32 peak gave."""
    from portachat.device import Device
    from tests.device.device_sim import zen4

    dev = Device(zen4(cores=2, max_mhz=2600.0))
    assert dev.dtype == torch.bfloat16
    model, data, tc = _setup(small_tokenizer, steps=2)
    train(model, small_tokenizer, data, tc, dev, dist_env(), tmp_path / "z", print_fn=lambda _: None)
    records = [r for r in map(json.loads, (tmp_path / "z" / "log.jsonl").read_text().splitlines()) if "mfu" in r]
    cores = min(2, torch.get_num_threads())  # the peak counts the cores torch computes on
    fp32_peak, bf16_peak = cores * 32 * 2.6e9, cores * 64 * 2.6e9
    flops_per_token = causal_flops_per_token(model, 16)  # attention counted as the causal kernel does it
    assert len(records) == 2
    for r in records:
        assert r["mfu"] == pytest.approx(flops_per_token * r["tok_per_s"] / bf16_peak)
        assert r["mfu"] == pytest.approx(0.5 * flops_per_token * r["tok_per_s"] / fp32_peak)
    meta = json.loads((tmp_path / "z" / "step_000002" / "portachat.json").read_text())
    assert meta["peak_flops"]["dtype"] == "bf16" and "AVX512-BF16" in meta["peak_flops"]["source"]


class HalfPaddedStream:
    """Rows of 16 positions holding 10 and 6 real tokens: half of every batch is padding."""

    def next_batch(self):
        from portachat.data.batch import Batch

        inputs = torch.full((2, 16), 3, dtype=torch.long)
        inputs[0, :10] = torch.arange(10) % 7 + 10
        inputs[1, :6] = torch.arange(6) % 7 + 10
        targets = torch.full((2, 16), -1, dtype=torch.long)
        targets[0, :9], targets[1, :5] = inputs[0, 1:10], inputs[1, 1:6]
        return Batch(inputs, targets, lengths=(10, 6))

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


def test_throughput_and_mfu_count_real_tokens_and_the_padding_share_is_shown(small_tokenizer, tmp_path):
    model, data, tc = _setup(small_tokenizer, steps=2, eval_every=0)
    data.make_stream = lambda s, n: HalfPaddedStream()
    data.val_batches, data.sample_prompts = None, []
    tc = replace(tc, device_batch_size=2)
    lines: list[str] = []
    dev = get_device("cpu")
    train(model, small_tokenizer, data, tc, dev, dist_env(), tmp_path / "p", print_fn=lines.append)
    records = [r for r in map(json.loads, (tmp_path / "p" / "log.jsonl").read_text().splitlines()) if "loss" in r]
    per_real, per_supervised = model.training_flop_rates()
    c = model.config
    per_pair = attention_flops_per_token(c.n_layer, c.n_head, c.head_dim, 1)  # causal: as the kernel works
    peak = dev.peak_flops(dev.dtype).value
    for r in records:
        assert r["real_tokens"] == 16 and r["supervised_tokens"] == 14 and r["padding"] == pytest.approx(0.5)
        assert r["tok_per_s"] == pytest.approx(16 / r["dt_s"])
        work = per_real * 16 + per_supervised * 14 + per_pair * (10**2 + 6**2)  # attention by each row's own length
        assert r["mfu"] == pytest.approx(work / r["dt_s"] / peak)
    assert any("(pad 50%)" in line and "tok/s" in line for line in lines)


def test_frozen_weights_and_unsupervised_positions_are_no_model_flops():
    cfg = GPTConfig(vocab_size=128, n_layer=1, n_embd=32, n_head=2, n_kv_head=2, head_dim=16, intermediate_size=64,
                    max_seq_len=16)
    model = GPT(cfg)
    per_real, per_supervised = model.training_flop_rates()
    assert per_real + per_supervised == pytest.approx(model.flops_per_token(0))  # every weight trains, every position
    model.requires_grad_(False)
    frozen_real, frozen_supervised = model.training_flop_rates()
    assert frozen_real == pytest.approx(per_real * 2 / 3) and frozen_supervised == pytest.approx(per_supervised * 2 / 3)
