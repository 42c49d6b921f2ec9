"""`portachat speedrun`: the whole pipeline, tokenizer to report card, in one resumable command."""

from __future__ import annotations

from portachat.commands.common import EPILOG, flag, later
from portachat.commands.inference import nonneg_float
from portachat.commands.launch import add_launch_flags
from portachat.i18n import _
from portachat.speedrun.presets import PRESETS
from portachat.speedrun.stages import STAGES


def register(sub) -> None:
    p = sub.add_parser(
        "speedrun", help=_("the whole pipeline: tokenizer -> base -> mid -> SFT -> RL -> evals -> report.md"),
        epilog=EPILOG,
        description=_("Train your own small ChatGPT end to end and write <home>/runs/<run>/report.md (hardware, time and "
                    "cost per stage, metrics, curves). Interrupted? Run the same command again: finished stages are "
                    "skipped and the interrupted one resumes from its latest checkpoint. Without --data-dir every stage "
                    "uses the built-in synthetic curriculum (offline)."),
    )
    flag(p, "--preset", default="auto", choices=["auto", *PRESETS],
         help=_("model size and steps: auto picks by hardware (CPU -> smoke, 1 accelerator -> d12, 8 -> d20)"))
    p.add_argument("--run-name", "--run_name", "--run", dest="run", default="speedrun",
                   help=_("run name: everything goes to <home>/runs/<run>/ (default: speedrun)"))
    flag(p, "--data-dir", default=None,
         help=_("directory with base/ (parquet/txt/jsonl pretraining text) and chat/ (conversation jsonl/parquet)"))
    flag(p, "--runs-root", default=None, help=_("directory holding runs (default: $PORTACHAT_HOME/runs)"))
    flag(p, "--price-per-device-hour", type=nonneg_float, default=None,
         help=_("USD per device-hour for the report's cost column (default 2.00 on accelerators, 0.05 on a CPU)"))
    flag(p, "--stop-after", default=None, choices=list(STAGES), help=_("stop after this stage (default: run them all)"))
    flag(p, "--overwrite", action="store_true", help=_("delete this run and start over"))
    flag(p, "--seed", type=int, default=42, help=_("random seed (default 42)"))
    flag(p, "--device", default=None, help=_("cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto-detect)"))
    flag(p, "--dtype", default=None, help=_("bf16|fp16|fp32 (default: the device's best)"))
    flag(p, "--compile", default=None, choices=["0", "1"], help=_("torch.compile the model (default: per device policy)"))
    add_launch_flags(p)
    p.set_defaults(func=later("speedrun", "cmd_speedrun"))
