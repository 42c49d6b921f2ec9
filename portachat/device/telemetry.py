"""Live utilization / temperature / power, from whatever the vendor offers; None where nothing does.

Parsers of vendor CLI text are pure functions (tested on captured output); readers call the tools.
"""

from __future__ import annotations

import json
import re
import threading
from dataclasses import dataclass

import psutil
import torch

from portachat.device.probe import run_cli


@dataclass
class Telemetry:
    utilization_pct: float | None
    temperature_c: float | None
    power_w: float | None


@dataclass
class NpuSmiEntry:
    npu_id: int
    chip: int
    name: str
    health: str
    power_w: float | None
    temperature_c: float | None
    aicore_pct: float | None
    hbm_used_mb: int | None
    hbm_total_mb: int | None


EMPTY = Telemetry(None, None, None)


def _num(text: str | None) -> float | None:
    if text is None:
        return None
    m = re.search(r"-?\d+(?:\.\d+)?", text)
    return float(m.group(0)) if m else None


def parse_nvidia_smi(text: str) -> list[Telemetry]:
    """Output of `nvidia-smi --query-gpu=utilization.gpu,temperature.gpu,power.draw --format=csv,noheader,nounits`."""
    rows = []
    for line in text.strip().splitlines():
        parts = [p.strip() for p in line.split(",")]
        if len(parts) < 3:
            continue
        rows.append(Telemetry(*(_num(p) if "N/A" not in p else None for p in parts[:3])))
    return rows


def parse_npu_smi_info(text: str) -> list[NpuSmiEntry]:
    """`npu-smi info`: each device is two table rows, (NPU Name | Health | Power Temp ...) then
    (Chip | Bus-Id | AICore% Memory-Usage HBM-Usage)."""
    rows = [
        line
        for line in text.splitlines()
        if line.startswith("|") and not re.match(r"^\|\s*(NPU|Chip)\s", line)
    ]
    entries: list[NpuSmiEntry] = []
    pending: list[str] | None = None
    for line in rows:
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) < 3:
            continue
        first = cells[0].split()
        if pending is None:
            # device row: "0     910B3" | "OK" | "93.1   37   0 / 0"
            if len(first) >= 2 and first[0].isdigit():
                pending = cells
            continue
        # chip row: "0" | "0000:C1:00.0" | "0   0 / 0   3161 / 65536"
        if not (first and first[0].isdigit()):
            pending = None
            continue
        metrics = pending[2].split()
        chip_metrics = re.findall(r"\d+(?:\.\d+)?", cells[2])
        hbm_used = hbm_total = None
        usage = re.findall(r"(\d+)\s*/\s*(\d+)", cells[2])
        if usage:
            hbm_used, hbm_total = (int(x) for x in usage[-1])
        entries.append(
            NpuSmiEntry(
                npu_id=int(pending[0].split()[0]),
                chip=int(first[0]),
                name=" ".join(pending[0].split()[1:]),
                health=pending[1],
                power_w=_num(metrics[0]) if metrics and metrics[0] != "NA" else None,
                temperature_c=_num(metrics[1]) if len(metrics) > 1 and metrics[1] != "NA" else None,
                aicore_pct=float(chip_metrics[0]) if chip_metrics else None,
                hbm_used_mb=hbm_used,
                hbm_total_mb=hbm_total,
            )
        )
        pending = None
    return entries


def parse_hy_smi(text: str) -> list[Telemetry]:
    """`hy-smi` (Hygon DCU) prints a table whose header names columns: DCU  Temp  AvgPwr ... DCU%."""
    header: list[str] | None = None
    rows: list[Telemetry] = []
    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0] in ("DCU", "GPU", "HCU") and any("Temp" in p for p in parts):
            header = parts
            continue
        if header is None or not parts[0].isdigit() or len(parts) < len(header):
            continue
        col = dict(zip(header, parts, strict=False))
        util_key = next((h for h in header if h.endswith("%") and not h.upper().startswith("VRAM")), None)
        power_key = next((h for h in header if "Pwr" in h and "Cap" not in h), None)
        temp_key = next(h for h in header if "Temp" in h)
        rows.append(
            Telemetry(
                utilization_pct=_num(col.get(util_key)) if util_key else None,
                temperature_c=_num(col.get(temp_key)),
                power_w=_num(col.get(power_key)) if power_key else None,
            )
        )
    return rows


def parse_rocm_smi_json(text: str) -> list[Telemetry]:
    """`rocm-smi --showuse --showtemp --showpower --json`: {"card0": {"GPU use (%)": "12", ...}}."""
    try:
        data = json.loads(text)
    except ValueError:
        return []
    rows = []
    for key in sorted(
        (k for k in data if k.startswith("card")), key=lambda k: int(re.sub(r"\D", "", k) or 0)
    ):
        card = data[key]
        util = next((v for k, v in card.items() if "use (%)" in k), None)
        temp = next(
            (v for k, v in card.items() if k.startswith("Temperature") and ("edge" in k or "junction" in k)),
            None,
        )
        power = next((v for k, v in card.items() if "Power (W)" in k), None)
        rows.append(Telemetry(_num(util), _num(temp), _num(power)))
    return rows


