"""Two "nodes" on 127.0.0.1: two `--nproc 1 --nnodes 2` launchers meet through c10d rendezvous, each in its
own working directory and PORTACHAT_HOME, so nothing is shared but the network (the tokenizer rank 0
trains reaches the other node through the process group; rank 0 writes the whole checkpoint)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys
import time

import pytest

from tests.e2e.helpers import cli_env, step_losses

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _launch_two_nodes(tmp_path, args: list[str], first: int = 0) -> list[tuple[int, str, str]]:
    """Both launchers, `first` started first (c10d orders ranks by host name, then launcher pid: on one
    machine the node started first gets rank 0). Returns (exit code, stdout, stderr) per node."""
    procs = {}
    for node in (first, 1 - first):
        work = tmp_path / f"node{node}"
        work.mkdir(exist_ok=True)
        procs[node] = subprocess.Popen([sys.executable, "-m", "portachat", *args, "--node-rank", str(node)], cwd=work,
                                       env=cli_env(work / "home", threads=1), stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE, text=True)
        time.sleep(2.0)
    outs = []
    for node in (0, 1):
        try:
            out, err = procs[node].communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in procs.values():
                p.kill()
            raise
        outs.append((procs[node].returncode, out, err))
    for code, out, err in outs:
        assert code == 0, out[-3000:] + err[-3000:]
    return outs


def test_two_node_rendezvous_without_a_shared_filesystem(tmp_path, shakespeare_path):
    args = ["train", "base", "--data", str(shakespeare_path), "--depth", "1", "--max-seq-len", "32",
            "--device-batch-size", "2", "--vocab-size", "384", "--tokenizer-max-chars", "200000",
            "--eval-every", "0", "--eval-tokens", "512", "--log-every", "1",
            "--dtype", "fp32", "--compile", "0", "--run-name", "mn", "--nproc", "1", "--nnodes", "2"]
    outs = _launch_two_nodes(tmp_path, [*args, "--num-iterations", "3", "--rdzv-endpoint", f"127.0.0.1:{_free_port()}"])
    assert any("weights identical on all 2 ranks" in out for _, out, _ in outs)

    # Exactly one node held rank 0 and wrote the run; the other wrote nothing (not even the tokenizer).
    runs = [tmp_path / f"node{n}" / "home" / "runs" / "mn" for n in (0, 1)]
    holder = [n for n in (0, 1) if (runs[n] / "base" / "step_000003").is_dir()]
    assert len(holder) == 1, runs
    main, other = holder[0], 1 - holder[0]
    assert not (runs[other] / "tokenizer").exists() and not (runs[other] / "base").exists()
    final = runs[main] / "base" / "step_000003"
    meta = json.loads((final / "portachat.json").read_text())
    assert meta["world_size"] == 2 and "gloo" in json.dumps(meta["device"])
    assert sorted(p.name for p in (final / "trainer_state").glob("rank*")) == ["rank0.safetensors", "rank1.safetensors"]
    losses = step_losses(runs[main] / "base" / "log.jsonl")
    assert sorted(losses) == [1, 2, 3] and all(0 < v < 10 for v in losses.values())

    # Resume on both nodes: the other node's stale copy of that checkpoint (a same-named older run) is
    # replaced by rank 0's, in its own home.
    stale = runs[other] / "base" / "step_000003"
    stale.mkdir(parents=True)
    (stale / "portachat.json").write_text('{"step": 3, "stale": true}')
    _launch_two_nodes(tmp_path, [*args, "--num-iterations", "4", "--resume",
                                 "--rdzv-endpoint", f"127.0.0.1:{_free_port()}"], first=main)
    copied = runs[other] / "base" / "step_000003"
    assert (copied / "model.safetensors").read_bytes() == (final / "model.safetensors").read_bytes()
    assert (runs[main] / "base" / "step_000004").is_dir()
    assert sorted(step_losses(runs[main] / "base" / "log.jsonl")) == [1, 2, 3, 4]
