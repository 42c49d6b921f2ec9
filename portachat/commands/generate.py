"""`portachat generate --model PATH --input prompts.jsonl --output out.jsonl`: batch inference."""

from __future__ import annotations

from portachat.commands.common import EPILOG, flag, later
from portachat.commands.inference import add_model_flags, add_sampling_flags
from portachat.i18n import _
from portachat.serve.fallbacks import GENERATE_FALLBACK


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
    p.set_defaults(func=later("generate", "cmd_generate"))
