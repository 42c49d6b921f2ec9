"""`--nproc N` re-runs the command under torchrun with the same arguments."""

from __future__ import annotations

import argparse
import sys

from portachat.commands.launch import strip_launch_flags, torchrun_command


def test_strip_launch_flags_keeps_everything_else():
    argv = ["speedrun", "--nproc", "2", "--preset", "smoke", "--nnodes=2", "--node_rank", "1", "--run-name", "x",
            "--rdzv-endpoint", "10.0.0.1:29500"]
    assert strip_launch_flags(argv) == ["speedrun", "--preset", "smoke", "--run-name", "x"]


def test_torchrun_command_single_and_multi_node():
    one = argparse.Namespace(nproc=4, nnodes=1, node_rank=0, rdzv_endpoint=None)
    cmd = torchrun_command(one, ["train", "base", "--nproc", "4", "--depth", "2"])
    assert cmd[:3] == [sys.executable, "-m", "torch.distributed.run"]
    assert "--nproc_per_node=4" in cmd and "--standalone" in cmd
    assert cmd[-5:] == ["portachat", "train", "base", "--depth", "2"]
    two = argparse.Namespace(nproc=2, nnodes=2, node_rank=1, rdzv_endpoint="127.0.0.1:29600")
    cmd = torchrun_command(two, ["speedrun", "--nproc=2", "--nnodes", "2"])
    assert "--rdzv-backend=c10d" in cmd and "--rdzv-endpoint=127.0.0.1:29600" in cmd and "--node-rank=1" in cmd
    assert "--standalone" not in cmd and cmd[-1] == "speedrun"
