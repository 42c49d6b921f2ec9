"""Every download honours HF_ENDPOINT / HF_HUB_OFFLINE and can come from ModelScope: the real clients
(huggingface_hub, modelscope) talking to local servers in the hubs' own layouts (tests/data/fake_hubs.py)."""

from __future__ import annotations

import io
import json
import sys
import zipfile

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from portachat.data.chat_data import load_conversations
from portachat.data.document_source import DataError
from portachat.data.hub import download_shards
from portachat.data.sources import open_source
from portachat.eval.chinese_mc import read_chinese_mc
from portachat.eval.data_files import EvalDataError, resolve_data
from portachat.storage import hubs
from tests.data.fake_hubs import FakeHF, FakeModelScope, dead_url

pytest.importorskip("modelscope", reason="ModelScope's client: pip install 'portachat[china]'")


def parquet_bytes(texts: list[str]) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table({"text": texts}), buf)
    return buf.getvalue()


def chat_jsonl(n: int) -> bytes:
    rows = [{"messages": [{"role": "user", "content": f"hi {i}"}, {"role": "assistant", "content": f"hello {i}"}]}
            for i in range(n)]
    return "".join(json.dumps(r) + "\n" for r in rows).encode()


def cmmlu_zip() -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("dev/arts.csv", ",Question,A,B,C,D,Answer\n0,示例题____,甲,乙,丙,丁,B\n")
        z.writestr("test/arts.csv", ",Question,A,B,C,D,Answer\n0,第一题____,甲,乙,丙,丁,C\n1,第二题____,甲,乙,丙,丁,A\n")
    return buf.getvalue()


@pytest.fixture
def online(monkeypatch, tmp_path):
    monkeypatch.delenv("HF_HUB_OFFLINE", raising=False)
    monkeypatch.delenv("HF_ENDPOINT", raising=False)
    monkeypatch.delenv("MODELSCOPE_ENDPOINT", raising=False)
    monkeypatch.delenv("MODELSCOPE_DOMAIN", raising=False)
    monkeypatch.delenv(hubs.HUB_ENV, raising=False)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf_home"))  # never the user's caches or tokens
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_CACHE", str(tmp_path / "hf_home" / "hub"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    monkeypatch.setenv("MODELSCOPE_CACHE", str(tmp_path / "ms_cache"))


def test_repo_ids_name_their_hub(monkeypatch):
    monkeypatch.delenv(hubs.HUB_ENV, raising=False)
    assert hubs.parse_repo("a/b") == hubs.RepoRef(hubs.HF, "a/b")
    assert hubs.parse_repo("modelscope:a/b") == hubs.parse_repo("ms:a/b") == hubs.RepoRef(hubs.MODELSCOPE, "a/b")
    monkeypatch.setenv(hubs.HUB_ENV, "modelscope")
    assert hubs.parse_repo("a/b").hub == hubs.MODELSCOPE and hubs.parse_repo("hf:a/b").hub == hubs.HF
    monkeypatch.setenv(hubs.HUB_ENV, "gitee")
    with pytest.raises(hubs.HubError, match="PORTACHAT_HUB='gitee'.*hf or modelscope"):
        hubs.parse_repo("a/b")
    with pytest.raises(DataError, match="PORTACHAT_HUB"):
        download_shards("a/b", "/nonexistent")


def test_pretraining_shards_from_modelscope(online, monkeypatch, tmp_path):
    files = {f"data/shard_{i:05d}.parquet": parquet_bytes([f"doc {i}.{j} " * 4 for j in range(6)]) for i in range(3)}
    with FakeModelScope({("dataset", "someone/edu"): {**files, "README.md": b"# edu\n"}}) as ms:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", ms.url)
        dest = tmp_path / "shards"
        lines: list[str] = []
        paths = download_shards("modelscope:someone/edu", dest, num_shards=1, include_last=True, log=lines.append)
        assert [p.relative_to(dest).as_posix() for p in paths] == ["data/shard_00000.parquet", "data/shard_00002.parquet"]
        assert all(p.read_bytes() == files[p.relative_to(dest).as_posix()] for p in paths)
        assert open_source(dest, split="val").read_unit(0)[0].startswith("doc 2.0")
        assert any("/api/v1/datasets/someone/edu/repo/tree" in r for r in ms.requests)
        monkeypatch.setenv(hubs.HUB_ENV, "modelscope")  # a bare id on the hub PORTACHAT_HUB names
        assert len(download_shards("someone/edu", tmp_path / "all", log=lines.append)) == 3
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # offline: the shards already here
    assert download_shards("modelscope:someone/edu", dest, num_shards=1, include_last=True, log=lines.append) == paths


