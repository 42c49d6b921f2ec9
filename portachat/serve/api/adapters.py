"""LoRA adapters added and removed while the server runs, with vLLM's routes and bodies:

    POST /v1/load_lora_adapter    {"lora_name": NAME, "lora_path": PATH}  -> a registry row NAME on its base
    POST /v1/unload_lora_adapter  {"lora_name": NAME}                     -> the row goes (after its requests)

An adapter loaded here is the same registry row `--lora NAME=PATH` makes at start-up: its base is the
served model its adapter_config.json names (base_model_name_or_path), else the one model served; it
joins its base's engine at once when that is loaded. With API keys both routes need the admin key
(limits.ADMIN_PATHS). Unloading waits for the requests already running on the adapter; new ones
find no such model. Both answer plain text, as vLLM does."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import PlainTextResponse, Response
from pydantic import BaseModel, ConfigDict, Field

from portachat.i18n import _
from portachat.model.lora import find_adapter_dir, load_lora
from portachat.serve.api.errors import APIError
from portachat.serve.api.protocol import parse_body
from portachat.serve.api.state import ServerState
from portachat.serve.registry import ModelSpec
from portachat.serve.registry.catalog import adapter_base
from portachat.serve.registry.registry import LoadFailed, in_daemon_thread
from portachat.storage.atomic import CheckpointError
from portachat.storage.paths import portachat_home


class LoadAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1, max_length=200, pattern=r"^[\w.:-]+$")
    lora_path: str = Field(min_length=1)


class UnloadAdapter(BaseModel):
    model_config = ConfigDict(extra="ignore")
    lora_name: str = Field(min_length=1)


def _base_for(server: ServerState, directory: Any, name: str) -> str:
    models = [e.spec for e in server.registry.entries.values() if not e.is_adapter]
    base = adapter_base(directory, models) or (models[0].name if len(models) == 1 else None)
    if base is None:
        raise APIError(400, _("The LoRA adapter '{name}': its adapter_config.json's base_model_name_or_path names none "
                              "of the served models ({models}); set it to the base model's name or path.").format(
            name=name, models=", ".join(m.name for m in models)), param="lora_path", code="invalid_value")
    return base


def _on_this_disk(spec: str) -> bool:
    """A path on the server's disk, or a run under PORTACHAT_HOME/runs: what a client may name. The model
    resolver would also download hf:/modelscope: ids, which a request must not be able to start."""
    return Path(spec).expanduser().exists() or (portachat_home() / "runs" / spec).exists()


async def load_lora_adapter(request: Request) -> Response:
    req = parse_body(await request.body(), LoadAdapter)
    server: ServerState = request.app.state.server
    server.require_ready()
    registry = server.registry
    if req.lora_name in registry.entries:
        raise APIError(400, _("The LoRA adapter '{name}' has already been loaded (a model or adapter of that name is "
                              "served): unload it first with POST /v1/unload_lora_adapter, or pick another "
                              "lora_name.").format(name=req.lora_name), param="lora_name", code="invalid_value")
    if not _on_this_disk(req.lora_path):
        raise APIError(400, _("lora_path {path} is not a directory on the server: a request never starts a hub "
                              "download. Give the adapter's directory (or a run under PORTACHAT_HOME/runs), or "
                              "download it first and pass the local path.").format(path=req.lora_path),
                       param="lora_path", code="invalid_value")
    try:
        directory = await in_daemon_thread(find_adapter_dir, req.lora_path)  # follows `latest` pointers on disk
    except CheckpointError as exc:
        raise APIError(400, str(exc), param="lora_path", code="invalid_value") from None
    spec = ModelSpec(req.lora_name, str(directory), base=_base_for(server, directory, req.lora_name))
    if registry.get(spec.base).state != "loaded":  # read the files now: a broken adapter fails here, not later
        try:
            await in_daemon_thread(load_lora, directory)
        except (CheckpointError, OSError, ValueError, KeyError) as exc:
            raise APIError(400, _("The LoRA adapter at {path} cannot be read: {error}").format(
                path=req.lora_path, error=exc), param="lora_path", code="invalid_value") from None
    registry.add_adapter(spec)
    if registry.get(spec.base).state == "loaded":  # into the running engine now, so the next request finds it there
        try:
            await registry.load(spec.name)
        except LoadFailed as exc:
            await registry.remove_adapter(spec.name)
            raise APIError(400, _("The LoRA adapter at {path} cannot be read: {error}").format(
                path=req.lora_path, error=exc), param="lora_path", code="invalid_value") from None
    return PlainTextResponse(_("Success: LoRA adapter '{name}' added successfully.").format(name=req.lora_name))


async def unload_lora_adapter(request: Request) -> Response:
    req = parse_body(await request.body(), UnloadAdapter)
    server: ServerState = request.app.state.server
    entry = server.registry.entries.get(req.lora_name)
    if entry is None or not entry.is_adapter:
        raise APIError(404, _("The LoRA adapter '{name}' cannot be found: GET /v1/models lists the adapters (those "
                              "with a parent).").format(name=req.lora_name), param="lora_name", code="model_not_found")
    if entry.spec.pinned and not server.settings.allow_unload:
        raise APIError(403, _("The LoRA adapter '{name}' was given at start-up (--lora) and clients may not unload it: "
                              "restart the server with --allow-unload to allow that.").format(name=req.lora_name),
                       param="lora_name", code="unload_not_allowed")
    await server.registry.remove_adapter(req.lora_name)
    return PlainTextResponse(_("Success: LoRA adapter '{name}' removed successfully.").format(name=req.lora_name))


ROUTES = [("/v1/load_lora_adapter", load_lora_adapter, "POST"), ("/v1/unload_lora_adapter", unload_lora_adapter, "POST")]
