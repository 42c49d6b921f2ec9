"""Device-layer errors and the vendor-knowledge table that explains known failures.

The table names vendor environment variables and tools, which is why it lives under device/;
`portachat.device.explain` is the public entry point.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from portachat.i18n import N_, _, gettext


class DeviceError(RuntimeError):
    """A bad device configuration (e.g. PORTACHAT_DTYPE=bf17); the message says what to do."""


@dataclass
class Diagnosis:
    title: str  # in the user's language
    what_happened: str
    remedies: list[str]
    rule: str = ""  # the rule's English title: a stable name for code to test (the title is translated)

    def line(self, error: BaseException) -> str:
        """The diagnosis on one line, with the error it explains: for logs, API errors and wrapped errors
        (format_diagnosis in explain.py is the terminal's multi-line form)."""
        return _("{title}: {what_happened} What to do: {remedies}. ({error})").format(
            title=self.title, what_happened=self.what_happened, remedies="; ".join(self.remedies),
            error=f"{type(error).__name__}: {error}")


@dataclass(frozen=True)
class Rule:
    """A known failure. Texts are English msgids (marked with N_); diagnose() shows them translated."""

    title: str
    what_happened: str
    remedies: tuple[str, ...]
    pattern: str | None = None  # regex searched in the exception message (case-insensitive)
    type_names: tuple[str, ...] = ()  # exception class names matched anywhere in the MRO


_BATCH = N_("lower --device-batch-size (gradient accumulation keeps the total batch size)")
_TUNE = N_("run `portachat tune batch-size` to find the largest batch that fits")
_CTX = N_("shorten --max-seq-len, or use a smaller --depth")
_ESTIMATE = N_("see what fits before running: `portachat estimate memory --depth N --device-batch-size B --max-seq-len T`")

RULES: tuple[Rule, ...] = (
    Rule(
        N_("Configuration problem"),
        N_("portachat rejected the device configuration before running anything."),
        (
            N_("read the message above: it names the setting and its valid values"),
            N_("run `portachat doctor` for a full check"),
        ),
        type_names=("DeviceError",),
    ),
    Rule(
        N_("Out of memory on the Ascend NPU"),
        N_("The NPU ran out of HBM while allocating a tensor."),
        (_BATCH, _TUNE, N_("export PYTORCH_NPU_ALLOC_CONF=expandable_segments:True (less fragmentation)"), _CTX, _ESTIMATE),
        pattern=r"NPU out of memory|NPU memory.*(exhausted|insufficient)|EL0004|207018",
    ),
    Rule(
        N_("Out of memory on the AMD / Hygon GPU"),
        N_("The HIP device ran out of memory while allocating a tensor."),
        (_BATCH, _TUNE, N_("export PYTORCH_HIP_ALLOC_CONF=expandable_segments:True (less fragmentation)"), _CTX, _ESTIMATE),
        pattern=r"HIP out of memory|hipErrorOutOfMemory",
    ),
    Rule(
        N_("Out of memory on the NVIDIA GPU"),
        N_("The GPU ran out of memory while allocating a tensor."),
        (
            _BATCH,
            _TUNE,
            N_("export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (less fragmentation)"),
            _CTX,
            _ESTIMATE,
            N_("check `nvidia-smi` for other processes holding GPU memory"),
        ),
        pattern=r"CUDA out of memory|CUBLAS_STATUS_ALLOC_FAILED|cudaErrorMemoryAllocation",
    ),
    Rule(
        N_("Out of memory on the Apple GPU"),
        N_("The MPS backend hit its memory limit."),
        (_BATCH, _TUNE, N_("export PYTORCH_MPS_HIGH_WATERMARK_RATIO=0.0 to lift the limit (may swap)"), _CTX),
        pattern=r"MPS backend out of memory",
    ),
    Rule(
        N_("Out of memory on the Intel GPU"),
        N_("The XPU ran out of memory while allocating a tensor."),
        (_BATCH, _TUNE, _CTX),
        pattern=r"XPU out of memory|UR_RESULT_ERROR_OUT_OF_DEVICE_MEMORY",
    ),
    Rule(
        N_("Out of memory"),
        N_("A memory allocation failed."),
        (_BATCH, _TUNE, _CTX, _ESTIMATE, N_("on CPU, close other programs or use a smaller model")),
        pattern=r"out of memory|can't allocate memory|Cannot allocate memory",
        type_names=("OutOfMemoryError", "MemoryError"),
    ),
    Rule(
        N_("NCCL collective timed out"),
        N_("A collective operation did not finish in time: usually one rank crashed, hangs, or runs different steps."),
        (
            N_("look at the other ranks' logs first: the real error is usually there"),
            N_("export NCCL_DEBUG=INFO and rerun to see where ranks disagree"),
            N_("make sure every rank runs the same number of steps and batches"),
            N_("raise the collective timeout (export PORTACHAT_DIST_TIMEOUT=SECONDS; default 7200) if rank 0 legitimately "
               "works alone that long, e.g. evaluation"),
        ),
        pattern=r"(NCCL|ProcessGroupNCCL|collective operation).*(timeout|timed out)|Watchdog caught collective",
    ),
    Rule(
        N_("NCCL / RCCL communication failed"),
        N_("The NVIDIA (or ROCm RCCL) collective library failed to set up or run a collective."),
        (
            N_("export NCCL_DEBUG=INFO and rerun: it prints the failing transport"),
            N_("set NCCL_SOCKET_IFNAME to the network interface the nodes share (e.g. eth0)"),
            N_("to isolate transport problems try NCCL_P2P_DISABLE=1 or NCCL_IB_DISABLE=1"),
            N_("check that every rank sees its own GPU (CUDA_VISIBLE_DEVICES / HIP_VISIBLE_DEVICES)"),
        ),
        pattern=r"NCCL error|nccl(Internal|System|Unhandled|Invalid)\w*|NCCL WARN|RCCL",
    ),
    Rule(
        N_("HCCL collective timed out"),
        N_("An Ascend collective (HCCL) did not finish or connect in time."),
        (
            N_("export HCCL_CONNECT_TIMEOUT=1200 (link setup) and HCCL_EXEC_TIMEOUT=1800 (collectives)"),
            N_("check the other ranks' logs and `npu-smi info` health on every node"),
            N_("give each rank its own NPU: ASCEND_RT_VISIBLE_DEVICES must not overlap between jobs"),
        ),
        pattern=r"HCCL.*(timeout|time out|timed out)|EI0002|EI0006",
    ),
    Rule(
        N_("HCCL initialization failed"),
        N_("The Ascend collective library could not set up the process group."),
        (
            N_("source /usr/local/Ascend/ascend-toolkit/set_env.sh on every node before launching"),
            N_("set HCCL_IF_IP / HCCL_SOCKET_IFNAME to the interface the nodes share"),
            N_("check the NPU network with `hccn_tool -i 0 -link -g` and `npu-smi info`"),
            N_("export ASCEND_GLOBAL_LOG_LEVEL=1 and read ~/ascend/log for the failing step"),
        ),
        pattern=r"\bHCCL\b|hccl\w*(error|fail)|EI\d{4}",
    ),
    Rule(
        N_("No usable NVIDIA driver"),
        N_("torch was built for CUDA but cannot talk to an NVIDIA driver."),
        (
            N_("run `nvidia-smi`: if it fails, install or repair the NVIDIA driver"),
            N_("if the driver is older than torch's CUDA, install a torch wheel built for an older CUDA"),
            N_("to run without a GPU: PORTACHAT_DEVICE=cpu"),
        ),
        pattern=r"Found no NVIDIA driver|NVIDIA driver on your system is too old|CUDA driver version is insufficient"
        r"|no CUDA-capable device|cudaErrorNoDevice",
    ),
    Rule(
        N_("No usable AMD / Hygon GPU"),
        N_("torch was built for ROCm/HIP but sees no device."),
        (
            N_("add your user to the render and video groups (access to /dev/kfd and /dev/dri)"),
            N_("check HIP_VISIBLE_DEVICES; on Hygon DCU run `hy-smi` and `source /opt/dtk/env.sh`"),
            N_("to run without a GPU: PORTACHAT_DEVICE=cpu"),
        ),
        pattern=r"No HIP GPUs are available|hipErrorNoDevice|HSA_STATUS_ERROR",
    ),
    Rule(
        N_("Ascend CANN runtime not found"),
        N_("torch_npu could not load the CANN libraries or the NPU driver."),
        (
            N_("source /usr/local/Ascend/ascend-toolkit/set_env.sh (or your CANN install's set_env.sh)"),
            N_("check the driver with `npu-smi info`"),
            N_("install the torch_npu release that matches your torch and CANN versions"),
        ),
        pattern=r"libascendcl|libhccl|libtorch_npu|libge_runner|ACL_ERROR_\w+|aclInit|Failed to import torch_npu"
        r"|ASCEND_\w+ is not set|ascend-toolkit",
    ),
    Rule(
        N_("Operator or dtype not supported on the Ascend NPU"),
        N_("An operator (or an operator in this dtype) has no NPU kernel in this torch_npu / CANN."),
        (
            N_("on Ascend 910A use fp16: PORTACHAT_DTYPE=fp16 (910A has no bf16)"),
            N_("upgrade torch_npu and CANN together to a pair from the published compatibility table"),
            N_("disable compilation: PORTACHAT_COMPILE=0"),
            N_("report the operator name; as a last resort run that step on CPU"),
        ),
        pattern=r"not implemented for .?(npu|PrivateUse1)|aclnn\w*|EZ\d{4}|E[0-9A-Z]\d{4}.*(not support|unsupport)"
        r"|is not supported on npu|NPU.*(not support|unsupport)",
    ),
    Rule(
        N_("Dtype not supported by this device"),
        N_("An operator has no kernel for the chosen dtype on this device."),
        (
            N_("choose another dtype: PORTACHAT_DTYPE=fp16 or PORTACHAT_DTYPE=fp32"),
            N_("run `portachat doctor` to see which dtype portachat would pick and why"),
        ),
        pattern=r"not implemented for '(BFloat16|Half)'|bf16 is not supported|BFloat16 is not supported",
    ),
    Rule(
        N_("torch.compile failed"),
        N_("Compiling the model (TorchDynamo / Inductor / Triton) failed; eager mode still works."),
        (
            N_("run without compilation: PORTACHAT_COMPILE=0"),
            N_("for details rerun with TORCH_LOGS=+dynamo,+inductor"),
            N_("make sure the installed triton is the one your torch release pins"),
            N_("clear a stale kernel cache: delete the directory in TORCHINDUCTOR_CACHE_DIR (default /tmp/torchinductor_$USER)"),
        ),
        pattern=r"torch\._dynamo|torch\._inductor|BackendCompilerFailed|InductorError|triton\w*\.|CompilationError",
        type_names=(
            "BackendCompilerFailed",
            "InductorError",
            "TorchRuntimeError",
            "Unsupported",
            "CompilationError",
        ),
    ),
    Rule(
        N_("A distributed peer process died"),
        N_("Another rank of the process group (a tensor-parallel worker, or a training rank) went away in the "
           "middle of a collective, so this rank's step could not finish."),
        (
            N_("read the dead process's own output above for its error (device error, out of memory); "
               "`dmesg | tail` shows the kernel's OOM killer"),
            N_("restart the command; with --tensor-parallel-size, --quantize int8 or more devices lower the memory "
               "per device"),
        ),
        pattern=r"Connection closed by peer|Connection reset by peer|remote worker crash",
    ),
    Rule(
        N_("Could not connect the distributed processes"),
        N_("The rendezvous (TCPStore / gloo) could not connect the ranks."),
        (
            N_("check MASTER_ADDR / MASTER_PORT: rank 0's address, reachable from every node"),
            N_("pick a free port: torchrun --master_port 29511 ... (Address already in use means another job holds it)"),
            N_("open the port in the firewall; set GLOO_SOCKET_IFNAME to the shared network interface"),
        ),
        pattern=r"Connection refused|connect\(\) timed out|Address already in use|EADDRINUSE|TCPStore|"
        r"DistNetworkError|DistStoreError|Gloo.*(connect|timeout)|Socket Timeout",
        type_names=("DistNetworkError", "DistStoreError"),
    ),
)


def _chain(exc: BaseException, limit: int = 6) -> list[BaseException]:
    out: list[BaseException] = []
    cur: BaseException | None = exc
    while cur is not None and cur not in out and len(out) < limit:
        out.append(cur)
        cur = cur.__cause__ or cur.__context__
    return out


def _matches(rule: Rule, exc: BaseException) -> bool:
    if rule.type_names and any(cls.__name__ in rule.type_names for cls in type(exc).__mro__):
        return True
    return bool(rule.pattern and re.search(rule.pattern, str(exc), re.IGNORECASE))


def diagnose(exc: BaseException) -> Diagnosis | None:
    """Explain a known failure (outermost exception first, then its causes); None when unknown."""
    for link in _chain(exc):
        for rule in RULES:
            if _matches(rule, link):
                message = str(link).strip().splitlines()
                detail = message[0] if message else type(link).__name__
                if len(detail) > 300:
                    detail = detail[:300] + "..."
                return Diagnosis(
                    gettext(rule.title),
                    f"{gettext(rule.what_happened)} ({type(link).__name__}: {detail})",
                    [gettext(remedy) for remedy in rule.remedies],
                    rule.title,
                )
    return None
