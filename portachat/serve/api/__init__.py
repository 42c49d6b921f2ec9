"""The OpenAI-compatible HTTP server over the engine: routes, protocol, SSE, errors, limits, metrics."""

from portachat.serve.api.app import begin_graceful_shutdown, chat_page_html, create_app
from portachat.serve.api.state import ServedModel, ServerSettings

__all__ = ["ServedModel", "ServerSettings", "begin_graceful_shutdown", "chat_page_html", "create_app"]
