"""The engine behind an asyncio server: one thread drives `LLMEngine.step()`, coroutines await outputs.

The engine is not thread-safe, so every call into it (add, abort, step, stats) happens on the
engine thread; coroutines send it commands through a queue and get RequestOutputs back on their
own event loop (`call_soon_threadsafe`, once per step and loop). The step itself is CPU-bound work
in torch, which releases the GIL, so the event loop stays responsive while the engine computes.
"""

from __future__ import annotations

import asyncio
import queue
import threading
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any, Protocol

from portachat.device.explain import diagnose
from portachat.engine.types import EngineError, RequestOutput, SamplingParams
from portachat.i18n import _


class EngineLike(Protocol):
    def add_request(self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None) -> str: ...
    def abort(self, request_id: str) -> None: ...
    def step(self) -> list[RequestOutput]: ...
    def has_unfinished(self) -> bool: ...
    def stats(self) -> dict: ...


class EngineShutdown(RuntimeError):
    """The engine is stopping and takes no new requests."""


class RequestObserver(Protocol):
    """Gets told about a request's life (metrics); called on the engine thread."""

    def on_output(self, request: RequestTiming, output: RequestOutput, now: float) -> None: ...
    def on_stats(self, stats: dict) -> None: ...


@dataclass
class RequestTiming:
    """When a request arrived and produced tokens (monotonic seconds), for TTFT / ITL / e2e latency."""

    arrival: float
    first_token: float | None = None
    last_token: float | None = None
    adapter: str | None = None  # the LoRA adapter it ran with: its metrics carry the adapter's name


@dataclass
class _Stream:
    loop: asyncio.AbstractEventLoop
    outputs: asyncio.Queue
    timing: RequestTiming
    completion_tokens: int = 0
    prompt_tokens: int = 0


@dataclass
class _Command:
    kind: str  # "add" | "abort" | "abort_all" | "call" | "stop"
    request_id: str = ""
    prompt_ids: list[int] = field(default_factory=list)
    params: SamplingParams | None = None
    stream: _Stream | None = None
    accepted: asyncio.Future | None = None
    reason: str = ""
    fn: Callable[[Any], Any] | None = None  # "call": run on the engine thread between steps


def _diagnosis_text(exc: BaseException) -> str:
    d = diagnose(exc)
    if d is None:
        return _("the engine failed while running this request: {error}").format(error=f"{type(exc).__name__}: {exc}")
    return d.line(exc)


