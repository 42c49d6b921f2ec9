"""A crash between commit_tmp's two renames (old aside, new in) leaves only `.old-*`: the next
commit or read of that directory puts the previous copy back instead of losing it."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

from portachat.checkpoint import load_model_dir, save_checkpoint
from portachat.model import GPT, GPTConfig
from portachat.storage import atomic
from portachat.storage.atomic import atomic_directory, commit_tmp, prepare_tmp


class Crash(BaseException):
    """The process dying: no except clause of the code under test catches it."""


def _crash_on_second_rename(monkeypatch):
    calls = []
    real = os.rename

    def rename(src, dst):
        calls.append((src, dst))
        if len(calls) == 2:
            raise Crash
        real(src, dst)

    monkeypatch.setattr(atomic.os, "rename", rename)


def _write(directory, text):
    (directory / "weights.txt").write_text(text)


def test_a_crash_between_the_renames_is_undone_by_the_next_commit(tmp_path, monkeypatch):
    final = tmp_path / "ckpt"
    with atomic_directory(final) as tmp:
        _write(tmp, "v1")
    tmp = prepare_tmp(final)
    _write(tmp, "v2")
    with monkeypatch.context() as m:
        _crash_on_second_rename(m)
        with pytest.raises(Crash):
            commit_tmp(tmp, final)
    assert not final.exists() and (tmp_path / ".old-ckpt").is_dir()  # the window the issue found
    with atomic_directory(final) as tmp:  # the next save
        assert (final / "weights.txt").read_text() == "v1"  # restored before anything else happens
        _write(tmp, "v3")
    assert (final / "weights.txt").read_text() == "v3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_a_leftover_old_copy_beside_the_new_one_is_removed(tmp_path):
    final = tmp_path / "ckpt"
    with atomic_directory(final) as tmp:
        _write(tmp, "v2")
    shutil.copytree(final, tmp_path / ".old-ckpt")  # crash after the second rename, before the cleanup
    (tmp_path / ".old-ckpt" / "weights.txt").write_text("v1")
    with atomic_directory(final) as tmp:
        _write(tmp, "v3")
    assert (final / "weights.txt").read_text() == "v3"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt"]


def test_reading_a_checkpoint_after_the_crash_finds_the_previous_one(tmp_path, small_tokenizer, monkeypatch):
    torch.manual_seed(0)
    model = GPT(GPTConfig(vocab_size=small_tokenizer.vocab_size, n_layer=1, n_embd=32, n_head=2, n_kv_head=1,
                          head_dim=16, intermediate_size=64, max_seq_len=32))
    path = save_checkpoint(tmp_path / "base", 1, model, small_tokenizer, {"step": 1})
    with monkeypatch.context() as m:
        _crash_on_second_rename(m)
        with pytest.raises(Crash):
            with atomic_directory(path) as tmp:  # overwriting the step directory in place
                _write(tmp, "half a checkpoint")
    assert not path.exists()
    loaded = load_model_dir(path)
    assert not (path.parent / f".old-{path.name}").exists()
    for (name, a), b in zip(model.state_dict().items(), loaded.model.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
