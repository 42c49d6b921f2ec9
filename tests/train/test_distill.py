"""The distill stage: a student cut from its teacher, the shared-vocabulary check, the command line,
and (slow) runs that lower the distillation loss and save models transformers and portachat load."""

from __future__ import annotations

import json

import pytest
import torch

from portachat.data.batch import Batch
from portachat.device import get_device
from portachat.engine import SamplingParams
from portachat.engine.loading import LoadOptions, SpeculativeOptions, load_served_model
from portachat.model.load import load_for_inference
from portachat.model.model_dir import save_model_files
from portachat.train.distill import DistillOptions, OnPolicyStream, run_distill
from portachat.train.distill_loss import DistillLoss
from portachat.train.lora import LoraOptions
from portachat.train.rollout import Rollout
from portachat.train.student import kept_layers, student_from_teacher
from portachat.train.trainer import TrainConfig, TrainingError
from tests.model.hf_families import VOCAB, make_hf_dir
from tests.train.test_lora import IDS, write_conversations

CPU = dict(device="cpu", dtype=torch.float32)


def cpu():
    return get_device("cpu", dtype="fp32", compile=False)


def test_kept_layers_are_evenly_spaced_from_first_to_last():
    assert kept_layers(8, 3) == [0, 4, 7]
    assert kept_layers(4, 2) == [0, 3]
    assert kept_layers(12, 4) == [0, 4, 7, 11]
    assert kept_layers(5, 1) == [0]
    with pytest.raises(TrainingError, match="--student-depth 4.*1 to 3"):
        kept_layers(4, 4)


def test_student_depth_builds_a_model_transformers_loads(tmp_path):
    import transformers

    make_hf_dir(tmp_path / "teacher", "qwen2", seed=1, num_hidden_layers=4)
    teacher = load_for_inference(tmp_path / "teacher", **CPU)
    student = student_from_teacher(teacher.model, 2)
    assert student.config.n_layer == 2 and teacher.model.config.n_layer == 4
    torch.testing.assert_close(student.model.layers[1].mlp.down_proj.weight,
                               teacher.model.model.layers[3].mlp.down_proj.weight, rtol=0, atol=0)
    (tmp_path / "student").mkdir()
    save_model_files(tmp_path / "student", student, teacher.tokenizer, {"stage": "distill"})
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(tmp_path / "student"), dtype=torch.float32).eval()
    assert hf.config.num_hidden_layers == 2 and hf.config.model_type == "qwen2"
    with torch.no_grad():
        torch.testing.assert_close(hf(IDS).logits, student.eval()(IDS), atol=1e-4, rtol=0)
        assert (student(IDS) - teacher.model(IDS)).abs().max() > 1e-3  # fewer layers: another function


def test_a_student_of_another_vocabulary_is_refused_before_any_work(tmp_path):
    make_hf_dir(tmp_path / "teacher", "llama", seed=1)
    make_hf_dir(tmp_path / "student", "llama", seed=2, vocab_size=VOCAB + 64)
    runs = tmp_path / "runs"
    opts = DistillOptions(teacher=str(tmp_path / "teacher"), student=str(tmp_path / "student"),
                          data=[str(tmp_path / "no-such-data.jsonl")], train=TrainConfig(run="v", runs_root=str(runs)))
    with pytest.raises(TrainingError) as err:
        run_distill(opts, dev=cpu(), print_fn=lambda _m: None)
    message = str(err.value)
    assert "teacher" in message and str(tmp_path / "teacher") in message and str(tmp_path / "student") in message
    assert str(VOCAB) in message and str(VOCAB + 64) in message and "--student-depth" in message
    assert not runs.exists()  # no stage directory, and the missing data file was never read


@pytest.mark.parametrize("bad,flag", [(dict(student="x", student_depth=2), "--student"),
                                      (dict(student_depth=2, lora=LoraOptions(rank=4)), "--lora-rank"),
                                      (dict(student_depth=2, on_policy=1.5), "--on-policy"),
                                      (dict(student_depth=2, loss=DistillLoss(beta=2.0)), "--beta"),
                                      (dict(student_depth=2, teacher="http://127.0.0.1:9"), "--student MODEL")])
