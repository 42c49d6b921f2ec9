"""docs/TROUBLESHOOTING.md and docs/TROUBLESHOOTING.zh-CN.md, generated from the diagnosis table.

The table in portachat.device.errors is what the CLI shows when a known error happens; the guide is
the same knowledge to read ahead. Regenerate after editing the table (a test fails when they differ):

    python -m portachat.tools.troubleshooting --write
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from portachat.device.errors import RULES, Rule

DOCS = Path(__file__).resolve().parents[2] / "docs"
FILES = {"en": "TROUBLESHOOTING.md", "zh": "TROUBLESHOOTING.zh-CN.md"}

INTRO = {
    "en": (
        "# Troubleshooting\n\n"
        "*Generated from the diagnosis table (`portachat/device/errors.py`) by "
        "`python -m portachat.tools.troubleshooting --write`; edit the table, not this file.* "
        "[中文](TROUBLESHOOTING.zh-CN.md)\n\n"
        "When a command fails with a known error, portachat prints the matching entry below instead of a "
        "traceback (`--debug` shows the traceback). Start with `portachat doctor`: it checks the environment "
        "and says what it would choose for your device and why. Before a long run, `portachat estimate memory` "
        "and `portachat tune batch-size` tell you what fits, and `portachat profile` shows where a step's time goes.\n"
    ),
    "zh": (
        "# 故障排查\n\n"
        "*本文由诊断表（`portachat/device/errors.py`）经 `python -m portachat.tools.troubleshooting --write` "
        "自动生成；请修改诊断表，而不是本文件。* [English](TROUBLESHOOTING.md)\n\n"
        "命令遇到已知错误时，portachat 会打印下面对应的条目，而不是堆栈信息（加 `--debug` 可看完整堆栈）。"
        "先运行 `portachat doctor`：它检查环境，并说明会为你的设备选择什么、为什么。长时间训练之前，"
        "`portachat estimate memory` 和 `portachat tune batch-size` 告诉你什么配置放得下，"
        "`portachat profile` 显示一步训练的时间花在哪里。\n"
    ),
}
LABELS = {
    "en": {"what": "What happened", "fix": "What to do", "match": "Recognised by"},
    "zh": {"what": "发生了什么", "fix": "怎么办", "match": "识别依据"},
}

# Chinese for every title, explanation and remedy of the table (commands, flags, variables unchanged).
ZH: dict[str, str] = {
    "Configuration problem": "配置问题",
    "portachat rejected the device configuration before running anything.": "portachat 在运行任何内容之前拒绝了设备配置。",
    "read the message above: it names the setting and its valid values": "阅读上面的信息：它指出了出问题的设置及其有效取值",
    "run `portachat doctor` for a full check": "运行 `portachat doctor` 做全面检查",
    "Out of memory on the Ascend NPU": "昇腾 NPU 显存不足",
    "The NPU ran out of HBM while allocating a tensor.": "NPU 在分配张量时 HBM 不足。",
    "lower --device-batch-size (gradient accumulation keeps the total batch size)": "减小 --device-batch-size（梯度累积会保持总批大小不变）",
    "run `portachat tune batch-size` to find the largest batch that fits": "运行 `portachat tune batch-size` 找到放得下的最大批大小",
    "export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True (less fragmentation)": "export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True（减少显存碎片）",
    "shorten --max-seq-len, or use a smaller --depth": "缩短 --max-seq-len，或使用更小的 --depth",
    "see what fits before running: `portachat estimate memory --depth N --device-batch-size B --max-seq-len T`":
        "运行前先估算能否放下：`portachat estimate memory --depth N --device-batch-size B --max-seq-len T`",
    "Out of memory on the AMD / Hygon GPU": "AMD / 海光 GPU 显存不足",
    "The HIP device ran out of memory while allocating a tensor.": "HIP 设备在分配张量时显存不足。",
    "export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True (less fragmentation)": "export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True（减少显存碎片）",
    "Out of memory on the NVIDIA GPU": "NVIDIA GPU 显存不足",
    "The GPU ran out of memory while allocating a tensor.": "GPU 在分配张量时显存不足。",
    "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less fragmentation)": "export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True（减少显存碎片）",
    "check `nvidia-smi` for other processes holding GPU memory": "用 `nvidia-smi` 检查是否有其他进程占用显存",
    "Out of memory on the Apple GPU": "Apple GPU 内存不足",
    "The MPS backend hit its memory limit.": "MPS 后端达到了内存上限。",
    "export PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to lift the limit (may swap)": "export PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 取消上限（可能使用交换内存）",
    "Out of memory on the Intel GPU": "Intel GPU 显存不足",
    "The XPU ran out of memory while allocating a tensor.": "XPU 在分配张量时显存不足。",
    "Out of memory": "内存不足",
    "A memory allocation failed.": "一次内存分配失败。",
    "on CPU, close other programs or use a smaller model": "在 CPU 上：关闭其他程序，或使用更小的模型",
    "NCCL collective timed out": "NCCL 集合通信超时",
    "A collective operation did not finish in time: usually one rank crashed, hangs, or runs different steps.":
        "集合通信没有按时完成：通常是某个 rank 崩溃、卡住，或各 rank 执行的步骤不一致。",
    "look at the other ranks' logs first: the real error is usually there": "先看其他 rank 的日志：真正的错误通常在那里",
    "export NCCL_DEBUG=INFO and rerun to see where ranks disagree": "export NCCL_DEBUG=INFO 后重新运行，查看各 rank 在哪里不一致",
    "make sure every rank runs the same number of steps and batches": "确保每个 rank 运行相同数量的步骤和批次",
    "raise the timeout (init_distributed(timeout_s=...)) if a step legitimately takes long, e.g. evaluation":
        "如果某一步本来就很慢（例如评估），调大超时（init_distributed(timeout_s=...)）",
    "NCCL / RCCL communication failed": "NCCL / RCCL 通信失败",
    "The NVIDIA (or ROCm RCCL) collective library failed to set up or run a collective.":
        "NVIDIA（或 ROCm RCCL）集合通信库未能建立或执行一次集合通信。",
    "export NCCL_DEBUG=INFO and rerun: it prints the failing transport": "export NCCL_DEBUG=INFO 后重新运行：它会打印出失败的传输通道",
    "set NCCL_SOCKET_IFNAME to the network interface the nodes share (e.g. eth0)": "把 NCCL_SOCKET_IFNAME 设为各节点共用的网卡（例如 eth0）",
    "to isolate transport problems try NCCL_P2P_DISABLE=1 or NCCL_IB_DISABLE=1": "排查传输问题时可尝试 NCCL_P2P_DISABLE=1 或 NCCL_IB_DISABLE=1",
    "check that every rank sees its own GPU (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES)": "检查每个 rank 都能看到自己的 GPU（CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES）",
    "HCCL collective timed out": "HCCL 集合通信超时",
    "An Ascend collective (HCCL) did not finish or connect in time.": "昇腾集合通信（HCCL）没有按时完成或建立连接。",
    "export HCCL_CONNECT_TIMEOUT=1200 (link setup) and HCCL_EXEC_TIMEOUT=1800 (collectives)":
        "export HCCL_CONNECT_TIMEOUT=1200（建链）和 HCCL_EXEC_TIMEOUT=1800（集合通信）",
    "check the other ranks' logs and `npu-smi info` health on every node": "检查其他 rank 的日志，以及每个节点上 `npu-smi info` 的健康状态",
    "give each rank its own NPU: ASCEND_RT_VISIBLE_DEVICES must not overlap between jobs": "为每个 rank 分配独立的 NPU：不同任务的 ASCEND_RT_VISIBLE_DEVICES 不能重叠",
    "HCCL initialization failed": "HCCL 初始化失败",
    "The Ascend collective library could not set up the process group.": "昇腾集合通信库无法建立进程组。",
    "source /usr/local/Ascend/ascend-toolkit/set_env.sh on every node before launching": "启动前在每个节点上 source /usr/local/Ascend/ascend-toolkit/set_env.sh",
    "set HCCL_IF_IP / HCCL_SOCKET_IFNAME to the interface the nodes share": "把 HCCL_IF_IP / HCCL_SOCKET_IFNAME 设为各节点共用的网卡",
    "check the NPU network with `hccn_tool -i 0 -link -g` and `npu-smi info`": "用 `hccn_tool -i 0 -link -g` 和 `npu-smi info` 检查 NPU 网络",
    "export ASCEND_GLOBAL_LOG_LEVEL=1 and read ~/ascend/log for the failing step": "export ASCEND_GLOBAL_LOG_LEVEL=1，然后在 ~/ascend/log 中查找失败的步骤",
    "No usable NVIDIA driver": "没有可用的 NVIDIA 驱动",
    "torch was built for CUDA but cannot talk to an NVIDIA driver.": "torch 是 CUDA 版本，但无法与 NVIDIA 驱动通信。",
    "run `nvidia-smi`: if it fails, install or repair the NVIDIA driver": "运行 `nvidia-smi`：如果失败，请安装或修复 NVIDIA 驱动",
    "if the driver is older than torch's CUDA, install a torch wheel built for an older CUDA": "如果驱动比 torch 所用的 CUDA 旧，请安装基于更旧 CUDA 构建的 torch",
    "to run without a GPU: PORTACHAT_DEVICE=cpu": "不用 GPU 运行：PORTACHAT_DEVICE=cpu",
    "No usable AMD / Hygon GPU": "没有可用的 AMD / 海光 GPU",
    "torch was built for ROCm/HIP but sees no device.": "torch 是 ROCm/HIP 版本，但看不到任何设备。",
    "add your user to the render and video groups (access to /dev/kfd and /dev/dri)": "把当前用户加入 render 和 video 组（以访问 /dev/kfd 和 /dev/dri）",
    "check HIP_VISIBLE_DEVICES; on Hygon DCU run `hy-smi` and `source /opt/dtk/env.sh`": "检查 HIP_VISIBLE_DEVICES；海光 DCU 上运行 `hy-smi` 和 `source /opt/dtk/env.sh`",
    "Ascend CANN runtime not found": "找不到昇腾 CANN 运行时",
    "torch_npu could not load the CANN libraries or the NPU driver.": "torch_npu 无法加载 CANN 库或 NPU 驱动。",
    "source /usr/local/Ascend/ascend-toolkit/set_env.sh (or your CANN install's set_env.sh)": "source /usr/local/Ascend/ascend-toolkit/set_env.sh（或你的 CANN 安装目录下的 set_env.sh）",
    "check the driver with `npu-smi info`": "用 `npu-smi info` 检查驱动",
    "install the torch_npu release that matches your torch and CANN versions": "安装与 torch 和 CANN 版本匹配的 torch_npu",
    "Operator or dtype not supported on the Ascend NPU": "昇腾 NPU 不支持该算子或数据类型",
    "An operator (or an operator in this dtype) has no NPU kernel in this torch_npu / CANN.": "当前 torch_npu / CANN 中，该算子（或该数据类型下的算子）没有 NPU 实现。",
    "on Ascend 910A use fp16: PORTACHAT_DTYPE=fp16 (910A has no bf16)": "在昇腾 910A 上使用 fp16：PORTACHAT_DTYPE=fp16（910A 不支持 bf16）",
    "upgrade torch_npu and CANN together to a pair from the published compatibility table": "按官方配套表同时升级 torch_npu 和 CANN",
    "disable compilation: PORTACHAT_COMPILE=0": "关闭编译：PORTACHAT_COMPILE=0",
    "report the operator name; as a last resort run that step on CPU": "报告该算子名称；万不得已时把这一步放到 CPU 上运行",
    "Dtype not supported by this device": "该设备不支持此数据类型",
    "An operator has no kernel for the chosen dtype on this device.": "在该设备上，某个算子没有所选数据类型的实现。",
    "choose another dtype: PORTACHAT_DTYPE=fp16 or PORTACHAT_DTYPE=fp32": "换一种数据类型：PORTACHAT_DTYPE=fp16 或 PORTACHAT_DTYPE=fp32",
    "run `portachat doctor` to see which dtype portachat would pick and why": "运行 `portachat doctor` 查看 portachat 会选择哪种数据类型以及原因",
    "torch.compile failed": "torch.compile 失败",
    "Compiling the model (TorchDynamo / Inductor / Triton) failed; eager mode still works.": "模型编译（TorchDynamo / Inductor / Triton）失败；eager 模式仍然可用。",
    "run without compilation: PORTACHAT_COMPILE=0": "不编译运行：PORTACHAT_COMPILE=0",
    "for details rerun with TORCH_LOGS=+dynamo,+inductor": "想看细节，用 TORCH_LOGS=+dynamo,+inductor 重新运行",
    "make sure the installed triton is the one your torch release pins": "确认安装的 triton 正是你的 torch 版本所要求的版本",
    "clear a stale kernel cache: delete the directory in TORCHINDUCTOR_CACHE_DIR (default /tmp/torchinductor_$USER)":
        "清理过期的内核缓存：删除 TORCHINDUCTOR_CACHE_DIR 指向的目录（默认 /tmp/torchinductor_$USER）",
    "Could not connect the distributed processes": "分布式进程无法互联",
    "The rendezvous (TCPStore / gloo) could not connect the ranks.": "rendezvous（TCPStore / gloo）无法连接各个 rank。",
    "check MASTER_ADDR / MASTER_PORT: rank 0's address, reachable from every node": "检查 MASTER_ADDR / MASTER_PORT：应为 rank 0 的地址，且每个节点都能访问",
    "pick a free port: torchrun --master_port 29511 ... (Address already in use means another job holds it)":
        "换一个空闲端口：torchrun --master_port 29511 ...（Address already in use 表示端口被其他任务占用）",
    "open the port in the firewall; set GLOO_SOCKET_IFNAME to the shared network interface": "在防火墙中放行该端口；把 GLOO_SOCKET_IFNAME 设为共用的网卡",
}


def _text(text: str, lang: str) -> str:
    if lang == "en":
        return text
    if text not in ZH:
        raise KeyError(f"no Chinese for {text!r}: add it to ZH in {__name__}")
    return ZH[text]


def _slug(title: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in title.lower()).strip("-")


def _match(rule: Rule) -> str:
    parts = []
    if rule.type_names:
        parts.append(", ".join(f"`{name}`" for name in rule.type_names))
    if rule.pattern:
        parts.append(f"`{rule.pattern.replace('|', ' | ')}`")
    return "; ".join(parts)


def render_guide(lang: str = "en") -> str:
    """The whole guide as Markdown, in English ("en") or Chinese ("zh")."""
    labels = LABELS[lang]
    lines = [INTRO[lang], "## " + ("Contents" if lang == "en" else "目录"), ""]
    lines += [f"- [{_text(r.title, lang)}](#{_slug(r.title)})" for r in RULES]
    for rule in RULES:
        lines += ["", f'<a id="{_slug(rule.title)}"></a>', f"## {_text(rule.title, lang)}", "",
                  f"**{labels['what']}:** {_text(rule.what_happened, lang)}", "", f"**{labels['fix']}:**", ""]
        lines += [f"{i}. {_text(remedy, lang)}" for i, remedy in enumerate(rule.remedies, 1)]
        lines += ["", f"<sub>{labels['match']}: {_match(rule)}</sub>"]
    return "\n".join(lines) + "\n"


def write_guides(docs: Path = DOCS) -> list[Path]:
    docs.mkdir(parents=True, exist_ok=True)
    written = []
    for lang, name in FILES.items():
        path = docs / name
        path.write_text(render_guide(lang), encoding="utf-8")
        written.append(path)
    return written


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description="Generate docs/TROUBLESHOOTING*.md from the diagnosis table.")
    p.add_argument("--write", action="store_true", help="write the files (default: check they are up to date)")
    args = p.parse_args(argv)
    if args.write:
        for path in write_guides():
            print(f"wrote {path}")
        return 0
    stale = [name for lang, name in FILES.items()
             if not (DOCS / name).exists() or (DOCS / name).read_text(encoding="utf-8") != render_guide(lang)]
    if stale:
        print(f"out of date: {', '.join(stale)}; run python -m portachat.tools.troubleshooting --write", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
