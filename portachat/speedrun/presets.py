"""Speedrun presets: how big a model and how many steps per stage, chosen by hardware with `auto`.

Sizes follow nanochat's ladder (d12 ~ a one-GPU run, d20 ~ an 8-GPU run of a few hours); `smoke`
and `cpu` are the same pipeline shrunk until it runs on a laptop CPU, so every stage still runs
and its effect is measurable on the synthetic curriculum.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from portachat.i18n import N_, _

if TYPE_CHECKING:  # torch-free at import: the command line reads PRESETS for --help
    from portachat.device import Device


@dataclass(frozen=True)
class TrainingDefaults:
    """Model and batch sizes a training command uses when the user gives none (product policy, not a
    device fact: the device layer only says whether an accelerator does the work)."""

    depth: int
    device_batch_size: int
    max_seq_len: int
    rl_groups_per_row_batch: int  # RL micro-batch = this many groups of --num-samples replies


def training_defaults(dev: Device) -> TrainingDefaults:
    if dev.is_accelerator:
        return TrainingDefaults(depth=20, device_batch_size=32, max_seq_len=2048, rl_groups_per_row_batch=4)
    return TrainingDefaults(depth=4, device_batch_size=4, max_seq_len=256, rl_groups_per_row_batch=1)


def price_per_device_hour(dev: Device) -> float:
    """A rough rental price (USD) for cost estimates in reports: a cloud accelerator, or a CPU machine."""
    return 2.0 if dev.is_accelerator else 0.05


@dataclass(frozen=True)
class StagePlan:
    num_iterations: int | None  # None = the stage's own horizon (Chinchilla for base, epochs for chat)
    device_batch_size: int
    max_seq_len: int
    total_batch_size: int | None = None
    eval_every: int = 0  # 0 = only at the end


@dataclass(frozen=True)
class Preset:
    name: str
    depth: int
    vocab_size: int | None  # None = sized from the data
    base: StagePlan
    mid: StagePlan
    sft: StagePlan
    rl_steps: int
    rl_prompts_per_step: int
    rl_samples_per_prompt: int
    rl_max_tokens: int
    eval_limit: int  # questions per evaluation task
    synthetic_conversations: int  # mid-training conversations generated when no data is given
    note: str
    tokenizer_max_chars: int = 2_000_000_000  # characters the tokenizer trains on
    rl_lr_scale: float = 0.02  # RL's learning rates as a fraction of pretraining's


PRESETS: dict[str, Preset] = {
    "smoke": Preset(
        name="smoke",
        depth=3,
        vocab_size=1024,
        base=StagePlan(num_iterations=800, device_batch_size=8, max_seq_len=256, eval_every=400),
        mid=StagePlan(num_iterations=800, device_batch_size=8, max_seq_len=256, eval_every=400),
        sft=StagePlan(num_iterations=300, device_batch_size=8, max_seq_len=256, eval_every=300),
        rl_steps=120,  # ~1000 prompts: after 60 steps held-out answers flipped either way about equally
        rl_prompts_per_step=8,
        rl_samples_per_prompt=8,
        rl_max_tokens=64,  # a worked comparison with a tie is ~50 tokens
        eval_limit=500,  # ~140 comparison questions: RL's gain there is a few questions, 200 was too noisy
        synthetic_conversations=24000,
        note=N_("about five and a half minutes on a 2-core CPU: proves every stage works and moves the metrics"),
        tokenizer_max_chars=3_000_000,
        rl_lr_scale=0.05,
    ),
    "cpu": Preset(
        name="cpu",
        depth=6,
        vocab_size=2048,
        base=StagePlan(num_iterations=3000, device_batch_size=8, max_seq_len=512, eval_every=500),
        mid=StagePlan(num_iterations=800, device_batch_size=8, max_seq_len=512, eval_every=400),
        sft=StagePlan(num_iterations=400, device_batch_size=8, max_seq_len=512, eval_every=200),
        rl_steps=60,
        rl_prompts_per_step=8,
        rl_samples_per_prompt=8,
        rl_max_tokens=64,
        eval_limit=500,
        synthetic_conversations=20000,
        note=N_("about an hour on a desktop CPU"),
    ),
    "d12": Preset(
        name="d12",
        depth=12,
        vocab_size=None,
        base=StagePlan(num_iterations=None, device_batch_size=32, max_seq_len=2048, total_batch_size=524288,
                       eval_every=250),
        mid=StagePlan(num_iterations=None, device_batch_size=32, max_seq_len=2048, total_batch_size=524288,
                      eval_every=150),
        sft=StagePlan(num_iterations=None, device_batch_size=4, max_seq_len=2048, eval_every=100),
        rl_steps=200,
        rl_prompts_per_step=16,
        rl_samples_per_prompt=16,
        rl_max_tokens=256,
        eval_limit=1000,
        synthetic_conversations=200000,
        note=N_("about a GPU-day's fraction on one modern GPU (nanochat's d12)"),
    ),
    "d20": Preset(
        name="d20",
        depth=20,
        vocab_size=None,
        base=StagePlan(num_iterations=None, device_batch_size=32, max_seq_len=2048, total_batch_size=524288,
                       eval_every=250),
        mid=StagePlan(num_iterations=None, device_batch_size=32, max_seq_len=2048, total_batch_size=524288,
                      eval_every=150),
        sft=StagePlan(num_iterations=None, device_batch_size=4, max_seq_len=2048, eval_every=100),
        rl_steps=400,
        rl_prompts_per_step=16,
        rl_samples_per_prompt=16,
        rl_max_tokens=256,
        eval_limit=0,  # 0 = whole task sets
        synthetic_conversations=400000,
        note=N_("nanochat's $100 tier: about 4 hours on 8 H100-class accelerators"),
    ),
}
PRESETS["d26"] = replace(PRESETS["d20"], name="d26", depth=26, note=N_("nanochat's $300 tier: ~12 hours on 8 accelerators"))


def choose_preset(name: str, accelerated: bool, world_size: int) -> tuple[Preset, str]:
    """The preset to run and why (`auto` looks at the hardware)."""
    if name != "auto":
        if name not in PRESETS:
            raise ValueError(_("unknown preset {name}; choose one of {presets}").format(
                name=repr(name), presets=", ".join(("auto", *PRESETS))))
        return PRESETS[name], f"--preset {name}"
    if not accelerated:
        return PRESETS["smoke"], _("auto: no accelerator, so the smoke preset (a few minutes on a CPU)")
    if world_size >= 8:
        return PRESETS["d20"], _("auto: {n} accelerators, so d20").format(n=world_size)
    return PRESETS["d12"], _("auto: {n} accelerator(s), so d12 (use --nproc 8 and --preset d20 for more)").format(
        n=world_size)
