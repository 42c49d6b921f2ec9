from __future__ import annotations

import csv
import io
import json
import re
import zipfile

import pytest
import torch

from portachat.cli import main
from portachat.eval.chinese_mc import (
    CEVAL,
    CMMLU,
    conversation,
    evaluate_chinese_mc,
    fitted_prompt,
    read_chinese_mc,
)
from portachat.eval.data_files import EvalDataError
from portachat.eval.generation import as_chat_tokenizer
from portachat.eval.multiple_choice import letter_ids

# (question, A, B, C, D, answer) per subject; a few made-up rows in the releases' shape
CEVAL_ROWS = {
    "computer_network": [("滑动窗口的作用是____。", "流量控制", "拥塞控制", "路由控制", "差错控制", "A"),
                         ("OSI 参考模型有几层？", "5", "6", "7", "8", "C"),
                         ("IP 地址有多少位？", "16", "32", "48", "64", "B")],
    "logic": [("所有的猫都是动物，这只是猫，所以____。", "它是动物", "它是狗", "它不是动物", "无法判断", "A"),
              ("如果下雨地就湿。地没湿，所以____。", "下雨了", "没下雨", "无法判断", "地是干的也可能下雨", "B")],
}
CMMLU_ROWS = {
    "agronomy": [("在农业生产中最主要的基本生产资料是____", "农业生产工具", "土地", "劳动力", "资金", "B"),
                 ("水稻属于____作物", "旱地", "水生", "沙漠", "高山", "B"),
                 ("小麦的主要用途是____", "粮食", "燃料", "纤维", "染料", "A")],
    "world_history": [("第一次世界大战开始于____年", "1914", "1918", "1939", "1945", "A")],
}


def _ceval_csv(rows, split: str) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    header = ["id", "question", "A", "B", "C", "D"] + ([] if split == "test" else ["answer"])
    w.writerow(header + (["explanation"] if split == "dev" else []))
    for i, (q, a, b, c, d, ans) in enumerate(rows):
        tail = [] if split == "test" else [ans]
        w.writerow([i, q, a, b, c, d, *tail, *(["1. 解析"] if split == "dev" else [])])
    return out.getvalue()


def _cmmlu_csv(rows) -> str:
    out = io.StringIO()
    w = csv.writer(out)
    w.writerow(["", "Question", "A", "B", "C", "D", "Answer"])  # pandas' index column comes first
    for i, row in enumerate(rows):
        w.writerow([i, *row])
    return out.getvalue()


def ceval_files() -> dict[str, str]:
    """C-Eval's release: dev/val/test folders, <subject>_<split>.csv; dev = the val rows reversed."""
    files = {}
    for subject, rows in CEVAL_ROWS.items():
        for split, part in (("dev", rows[::-1] * 2), ("val", rows), ("test", rows)):
            files[f"{split}/{subject}_{split}.csv"] = _ceval_csv(part, split)
    return files


def cmmlu_files() -> dict[str, str]:
    files = {}
    for subject, rows in CMMLU_ROWS.items():
        files[f"dev/{subject}.csv"] = _cmmlu_csv(rows[::-1] * 5)
        files[f"test/{subject}.csv"] = _cmmlu_csv(rows)
    return files


def write_tree(root, files: dict[str, str]):
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text, encoding="utf-8")
    return root


def write_zip(path, files: dict[str, str], prefix: str = ""):
    with zipfile.ZipFile(path, "w") as z:
        for rel, text in files.items():
            z.writestr(prefix + rel, text)
    return path