def test_bad_options_are_refused_before_loading_anything(bad, flag):
    options = {"teacher": "/no/such/teacher", **bad}
    with pytest.raises(TrainingError, match=flag):
        run_distill(DistillOptions(**options), dev=cpu(), print_fn=lambda _m: None)


def test_command_line_maps_to_options(tmp_path):
    from portachat.cli import build_parser
    from portachat.commands.run.distill import distill_options

    args = build_parser().parse_args(["distill", "--teacher", "T", "--student-depth", "2", "--loss", "jsd",
                                      "--top-k", "8", "--on-policy", "0.25", "--temperature", "2", "--alpha", "0.5",
                                      "--num-iterations", "3", "--lr", "1e-4", "--data", "a.jsonl"])
    opts = distill_options(args, cpu())
    assert (opts.teacher, opts.student, opts.student_depth, opts.on_policy, opts.lr) == ("T", None, 2, 0.25, 1e-4)
    assert opts.loss == DistillLoss(beta=0.5, temperature=2.0, alpha=0.5, top_k=8)
    assert opts.num_iterations == 3 and opts.data == ["a.jsonl"]
    args = build_parser().parse_args(["distill", "--teacher", "T", "--student", "S", "--loss", "reverse-kl",
                                      "--lora-rank", "4", "--merge"])
    opts = distill_options(args, cpu())
    assert opts.loss.beta == 1.0 and opts.loss.top_k is None and opts.lora.rank == 4 and opts.merge
    with pytest.raises(SystemExit):
        build_parser().parse_args(["distill", "--teacher", "T", "--student-depth", "2", "--on-policy", "2"])


def _log(stage):
    return [json.loads(line) for line in (stage / "log.jsonl").read_text().splitlines()]


@pytest.mark.slow
def test_a_depth_two_student_distilled_on_and_off_policy_gets_closer_to_its_teacher(tmp_path):
    import transformers

    make_hf_dir(tmp_path / "teacher", "qwen2", seed=2, num_hidden_layers=4)
    data = write_conversations(tmp_path / "chat.jsonl")
    opts = DistillOptions(
        teacher=str(tmp_path / "teacher"), student_depth=2, data=[str(data)], num_iterations=8, max_seq_len=48,
        lr=3e-3, loss=DistillLoss(temperature=2.0, alpha=0.1, top_k=8), on_policy=0.5, max_new_tokens=8,
        activation_checkpointing=False,
        train=TrainConfig(run="d", runs_root=str(tmp_path / "runs"), device_batch_size=4, eval_every=8, log_every=1,
                          warmdown_ratio=0.0))
    result = run_distill(opts, dev=cpu(), print_fn=lambda _m: None)
    records = _log(result.final_checkpoint.parent)
    kd = {r["step"]: r["eval/val_kd"] for r in records if "eval/val_kd" in r}
    assert kd[8] < 0.85 * kd[0], kd
    meta = json.loads((result.final_checkpoint / "portachat.json").read_text())
    assert meta["distill"]["top_k"] == 8 and meta["student"]["depth"] == 2
    hf = transformers.AutoModelForCausalLM.from_pretrained(str(result.final_checkpoint), dtype=torch.float32).eval()
    ours = load_for_inference(result.final_checkpoint, **CPU)
    assert hf.config.num_hidden_layers == 2 == ours.model.config.n_layer
    with torch.no_grad():
        torch.testing.assert_close(hf(IDS).logits, ours.model(IDS), atol=1e-4, rtol=0)
    # the distilled student drafts for its teacher (--speculative-model): greedy output is plain decoding's
    params = SamplingParams(max_tokens=24, temperature=0.0, ignore_eos=True)
    prompts = [[1, 5, 9, 40, 77, 120], [1, 300, 64, 12]]

    def served(speculative):
        return load_served_model(LoadOptions(model=str(tmp_path / "teacher"), device="cpu", dtype="fp32", compile=False,
                                             max_num_seqs=2, speculative=speculative)).engine

    plain = served(None).generate(prompts, params)
    engine = served(SpeculativeOptions(model=str(result.final_checkpoint), num_speculative_tokens=3))
    drafted = engine.generate(prompts, params)
    assert [d.token_ids for d in drafted] == [p.token_ids for p in plain]
    assert engine.stats()["spec_decode_num_drafts"] > 0


