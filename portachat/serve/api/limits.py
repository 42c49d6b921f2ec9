"""Guards in front of the routes: the request-body size limit and the API keys.

Both are plain ASGI middleware so they answer before FastAPI reads or parses anything: a 10 MB
body is refused after its first chunk past the limit, not buffered and then parsed.
"""

from __future__ import annotations

import hmac
import json

from portachat.i18n import _
from portachat.serve.api.errors import error_body
from portachat.serve.api.owner import owner_id

Scope = dict
PUBLIC_PATHS = ("/health",)  # answer load balancers without a key
PAGE_PATHS = ("/", "/index.html", "/favicon.ico")  # the static chat page holds no data; its API calls need the key
# With keys, only the admin key loads and unloads models and adds or removes adapters.
ADMIN_PATHS = ("/models/load", "/models/unload", "/v1/load_lora_adapter", "/v1/unload_lora_adapter")
UPLOAD_PATHS = ("/v1/files",)  # document uploads: multipart, and a larger size limit than prompts


class _BodyTooLarge(Exception):
    pass


async def send_error(send, status: int, message: str, param: str | None = None, code: str | None = None,
                     headers: list[tuple[bytes, bytes]] | None = None) -> None:
    body = json.dumps(error_body(status, message, param, code)).encode()
    await send({
        "type": "http.response.start",
        "status": status,
        "headers": [(b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    *(headers or [])],
    })
    await send({"type": "http.response.body", "body": body})


class BodySizeLimit:
    """413 for bodies over `max_bytes`, whether announced by Content-Length or streamed chunked."""

    def __init__(self, app, max_bytes: int, upload_bytes: int | None = None) -> None:
        self.app = app
        self.max_bytes = max_bytes
        self.upload_bytes = upload_bytes or max_bytes

    def _message(self, upload: bool) -> str:
        if upload:
            return _("The file is larger than this server's upload limit of {limit} bytes: start the server "
                     "with a larger `portachat serve --max-upload-bytes`.").format(limit=self.upload_bytes)
        return _("The request body is larger than this server's limit of {limit} bytes: send a shorter prompt, "
                 "or start the server with a larger `portachat serve --max-body-bytes`.").format(limit=self.max_bytes)

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        upload = scope["path"] in UPLOAD_PATHS
        limit = self.upload_bytes if upload else self.max_bytes
        for name, value in scope.get("headers", []):
            if name == b"content-length":
                try:
                    declared = int(value)
                except ValueError:
                    declared = 0
                if declared > limit:
                    await send_error(send, 413, self._message(upload), code="request_too_large",
                                     headers=[(b"connection", b"close")])
                    return
        received = 0
        started = False

        async def limited_receive():
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge
            return message

        async def tracking_send(message):
            nonlocal started
            if message["type"] == "http.response.start":
                started = True
            await send(message)

        try:
            await self.app(scope, limited_receive, tracking_send)
        except _BodyTooLarge:
            if not started:
                await send_error(send, 413, self._message(upload), code="request_too_large",
                                 headers=[(b"connection", b"close")])


class APIKeyCheck:
    """401 unless `Authorization: Bearer <key>` names one of the keys, on every route but /health and the
    page; 403 on the admin routes unless it names the admin key. Records who called in the request's
    state (owner.request_owner, owner.request_is_admin). With no keys at all, every caller is the
    anonymous admin (owner "")."""

    def __init__(self, app, api_keys: list[str], admin_api_key: str | None = None) -> None:
        self.app = app
        self.admin = f"Bearer {admin_api_key}".encode() if admin_api_key else None
        # The admin key opens every route too; each key is kept with its owner id.
        self.keys = [(f"Bearer {key}".encode(), owner_id(key)) for key in api_keys]
        if admin_api_key:
            self.keys.append((self.admin, owner_id(admin_api_key)))

    def _match(self, given: bytes) -> str | None:
        """The owner id of the key `given` names, else None. Compares against every key whatever
        matched, each in constant time, so the answer's timing says nothing about the keys."""
        found = None
        for expected, owner in self.keys:
            if hmac.compare_digest(given, expected):
                found = owner
        return found

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        state = scope.setdefault("state", {})
        if not self.keys:
            state["owner"], state["admin"] = "", True
            await self.app(scope, receive, send)
            return
        state["owner"], state["admin"] = "", False
        if scope["path"] in PUBLIC_PATHS + PAGE_PATHS or scope.get("method") == "OPTIONS":
            await self.app(scope, receive, send)
            return
        given = b""
        for name, value in scope.get("headers", []):
            if name == b"authorization":
                given = value
        owner = self._match(given)
        if owner is None:
            message = _("Invalid API key") if given else _("Missing API key")
            await send_error(
                send, 401,
                message + ": " + _("send the header 'Authorization: Bearer <key>' with a key given to "
                                   "`portachat serve --api-key` or $PORTACHAT_API_KEY (the openai client: "
                                   "OpenAI(api_key=...))."),
                code="invalid_api_key",
                headers=[(b"www-authenticate", b"Bearer")],
            )
            return
        admin = self.admin is not None and hmac.compare_digest(given, self.admin)
        if scope["path"] in ADMIN_PATHS and not admin:
            route = f"{scope.get('method', '')} {scope['path']}"
            await send_error(send, 403, admin_key_message(route, self.admin is not None), code="admin_key_required")
            return
        state["owner"], state["admin"] = owner, admin
        await self.app(scope, receive, send)


def admin_key_message(what: str, has_admin_key: bool) -> str:
    """Why a non-admin key may not do `what` (load, unload or pin a model), and how to."""
    if has_admin_key:
        return _("{what} is an admin action: send it with the admin key ('Authorization: Bearer <key>' with the key "
                 "given to `portachat serve --admin-api-key` or $PORTACHAT_ADMIN_API_KEY).").format(what=what)
    return _("{what} is an admin action and this server has no admin key: restart it with --admin-api-key (or "
             "$PORTACHAT_ADMIN_API_KEY) and send that key.").format(what=what)
