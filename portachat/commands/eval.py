"""`portachat eval [bpb|synthetic|gsm8k|arc|mmlu|ceval|cmmlu|humaneval|core|all] --model PATH`: evaluations."""

from __future__ import annotations

from portachat.commands.common import EPILOG, flag, int_at_least, later, positive_int
from portachat.eval.tasks import CHOICES
from portachat.i18n import _


def register(sub) -> None:
    p = sub.add_parser(
        "eval", help=_("evaluate a model: bits/byte, synthetic tasks, GSM8K, ARC, MMLU, C-Eval, CMMLU, HumanEval, CORE"), epilog=EPILOG,
        description=_("Evaluate a model (our checkpoint, a Hugging Face directory or a .gguf file). Task data is read "
                    "from --data, else from $PORTACHAT_HOME/eval_data/<task> (downloaded when online from the Hugging "
                    "Face Hub at HF_ENDPOINT, or from ModelScope with PORTACHAT_HUB=modelscope). `all` runs every task with local data plus the CORE-style centred mean."),
    )
    p.add_argument("task", nargs="?", default="all", choices=CHOICES, help=_("what to evaluate (default: all)"))
    flag(p, "--model", required=True, help=_("checkpoint directory, Hugging Face model directory or .gguf file"))
    flag(p, "--data", default=None, help=_("the task's data: a file or directory (jsonl, jsonl.gz, parquet, csv; "
         "C-Eval/CMMLU: the released directory or .zip), or hf:OWNER/NAME[:GLOB] / modelscope:OWNER/NAME[:GLOB] "
         "to download one"))
    flag(p, "--limit", type=positive_int, default=None, help=_("evaluate only the first N questions (bpb: N rows of text)"))
    flag(p, "--max-tokens", type=positive_int, default=None, help=_("longest reply for generative tasks (default per task)"))
    flag(p, "--shots", type=int_at_least(0), default=5,
         help=_("C-Eval/CMMLU: solved dev-split examples before each question (default 5)"))
    flag(p, "--seed", type=int, default=0, help=_("seed of the synthetic held-out set and of sampling (default 0)"))
    flag(p, "--workers", type=positive_int, default=None, help=_("HumanEval sandboxes run at a time (default: min(4, CPUs))"))
    flag(p, "--allow-unsandboxed-code", action="store_true",
         help=_("HumanEval: run the model's programs even where this machine gives the sandbox no namespaces "
                "(no bubblewrap or no user namespaces; `portachat doctor` says which): they are then held only by "
                "resource limits and a Python guard and can read and write whatever you can. Default: refuse"))
    flag(p, "--device", default=None, help=_("cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto-detect)"))
    flag(p, "--dtype", default=None, help=_("bf16|fp16|fp32 (default: the device's inference dtype)"))
    flag(p, "--quantize", default=None, choices=["int8", "int4"], help=_("weight-only quantization (default: off)"))
    p.add_argument("--tensor-parallel-size", "--tensor_parallel_size", "-tp", type=positive_int, default=1,
                   help=_("generative tasks (synthetic, gsm8k, humaneval) over N devices; the command starts its "
                        "N-1 workers itself (default 1)"))
    flag(p, "--json", action="store_true", help=_("print the results as JSON instead of a table"))
    p.set_defaults(func=later("eval", "cmd_eval"))
