"""Who sent a request: the stable, non-secret id of the API key it used, and whether that key is the
admin key. The key check (limits.APIKeyCheck) writes both into the request's state after it
authenticates; routes read them here (files and vector stores belong to the key that made them)."""

from __future__ import annotations

import hashlib

from starlette.requests import HTTPConnection


def owner_id(key: str) -> str:
    """The first 16 hex digits of sha256(key): names the key in storage and logs without revealing it."""
    return hashlib.sha256(key.encode()).hexdigest()[:16]


def request_owner(request: HTTPConnection) -> str:
    """The id of the key that authenticated `request`; "" on a server without keys."""
    return str(getattr(request.state, "owner", ""))


def request_is_admin(request: HTTPConnection) -> bool:
    """Whether `request` may load, unload and pin models: it used the admin key, or the server has no
    keys at all. False when no key check ran (fail closed)."""
    return bool(getattr(request.state, "admin", False))
