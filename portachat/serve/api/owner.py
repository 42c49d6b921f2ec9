"""Who made a request: a stable, non-secret id of the API key it used ("" when the server has no keys)."""

from __future__ import annotations

from starlette.requests import Request


def request_owner(request: Request) -> str:
    return getattr(request.state, "owner", "")