def test_chat_and_eval_data_follow_hf_endpoint_and_portachat_hub(online, monkeypatch, tmp_path):
    import hashlib

    ceval = {}
    for split, answers in (("dev", "ABCDA"), ("val", "CB")):
        rows = [{"id": i, "question": f"题{i}", "A": "甲", "B": "乙", "C": "丙", "D": "丁", "answer": a,
                 "explanation": ""} for i, a in enumerate(answers)]
        buf = io.BytesIO()
        pq.write_table(pa.Table.from_pylist(rows), buf)
        ceval[f"logic/{split}-00000-of-00001.parquet"] = buf.getvalue()
    hf_repos = {("dataset", "someone/chat"): {"data/train-00000.jsonl": chat_jsonl(3), "README.md": b"x"},
                ("dataset", "ceval/ceval-exam"): {**ceval, "ceval-exam.zip": b"not fetched"}}
    ms_repos = {("dataset", "someone/chat"): {"train.jsonl": chat_jsonl(2)},
                ("dataset", "modelscope/cmmlu"): {"cmmlu_v1_0_1.zip": cmmlu_zip()}}
    with FakeHF(hf_repos) as hf, FakeModelScope(ms_repos) as ms:
        monkeypatch.setenv("HF_ENDPOINT", hf.url)
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", ms.url)
        assert len(load_conversations(["hf:someone/chat:*.jsonl"])) == 3
        assert len(load_conversations(["modelscope:someone/chat:*.jsonl"])) == 2
        data = read_chinese_mc("ceval", resolve_data("ceval", None))  # the default source, from HF_ENDPOINT
        assert [q.answer for q in data.questions] == [2, 1] and len(data.shots["logic"]) == 5
        assert not any("ceval-exam.zip" in r for r in hf.requests)  # only the dev/val parquet it needs
        monkeypatch.setenv(hubs.HUB_ENV, "modelscope")
        cmmlu = read_chinese_mc("cmmlu", resolve_data("cmmlu", None))
        assert [q.answer for q in cmmlu.questions] == [2, 0] and cmmlu.shots["arts"][0].answer == 1
        named = resolve_data("gsm8k", "hf:someone/chat:data/*")  # --data can name a hub repo too
        assert hashlib.sha256((named / "data/train-00000.jsonl").read_bytes()).hexdigest() == \
            hashlib.sha256(chat_jsonl(3)).hexdigest()
        with pytest.raises(EvalDataError, match="downloading modelscope:modelscope/ai2_arc failed"):
            resolve_data("arc", None)  # not on this fake ModelScope
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    with pytest.raises(EvalDataError, match="HF_HUB_OFFLINE is set.*Pass --data"):
        resolve_data("mmlu", None)
    with pytest.raises(DataError, match="HF_HUB_OFFLINE is set.*--data FILE_OR_DIR"):
        load_conversations(["modelscope:someone/other"])


def test_missing_modelscope_client_names_the_install_command(online, monkeypatch):
    monkeypatch.setitem(sys.modules, "modelscope.hub.snapshot_download", None)  # import fails as if absent
    with pytest.raises(hubs.HubError, match=r"pip install 'portachat\[china\]'"):
        hubs.snapshot(hubs.RepoRef(hubs.MODELSCOPE, "a/b"), repo_type="model")
    monkeypatch.setenv(hubs.HUB_ENV, "modelscope")
    with pytest.raises(EvalDataError, match=r"ModelScope's client library.*portachat\[china\]"):
        resolve_data("cmmlu", None)


@pytest.fixture
def tiny_model_files(small_tokenizer, tmp_path) -> dict[str, bytes]:
    from portachat.model import GPT, GPTConfig
    from portachat.model.model_dir import save_model_files

    cfg = GPTConfig(vocab_size=small_tokenizer.vocab_size, n_layer=1, n_embd=32, n_head=2, n_kv_head=1,
                    head_dim=16, intermediate_size=64, max_seq_len=64)
    model = GPT(cfg)
    model.init_weights(seed=0)
    out = tmp_path / "saved"
    out.mkdir()
    save_model_files(out, model, small_tokenizer, {"stage": "sft", "step": 1})
    return {p.relative_to(out).as_posix(): p.read_bytes() for p in out.rglob("*") if p.is_file()}


def test_models_for_serve_and_init_come_from_either_hub(online, monkeypatch, tiny_model_files):
    import torch

    from portachat.model.load import load_for_inference
    from portachat.model.source import resolve
    from portachat.storage.atomic import CheckpointError

    extra = {"pytorch_model.bin": b"never fetched", "onnx/model.onnx": b"never fetched"}
    repos = {("model", "someone/tiny"): {**tiny_model_files, **extra}}
    with FakeHF(repos) as hf, FakeModelScope(repos) as ms:
        monkeypatch.setenv("HF_ENDPOINT", hf.url)
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", ms.url)
        from_hf = resolve("hf:someone/tiny").path
        from_ms = resolve("modelscope:someone/tiny").path
        assert from_hf != from_ms
        for path in (from_hf, from_ms):
            assert {p.name for p in path.iterdir() if p.is_file()} >= {"config.json", "model.safetensors",
                                                                        "tokenizer.json"}
            assert not (path / "pytorch_model.bin").exists()
        a, b = load_for_inference(from_hf, device="cpu", dtype="fp32"), load_for_inference(from_ms, device="cpu",
                                                                                            dtype="fp32")
        ids = torch.tensor([[1, 2, 3]])
        assert torch.equal(a.model(ids), b.model(ids))
        monkeypatch.setenv(hubs.HUB_ENV, "modelscope")
        assert resolve("someone/tiny").path == from_ms  # bare ids go to the hub PORTACHAT_HUB names
    monkeypatch.delenv(hubs.HUB_ENV)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")  # the server is gone: the cached copy still resolves
    assert resolve("hf:someone/tiny").path == from_hf
    with pytest.raises(CheckpointError, match="HF_HUB_OFFLINE is set and it is not in the cache"):
        resolve("hf:someone/other")


