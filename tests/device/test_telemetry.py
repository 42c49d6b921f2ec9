"""Parsers of captured vendor CLI output."""

from __future__ import annotations

from portachat.device.telemetry import (
    parse_hy_smi,
    parse_npu_smi_info,
    parse_nvidia_smi,
    parse_rocm_smi_json,
    physical_index,
)

NPU_SMI_INFO = """\
+------------------------------------------------------------------------------------------------+
| npu-smi 23.0.6                   Version: 23.0.6                                               |
+---------------------------+---------------+----------------------------------------------------+
| NPU   Name                | Health        | Power(W)    Temp(C)           Hugepages-Usage(page)|
| Chip                      | Bus-Id        | AICore(%)   Memory-Usage(MB)  HBM-Usage(MB)        |
+===========================+===============+====================================================+
| 0     910B3               | OK            | 93.1        37                0    / 0             |
| 0                         | 0000:C1:00.0  | 12          0    / 0          3161 / 65536         |
+===========================+===============+====================================================+
| 1     910B3               | Warning       | 89.7        41                0    / 0             |
| 0                         | 0000:C2:00.0  | 0           0    / 0          2890 / 65536         |
+===========================+===============+====================================================+
+---------------------------+---------------+----------------------------------------------------+
| NPU     Chip              | Process id    | Process name             | Process memory(MB)      |
+===========================+===============+====================================================+
| No running processes found in NPU 0                                                            |
+===========================+===============+====================================================+
"""

HY_SMI = """\
============================ System Management Interface =============================
======================================================================================
DCU     Temp     AvgPwr     Perf     PwrCap     VRAM%      DCU%      Mode
0       49.0C    120.0W     auto     400.0W     5%         87%       Normal
1       51.0C    35.0W      auto     400.0W     0%         0%        Normal
======================================================================================
=================================== End of SMI Log ===================================
"""

NVIDIA_SMI = "87, 64, 612.35\n0, 33, [N/A]\n"

ROCM_SMI_JSON = (
    '{"card0": {"Temperature (Sensor edge) (C)": "45.0", "Current Socket Graphics Package Power (W)": "350.2",'
    ' "GPU use (%)": "97"}, "card1": {"Temperature (Sensor edge) (C)": "38.0", "GPU use (%)": "0"}}'
)


def test_npu_smi_info():
    rows = parse_npu_smi_info(NPU_SMI_INFO)
    assert len(rows) == 2
    first, second = rows
    assert (first.npu_id, first.name, first.health) == (0, "910B3", "OK")
    assert (first.power_w, first.temperature_c, first.aicore_pct) == (93.1, 37.0, 12.0)
    assert (first.hbm_used_mb, first.hbm_total_mb) == (3161, 65536)
    assert second.health == "Warning" and second.temperature_c == 41.0


def test_hy_smi():
    rows = parse_hy_smi(HY_SMI)
    assert [(r.utilization_pct, r.temperature_c, r.power_w) for r in rows] == [
        (87.0, 49.0, 120.0),
        (0.0, 51.0, 35.0),
    ]


def test_nvidia_smi():
    rows = parse_nvidia_smi(NVIDIA_SMI)
    assert (rows[0].utilization_pct, rows[0].temperature_c, rows[0].power_w) == (87.0, 64.0, 612.35)
    assert rows[1].power_w is None


def test_rocm_smi_json():
    rows = parse_rocm_smi_json(ROCM_SMI_JSON)
    assert (rows[0].utilization_pct, rows[0].temperature_c, rows[0].power_w) == (97.0, 45.0, 350.2)
    assert rows[1].power_w is None
    assert parse_rocm_smi_json("not json") == []


def test_garbage_parses_to_nothing():
    assert parse_npu_smi_info("npu-smi: command failed") == []
    assert parse_hy_smi("") == []


def test_physical_index_follows_visible_devices():
    assert physical_index(1, "4,5,6") == 5
    assert physical_index(0, None) == 0
    assert physical_index(2, "GPU-abc,GPU-def") == 2
