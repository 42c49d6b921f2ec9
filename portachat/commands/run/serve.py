"""`portachat serve --model PATH`: the OpenAI-compatible server and the web chat page.

What runs. The flags are in commands/serve.py, which `--help` imports without torch."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import threading
import traceback

from portachat.commands.run.inference import load_options
from portachat.commands.serve import api_keys
from portachat.device import get_device
from portachat.device.explain import diagnose, format_diagnosis
from portachat.device.inference import model_memory_budget
from portachat.engine.loading import load_served_model
from portachat.engine.workers import WorkerFailure
from portachat.i18n import _
from portachat.model.lora import find_adapter_dir
from portachat.serve.api import ServerSettings, create_app
from portachat.serve.api.server import make_server
from portachat.serve.registry import (
    ModelRegistry,
    ModelSpec,
    discover_models,
    parse_keep_alive,
    parse_model_arg,
)
from portachat.serve.registry.catalog import adapter_base, discover_adapters, given_model
from portachat.serve.registry.registry import RegistryEvents
from portachat.storage.atomic import CheckpointError

WORKER_FAILURE_GRACE_S = 1.0  # a dead worker: /health says 503 this long before the server exits


def model_specs(args: argparse.Namespace) -> list:
    """`--model [NAME=]PATH` (repeatable, loaded at start-up) and `--models-dir` (loaded on demand)."""
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
    parsed = [parse_model_arg(v) for v in values]
    folded = [path for name, path in parsed if name is None]
    if len(folded) > 1:
        raise SystemExit("portachat serve: " + _("error: {message}").format(message=_(
            "only one --lora PATH can be folded into the weights; name the others (--lora NAME=PATH) to serve "
            "them as adapters")))
    return (folded[0] if folded else None), [(name, path) for name, path in parsed if name is not None]


def adapter_specs(adapters: list[tuple[str, str]], models: list, models_dir: str | None) -> list:
    """Registry entries for `--lora NAME=PATH` and the adapters found under --models-dir."""
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
