"""A stage's preamble (train/stage.begin_stage) and configs that stages derive instead of changing."""

from __future__ import annotations

from dataclasses import FrozenInstanceError

import pytest
import torch

from portachat.checkpoint import CheckpointError
from portachat.device import get_device
from portachat.train.optim import OptimConfig
from portachat.train.stage import begin_stage
from portachat.train.trainer import TrainConfig, TrainingError


def test_begin_stage_derives_the_stage_config_and_leaves_the_callers_alone(tmp_path):
    given = TrainConfig(run="r", runs_root=str(tmp_path), seed=7)
    start = begin_stage("sft", given, get_device("cpu"), print_fn=lambda _m: None)
    assert start.cfg.stage == "sft" and given.stage == "base"  # the caller's config is not the stage's
    assert start.cfg == TrainConfig(run="r", runs_root=str(tmp_path), seed=7, stage="sft")
    assert start.path == tmp_path / "r" / "sft" and start.runs_root == tmp_path
    assert start.resume_from is None and start.init_from is None and start.checkpoint is None
    drawn = torch.rand(3)
    torch.manual_seed(7)
    assert torch.equal(drawn, torch.rand(3))  # seeded with --seed


def test_begin_stage_refuses_what_it_cannot_start_from(tmp_path):
    cfg = TrainConfig(run="r", runs_root=str(tmp_path))
    with pytest.raises(TrainingError, match="--overwrite deletes it"):
        begin_stage("base", cfg, get_device("cpu"), resume="auto", overwrite=True)
    with pytest.raises(CheckpointError, match="no checkpoint to resume"):
        begin_stage("base", cfg, get_device("cpu"), resume="auto")
    with pytest.raises(CheckpointError, match="portachat train mid --run-name r"):
        begin_stage("sft", cfg, get_device("cpu"), from_previous=True)


def test_configs_are_frozen_and_stages_derive_them():
    cfg = TrainConfig()
    with pytest.raises(FrozenInstanceError):
        cfg.num_iterations = 3  # type: ignore[misc]
    with pytest.raises(FrozenInstanceError):
        cfg.optim.matrix_lr = 1.0  # type: ignore[misc]
    o = OptimConfig(weight_decay=0.1)
    half = o.scaled(0.5)
    assert (half.matrix_lr, half.embedding_lr, half.unembedding_lr, half.scalar_lr) == (
        o.matrix_lr / 2, o.embedding_lr / 2, o.unembedding_lr / 2, o.scalar_lr / 2)
    assert half.weight_decay == 0.1 and half.adam_betas == o.adam_betas and o.matrix_lr == OptimConfig().matrix_lr
