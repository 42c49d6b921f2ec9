"""`portachat serve --model PATH`: the OpenAI-compatible server and the web chat page."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import traceback

from portachat.commands.common import EPILOG, flag, int_at_least, positive_int
from portachat.commands.inference import (
    add_engine_flags,
    add_speculative_flags,
    add_tensor_parallel_flag,
    load_options,
)
from portachat.engine.embeddings.config import POOLING_MODES
from portachat.i18n import _
from portachat.serve.api.request_params import OPENAI_FALLBACK


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


WORKER_FAILURE_GRACE_S = 1.0  # a dead worker: /health says 503 this long before the server exits
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


def model_specs(args: argparse.Namespace) -> list:
    """`--model [NAME=]PATH` (repeatable, loaded at start-up) and `--models-dir` (loaded on demand)."""
    from portachat.serve.registry import discover_models, parse_model_arg  # deferred: loads torch
    from portachat.serve.registry.catalog import given_model  # deferred: loads torch

    given = [parse_model_arg(text) for text in args.model or []]
    if args.served_model_name and len(given) != 1:
        raise SystemExit("portachat serve: " + _("error: {message}").format(message=_(
            "--served-model-name names the one --model; with several models use --model NAME=PATH for each")))
    specs = [given_model(path, args.served_model_name or name) for name, path in given]
    if args.models_dir:
        try:
            found = discover_models(args.models_dir)
        except FileNotFoundError as exc:
            raise SystemExit("portachat serve: " + _("error: {message}").format(message=exc)) from None
        if not found and not specs:
            raise SystemExit("portachat serve: " + _("error: {message}").format(message=_(
                "--models-dir {dir} holds no model (checkpoint directories, Hugging Face model directories or "
                ".gguf files)").format(dir=args.models_dir)))
        taken = {s.name for s in specs}
        specs += [s for s in found if s.name not in taken]
    if not specs:
        raise SystemExit("portachat serve: " + _("error: {message}").format(
            message=_("give --model PATH (repeatable) or --models-dir DIR")))
    folded, adapters = lora_args(args.lora or [])
    if folded and len(specs) > 1:
        raise SystemExit("portachat serve: " + _("error: {message}").format(message=_(
            "--lora PATH folds an adapter into one model; serve it with a single --model, or name it "
            "(--lora NAME=PATH) to serve it beside the base")))
    return specs + adapter_specs(adapters, specs, args.models_dir)


def lora_args(values: list[str]) -> tuple[str | None, list[tuple[str, str]]]:
    """`--lora PATH` (folded into the one model's weights; at most one) and `--lora NAME=PATH`
    (served as model NAME on its base's engine, batched with it)."""
    from portachat.serve.registry import parse_model_arg  # deferred: loads torch

    parsed = [parse_model_arg(v) for v in values]
    folded = [path for name, path in parsed if name is None]
    if len(folded) > 1:
        raise SystemExit("portachat serve: " + _("error: {message}").format(message=_(
            "only one --lora PATH can be folded into the weights; name the others (--lora NAME=PATH) to serve "
            "them as adapters")))
    return (folded[0] if folded else None), [(name, path) for name, path in parsed if name is not None]


def adapter_specs(adapters: list[tuple[str, str]], models: list, models_dir: str | None) -> list:
    """Registry entries for `--lora NAME=PATH` and the adapters found under --models-dir."""
    from portachat.model.lora import find_adapter_dir  # deferred: loads torch
    from portachat.serve.registry import ModelSpec  # deferred: loads torch
    from portachat.serve.registry.catalog import adapter_base, discover_adapters  # deferred: loads torch
    from portachat.storage.atomic import CheckpointError  # deferred: loads torch

    out = []
    pinned = {s.name for s in models if s.pinned}
    only = models[0].name if len(models) == 1 else None  # the one served model is every adapter's base
    for name, path in adapters:
        try:
            directory = find_adapter_dir(path)
        except CheckpointError as exc:
            raise SystemExit("portachat serve: " + _("error: {message}").format(message=exc)) from None
        base = adapter_base(directory, models) or only
        if base is None:
            raise SystemExit("portachat serve: " + _("error: {message}").format(message=_(
                "--lora {name}={path}: its base_model_name_or_path names none of the served models; with several "
                "models, set it to the base's name or path").format(name=name, path=path)))
        out.append(ModelSpec(name, str(directory), pinned=base in pinned, base=base))  # loads with its base
    if models_dir:
        taken = {s.name for s in models} | {s.name for s in out}
        out += [s for s in discover_adapters(models_dir, models) if s.name not in taken]
    return out


def cmd_serve(args: argparse.Namespace) -> int:
    from portachat.device import get_device  # deferred: loads torch
    from portachat.device.explain import diagnose, format_diagnosis  # deferred: loads torch
    from portachat.device.inference import model_memory_budget  # deferred: loads torch
    from portachat.engine.loading import load_served_model  # deferred: loads torch
    from portachat.serve.api import ServerSettings, create_app  # deferred: loads torch
    from portachat.serve.api.server import make_server  # deferred: loads torch
    from portachat.serve.registry import ModelRegistry, parse_keep_alive  # deferred: loads torch
    from portachat.serve.registry.registry import RegistryEvents  # deferred: loads torch

    specs = model_specs(args)
    name = specs[0].name
    if args.embedding_model and args.embedding_model not in {s.name for s in specs}:
        raise SystemExit("portachat serve: " + _("error: {message}").format(message=_(
            "--embedding-model {name} is not a served model ({served}); add it with --model {name}=PATH").format(
                name=args.embedding_model, served=", ".join(s.name for s in specs))))
    settings = ServerSettings(
        served_model_name=name,
        api_keys=api_keys(args.api_key, os.environ.get("PORTACHAT_API_KEY")),
        admin_api_key=args.admin_api_key or os.environ.get("PORTACHAT_ADMIN_API_KEY") or None,
        allow_unload=args.allow_unload,
        host=args.host,
        cors_origins=args.cors_origins or [],
        max_body_bytes=args.max_body_bytes,
        max_upload_bytes=args.max_upload_bytes,
        max_messages=args.max_messages,
        shutdown_grace_s=args.shutdown_timeout,
        embedding_model=args.embedding_model,
        docs_max_bytes=args.docs_max_bytes,
        docs_max_files=args.docs_max_files,
    )
    options = dataclasses.replace(load_options(args), lora=lora_args(args.lora or [])[0],
                                  grammar_cache_mb=args.grammar_cache_mb)
    url = f"http://{args.host}:{args.port}"
    failure: list[BaseException] = []
    device = get_device(kind=args.device, dtype=None, compile=None)
    budget = model_memory_budget(device, args.gpu_memory_utilization)

    def load(spec):
        print("[portachat] " + _("loading {name} from {path} ...").format(name=spec.name, path=spec.path),
              file=sys.stderr, flush=True)
        served = load_served_model(dataclasses.replace(options, model=spec.path), embedding_models=True,
                                   on_worker_failure=on_worker_failure, source=spec.source)
        print("[portachat] " + _("{name} ready: {description}").format(name=spec.name,
                                                                        description=served.description),
              file=sys.stderr, flush=True)
        return served

    def on_worker_failure(message: str) -> None:
        from portachat.engine.workers import WorkerFailure  # deferred: loads torch

        failure.append(WorkerFailure(message))
        # /health answers 503 meanwhile; in-flight requests have had their error from the failed step.
        threading.Timer(WORKER_FAILURE_GRACE_S, server.stop, kwargs={"failed": True}).start()

    registry = ModelRegistry(
        specs, load, keep_alive=parse_keep_alive(args.keep_alive), max_loaded=args.max_loaded_models,
        budget_bytes=budget.value, events=RegistryEvents(after_unload=device.empty_cache),
    )

    def on_load_error(exc: BaseException) -> None:
        failure.append(exc)
        server.stop(failed=True)

    app = create_app(settings, on_load_error=on_load_error, registry=registry)
    server = make_server(app, args.host, args.port, args.shutdown_timeout, log_level=args.log_level)
    pinned = [s.name for s in specs if s.pinned]
    on_demand = [s.name for s in specs if not s.pinned]
    print("[portachat] " + _("listening on {url} (GET /health answers 503 until the start-up models are loaded: "
                             "{models})").format(url=url, models=", ".join(pinned) or "-"),
          file=sys.stderr, flush=True)
    if len(specs) > 1:
        print("[portachat] " + _("models: {pinned} at start-up; {on_demand} on first request. Memory budget "
                                 "{budget}; --max-loaded-models {max_loaded}; --keep-alive {keep_alive}").format(
            pinned=", ".join(pinned) or "-", on_demand=", ".join(on_demand) or "-", budget=budget.reason,
            max_loaded=args.max_loaded_models or "-", keep_alive=args.keep_alive), file=sys.stderr, flush=True)
    print("[portachat] " + _("serving '{name}' at {url}  (OpenAI API: {url}/v1, chat page: {url}/, metrics: "
                             "{url}/metrics)").format(name=name, url=url)
          + ("  " + _("[API key required]") if settings.has_keys else ""), file=sys.stderr, flush=True)
    server.run()
    if failure:
        exc = failure[0]
        if args.debug:
            traceback.print_exception(exc)
        if type(exc).__name__ == "WorkerFailure":
            print("portachat: " + _("error: {message}").format(message=_("{error}; the server stopped").format(
                error=exc)), file=sys.stderr)
            return 1
        diagnosis = diagnose(exc)
        print(format_diagnosis(diagnosis) if diagnosis else "portachat: " + _("error: {message}").format(
            message=_("could not load the model: {error}").format(error=exc)), file=sys.stderr)
        return 1
    if not server.started:  # e.g. the port was taken; uvicorn has said why
        print("portachat: " + _("error: {message}").format(message=_(
            "could not listen on {host}:{port}; pick another --port").format(host=args.host, port=args.port)),
              file=sys.stderr)
        return 1
    return 0


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
    p.set_defaults(func=cmd_serve)
