import errno
import json

import pytest
import torch

from portachat.checkpoint import CheckpointError, latest_checkpoint, load_model_dir, save_checkpoint
from portachat.checkpoint.trainer_state import load_optimizers
from portachat.model import GPT, GPTConfig
from portachat.storage.atomic import atomic_directory
from portachat.storage.runs import list_steps
from portachat.train.optim import OptimConfig, build_optimizers


def _model(vocab: int, tied: bool = False) -> GPT:
    cfg = GPTConfig(vocab_size=vocab, n_layer=2, n_embd=32, n_head=2, n_kv_head=1, head_dim=16,
                    intermediate_size=64, max_seq_len=32, tie_embeddings=tied)
    torch.manual_seed(0)
    return GPT(cfg)


def _train_a_bit(model, optimizers, vocab):
    x = torch.randint(0, vocab, (2, 16))
    for _ in range(2):
        model(x, x).backward()
        for o in optimizers:
            o.step()
            o.zero_grad()


@pytest.mark.parametrize("tied", [False, True])
def test_save_load_roundtrip_with_trainer_state(tmp_path, small_tokenizer, tied):
    vocab = small_tokenizer.vocab_size
    model = _model(vocab, tied)
    opts = build_optimizers(model, OptimConfig(), 32, torch.float32, fused=False)
    _train_a_bit(model, opts, vocab)
    path = save_checkpoint(tmp_path / "base", 7, model, small_tokenizer, {"stage": "base", "step": 7},
                           optimizers=opts, rng={"cpu": torch.get_rng_state()})
    assert latest_checkpoint(tmp_path / "base") == path
    meta = json.loads((path / "portachat.json").read_text())
    assert meta["step"] == 7 and meta["model_config"]["vocab_size"] == vocab

    loaded = load_model_dir(path)
    x = torch.randint(0, vocab, (2, 10))
    assert torch.equal(loaded.model(x), model(x))

    fresh = _model(vocab, tied)
    fresh.load_state_dict(loaded.model.state_dict())
    fresh_opts = build_optimizers(fresh, OptimConfig(), 32, torch.float32, fused=False)
    load_optimizers(path, fresh, fresh_opts)
    for a, b in zip(opts, fresh_opts, strict=True):
        sa, sb = a.state_dict(), b.state_dict()
        assert sa["param_groups"] == sb["param_groups"]
        for idx, st in sa["state"].items():
            for k, v in st.items():
                assert torch.equal(torch.as_tensor(v), torch.as_tensor(sb["state"][idx][k])), k
    # One more identical step on both gives identical weights: the state is really the same.
    torch.manual_seed(1)
    _train_a_bit(model, opts, vocab)
    torch.manual_seed(1)
    _train_a_bit(fresh, fresh_opts, vocab)
    for (name, a), b in zip(model.named_parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b), name


def test_failed_write_leaves_nothing_and_latest_untouched(tmp_path, small_tokenizer, monkeypatch):
    vocab = small_tokenizer.vocab_size
    model = _model(vocab)
    stage = tmp_path / "base"
    first = save_checkpoint(stage, 1, model, small_tokenizer, {"step": 1})

    import portachat.checkpoint as ckpt

    def disk_full(*args, **kwargs):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckpt, "save_model_files", disk_full)
    with pytest.raises(CheckpointError, match="disk full"):
        save_checkpoint(stage, 2, model, small_tokenizer, {"step": 2})
    assert latest_checkpoint(stage) == first
    assert [s for s, _ in list_steps(stage)] == [1]
    assert not any(p.name.startswith(".tmp") for p in stage.iterdir())


def test_atomic_directory_removes_partial_output(tmp_path):
    target = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with atomic_directory(target) as tmp:
            (tmp / "half.bin").write_bytes(b"x" * 10)
            raise RuntimeError("killed")
    assert not target.exists() and list(tmp_path.iterdir()) == []


def test_load_refuses_damaged_or_mismatched(tmp_path, small_tokenizer):
    vocab = small_tokenizer.vocab_size
    path = save_checkpoint(tmp_path / "base", 1, _model(vocab), small_tokenizer, {"step": 1})
    (path / "model.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="damaged"):
        load_model_dir(path)

    small = _model(vocab // 2)
    path2 = save_checkpoint(tmp_path / "other", 1, _model(vocab), small_tokenizer, {"step": 1})
    cfg = json.loads((path2 / "config.json").read_text())
    cfg["vocab_size"] = small.config.vocab_size
    (path2 / "config.json").write_text(json.dumps(cfg))
    with pytest.raises(CheckpointError, match="vocab mismatch"):
        load_model_dir(path2)

    with pytest.raises(CheckpointError, match="config.json is missing"):
        load_model_dir(tmp_path)


def test_keep_last_prunes_old_checkpoints(tmp_path, small_tokenizer):
    model = _model(small_tokenizer.vocab_size)
    for step in (1, 2, 3, 4):
        save_checkpoint(tmp_path / "base", step, model, small_tokenizer, {"step": step}, keep_last=2)
    assert [s for s, _ in list_steps(tmp_path / "base")] == [3, 4]


def test_resume_takes_learning_rates_from_the_new_run(tmp_path, small_tokenizer):
    vocab = small_tokenizer.vocab_size
    model = _model(vocab)
    opts = build_optimizers(model, OptimConfig(), 32, torch.float32, fused=False)
    _train_a_bit(model, opts, vocab)
    path = save_checkpoint(tmp_path / "base", 2, model, small_tokenizer, {"step": 2}, optimizers=opts)
    lower = OptimConfig(matrix_lr=0.001, embedding_lr=0.01, unembedding_lr=0.0001, scalar_lr=0.001)
    fresh_opts = build_optimizers(model, lower, 32, torch.float32, fused=False)
    wanted = [[g["initial_lr"] for g in o.param_groups] for o in fresh_opts]
    load_optimizers(path, model, fresh_opts)
    assert [[g["initial_lr"] for g in o.param_groups] for o in fresh_opts] == wanted
    assert fresh_opts[0].state  # the moments were still restored