class AsyncEngine:
    """Runs `engine` on a background thread; `generate()` streams one request's outputs."""

    def __init__(self, engine: EngineLike, observer: RequestObserver | None = None) -> None:
        self.engine = engine
        self.observer = observer
        self._commands: queue.SimpleQueue[_Command] = queue.SimpleQueue()
        self._streams: dict[str, _Stream] = {}  # touched only on the engine thread
        self._accepting = True
        self._active: set[str] = set()  # accepted and not yet finished; touched only by callers
        self._stats: dict = {"num_running": 0, "num_waiting": 0, "kv_cache_usage": 0.0}
        self._thread = threading.Thread(target=self._run, name="portachat-engine", daemon=True)
        self._thread.start()

    # ---------------------------------------------------------------- coroutine side

    async def add(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> RequestStream:
        """Submit a request; returns once the engine accepted it (raises EngineError /
        EngineShutdown when refused), so a server can still answer with an HTTP error status."""
        if not self._accepting:
            raise EngineShutdown(_("the server is shutting down and takes no new requests"))
        loop = asyncio.get_running_loop()
        request_id = request_id or uuid.uuid4().hex
        stream = _Stream(loop, asyncio.Queue(), RequestTiming(time.monotonic(), adapter=params.adapter),
                         prompt_tokens=len(prompt_ids))
        accepted = loop.create_future()
        self._commands.put(_Command("add", request_id, list(prompt_ids), params, stream, accepted))
        handle = RequestStream(self, request_id, stream)
        try:
            await accepted
        except BaseException:
            handle.abort()  # cancelled while waiting: the engine may have taken it meanwhile
            raise
        self._active.add(request_id)
        return handle

    async def generate(
        self, prompt_ids: list[int], params: SamplingParams, request_id: str | None = None
    ) -> AsyncIterator[RequestOutput]:
        """Yield the request's outputs as the engine makes them; the last one has `finished` set.

        Leaving the iteration early (client gone, task cancelled) aborts the request in the engine.
        """
        handle = await self.add(prompt_ids, params, request_id)
        try:
            async for output in handle:
                yield output
        finally:
            handle.abort()

    async def call(self, fn: Callable[[EngineLike], Any]) -> Any:
        """`fn(engine)` on the engine thread between two steps (e.g. adding a LoRA adapter), so it never
        races a step; returns its result or raises its exception."""
        loop = asyncio.get_running_loop()
        done = loop.create_future()
        self._commands.put(_Command("call", fn=lambda engine: _settle(loop, done, engine, fn), accepted=done))
        return await done

    def abort(self, request_id: str) -> None:
        """Stop a request and free its KV blocks; its stream ends with finish_reason "abort"."""
        self._commands.put(_Command("abort", request_id, reason="aborted"))

    def stop_accepting(self) -> None:
        """New requests are refused from now on (graceful shutdown); running ones go on."""
        self._accepting = False

    def abort_all(self) -> None:
        """End every request now; each stream gets a final output with finish_reason "abort"."""
        self._commands.put(_Command("abort_all", reason="the server is shutting down"))

    async def drain(self, timeout_s: float) -> bool:
        """Wait up to `timeout_s` for in-flight requests to finish; True when none are left."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.num_in_flight() == 0:
                return True
            await asyncio.sleep(0.05)
        return self.num_in_flight() == 0

    def shutdown(self, timeout_s: float = 10.0) -> None:
        """Abort everything and stop the engine thread."""
        self._accepting = False
        self._commands.put(_Command("stop"))
        self._thread.join(timeout_s)

    def stats(self) -> dict:
        """The engine's last stats (num_running, num_waiting, kv_cache_usage, ...), plus num_in_flight."""
        return dict(self._stats)

    def num_in_flight(self) -> int:
        """Requests accepted whose callers have not yet seen their end."""
        return len(self._active)

    @property
    def is_alive(self) -> bool:
        return self._thread.is_alive()

    # ---------------------------------------------------------------- engine thread

    def _run(self) -> None:
        try:
            while True:
                # Idle: sleep until a command arrives. Busy: take what is queued and step.
                block = not self.engine.has_unfinished()
                if not self._handle_commands(block):
                    break
                if self.engine.has_unfinished():
                    self._step()
                self._refresh_stats()
        finally:
            self._accepting = False
            self._finish_all("the engine stopped")

    def _handle_commands(self, block: bool) -> bool:
        """Apply queued commands; False when asked to stop."""
        try:
            command = self._commands.get(timeout=None) if block else self._commands.get_nowait()
        except queue.Empty:
            return True
        while True:
            if command.kind == "stop":
                return False
            self._apply(command)
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                return True

    def _apply(self, command: _Command) -> None:
        if command.kind == "add":
            stream, accepted = command.stream, command.accepted
            assert stream is not None and accepted is not None and command.params is not None
            try:
                if not self._accepting:
                    raise EngineShutdown(_("the server is shutting down and takes no new requests"))
                self.engine.add_request(command.prompt_ids, command.params, command.request_id)
            except (EngineError, EngineShutdown) as exc:
                _resolve(stream.loop, accepted, exc)
            except Exception as exc:  # noqa: BLE001 - a refusal we did not foresee still answers the caller
                _resolve(stream.loop, accepted, EngineError(_diagnosis_text(exc), kind="internal"))
            else:
                self._streams[command.request_id] = stream
                _resolve(stream.loop, accepted, None)
        elif command.kind == "abort":
            if command.request_id in self._streams:
                self._abort(command.request_id, command.reason)
        elif command.kind == "abort_all":
            for request_id in list(self._streams):
                self._abort(request_id, command.reason)
        elif command.kind == "call" and command.fn is not None:
            command.fn(self.engine)

    def _abort(self, request_id: str, reason: str) -> None:
        try:
            self.engine.abort(request_id)
        finally:
            stream = self._streams.pop(request_id)
            final = _final(request_id, "abort", stream, None)
            if reason:  # an abort the client did not ask for: its stream gets a last word
                self._deliver_one(stream, final)
            elif self.observer is not None:  # the client left: nobody to tell but the metrics
                self.observer.on_output(stream.timing, final, time.monotonic())

    def _step(self) -> None:
        try:
            outputs = self.engine.step()
        except Exception as exc:  # noqa: BLE001 - the engine should fail only the requests a step touched;
            # if the step itself raised, every request in it is lost: tell them why and keep serving.
            message = _diagnosis_text(exc)
            for request_id in list(self._streams):
                try:
                    self.engine.abort(request_id)
                except Exception:  # noqa: BLE001 - freeing is best effort after a failed step
                    pass
                stream = self._streams.pop(request_id)
                self._deliver_one(stream, _final(request_id, "error", stream, message))
            return
        now = time.monotonic()
        by_loop: dict[asyncio.AbstractEventLoop, list[tuple[_Stream, RequestOutput]]] = {}
        for output in outputs:
            stream = self._streams.get(output.request_id)
            if stream is None:
                continue  # aborted while the step ran
            stream.completion_tokens += len(output.token_ids)
            if output.token_ids:
                if stream.timing.first_token is None:
                    stream.timing.first_token = now
            if self.observer is not None:
                self.observer.on_output(stream.timing, output, now)
            if output.token_ids:
                stream.timing.last_token = now
            if output.finished:
                del self._streams[output.request_id]
            by_loop.setdefault(stream.loop, []).append((stream, output))
        for loop, items in by_loop.items():
            _call_soon(loop, _put_all, items)

    def _deliver_one(self, stream: _Stream, output: RequestOutput) -> None:
        if self.observer is not None:
            self.observer.on_output(stream.timing, output, time.monotonic())
        _call_soon(stream.loop, _put_all, [(stream, output)])

    def _finish_all(self, reason: str) -> None:
        for request_id in list(self._streams):
            try:
                self._abort(request_id, reason)
            except Exception:  # noqa: BLE001 - stopping: nothing more to free
                pass
        while True:  # refuse whatever was still queued
            try:
                command = self._commands.get_nowait()
            except queue.Empty:
                break
            if command.kind == "add" and command.stream is not None and command.accepted is not None:
                _resolve(command.stream.loop, command.accepted, EngineShutdown(_("the engine stopped")))

    def _refresh_stats(self) -> None:
        stats = dict(self.engine.stats())
        stats["num_in_flight"] = len(self._streams)
        self._stats = stats
        if self.observer is not None:
            self.observer.on_stats(stats)


class RequestStream:
    """One accepted request: iterate it for its outputs; `abort()` (idempotent) when done with it."""

    def __init__(self, engine: AsyncEngine, request_id: str, stream: _Stream) -> None:
        self.engine = engine
        self.request_id = request_id
        self._stream = stream
        self.finished = False

    @property
    def timing(self) -> RequestTiming:
        return self._stream.timing

    def __aiter__(self) -> AsyncIterator[RequestOutput]:
        return self._iterate()

    async def _iterate(self) -> AsyncIterator[RequestOutput]:
        while not self.finished:
            output: RequestOutput = await self._stream.outputs.get()
            if output.finished:
                self._done()
            yield output

    def abort(self) -> None:
        """Free the request's place in the engine unless it already finished (no further outputs)."""
        if not self.finished:
            self._done()
            self.engine._commands.put(_Command("abort", self.request_id))

    def _done(self) -> None:
        self.finished = True
        self.engine._active.discard(self.request_id)


def _final(request_id: str, reason: str, stream: _Stream, error: str | None) -> RequestOutput:
    return RequestOutput(
        request_id=request_id,
        text="",
        token_ids=[],
        finished=True,
        finish_reason=reason,  # type: ignore[arg-type]
        error=error,
        prompt_tokens=stream.prompt_tokens,
        completion_tokens=stream.completion_tokens,
    )


def _call_soon(loop: asyncio.AbstractEventLoop, fn: Callable, *args: Any) -> None:
    try:
        loop.call_soon_threadsafe(fn, *args)
    except RuntimeError:  # the caller's loop is closed: nobody is listening any more
        pass


def _put_all(items: list[tuple[_Stream, RequestOutput]]) -> None:
    for stream, output in items:
        stream.outputs.put_nowait(output)


def _settle(loop: asyncio.AbstractEventLoop, future: asyncio.Future, engine: Any, fn: Callable[[Any], Any]) -> None:
    """Run `fn(engine)` and hand its result or exception to `future` on its loop."""
    try:
        value, exc = fn(engine), None
    except Exception as error:  # noqa: BLE001 - raised in the awaiting coroutine
        value, exc = None, error

    def settle() -> None:
        if not future.done():
            future.set_exception(exc) if exc is not None else future.set_result(value)

    _call_soon(loop, settle)


def _resolve(loop: asyncio.AbstractEventLoop, future: asyncio.Future, exc: BaseException | None) -> None:
    def settle() -> None:
        if future.done():
            return
        if exc is None:
            future.set_result(None)
        else:
            future.set_exception(exc)

    _call_soon(loop, settle)
