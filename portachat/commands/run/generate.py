"""`portachat generate --model PATH --input prompts.jsonl --output out.jsonl`: batch inference.

What runs. The flags are in commands/generate.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from tqdm import tqdm

from portachat.commands.run.inference import load_options, sampling_params
from portachat.engine.loading import load_served_model
from portachat.engine.served import ServedModel
from portachat.i18n import _
from portachat.serve.api.local import local_app
from portachat.serve.api.state import ServerSettings
from portachat.serve.batch import BatchInputError, generate_file, read_input
from portachat.serve.fallbacks import GENERATE_FALLBACK


def cmd_generate(args: argparse.Namespace) -> int:
    input_path, output_path = Path(args.input), Path(args.output)
    if not input_path.is_file():
        raise BatchInputError(_("--input {path} does not exist (expected a JSONL file)").format(path=input_path))
    if output_path.resolve() == input_path.resolve():
        raise BatchInputError(_("--output must differ from --input (the output is appended to)"))

    def load() -> ServedModel:  # called once `batch` (below) has passed its checks
        print("[portachat] " + _("loading {model} ...").format(model=args.model), file=sys.stderr, flush=True)
        served = load_served_model(load_options(args), embedding_models=batch.embeds)
        print(f"[portachat] {served.description}", file=sys.stderr, flush=True)
        return served

    app = local_app(ServerSettings(served_model_name=args.model), load)
    batch = read_input(input_path, app)  # every line checked before the model loads
    bars: list = []  # the bar starts with the first answer, below the loading messages

    def progress(done: int, total: int, tokens: int, seconds: float) -> None:
        if not bars:
            bars.append(tqdm(total=total, unit="row", file=sys.stderr, dynamic_ncols=True))
        bars[0].n = done
        bars[0].set_postfix_str(f"{tokens / max(seconds, 1e-9):.1f} tok/s")
        bars[0].refresh()

    try:
        summary = generate_file(
            app, batch, output_path, lambda served: sampling_params(args, served.generation_defaults, GENERATE_FALLBACK),
            max_in_flight=min(args.max_num_seqs * 2, args.max_num_seqs + args.max_waiting), progress=progress,
        )
    finally:
        for bar in bars:
            bar.close()
    rate = summary.completion_tokens / max(summary.seconds, 1e-9)
    print(
        "[portachat] " + _("{written} rows written to {path} ({skipped} already done), "
                           "{tokens} tokens in {seconds}s = {rate} tok/s").format(
            written=summary.written, path=output_path, skipped=summary.skipped, tokens=summary.completion_tokens,
            seconds=f"{summary.seconds:.1f}", rate=f"{rate:.1f}"),
        file=sys.stderr,
    )
    if summary.failed:
        print("[portachat] " + _("{failed} of them answered an error (the row's 'error', or a batch line's "
                                 "response.status_code and body, says why)").format(failed=summary.failed),
              file=sys.stderr)
    return 0
