"""Two "nodes" on 127.0.0.1: two `--nproc 1 --nnodes 2` launchers meet through c10d rendezvous, each in its
own working directory and PORTACHAT_HOME, so nothing is shared but the network (the tokenizer rank 0
trains reaches the other node through the process group; rank 0 writes the whole checkpoint)."""

from __future__ import annotations

import json
import socket
import subprocess
import sys

import pytest

from tests.e2e.helpers import cli_env, step_losses

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_two_node_rendezvous_without_a_shared_filesystem(tmp_path, shakespeare_path):
    port = _free_port()
    args = ["train", "base", "--data", str(shakespeare_path), "--depth", "1", "--max-seq-len", "32",
            "--device-batch-size", "2", "--vocab-size", "384", "--tokenizer-max-chars", "200000",
            "--num-iterations", "3", "--eval-every", "0", "--eval-tokens", "512", "--log-every", "1",
            "--dtype", "fp32", "--compile", "0", "--run-name", "mn",
            "--nproc", "1", "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}"]
    nodes = []
    for node in (0, 1):
        work = tmp_path / f"node{node}"
        work.mkdir()
        nodes.append(subprocess.Popen([sys.executable, "-m", "portachat", *args, "--node-rank", str(node)], cwd=work,
                                      env=cli_env(work / "home", threads=1), stdout=subprocess.PIPE,
                                      stderr=subprocess.PIPE, text=True))
    outs = []
    for proc in nodes:
        try:
            out, err = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            for p in nodes:
                p.kill()
            raise
        outs.append((proc.returncode, out, err))
    for code, out, err in outs:
        assert code == 0, out[-3000:] + err[-3000:]
    assert any("weights identical on all 2 ranks" in out for _, out, _ in outs)

    # Exactly one node held rank 0 and wrote the run; the other wrote nothing (not even the tokenizer).
    written = [tmp_path / f"node{n}" / "home" / "runs" / "mn" for n in (0, 1)]
    have = [w for w in written if (w / "base" / "step_000003").is_dir()]
    assert len(have) == 1, written
    other = next(w for w in written if w not in have)
    assert not (other / "tokenizer").exists() and not (other / "base" / "step_000003").exists()
    final = have[0] / "base" / "step_000003"
    meta = json.loads((final / "portachat.json").read_text())
    assert meta["world_size"] == 2 and "gloo" in json.dumps(meta["device"])
    assert sorted(p.name for p in (final / "trainer_state").glob("rank*")) == ["rank0.safetensors", "rank1.safetensors"]
    losses = step_losses(have[0] / "base" / "log.jsonl")
    assert sorted(losses) == [1, 2, 3] and all(0 < v < 10 for v in losses.values())
