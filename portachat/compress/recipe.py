"""`portachat compress`: prune -> heal -> evaluate -> report, in one output directory:

    DIR/pruned/                 the pruned checkpoint (portachat prune)
    DIR/runs/compress/sft/...   the healing run's checkpoints (its `latest` is the result)
    DIR/report.md, report.json, compress.png   before / pruned / healed numbers

Healing goes through one interface, `HealStep`. Minitron heals a pruned model by distilling from
the model it was pruned from; the step used today, `finetune_heal`, is plain next-token
cross-entropy on the healing data through the fine-tuning stage (train/finetune.py), and the
distillation stage plugs in here as another HealStep with the same request (student, teacher,
data, budget).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from portachat.compress.measure import ModelNumbers, measure_model
from portachat.compress.prune import PruneError
from portachat.compress.prune_run import (
    PruneOptions,
    calibration_for,
    check_options,
    check_output_free,
    run_prune,
)
from portachat.compress.report import write_report
from portachat.device import Device, get_device
from portachat.i18n import _
from portachat.train.finetune import FinetuneOptions, run_finetune
from portachat.train.trainer import TrainConfig

HEAL_LR = 1e-4  # a pruned model is far from its optimum: fine-tuning's 2e-5 heals it too slowly
HEAL_RUN = "compress"


@dataclass
class HealRequest:
    student: Path  # the pruned checkpoint
    teacher: str  # the model it was pruned from
    data: str  # chat conversations to heal on
    steps: int
    seq_len: int
    device_batch_size: int
    runs_root: Path
    lr: float = HEAL_LR


HealStep = Callable[[HealRequest, Device, Callable[[str], None]], Path]


def finetune_heal(req: HealRequest, dev: Device, print_fn: Callable[[str], None]) -> Path:
    """Heal by next-token cross-entropy on `req.data` (full fine-tuning); the teacher is not read."""
    opts = FinetuneOptions(
        init=str(req.student), stage="sft", data=[req.data], lr=req.lr, num_iterations=req.steps,
        max_seq_len=req.seq_len, eval_examples=0, val_conversations=8,
        train=TrainConfig(run=HEAL_RUN, runs_root=str(req.runs_root), device_batch_size=req.device_batch_size,
                          eval_every=0, log_every=max(1, req.steps // 10), warmdown_ratio=0.5),
    )
    result = run_finetune(opts, dev=dev, print_fn=print_fn)
    if result.final_checkpoint is None:
        raise PruneError(_("the healing run wrote no checkpoint"))
    return result.final_checkpoint


@dataclass
class CompressOptions:
    prune: PruneOptions  # its output is ignored: the pruned model goes to DIR/pruned
    output: str
    heal_data: str | None = None  # chat conversations; None = --data when it is a chat dataset
    heal_steps: int = 200
    device_batch_size: int = 8
    eval_samples: int = 16  # held-out rows of --data (after the calibration rows) for perplexity
    gsm8k: str | None = None  # a GSM8K .jsonl for task accuracy (None = not measured)
    gsm8k_examples: int = 50
    decode_tokens: int = 64
    notes: list[str] = field(default_factory=list)


@dataclass
class CompressResult:
    report: Path
    pruned: Path
    healed: Path | None
    numbers: dict[str, ModelNumbers]


def run_compress(opts: CompressOptions, dev: Device | None = None, heal: HealStep = finetune_heal,
                 print_fn: Callable[[str], None] = print) -> CompressResult:
    output = Path(opts.output).expanduser()
    prune_opts = replace(opts.prune, output=str(output / "pruned"))
    check_output_free(output)
    check_options(replace(prune_opts, output=str(output)))  # everything but the output, before any work
    if not prune_opts.data:
        raise PruneError(_("compress measures importance and perplexity on --data FILE (a text file or a chat "
                           ".jsonl): pass it"))
    heal_data = opts.heal_data or (None if str(prune_opts.data).endswith((".txt", ".txt.gz")) else prune_opts.data)
    if opts.heal_steps > 0 and heal_data is None:
        raise PruneError(_("healing trains on conversations: pass --heal-data FILE.jsonl (or --heal-steps 0 to "
                           "skip healing)"))
    output.mkdir()
    dev = dev or get_device()
    pruned = run_prune(prune_opts, dev=dev, print_fn=print_fn).path
    healed = None
    if opts.heal_steps > 0:
        request = HealRequest(student=pruned, teacher=prune_opts.model, data=str(heal_data), steps=opts.heal_steps,
                              seq_len=prune_opts.seq_len, device_batch_size=opts.device_batch_size,
                              runs_root=output / "runs")
        healed = heal(request, dev, print_fn)
    skip = prune_opts.calibration_samples

    def held_out(base):
        return calibration_for(base, str(prune_opts.data), opts.eval_samples, prune_opts.seq_len, skip=skip)

    models = {"before": prune_opts.model, "pruned": str(pruned), **({"healed": str(healed)} if healed else {})}
    numbers = {}
    for name, spec in models.items():
        print_fn("[portachat] compress: " + _("measuring {name} ({path})").format(name=name, path=spec))
        numbers[name] = measure_model(spec, dev, held_out, opts.gsm8k, opts.gsm8k_examples, opts.decode_tokens)
    notes = [
        _("perplexity: {n} held-out rows of {tokens} tokens of {data} (after the {skip} calibration rows)").format(
            n=opts.eval_samples, tokens=prune_opts.seq_len, data=prune_opts.data, skip=skip),
        _("decode tok/s: one greedy stream of {n} tokens through the engine on {device}; measure on an idle "
          "machine before comparing").format(n=opts.decode_tokens, device=dev.type),
        _("healing: {steps} steps of next-token cross-entropy on {data}").format(steps=opts.heal_steps, data=heal_data)
        if healed else _("healing: skipped (--heal-steps 0)"),
        *opts.notes,
    ]
    report = write_report(output, {k: v.to_dict() for k, v in numbers.items()}, notes)
    print_fn("[portachat] compress: " + _("report: {path}").format(path=report))
    return CompressResult(report=report, pruned=pruned, healed=healed, numbers=numbers)
