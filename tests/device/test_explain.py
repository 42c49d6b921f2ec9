from __future__ import annotations

import pytest
import torch

from portachat.device import DeviceError
from portachat.device.explain import diagnose, format_diagnosis


@pytest.mark.parametrize(
    ("exc", "title", "remedy"),
    [
        (
            torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"),
            "NVIDIA",
            "PYTORCH_CUDA_ALLOC_CONF",
        ),
        (RuntimeError("HIP out of memory. Tried to allocate 1 GiB"), "AMD", "PYTORCH_HIP_ALLOC_CONF"),
        (RuntimeError("NPU out of memory. Tried to allocate 3.00 GiB"), "Ascend", "PYTORCH_NPU_ALLOC_CONF"),
        (RuntimeError("MPS backend out of memory (MPS allocated: 9 GB)"), "Apple", "HIGH_WATERMARK"),
        (torch.OutOfMemoryError("something else"), "Out of memory", "--device-batch-size"),
        (MemoryError(), "Out of memory", "tune batch-size"),
        (
            RuntimeError("[Rank 1] Watchdog caught collective operation timeout: WorkNCCL(SeqNum=5)"),
            "NCCL",
            "NCCL_DEBUG=INFO",
        ),
        (
            RuntimeError("NCCL error in: ProcessGroupNCCL.cpp:1970, unhandled system error, ncclSystemError"),
            "NCCL",
            "NCCL_SOCKET_IFNAME",
        ),
        (
            RuntimeError(
                "HCCL function error: HcclGetRootInfo, error code is 7 ... EI0006 socket build timeout"
            ),
            "HCCL",
            "HCCL_CONNECT_TIMEOUT",
        ),
        (RuntimeError("createHCCLComm: HCCL error ... EI0001"), "HCCL", "set_env.sh"),
        (RuntimeError("Found no NVIDIA driver on your system."), "driver", "PORTACHAT_DEVICE=cpu"),
        (RuntimeError("No HIP GPUs are available"), "AMD", "render"),
        (ImportError("libascendcl.so: cannot open shared object file"), "CANN", "set_env.sh"),
        (
            RuntimeError("\"addmm_impl_cpu_\" not implemented for 'npu' ... aclnnMatmul failed"),
            "Ascend",
            "PORTACHAT_DTYPE=fp16",
        ),
        (RuntimeError("\"baddbmm\" not implemented for 'BFloat16'"), "Dtype", "PORTACHAT_DTYPE=fp32"),
        (
            RuntimeError("torch._dynamo.exc.BackendCompilerFailed: backend='inductor' raised"),
            "compile",
            "PORTACHAT_COMPILE=0",
        ),
        (
            RuntimeError(
                "The server socket has failed to listen on any local network address. Address already in use"
            ),
            "connect",
            "--master_port",
        ),
        (ConnectionRefusedError("Connection refused"), "connect", "MASTER_ADDR"),
        (DeviceError("PORTACHAT_DTYPE='bf17' is not a valid dtype"), "Configuration", "doctor"),
    ],
)
def test_known_errors(exc, title, remedy):
    d = diagnose(exc)
    assert d is not None, f"no diagnosis for {exc!r}"
    assert title.lower() in d.title.lower()
    assert any(remedy in r for r in d.remedies), d.remedies
    text = format_diagnosis(d)
    assert d.title in text and "1." in text and "--debug" in text


def test_cause_chain_is_followed():
    try:
        try:
            raise RuntimeError("CUDA out of memory. Tried to allocate 20.00 MiB")
        except RuntimeError as inner:
            raise ValueError("training step failed") from inner
    except ValueError as outer:
        d = diagnose(outer)
    assert d is not None and "NVIDIA" in d.title


def test_unknown_errors_get_none():
    assert diagnose(KeyError("vocab")) is None
    assert diagnose(ValueError("bad value")) is None


def test_diagnosis_in_chinese(monkeypatch):
    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    d = diagnose(torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert d is not None and d.title == "NVIDIA GPU 显存不足"
    assert d.remedies[0] == "减小 --device-batch-size（梯度累积会保持总批大小不变）"  # the flag stays as it is
    assert "(OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB)" in d.what_happened
    text = format_diagnosis(d)
    assert text.startswith("错误：NVIDIA GPU 显存不足") and "怎么办：" in text and "--debug" in text


def test_a_command_reports_bad_input_in_chinese(monkeypatch, capsys):
    from portachat.cli import main

    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    assert main(["train", "base", "--dtype", "bf17", "--device", "cpu"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("错误：配置问题") and "bf17" in err and "运行 `portachat doctor` 做全面检查" in err
    assert err.count("--debug") == 1 and "Traceback" not in err


def test_out_of_memory_is_recognised_in_any_language(monkeypatch):
    from portachat.train.batch_size import is_out_of_memory

    monkeypatch.setenv("PORTACHAT_LANG", "zh")
    assert is_out_of_memory(RuntimeError("HIP out of memory. Tried to allocate 1 GiB"))
    assert diagnose(RuntimeError("HIP out of memory")).rule == "Out of memory on the AMD / Hygon GPU"
    assert not is_out_of_memory(RuntimeError("NCCL error: unhandled system error"))
