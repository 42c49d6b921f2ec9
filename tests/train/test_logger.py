import json
import time

from portachat.train.logger import RunLogger, format_progress


def test_progress_line_shows_what_matters():
    r = {"loss": 2.5, "lr_mult": 1.0, "tok_per_s": 12345.0, "mfu": 0.412, "mem_bytes": 3 * 2**30, "dt_s": 0.25,
         "util_pct": 97.0, "temp_c": 61.0, "power_w": None}
    line = format_progress(10, 100, r, eta_s=3725)
    for part in ("step 010/100", "loss 2.5000", "12,345 tok/s", "MFU 41.2%", "mem 3.00 GiB", "util 97% 61C",
                 "250 ms/step", "ETA 1h02m"):
        assert part in line, (part, line)
    assert "W |" not in line  # no power reading, no power shown
    r.update(mfu=None, mem_bytes=None, util_pct=None, temp_c=None)
    assert "MFU n/a (run portachat doctor --calibrate) | mem n/a | 250" in format_progress(10, 100, r, eta_s=5)
    r.update(mfu=1.7)  # a peak measured too low: never shown as 170%
    assert "MFU n/a (peak too low: portachat doctor --calibrate)" in format_progress(10, 100, r, eta_s=5)
    r.update(mfu=float("nan"))
    assert "MFU n/a" in format_progress(10, 100, r, eta_s=5)
    assert "reward" not in format_progress(10, 100, r, eta_s=5)
    r.update(reward=0.4375, response_length=12.5)  # an RL step: the reward beside the loss
    assert "loss 2.5000 | reward 0.438 | response_length 12.500 |" in format_progress(10, 100, r, eta_s=5)


def test_logger_writes_jsonl_and_tensorboard(tmp_path):
    log = RunLogger(tmp_path)
    log.log(1, {"loss": 3.0, "mfu": None})
    log.log(2, {"val/bpb": 1.5})
    log.close()
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert [x["step"] for x in lines] == [1, 2] and lines[0]["loss"] == 3.0 and lines[1]["val/bpb"] == 1.5
    assert any((tmp_path / "tensorboard").iterdir())
    RunLogger(tmp_path / "off", enabled=False).log(1, {"loss": 1.0})
    assert not (tmp_path / "off").exists()


def test_monitor_samples_in_the_background_into_the_log(tmp_path):
    from portachat.device import get_device
    from portachat.device.telemetry import TelemetryMonitor

    log = RunLogger(tmp_path)
    with TelemetryMonitor(get_device("cpu"), interval_s=0.05, sink=lambda s: log.log_device(7, s)) as monitor:
        deadline = time.time() + 10
        while not monitor.latest() and time.time() < deadline:
            time.sleep(0.02)
    log.close()
    assert monitor.latest()["mem_allocated_bytes"] > 0 and "util_pct" in monitor.latest()
    lines = [json.loads(x) for x in (tmp_path / "log.jsonl").read_text().splitlines()]
    assert lines and all(x["step"] == 7 for x in lines) and "device/mem_allocated_bytes" in lines[0]