def test_doctor_says_which_hub_answers_and_what_to_set(online, monkeypatch, tmp_path):
    from portachat.speedrun.doctor import run_doctor

    with FakeHF({}) as hf, FakeModelScope({}) as ms:
        monkeypatch.setenv("MODELSCOPE_ENDPOINT", ms.url)
        probes = hubs.probe_hubs(timeout=2, hf_default=dead_url(), mirror=hf.url)
        assert [(p.name, p.reachable) for p in probes] == [("huggingface", False), ("modelscope", True),
                                                           ("hf-mirror", True)]
        advice = hubs.hub_advice(probes)
        assert any("export HF_ENDPOINT=https://hf-mirror.com" in a for a in advice)
        assert any("PORTACHAT_HUB=modelscope" in a for a in advice)
        monkeypatch.setenv("HF_ENDPOINT", hf.url)  # a mirror that answers: nothing to advise
        probes = hubs.probe_hubs(timeout=2)
        assert [p.name for p in probes] == ["huggingface", "modelscope"] and hubs.hub_advice(probes) == []
        out = io.StringIO()
        assert run_doctor(stream=out) == 0
        assert f"huggingface  reachable  {hf.url}" in out.getvalue()
    monkeypatch.setenv("HF_ENDPOINT", dead_url())
    monkeypatch.setenv("MODELSCOPE_ENDPOINT", dead_url())
    probes = hubs.probe_hubs(timeout=2)
    advice = hubs.hub_advice(probes)
    assert not any(p.reachable for p in probes)
    assert "is not reachable; check it, or unset it" in advice[0] and "HF_HUB_OFFLINE=1" in advice[-1]
    out = io.StringIO()
    assert run_doctor(as_json=True, stream=out) == 0  # unreachable hubs are a warning, not a failure
    report = json.loads(out.getvalue())
    assert report["hubs"]["advice"] == advice
    check = next(c for c in report["checks"] if c["name"] == "model hubs")
    assert not check["ok"] and check["severity"] == "warning" and "HF_HUB_OFFLINE=1" in check["fix"]
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    out = io.StringIO()
    run_doctor(stream=out)
    assert "HF_HUB_OFFLINE is set" in out.getvalue()


def test_train_base_downloads_its_shards_from_hf_endpoint(online, monkeypatch, tmp_path, capsys):
    from portachat.cli import main

    monkeypatch.setenv("PORTACHAT_HOME", str(tmp_path / "home"))
    text = ["To be, or not to be, that is the question. " * 8 + f"Part {i}." for i in range(40)]
    files = {f"sample/shard_{i:05d}.parquet": parquet_bytes(text[i * 10 : (i + 1) * 10]) for i in range(4)}
    with FakeHF({("dataset", "someone/web"): {**files, "README.md": b"# web\n"}}) as hf:
        monkeypatch.setenv("HF_ENDPOINT", hf.url)
        code = main(["train", "base", "--data", "hf:someone/web:sample/*.parquet", "--run-name", "hubrun",
                     "--depth", "1", "--max-seq-len", "32", "--device-batch-size", "2", "--vocab-size", "300",
                     "--tokenizer-max-chars", "50000", "--eval-tokens", "64", "--log-every", "1", "--device", "cpu",
                     "--num-iterations", "1", "--total-batch-size", "64"])
        assert code == 0, capsys.readouterr().err[-2000:]
        for name in files:  # every shard, from the local endpoint
            assert any(f"/resolve/main/{name}" in r for r in hf.requests), name
    shards = tmp_path / "home" / "base_data" / "hf__someone__web" / "sample"
    assert sorted(p.name for p in shards.glob("*.parquet")) == [f"shard_{i:05d}.parquet" for i in range(4)]
    assert (tmp_path / "home" / "runs" / "hubrun" / "base").is_dir()
    # Offline now: the shards already downloaded are used as they are.
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert main(["train", "base", "--data", "hf:someone/web:sample/*.parquet", "--run-name", "hubrun2", "--depth", "1",
                 "--max-seq-len", "32", "--device-batch-size", "2", "--vocab-size", "300", "--tokenizer-max-chars",
                 "50000", "--eval-tokens", "64", "--device", "cpu", "--num-iterations", "1",
                 "--total-batch-size", "64"]) == 0
