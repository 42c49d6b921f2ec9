"""`portachat generate --model PATH --input prompts.jsonl --output out.jsonl`: batch inference."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from portachat.commands.common import EPILOG, flag
from portachat.commands.inference import add_model_flags, add_sampling_flags, load_options, sampling_params
from portachat.engine.served import ServedModel
from portachat.i18n import _
from portachat.serve.api.local import local_app
from portachat.serve.api.state import ServerSettings
from portachat.serve.batch import GENERATE_FALLBACK, BatchInputError, generate_file, read_input


def cmd_generate(args: argparse.Namespace) -> int:
    from tqdm import tqdm  # deferred: optional progress bar library, loaded only when generating

    from portachat.engine.loading import load_served_model  # deferred: loads torch

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


def register(sub) -> None:
    p = sub.add_parser(
        "generate", help=_("batch inference: JSONL prompts or conversations in, JSONL out (resumable)"), epilog=EPILOG,
        description=_("Each input line is {\"prompt\": TEXT} (continued as text) or {\"messages\": [...]} (answered as "
                    "the assistant), with an optional \"id\" and per-row max_tokens/temperature/top_p/top_k/seed/stop. "
                    "Output lines: {id, output, finish_reason, prompt_tokens, completion_tokens}. Each row is written "
                    "durably as it finishes; rerunning the command skips rows already in --output.") + " " +
                    _("The input may instead be an OpenAI batch file, the lines POST /v1/batches takes "
                      "({\"custom_id\", \"method\": \"POST\", \"url\", \"body\"} for /v1/chat/completions, "
                      "/v1/completions or /v1/embeddings); its output lines are OpenAI's batch output lines. Either "
                      "way every line is checked before any runs, and runs as the server's /v1/batches runs it; the "
                      "sampling flags fill what a line leaves unset."),
    )
    flag(p, "--input", required=True, help=_("JSONL file of prompts or conversations"))
    flag(p, "--output", required=True, help=_("JSONL file to append results to (created if missing)"))
    add_model_flags(p, max_num_seqs=32)
    add_sampling_flags(p, GENERATE_FALLBACK)
    p.set_defaults(func=cmd_generate)
