"""The command line: bad input gives a clear message and a non-zero exit, never a traceback or half a checkpoint."""

from __future__ import annotations

import errno
import json

import pytest

from portachat.cli import main

TINY = ["--depth", "1", "--max-seq-len", "32", "--device-batch-size", "2", "--vocab-size", "300",
        "--tokenizer-max-chars", "50000", "--eval-tokens", "256", "--log-every", "1", "--device", "cpu"]


def _fail(capsys, argv: list[str]) -> str:
    code = main(argv)
    err = capsys.readouterr().err
    assert code == 1, err
    assert "Traceback" not in err
    return err


def test_missing_data(capsys, tmp_path):
    err = _fail(capsys, ["train", "base", "--data", str(tmp_path / "nope.txt"), *TINY])
    assert "nope.txt" in err


def test_empty_data(capsys, tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n   \n")
    err = _fail(capsys, ["train", "base", "--data", str(empty), *TINY])
    assert "empty" in err.lower() or "no non-empty" in err.lower()


def test_corrupt_parquet(capsys, tmp_path):
    bad = tmp_path / "shard_00000.parquet"
    bad.write_bytes(b"PAR1 this is not really parquet")
    err = _fail(capsys, ["train", "base", "--data", str(tmp_path), *TINY])
    assert "shard_00000.parquet" in err


def test_depth_zero(capsys, shakespeare_path):
    err = _fail(capsys, ["train", "base", "--data", str(shakespeare_path), *TINY, "--depth", "0"])
    assert "--depth" in err


def test_total_batch_size_must_divide(capsys, shakespeare_path):
    err = _fail(capsys, ["train", "base", "--data", str(shakespeare_path), *TINY, "--total-batch-size", "100"])
    assert "multiple of" in err


def test_existing_run_is_not_overwritten_by_accident(capsys, shakespeare_path):
    args = ["train", "base", "--data", str(shakespeare_path), *TINY, "--num-iterations", "2", "--eval-every", "0"]
    assert main(args) == 0
    err = _fail(capsys, args)
    assert "--resume" in err and "--overwrite" in err
    assert main([*args, "--overwrite"]) == 0


def test_tokenizer_checkpoint_mismatch_on_resume(capsys, shakespeare_path, tmp_path):
    from portachat.tokenizer import train_tokenizer

    args = ["train", "base", "--data", str(shakespeare_path), *TINY, "--num-iterations", "2", "--eval-every", "0"]
    assert main(args) == 0
    other = train_tokenizer(["completely different text " * 50, "zebra quartz"] * 20, vocab_size=290, verbose=False)
    other.save(tmp_path / "other_tok")
    resume = [a for a in args[:-4] if a not in ("--vocab-size", "300")]
    err = _fail(capsys, [*resume, "--num-iterations", "4", "--eval-every", "0", "--resume",
                         "--tokenizer", str(tmp_path / "other_tok")])
    assert "mismatch" in err
    err = _fail(capsys, [*args, "--tokenizer", str(tmp_path / "other_tok")])
    assert "--vocab-size" in err
    err = _fail(capsys, [*args, "--resume", "--overwrite"])
    assert "not both" in err


def test_disk_full_while_saving_keeps_latest_on_a_complete_checkpoint(capsys, shakespeare_path, monkeypatch, tmp_path):
    import portachat.checkpoint as ckpt

    real = ckpt.save_model_files
    calls = {"n": 0}

    def fill_disk_on_second_save(directory, *a, **kw):
        calls["n"] += 1
        if calls["n"] == 2:
            (directory / "model.safetensors").write_bytes(b"partial")
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(directory, *a, **kw)

    monkeypatch.setattr(ckpt, "save_model_files", fill_disk_on_second_save)
    err = _fail(capsys, ["train", "base", "--data", str(shakespeare_path), *TINY, "--num-iterations", "4",
                         "--eval-every", "0", "--save-every", "1"])
    assert "disk full" in err
    stage = tmp_path / "home" / "runs" / "default" / "base"
    assert (stage / "latest").read_text().strip() == "step_000001"
    assert json.loads((stage / "step_000001" / "portachat.json").read_text())["step"] == 1
    assert not (stage / "step_000002").exists()
    assert not any(p.name.startswith(".tmp") for p in stage.iterdir())


def test_underscore_spelling_and_help(capsys, shakespeare_path):
    args = ["train", "base", "--data", str(shakespeare_path), *TINY, "--num-iterations", "1", "--eval_every", "0"]
    args[args.index("--device-batch-size")] = "--device_batch_size"
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "[portachat] done: 1 steps" in out
    with pytest.raises(SystemExit) as exc:
        main(["train", "base", "--help"])
    assert exc.value.code == 0
    assert "--device-batch-size" in capsys.readouterr().out


def test_doctor_bad_dtype(capsys, monkeypatch):
    monkeypatch.setenv("PORTACHAT_DTYPE", "bf17")
    from portachat.device import reset_device_cache

    reset_device_cache()
    code = main(["doctor", "--json"])
    out = capsys.readouterr().out
    report = json.loads(out)
    assert code == 1 and report["ok"] is False
    assert "bf17" in out and "bf16" in out
    reset_device_cache()


def test_tokenizer_train_and_eval_commands(capsys, shakespeare_path, tmp_path):
    out_dir = tmp_path / "tok"
    assert main(["tokenizer", "train", "--data", str(shakespeare_path), "--output", str(out_dir),
                 "--vocab-size", "400", "--max-chars", "200000"]) == 0
    assert (out_dir / "tokenizer.json").is_file() and (out_dir / "tokenizer_config.json").is_file()
    assert main(["tokenizer", "eval", "--tokenizer", str(out_dir), "--data", str(shakespeare_path)]) == 0
    out = capsys.readouterr().out
    assert "bytes/token" in out.lower() or "bytes per token" in out.lower()
    err = _fail(capsys, ["tokenizer", "train", "--data", str(shakespeare_path), "--output", str(tmp_path / "t2"),
                         "--vocab-size", "100"])
    assert "vocab" in err.lower()
    assert not (tmp_path / "t2").exists()


@pytest.mark.parametrize(("command", "constant"), [
    ("serve", "portachat.serve.fallbacks.OPENAI_FALLBACK"),
    ("chat", "portachat.serve.fallbacks.CHAT_FALLBACK"),
    ("generate", "portachat.serve.fallbacks.GENERATE_FALLBACK"),
])
def test_each_interface_shows_its_sampling_fallback_in_help(capsys, command, constant):
    # An unset temperature differs by interface (the API follows OpenAI, chat samples, generate is greedy):
    # each --help says which, from the named constant the interface uses.
    import importlib

    module, name = constant.rsplit(".", 1)
    fallback = getattr(importlib.import_module(module), name)
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert f"else OpenAI's default (temperature {fallback.temperature})" in text if command == "serve" else \
        f"else {fallback.temperature})" in text
