"""The guard against web pages driving the server: which Host, Origin and Content-Type a request may carry.

A browser lets any page send "simple" requests (a form post, a text/plain fetch) to any address,
127.0.0.1 included, without asking the server first. Three checks close that door:
- Host: on a loopback bind, the Host header must name loopback (localhost, 127.x, [::1]); a page
  that rebinds its own domain to 127.0.0.1 (DNS rebinding) still sends its own name.
- Origin: a browser names the page's origin on every cross-site request; only the server's own
  page (same host and port as the request's Host) and the --cors-origins may call.
- Content-Type: POST bodies are JSON (`application/json`, `+json`, any charset); the file upload
  takes multipart/form-data. Browsers cannot send JSON cross-site without a CORS preflight.
Each refusal answers before the body is read, in OpenAI's error shape.
"""

from __future__ import annotations

import ipaddress
from urllib.parse import urlsplit

from portachat.i18n import _
from portachat.serve.api.limits import UPLOAD_PATHS, Scope, send_error

BODY_METHODS = ("POST", "PUT", "PATCH")
DEFAULT_PORTS = {"http": 80, "https": 443, "ws": 80, "wss": 443}


def is_loopback_name(host: str) -> bool:
    """localhost, 127.0.0.0/8 or ::1 (a bind address or a Host header's host, without brackets)."""
    host = host.strip().lower().rstrip(".")
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


def split_host(value: str) -> tuple[str, int | None]:
    """A Host header -> (host without brackets, port or None): "a:80", "[::1]:8000", "localhost"."""
    value = value.strip().lower()
    if value.startswith("["):
        host, _sep, rest = value[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif value.count(":") == 1:
        host, port = value.split(":")
    else:  # no port (or a bare IPv6 address, which Host headers do not carry)
        host, port = value, ""
    return host, int(port) if port.isdigit() else None


def same_origin(origin: str, host_header: str) -> bool:
    """Whether the page at `origin` is this server's own, as reached through `host_header`. A Host
    without a port means the default port of the scheme the page used (behind a TLS proxy too)."""
    try:
        parts = urlsplit(origin)
        origin_host, origin_port = (parts.hostname or ""), parts.port
    except ValueError:
        return False
    default = DEFAULT_PORTS.get(parts.scheme)
    host, port = split_host(host_header)
    return bool(origin_host) and origin_host == host and (origin_port or default) == (port or default)


def _media_type(value: str) -> str:
    return value.split(";", 1)[0].strip().lower()


def is_json_type(value: str) -> bool:
    media = _media_type(value)
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


class RequestGuard:
    """403 for a non-loopback Host on a loopback bind and for a cross-site Origin not in `cors_origins`;
    415 for a body that is not JSON (multipart on the upload route). Install it outermost."""

    def __init__(self, app, bind_host: str, cors_origins: list[str]) -> None:
        self.app = app
        self.loopback = is_loopback_name(bind_host.strip("[]"))
        self.any_origin = "*" in cors_origins
        self.origins = {o.rstrip("/").lower() for o in cors_origins}

    async def __call__(self, scope: Scope, receive, send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        headers = {name: value.decode("latin-1") for name, value in scope.get("headers", [])}
        refusal = self._refusal(scope, headers)
        if refusal is not None:
            status, message, code = refusal
            await send_error(send, status, message, code=code)
            return
        await self.app(scope, receive, send)

    def _refusal(self, scope: Scope, headers: dict[bytes, str]) -> tuple[int, str, str] | None:
        host_header = headers.get(b"host", "")
        port = (scope.get("server") or ("", 0))[1]
        if self.loopback and host_header and not is_loopback_name(split_host(host_header)[0]):
            return 403, _("The Host header '{host}' does not name this machine's loopback, and this server listens on "
                          "loopback only: a web page may be reaching it through DNS rebinding. Call it as "
                          "http://127.0.0.1:{port} or http://localhost:{port}; to serve other hosts, start it with "
                          "--host 0.0.0.0 and an API key.").format(host=host_header, port=port), "forbidden_host"
        origin = headers.get(b"origin")
        if origin is not None and not self._origin_allowed(origin, host_header):
            return 403, _("Requests from the web page at {origin} are refused: it is neither this server's own page "
                          "nor an origin allowed by `portachat serve --cors-origins`. To let that page call the API, "
                          "restart the server with --cors-origins {origin}.").format(origin=origin), "forbidden_origin"
        if scope.get("method") in BODY_METHODS:
            return self._body_refusal(scope, headers)
        return None

    def _origin_allowed(self, origin: str, host_header: str) -> bool:
        return self.any_origin or origin.rstrip("/").lower() in self.origins or same_origin(origin, host_header)

    @staticmethod
    def _body_refusal(scope: Scope, headers: dict[bytes, str]) -> tuple[int, str, str] | None:
        given = headers.get(b"content-type")
        has_body = headers.get(b"content-length", "0").strip() not in ("", "0") or b"transfer-encoding" in headers
        if given is None and not has_body:
            return None  # nothing to parse (e.g. a POST that acts on its path)
        path, method = scope["path"], scope.get("method")
        shown = given if given is not None else _("no Content-Type")
        if path in UPLOAD_PATHS:
            if given is not None and _media_type(given) == "multipart/form-data":
                return None
            return 415, _("{method} {path} takes a multipart/form-data upload (fields 'file' and 'purpose'), got "
                          "{given}.").format(method=method, path=path, given=shown), "unsupported_media_type"
        if given is not None and is_json_type(given):
            return None
        return 415, _("The body of {method} {path} must be JSON, sent with the header 'Content-Type: "
                      "application/json' (got {given}).").format(method=method, path=path, given=shown), \
            "unsupported_media_type"