def physical_index(index: int, visible: str | None) -> int:
    """Map a logical device index to the physical one a vendor CLI numbers, via a *_VISIBLE_DEVICES list."""
    if not visible:
        return index
    ids = [v.strip() for v in visible.split(",") if v.strip()]
    if index < len(ids) and ids[index].isdigit():
        return int(ids[index])
    return index


def _pick(rows: list, index: int):
    return rows[index] if 0 <= index < len(rows) else None


def _torch_telemetry(index: int) -> Telemetry | None:
    """torch.cuda.utilization & co. use pynvml (NVIDIA) or amdsmi (ROCm) and honour visible devices."""
    cuda = torch.cuda
    try:
        util = float(cuda.utilization(index))
    except Exception:  # missing pynvml/amdsmi raises ModuleNotFoundError, a driver mismatch RuntimeError
        return None
    temp = power = None
    try:
        temp = float(cuda.temperature(index))
    except Exception:
        pass
    try:
        power = float(cuda.power_draw(index)) / 1000.0  # mW
    except Exception:
        pass
    return Telemetry(util, temp, power)


def read_telemetry(kind: str, index: int, env: dict[str, str]) -> Telemetry:
    """Telemetry for device `index` of `kind`; never raises."""
    try:
        return _read(kind, index, env)
    except Exception:
        return EMPTY


def _read(kind: str, index: int, env: dict[str, str]) -> Telemetry:
    if kind == "cpu":
        return _cpu_telemetry()
    if kind in ("cuda", "rocm"):
        got = _torch_telemetry(index)
        if got is not None:
            return got
    if kind == "cuda":
        phys = physical_index(index, env.get("CUDA_VISIBLE_DEVICES"))
        out = run_cli(
            [
                "nvidia-smi",
                f"--id={phys}",
                "--query-gpu=utilization.gpu,temperature.gpu,power.draw",
                "--format=csv,noheader,nounits",
            ],
            timeout_s=3,
        )
        return _pick(parse_nvidia_smi(out), 0) or EMPTY if out else EMPTY
    if kind == "rocm":
        phys = physical_index(index, env.get("HIP_VISIBLE_DEVICES") or env.get("ROCR_VISIBLE_DEVICES"))
        out = run_cli(["rocm-smi", "--showuse", "--showtemp", "--showpower", "--json"], timeout_s=3)
        return _pick(parse_rocm_smi_json(out), phys) or EMPTY if out else EMPTY
    if kind == "dcu":
        phys = physical_index(index, env.get("HIP_VISIBLE_DEVICES"))
        out = run_cli(["hy-smi"], timeout_s=3)
        return _pick(parse_hy_smi(out), phys) or EMPTY if out else EMPTY
    if kind == "npu":
        phys = physical_index(index, env.get("ASCEND_RT_VISIBLE_DEVICES"))
        out = run_cli(["npu-smi", "info"], timeout_s=3)
        entry = _pick(parse_npu_smi_info(out), phys) if out else None
        return Telemetry(entry.aicore_pct, entry.temperature_c, entry.power_w) if entry else EMPTY
    return EMPTY  # xpu, mps: no public telemetry API


def _cpu_telemetry() -> Telemetry:
    temp = None
    sensors = getattr(psutil, "sensors_temperatures", None)
    if sensors is not None:
        readings = sensors() or {}
        for chip in ("coretemp", "k10temp", "zenpower", "cpu_thermal", "acpitz"):
            if readings.get(chip):
                temp = float(readings[chip][0].current)
                break
    return Telemetry(
        utilization_pct=float(psutil.cpu_percent(interval=None)), temperature_c=temp, power_w=None
    )


class TelemetryMonitor:
    """Samples telemetry and memory on a background thread, so the training step never waits on a
    vendor tool (nvidia-smi / npu-smi / hy-smi take tens of milliseconds).

    `latest()` is what the progress line shows; `sink(sample)`, when given, receives every sample
    (e.g. RunLogger.log_device for the log and TensorBoard)."""

    def __init__(self, device, interval_s: float = 5.0, sink=None) -> None:
        self.device = device
        self.interval_s = interval_s
        self.sink = sink
        self._latest: dict[str, float] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> dict[str, float]:
        t = self.device.telemetry()
        mem = self.device.memory()
        values = {
            "util_pct": t.utilization_pct,
            "temp_c": t.temperature_c,
            "power_w": t.power_w,
            "mem_allocated_bytes": mem.allocated,
            "mem_reserved_bytes": mem.reserved,
            "mem_free_bytes": mem.free,
        }
        return {k: float(v) for k, v in values.items() if v is not None}

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                sample = self.sample()
            except Exception:  # monitoring must never take training down
                sample = {}
            with self._lock:
                self._latest = sample
            if self.sink is not None and sample:
                try:
                    self.sink(sample)
                except Exception:
                    pass
            self._stop.wait(self.interval_s)

    def start(self) -> TelemetryMonitor:
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="portachat-telemetry", daemon=True)
            self._thread.start()
        return self

    def latest(self) -> dict[str, float]:
        with self._lock:
            return dict(self._latest)

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, self.interval_s))
            self._thread = None

    def __enter__(self) -> TelemetryMonitor:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
