"""`portachat serve --model PATH`: the OpenAI-compatible server and the web chat page."""

from __future__ import annotations

import argparse

from portachat.commands.common import EPILOG, flag, int_at_least, later, positive_int
from portachat.commands.inference import add_engine_flags, add_speculative_flags, add_tensor_parallel_flag
from portachat.engine.embeddings.modes import POOLING_MODES
from portachat.i18n import _
from portachat.serve.fallbacks import OPENAI_FALLBACK


def _float_above(minimum: float, inclusive: bool):
    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(_("expected a number, got {text}").format(text=repr(text))) from None
        if value < minimum or (value == minimum and not inclusive):
            bound = _("must be at least {minimum}, got {value}") if inclusive else _("must be above {minimum}, got {value}")
            raise argparse.ArgumentTypeError(bound.format(minimum=minimum, value=value))
        return value

    return parse


_positive_float = _float_above(0.0, inclusive=False)


def _fraction(text: str) -> float:
    value = _positive_float(text)
    if value > 1.0:
        raise argparse.ArgumentTypeError(_("must be in (0, 1], got {value}").format(value=value))
    return value
_nonneg_float = _float_above(0.0, inclusive=True)


def _template_file(path: str) -> str:
    """`--chat-template FILE` -> the Jinja text (its syntax is checked when the model loads)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as exc:
        raise argparse.ArgumentTypeError(_("cannot read {path}: {error}").format(path=path, error=exc.strerror or exc)) from None
    if not text.strip():
        raise argparse.ArgumentTypeError(_("{path} is empty: give a Jinja chat template file").format(path=path))
    return text


def _origins(text: str) -> list[str]:
    return [o.strip() for o in text.split(",") if o.strip()]


def api_keys(given: list[str] | None, env: str | None) -> list[str]:
    """The keys of `--api-key` (repeatable), else of `$PORTACHAT_API_KEY` (comma-separated), each once."""
    keys = [k.strip() for k in given] if given else [k.strip() for k in (env or "").split(",")]
    return list(dict.fromkeys(k for k in keys if k))


def _keep_alive(text: str) -> str:
    from portachat.serve.registry import parse_keep_alive  # deferred: loads torch

    try:
        parse_keep_alive(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return text


def register(sub) -> None:
    p = sub.add_parser(
        "serve", help=_("OpenAI-compatible server with a web chat page"), epilog=EPILOG,
        description=_("Serve models over HTTP: POST /v1/chat/completions and /v1/completions (streaming or not), "
                    "POST /v1/messages (Anthropic), GET /v1/models, POST /models/load and /models/unload, POST /v1/embeddings, "
                    "/v1/files and /v1/vector_stores (document QA; chat requests ground answers with \"documents\"), /health, "
                    "/metrics (Prometheus) and / (a chat page); POST /v1/responses (stored per API key), /v1/batches over "
                    "/v1/files, and POST /v1/load_lora_adapter and /v1/unload_lora_adapter. Any OpenAI client works: "
                    "base_url=http://HOST:PORT/v1. A sampling field a request leaves unset takes the model's "
                    "generation_config.json, else OpenAI's default (temperature {temperature})."
                    ).format(temperature=OPENAI_FALLBACK.temperature),
    )
    g = p.add_argument_group(_("model"))
    flag(g, "--model", action="append", default=None, metavar="[NAME=]PATH",
         help=_("our checkpoint directory, a Hugging Face model directory, or a .gguf file, loaded at start-up; "
              "repeat it to serve several models (requests pick one by name: --model small=PATH)"))
    flag(g, "--models-dir", default=None, metavar="DIR",
         help=_("serve every model below DIR (checkpoint runs, Hugging Face directories, .gguf files), named by "
              "folder or file stem and loaded on first request"))
    flag(g, "--keep-alive", type=_keep_alive, default="-1",
         help=_("how long a model stays loaded after its last request, as Ollama's keep_alive: 30s, 5m, 1h, 0 = "
              "unload after each request, -1 = until evicted (default -1); a request's keep_alive overrides it"))
    flag(g, "--max-loaded-models", type=positive_int, default=None,
         help=_("most models loaded at once; loading one more unloads the least recently used idle one (default: "
              "limited by memory only)"))
    flag(g, "--gpu-memory-utilization", type=_fraction, default=0.9,
         help=_("fraction of device memory (CPU: of the RAM available at start-up) the loaded models may hold "
              "together, weights and KV caches (default 0.9)"))
    flag(g, "--lora", action="append", default=None, metavar="[NAME=]PATH",
         help=_("a LoRA adapter directory (PEFT format, e.g. from `portachat train sft --lora-rank R`). NAME=PATH "
                "(repeatable) serves it as model NAME: requests for different adapters and the base share batches; "
                "a bare PATH folds it into the one --model's weights at load time"))
    flag(g, "--quantize", default=None, choices=["int8", "int4"],
         help=_("weight-only quantization: int8 per channel or int4 in groups of 32 (default: off); the device layer "
              "picks the kernels and refuses where none exists"))
    flag(g, "--chat-template", type=_template_file, default=None,
         help=_("a Jinja chat template file replacing the model's own (e.g. one that renders `tools` for tool calling; "
              "Hugging Face directories and GGUF files)"))
    flag(g, "--pooling", default=None, choices=list(POOLING_MODES),
         help=_("how POST /v1/embeddings pools hidden states into one vector (default: the model's sentence-transformers "
              "config, else mean); an embedding model (e.g. all-MiniLM-L6-v2) serves embeddings only"))
    flag(g, "--embedding-model", default=None, metavar="NAME",
         help=_("the model (a --model NAME) that embeds documents for /v1/vector_stores and grounded chat "
              "(default: the first embedding model served)"))
    flag(g, "--served-model-name", default=None, help=_("the model name clients send and /v1/models lists "
                                                      "(default: from the path)"))
    flag(g, "--device", default=None, help=_("cpu|cuda|rocm|dcu|npu|xpu|mps (default: auto-detect)"))
    flag(g, "--dtype", default=None, help=_("bf16|fp16|fp32 weights (default: the device's best for inference)"))
    flag(g, "--compile", default=None, choices=["0", "1"], help=_("torch.compile the decode step (default: per device policy)"))
    flag(g, "--enforce-eager", action="store_true",
         help=_("never replay decode steps from device graphs (default: CUDA graphs where the device policy allows)"))
    g = p.add_argument_group(_("engine"))
    add_tensor_parallel_flag(g)
    g.add_argument("--data-parallel-size", "--data_parallel_size", "-dp", type=positive_int, default=1,
         help=_("engine replicas, one per device (the i-th visible GPU/NPU/DCU/XPU; on a CPU they share it), "
              "each request going to the least busy one; with -tp N, each replica takes N devices (default 1)"))
    add_engine_flags(g, 32, _("requests queued beyond the running batch; more get 429 (default 256)"))
    flag(g, "--grammar-cache-mb", type=positive_int, default=256,
         help=_("memory for compiled structured-output grammars (JSON schemas, regexes), least recently used "
                "dropped first; a grammar needing more than this is refused with 400 (default 256)"))
    add_speculative_flags(p)
    g = p.add_argument_group(_("HTTP"))
    flag(g, "--host", default="127.0.0.1", help=_("address to listen on (default 127.0.0.1; 0.0.0.0 for every interface)"))
    flag(g, "--port", type=int_at_least(0), default=8000, help=_("port (default 8000)"))
    flag(g, "--api-key", action="append", default=None,
         help=_("require 'Authorization: Bearer KEY' on every route but /health; repeat it for several keys. Prefer "
                "$PORTACHAT_API_KEY (comma-separated keys; the default): other users of this machine can read a "
                "command line"))
    flag(g, "--admin-api-key", default=None,
         help=_("the key that may load, unload and pin models (POST /models/load, /models/unload, a request's "
                "keep_alive) when API keys are set (default: $PORTACHAT_ADMIN_API_KEY, else no one may)"))
    flag(g, "--allow-unload", action="store_true",
         help=_("let clients unload the models given at start-up (/models/unload, a short keep_alive); by default "
                "they stay loaded"))
    flag(g, "--cors-origins", type=_origins, default=None,
         help=_("comma-separated origins whose web pages may call the API, or '*' (default: none: only the server's "
                "own chat page; other pages get 403)"))
    flag(g, "--max-body-bytes", type=positive_int, default=1_000_000, help=_("largest request body; larger get 413 (default 1000000)"))
    flag(g, "--max-upload-bytes", type=positive_int, default=64 * 2**20,
         help=_("largest document upload (POST /v1/files); larger get 413 (default 64 MiB)"))
    flag(g, "--max-messages", type=positive_int, default=512, help=_("most messages in one chat request (default 512)"))
    flag(g, "--docs-max-bytes", type=positive_int, default=8 * 2**30,
         help=_("document store quota: uploaded files plus their chunks and vectors; past it uploads and attaches "
                "get 400 (default 8 GiB)"))
    flag(g, "--docs-max-files", type=positive_int, default=10_000,
         help=_("most uploaded files kept at once; past it uploads get 400 (default 10000)"))
    flag(g, "--shutdown-timeout", type=_nonneg_float, default=10.0,
         help=_("on SIGTERM / Ctrl-C, seconds in-flight requests get to finish before they are ended (default 10)"))
    flag(g, "--log-level", default="info", choices=["debug", "info", "warning", "error"], help=_("server log level"))
    p.set_defaults(func=later("serve", "cmd_serve"))
