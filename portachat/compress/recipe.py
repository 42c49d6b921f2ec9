"""`portachat compress`: prune -> heal -> evaluate -> report, in one output directory:

    DIR/pruned/                 the pruned checkpoint (portachat prune)
    DIR/runs/compress/distill/...   the healing run's checkpoints (`sft/` with --heal sft)
    DIR/report.md, report.json, compress.png   before / pruned / healed numbers

Healing goes through one interface, `HealStep` (compress/heal.py): by default distillation from the
model it was pruned from, as Minitron heals; `--heal sft` fine-tunes on the labels instead.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

from portachat.compress.heal import HEAL_NOTES, HEALS, HealRequest, HealStep
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
from portachat.i18n import _, gettext


@dataclass
class CompressOptions:
    prune: PruneOptions  # its output is ignored: the pruned model goes to DIR/pruned
    output: str
    heal_data: str | None = None  # chat conversations; None = --data when it is a chat dataset
    heal: str = "distill"  # a key of HEALS: distill (from the unpruned model) or sft (cross-entropy)
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


def run_compress(opts: CompressOptions, dev: Device | None = None, heal: HealStep | None = None,
                 print_fn: Callable[[str], None] = print) -> CompressResult:
    """Prune, heal with `heal` (None: the step `opts.heal` names), measure, write the report."""
    output = Path(opts.output).expanduser()
    prune_opts = replace(opts.prune, output=str(output / "pruned"))
    check_output_free(output)
    if opts.heal not in HEALS:
        raise PruneError(_("unknown heal step {name}: pass --heal with one of {names}").format(name=repr(opts.heal),
                                                                             names=", ".join(HEALS)))
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
        healed = (heal or HEALS[opts.heal])(request, dev, print_fn)
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
        gettext(HEAL_NOTES[opts.heal]).format(steps=opts.heal_steps, teacher=prune_opts.model, data=heal_data)
        if healed else _("healing: skipped (--heal-steps 0)"),
        *opts.notes,
    ]
    report = write_report(output, {k: v.to_dict() for k, v in numbers.items()}, notes,
                          heal=opts.heal if healed else None)
    print_fn("[portachat] compress: " + _("report: {path}").format(path=report))
    return CompressResult(report=report, pruned=pruned, healed=healed, numbers=numbers)