@pytest.mark.slow
def test_a_lora_student_distills_and_merges_into_a_plain_model(tmp_path):
    make_hf_dir(tmp_path / "teacher", "llama", seed=3, num_hidden_layers=3)
    make_hf_dir(tmp_path / "student", "llama", seed=4, num_hidden_layers=1)
    data = write_conversations(tmp_path / "chat.jsonl")
    opts = DistillOptions(
        teacher=str(tmp_path / "teacher"), student=str(tmp_path / "student"), data=[str(data)], num_iterations=6,
        max_seq_len=48, lr=1e-2, loss=DistillLoss(beta=0.5), lora=LoraOptions(rank=4, alpha=8.0), merge=True,
        activation_checkpointing=False,
        train=TrainConfig(run="l", runs_root=str(tmp_path / "runs"), device_batch_size=4, eval_every=6, log_every=1,
                          warmdown_ratio=0.0))
    result = run_distill(opts, dev=cpu(), print_fn=lambda _m: None)
    stage = result.final_checkpoint.parent
    kd = {r["step"]: r["eval/val_kd"] for r in _log(stage) if "eval/val_kd" in r}
    assert kd[6] < kd[0], kd
    assert (result.final_checkpoint / "adapter_config.json").exists()
    merged = load_for_inference(stage / "merged", **CPU)
    before = load_for_inference(tmp_path / "student", **CPU)
    with torch.no_grad():
        assert (merged.model(IDS) - before.model(IDS)).abs().max() > 1e-3


class FixedLoader:
    """The data's batches: row i of batch n is [n, i, ...], all supervised."""

    def __init__(self) -> None:
        self.n = 0

    def next_batch(self) -> Batch:
        self.n += 1
        ids = torch.arange(12).repeat(2, 1) + self.n
        return Batch(ids[:, :-1], ids[:, 1:])

    def state_dict(self) -> dict:
        return {"n": self.n}

    def load_state_dict(self, state: dict) -> None:
        self.n = state["n"]


def test_on_policy_stream_mixes_own_samples_and_resumes_exactly():
    from tests.engine.engine_testing import tiny_model

    student = tiny_model(64, seed=0)
    opts = DistillOptions(teacher="t", student_depth=1, on_policy=0.5, max_new_tokens=5)
    rollout = Rollout(student, None, cpu(), max_num_seqs=2, max_model_len=17)

    def stream() -> OnPolicyStream:
        return OnPolicyStream(FixedLoader(), [[1, 2, 3], [4, 5, 6, 7]], rollout, opts, pad=0, batch_size=2,
                              seq_len=16, bucket=lambda n, _m: n, stream=0, num_streams=1, seed=3)

    whole = stream()
    straight = [whole.next_batch() for _ in range(8)]
    own = [b for b in straight if b.weights is not None]
    assert 0 < len(own) < 8  # both kinds at λ = 0.5
    for b in own:  # prompt tokens unsupervised, sampled ones supervised with CE weight 0
        assert (b.targets[0, :2] == -1).all() and (b.targets[0, 2] >= 0) and not b.weights.any()
    first = stream()
    for _ in range(4):
        first.next_batch()
    resumed = stream()
    resumed.load_state_dict(first.state_dict())
    for want in straight[4:]:
        got = resumed.next_batch()
        assert torch.equal(got.inputs, want.inputs) and torch.equal(got.targets, want.targets)
        assert (got.weights is None) == (want.weights is None)
