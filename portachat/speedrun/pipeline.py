"""The whole pipeline in one call: tokenizer -> base -> mid -> SFT -> RL -> evals -> report.md.

Each stage is the same library function its own command runs (`train base`, `train mid`, ...). A
state file, `<run>/speedrun.json`, records which stages finished, how long they took and what they
measured; run the same command again after an interruption and it skips finished stages and
resumes the interrupted one from its latest checkpoint.
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import torch.distributed as dist

from portachat.checkpoint import latest_checkpoint, stage_dir
from portachat.checkpoint.replicate import rank0_decides
from portachat.data.sources import open_source
from portachat.device import Device, DistEnv, get_device, init_distributed
from portachat.eval.data_files import default_data_path
from portachat.eval.report import format_table, summary
from portachat.eval.run import EvalOptions, run_evals
from portachat.i18n import N_, _, gettext
from portachat.speedrun.presets import Preset, StagePlan, choose_preset, price_per_device_hour
from portachat.speedrun.report import hardware_summary, write_report
from portachat.speedrun.stages import STAGES
from portachat.storage.atomic import write_text_atomic
from portachat.storage.runs import list_steps
from portachat.train.base import BaseOptions, prepare_tokenizer, run_base
from portachat.train.chat_stage import ChatOptions, run_chat_stage
from portachat.train.rl import RLOptions, run_rl
from portachat.train.trainer import TrainConfig

STATE_FILE = "speedrun.json"
SYNTHETIC_NOTE = N_("built-in synthetic curriculum (offline)")  # stored in the state, shown translated

class SpeedrunError(RuntimeError):
    """The speedrun cannot go on; the message says why and what to do."""


@dataclass
class SpeedrunOptions:
    run: str = "speedrun"
    preset: str = "auto"
    data_dir: str | None = None  # base/ (parquet/txt/jsonl) and chat/ (conversation files); None = Hub or synthetic
    runs_root: str | None = None
    price_per_device_hour: float | None = None  # USD; None = 2.0 on accelerators, 0.05 on a CPU
    overwrite: bool = False
    stop_after: str | None = None  # run up to and including this stage
    seed: int = 42
    overrides: dict[str, Any] = field(default_factory=dict)  # e.g. {"base.num_iterations": 50} for tests


def _run_dir(opts: SpeedrunOptions) -> Path:
    return stage_dir(opts.run, "x", Path(opts.runs_root) if opts.runs_root else None).parent


def load_state(run_dir: Path) -> dict[str, Any]:
    path = run_dir / STATE_FILE
    if not path.is_file():
        return {}
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise SpeedrunError(_("{path} is damaged ({error}); delete it to rerun every stage, or use --overwrite").format(
            path=path, error=exc)) from exc


def save_state(run_dir: Path, state: dict[str, Any]) -> None:
    run_dir.mkdir(parents=True, exist_ok=True)
    write_text_atomic(run_dir / STATE_FILE, json.dumps(state, indent=2) + "\n")  # stage order is the report order


def _plan(preset: Preset, stage: str, overrides: dict[str, Any]) -> StagePlan:
    plan: StagePlan = getattr(preset, stage)

    known = {f.name for f in fields(StagePlan)}
    changes = {k.split(".", 1)[1]: v for k, v in overrides.items() if k.startswith(stage + ".")}
    changes = {k: v for k, v in changes.items() if k in known}
    if changes:
        plan = replace(plan, **changes)
    return plan


def _train_config(plan: StagePlan, stage: str, opts: SpeedrunOptions):
    return TrainConfig(
        run=opts.run,
        stage=stage,
        runs_root=opts.runs_root,
        device_batch_size=plan.device_batch_size,
        total_batch_size=plan.total_batch_size,
        max_seq_len=plan.max_seq_len,
        eval_every=plan.eval_every,
        log_every=max(1, (plan.num_iterations or 1000) // 20),
        save_every=max(0, (plan.num_iterations or 0) // 2),
        keep_last=1,
        seed=opts.seed,
    )


def _data_source(opts: SpeedrunOptions, say: Callable[[str], None]) -> tuple[str | None, list[str], str]:
    """(base data, chat data files, note): --data-dir, else the synthetic curriculum (said loudly)."""
    if opts.data_dir:
        root = Path(opts.data_dir).expanduser()
        if not root.is_dir():
            raise SpeedrunError(_("--data-dir {path} is not a directory (expected base/ and optionally chat/ inside)").format(
                path=root))
        base = root / "base" if (root / "base").exists() else root
        chat = sorted(str(p) for p in (root / "chat").glob("*") if p.suffix in (".jsonl", ".parquet")) \
            if (root / "chat").is_dir() else []
        note = f"{base} for pretraining" + (f", {len(chat)} chat file(s) for mid/SFT" if chat else
                                             ", the synthetic curriculum for mid/SFT/RL")
        return str(base), chat, note
    say("[speedrun] " + "=" * 88)
    say("[speedrun] " + _("NO --data-dir: every stage uses the built-in SYNTHETIC curriculum (offline). For real data"))
    say("[speedrun] " + _("pass --data-dir DIR with base/ (FineWeb-style parquet shards) and chat/ (conversation jsonl)."))
    say("[speedrun] " + "=" * 88)
    return None, [], SYNTHETIC_NOTE


def _has_checkpoints(opts: SpeedrunOptions, stage: str) -> bool:
    return bool(list_steps(stage_dir(opts.run, stage, Path(opts.runs_root) if opts.runs_root else None)))


def run_speedrun(opts: SpeedrunOptions, dev: Device | None = None, print_fn: Callable[[str], None] = print) -> Path:
    """Run (or continue) the pipeline; returns the path of report.md."""
    dev = dev or get_device()
    env = init_distributed(dev)
    say = print_fn if env.is_main else (lambda _m: None)
    preset, why = choose_preset(opts.preset, dev.is_accelerator, env.world_size)
    run_dir = _run_dir(opts)
    # No shared filesystem is assumed: rank 0's view of the state file decides for every node.
    state = rank0_decides(lambda: load_state(run_dir))
    if state and opts.overwrite:
        if env.is_main:
            shutil.rmtree(run_dir)
        if env.is_distributed:
            dist.barrier()
        state = {}
    if state and state.get("preset") != preset.name:
        raise SpeedrunError(
            _("run '{run}' was started with preset {old}, not {new}; continue it with "
              "--preset {old}, pick another --run-name, or pass --overwrite").format(
                run=opts.run, old=state.get("preset"), new=preset.name)
        )
    base_data, chat_data, data_note = _data_source(opts, say)
    price = opts.price_per_device_hour
    if price is None:
        price = price_per_device_hour(dev)
    state.update(run=opts.run, preset=preset.name, preset_reason=why, data_note=data_note,
                 world_size=env.world_size, price_per_device_hour=price)
    state.setdefault("stages", {})
    state.setdefault("evals", {})
    say("[speedrun] " + _("run '{run}' in {path}: preset {preset} ({why}; {note})").format(
        run=opts.run, path=run_dir, preset=preset.name, why=why, note=gettext(preset.note)))
    last = opts.stop_after or STAGES[-1]
    if last not in STAGES:
        raise SpeedrunError(_("--stop-after must be one of {stages}, got {value}").format(
            stages=", ".join(STAGES), value=repr(last)))

    runners: dict[str, Callable[[], dict[str, Any]]] = {
        "tokenizer": lambda: _tokenizer_stage(opts, preset, base_data, run_dir, env, say),
        "base": lambda: _base_stage(opts, preset, base_data, dev, say),
        "mid": lambda: _chat_stage("mid", opts, preset, chat_data, dev, say),
        "sft": lambda: _chat_stage("sft", opts, preset, chat_data, dev, say),
        "rl": lambda: _rl_stage(opts, preset, dev, say),
        "eval": lambda: _eval_stage(opts, preset, dev, env, say, state),
    }
    for stage in STAGES:
        info = state["stages"].get(stage, {})
        if info.get("done"):
            say("[speedrun] " + _("{stage}: already done ({seconds}s), skipping").format(
                stage=stage, seconds=f"{info.get('seconds', 0):.0f}"))
        else:
            say(f"[speedrun] ---- {stage} " + "-" * (80 - len(stage)))
            t0 = time.perf_counter()
            metrics = runners[stage]()
            spent = float(info.get("seconds") or 0.0) + time.perf_counter() - t0
            state["stages"][stage] = {"done": True, "seconds": spent, "metrics": metrics}
            if env.is_main:
                save_state(run_dir, state)
            say("[speedrun] " + _("{stage}: done in {seconds}s").format(stage=stage, seconds=f"{spent:.0f}"))
        if stage == last:
            break
    final = latest_checkpoint(stage_dir(opts.run, "rl", Path(opts.runs_root) if opts.runs_root else None)) or \
        latest_checkpoint(stage_dir(opts.run, "sft", Path(opts.runs_root) if opts.runs_root else None))
    state["final_model"] = str(final) if final else None
    report = run_dir / "report.md"
    if env.is_main:
        save_state(run_dir, state)
        report = write_report(run_dir, state, hardware_summary(dev, env.world_size))
        say("[speedrun] " + _("report: {path}").format(path=report))
        if final:
            say("[speedrun] " + _("chat with it: {command}").format(command=f"portachat chat --model {final}"))
    return report


# ---------------------------------------------------------------------------------------------- stages


def _tokenizer_stage(opts: SpeedrunOptions, preset: Preset, base_data: str | None, run_dir: Path, env: DistEnv,
                     say) -> dict[str, Any]:

    base_opts = BaseOptions(data=base_data, vocab_size=preset.vocab_size,
                            tokenizer_max_chars=int(opts.overrides.get("tokenizer_max_chars", preset.tokenizer_max_chars)))
    source = open_source(base_data, split="train")
    tok = prepare_tokenizer(base_opts, source, run_dir, env, say)
    return {"vocab_size": tok.vocab_size}


def _base_stage(opts: SpeedrunOptions, preset: Preset, base_data: str | None, dev: Device, say) -> dict[str, Any]:
    plan = _plan(preset, "base", opts.overrides)
    result = run_base(
        BaseOptions(
            data=base_data,
            vocab_size=preset.vocab_size,
            tokenizer_max_chars=int(opts.overrides.get("tokenizer_max_chars", preset.tokenizer_max_chars)),
            depth=int(opts.overrides.get("depth", preset.depth)),
            num_iterations=plan.num_iterations,
            resume="auto" if _has_checkpoints(opts, "base") else None,
            train=_train_config(plan, "base", opts),
        ),
        dev=dev,
        print_fn=say,
    )
    return {"steps": result.steps, "val_bpb": result.val_bpb, **_float_metrics(result.metrics)}


def _chat_stage(stage: str, opts: SpeedrunOptions, preset: Preset, chat_data: list[str], dev: Device,
                say) -> dict[str, Any]:

    plan = _plan(preset, stage, opts.overrides)
    result = run_chat_stage(
        ChatOptions(
            stage=stage,
            data=list(chat_data),
            max_conversations=None if chat_data else int(opts.overrides.get(
                f"{stage}.conversations", preset.synthetic_conversations if stage == "mid"
                else preset.synthetic_conversations // 3)),
            num_iterations=plan.num_iterations,
            max_seq_len=plan.max_seq_len,
            eval_examples=int(opts.overrides.get("chat_eval_examples", 64)),
            resume="auto" if _has_checkpoints(opts, stage) else None,
            train=_train_config(plan, stage, opts),
        ),
        dev=dev,
        print_fn=say,
    )
    return {"steps": result.steps, **_float_metrics(result.metrics)}


def _rl_stage(opts: SpeedrunOptions, preset: Preset, dev: Device, say) -> dict[str, Any]:
    steps = int(opts.overrides.get("rl.steps", preset.rl_steps))
    group = preset.rl_samples_per_prompt
    # One micro-batch = prompts_per_step prompts x G replies (the group must share a micro-batch).
    plan = replace(preset.sft, num_iterations=steps, device_batch_size=preset.rl_prompts_per_step * group,
                   total_batch_size=None, eval_every=steps)
    result = run_rl(
        RLOptions(
            num_samples=group,
            max_new_tokens=preset.rl_max_tokens,
            lr_scale=preset.rl_lr_scale,
            num_iterations=steps,
            # dynamic sampling may draw up to sample_rounds prompts per slot: enough that none repeats
            max_prompts=max(200, steps * preset.rl_prompts_per_step * RLOptions.sample_rounds),
            eval_examples=int(opts.overrides.get("chat_eval_examples", 64)),
            resume="auto" if _has_checkpoints(opts, "rl") else None,
            train=_train_config(plan, "rl", opts),
        ),
        dev=dev,
        print_fn=say,
    )
    return {"steps": result.steps, **_float_metrics(result.metrics)}


def _eval_stage(opts: SpeedrunOptions, preset: Preset, dev: Device, env: DistEnv, say,
                state: dict[str, Any]) -> dict[str, Any]:
    """Held-out synthetic accuracy, per task and per language (plus any task whose data is present) for each chat stage's model."""

    if not env.is_main:  # evaluation is cheap next to training: rank 0 does it, the others wait
        if env.is_distributed:
            dist.barrier()
        return {}
    limit = int(opts.overrides.get("eval.limit", preset.eval_limit)) or None
    root = Path(opts.runs_root) if opts.runs_root else None
    headline: dict[str, Any] = {}
    for stage in ("mid", "sft", "rl"):  # base's bits/byte is already in its own metrics
        ckpt = latest_checkpoint(stage_dir(opts.run, stage, root))
        if ckpt is None:
            continue
        results = []
        for task in ("synthetic", *[t for t in LOCAL_DATA_EVALS if _has_local_eval_data(t)]):
            results += run_evals(EvalOptions(task=task, model=str(ckpt), limit=limit, device=dev.kind,
                                             seed=opts.seed), log=lambda _m: None)
        say(f"[speedrun] {stage}:\n{format_table(results)}")
        state["evals"][stage] = {**summary(results), **{  # per task too: where RL helps or hurts
            f"{r.task}/{t}": v for r in results if r.task == "synthetic"
            for t, v in {**(r.details.get("per_task") or {}), **(r.details.get("per_lang") or {})}.items()}}
        for r in results:
            headline[f"{stage}_{r.task}"] = r.value
    if env.is_distributed:
        dist.barrier()
    return headline


# Scored for every chat stage when their data is already under $PORTACHAT_HOME/eval_data (never downloaded here).
LOCAL_DATA_EVALS = ("ceval", "cmmlu")


def _has_local_eval_data(task: str) -> bool:
    path = default_data_path(task)
    return path.is_dir() and any(p.is_file() for p in path.rglob("*"))


def _float_metrics(metrics: dict[str, Any]) -> dict[str, float]:
    return {k: float(v) for k, v in (metrics or {}).items() if isinstance(v, (int, float)) and not isinstance(v, bool)}