def test_ceval_reads_the_release_csvs_its_zip_and_the_hub_parquet(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    data = read_chinese_mc("ceval", write_tree(tmp_path / "csv", ceval_files()))
    assert [(q.subject, q.answer) for q in data.questions] == [
        ("computer_network", 0), ("computer_network", 2), ("computer_network", 1), ("logic", 0), ("logic", 1)]
    assert data.questions[0].choices == ("流量控制", "拥塞控制", "路由控制", "差错控制")
    assert len(data.shots["computer_network"]) == 6 and data.shots["logic"][0].question.startswith("如果下雨")
    assert read_chinese_mc("ceval", write_zip(tmp_path / "ceval-exam.zip", ceval_files())).questions == data.questions
    hub = tmp_path / "hub"
    for subject, rows in CEVAL_ROWS.items():
        (hub / subject).mkdir(parents=True)
        for split, part in (("dev", rows[::-1] * 2), ("val", rows), ("test", rows)):
            table = [{"id": i, "question": q, "A": a, "B": b, "C": c, "D": d,
                      "answer": "" if split == "test" else ans, "explanation": ""}
                     for i, (q, a, b, c, d, ans) in enumerate(part)]
            pq.write_table(pa.Table.from_pylist(table), hub / subject / f"{split}-00000-of-00001.parquet")
    from_hub = read_chinese_mc("ceval", hub)
    assert from_hub.questions == data.questions and from_hub.shots == data.shots
    assert len(read_chinese_mc("ceval", hub, limit=2).questions) == 2


def test_cmmlu_reads_the_release_and_a_directory_holding_its_zip(tmp_path):
    data = read_chinese_mc("cmmlu", write_tree(tmp_path / "csv", cmmlu_files()))
    assert [(q.subject, q.answer) for q in data.questions] == [
        ("agronomy", 1), ("agronomy", 1), ("agronomy", 0), ("world_history", 0)]
    assert len(data.shots["agronomy"]) == 15
    (tmp_path / "dl").mkdir()
    write_zip(tmp_path / "dl" / "cmmlu_v1_0_1.zip", cmmlu_files())
    assert read_chinese_mc("cmmlu", tmp_path / "dl").questions == data.questions


def test_bad_or_missing_data_says_what_is_wrong(tmp_path):
    only_test = {k: v for k, v in ceval_files().items() if k.startswith("test/")}
    with pytest.raises(EvalDataError, match="test answers are not public"):
        read_chinese_mc("ceval", write_tree(tmp_path / "t", only_test))
    bad = {"test/agronomy.csv": _cmmlu_csv([("q", "a", "b", "c", "d", "E")])}
    with pytest.raises(EvalDataError, match="answer 'E' is not one of A, B, C, D"):
        read_chinese_mc("cmmlu", write_tree(tmp_path / "b", bad))
    with pytest.raises(EvalDataError, match="not a CMMLU row"):
        read_chinese_mc("cmmlu", write_tree(tmp_path / "c", {"test/x.csv": "Question,A,B\nq,a,b\n"}))
    with pytest.raises(EvalDataError, match="not a readable zip"):
        (tmp_path / "broken.zip").write_bytes(b"not a zip")
        read_chinese_mc("ceval", tmp_path / "broken.zip")


def test_prompts_are_each_benchmarks_own_chinese_few_shot_chat():
    q, *shots = [_q(row, "computer_network") for row in CEVAL_ROWS["computer_network"]]
    turns = conversation(CEVAL, q, shots)
    assert [t["role"] for t in turns] == ["user", "assistant", "user", "assistant", "user"]
    assert turns[0]["content"].startswith("以下是中国关于计算机网络考试的单项选择题，请选出其中的正确答案。\n\nOSI")
    assert turns[1]["content"] == "C" and turns[3]["content"] == "B"
    assert turns[-1]["content"] == "滑动窗口的作用是____。\nA. 流量控制\nB. 拥塞控制\nC. 路由控制\nD. 差错控制\n答案："
    (zero,) = conversation(CMMLU, _q(CMMLU_ROWS["agronomy"][0], "agronomy"), [])
    assert zero["content"].startswith("以下是关于农学的单项选择题，请直接给出正确答案的选项。\n\n题目：在农业生产中")
    assert zero["content"].endswith("D. 资金\n答案是：")
    unknown = conversation(CMMLU, _q(CMMLU_ROWS["agronomy"][0], "space_farming"), [])
    assert "关于space farming的单项选择题" in unknown[0]["content"]


def _q(row, subject):
    from portachat.eval.multiple_choice import MCQuestion

    return MCQuestion(row[0], tuple(row[1:5]), "ABCD".index(row[5]), subject)


def test_scoring_matches_an_unbatched_reference_and_drops_shots_that_do_not_fit(tool_model, small_tokenizer,
                                                                                 tmp_path):
    model, _ = tool_model
    tok = as_chat_tokenizer(small_tokenizer)
    data = read_chinese_mc("ceval", write_tree(tmp_path / "c", ceval_files()))
    max_len = model.config.max_seq_len
    result = evaluate_chinese_mc(data, model, tok, shots=5, batch_size=2)
    letters = letter_ids(tok, 4)
    right, per, used = 0, {}, []
    with torch.no_grad():
        for q in data.questions:
            shots = data.shots[q.subject][:5]
            k = max(k for k in range(6) if k == 0 or len(tok.render_prompt(conversation(CEVAL, q, shots[:k]))) <= max_len)
            used.append(k)
            ids = tok.render_prompt(conversation(CEVAL, q, shots[:k]))[-max_len:]
            ok = int(model(torch.tensor([ids]))[0, -1][letters].argmax()) == q.answer
            right += ok
            per.setdefault(q.subject, []).append(ok)
    assert result.task == "ceval" and result.n == 5 and result.chance == pytest.approx(0.25)
    assert result.value == pytest.approx(right / 5)
    assert result.details["per_task"] == pytest.approx({s: sum(v) / len(v) for s, v in per.items()})
    assert result.details["subject_mean"] == pytest.approx(sum(sum(v) / len(v) for v in per.values()) / 2)
    assert result.details["per_category"] == pytest.approx(  # computer_network is STEM, logic Humanities
        {"STEM": result.details["per_task"]["computer_network"], "Humanities": result.details["per_task"]["logic"]})
    assert result.details["mean_shots_used"] == pytest.approx(sum(used) / 5) and min(used) < 5  # 256 tokens is short
    ids, k = fitted_prompt(CEVAL, tok, data.questions[0], data.shots["computer_network"], max_len=10_000)
    assert k == 6 and len(ids) <= 10_000
    no_dev = read_chinese_mc("ceval", tmp_path / "c" / "val" / "logic_val.csv")  # one file: no dev split
    with pytest.raises(EvalDataError, match=r"no dev examples for 1 subject\(s\) \(logic\).*--shots 0"):
        evaluate_chinese_mc(no_dev, model, tok, shots=5)
    assert evaluate_chinese_mc(no_dev, model, tok, shots=0).n == 2


@pytest.fixture(scope="module")
def checkpoint(tool_model, small_tokenizer, tmp_path_factory):
    from portachat.model.model_dir import save_model_files

    model, _ = tool_model
    path = tmp_path_factory.mktemp("ckpt") / "sft"
    path.mkdir()
    save_model_files(path, model, small_tokenizer, {"stage": "sft", "step": 1})
    return path


def test_cli_runs_ceval_and_cmmlu_and_all_finds_them(checkpoint, capsys, tmp_path, monkeypatch):
    data = write_zip(tmp_path / "ceval-exam.zip", ceval_files())
    assert main(["eval", "ceval", "--model", str(checkpoint), "--data", str(data), "--shots", "1",
                 "--device", "cpu", "--json"]) == 0
    (r,) = json.loads(capsys.readouterr().out)["results"]
    assert r["task"] == "ceval" and r["n"] == 5 and r["details"]["shots"] == 1
    assert set(r["details"]["per_task"]) == {"computer_network", "logic"}
    home = tmp_path / "home"
    monkeypatch.setenv("PORTACHAT_HOME", str(home))
    write_tree(home / "eval_data" / "cmmlu", cmmlu_files())
    assert main(["eval", "all", "--model", str(checkpoint), "--limit", "2", "--max-tokens", "4",
                 "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    table = out[re.search(r"^task +metric", out, re.M).start():]
    assert re.search(r"^cmmlu +accuracy +[01]\.\d{4} +2 +0\.250$", table, re.M)
    assert "  agronomy" in table and "ceval: skipped, no data" in out
    assert main(["eval", "cmmlu", "--model", str(checkpoint), "--data", str(tmp_path / "nope")]) != 0


def test_a_random_model_scores_near_chance(small_tokenizer, tmp_path):
    """200 questions with the answers spread evenly over A-D: an untrained model's letter choice carries
    no knowledge, so its accuracy must sit near 25% (a scorer that leaked the answer would not)."""
    from tests.serve.api_testing import tiny_model

    gen = torch.Generator().manual_seed(0)
    rows = []
    for i in range(200):
        a, b = (int(x) for x in torch.randint(10, 99, (2,), generator=gen))
        options = [str(a + b + d) for d in (0, 1, 2, 3)]
        answer = "ABCD"[i % 4]
        correct = options.pop(0)
        options.insert("ABCD".index(answer), correct)
        rows.append((f"{a}加{b}等于多少？", *options, answer))
    files = {f"{split}/arithmetic_{split}.csv": _ceval_csv(rows if split == "val" else rows[:5], split)
             for split in ("dev", "val")}
    data = read_chinese_mc("ceval", write_tree(tmp_path / "c", files))
    model = tiny_model(small_tokenizer.vocab_size, seed=11)
    result = evaluate_chinese_mc(data, model, as_chat_tokenizer(small_tokenizer), shots=0, batch_size=16)
    assert result.n == 200 and result.chance == pytest.approx(0.25)
    assert 0.15 <= result.value <= 0.35, f"a random model scored {result.value:.3f}, far from chance (0.25)"
