"""The model registry: name -> (spec, state, last use, bytes); loads on demand, keeps alive, evicts.

Everything here runs on the server's event loop except the loading itself (a worker thread) and
an engine's shutdown (also a thread), so the bookkeeping needs no locks beyond one asyncio lock
that makes "is there room? then reserve it" a single step. Policy, after Ollama and llama-server's
router: a request for a model that is not loaded loads it (the request waits, others go on);
before a load, the least recently used idle models are unloaded until the new one fits both
`max_loaded` and the memory budget; a model with requests in flight is never evicted; when nothing
can be evicted the load is refused with a message naming what is loaded (the API answers 503 +
Retry-After). After its last request a model stays for its keep-alive, then unloads.

A LoRA adapter is an entry whose spec names a base: acquiring it acquires the base (loading it if
needed, and holding it in flight), then adds the adapter to the base's engine, where its rows share
every step with the base's and other adapters' rows. Adapters count neither towards
--max-loaded-models nor as models to evict; one idle past its keep-alive leaves the engine, and all
of a base's adapters leave with it.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

from portachat.device.explain import diagnose
from portachat.engine.async_engine import AsyncEngine, RequestObserver
from portachat.engine.embeddings.queue import EmbeddingQueue
from portachat.engine.types import EngineError
from portachat.engine.workers.data_parallel import DataParallelEngine, async_engine_for
from portachat.i18n import _
from portachat.model.lora import load_lora
from portachat.serve.registry.catalog import ModelSpec, estimate_bytes
from portachat.serve.registry.keep_alive import describe_keep_alive

State = Literal["available", "loading", "loaded"]
Loader = Callable[[ModelSpec], Any]  # -> a ServedModel (runs on a worker thread)


async def in_daemon_thread(fn: Callable[..., Any], *args: Any) -> Any:
    """`fn(*args)` on a daemon thread (asyncio.to_thread's pool would hold up the server's exit
    until a long load finished: Ctrl-C during a load should stop at once)."""
    loop = asyncio.get_running_loop()
    future = loop.create_future()

    def settle(value: Any, exc: BaseException | None) -> None:
        if not future.done():
            future.set_exception(exc) if exc is not None else future.set_result(value)

    def work() -> None:
        try:
            value, exc = fn(*args), None
        except BaseException as error:  # noqa: BLE001 - handed to the awaiting coroutine
            value, exc = None, error
        try:
            loop.call_soon_threadsafe(settle, value, exc)
        except RuntimeError:  # the loop has closed: nobody is waiting any more
            pass

    threading.Thread(target=work, name="portachat-registry", daemon=True).start()
    return await future


def served_memory_bytes(served: Any) -> int | None:
    """Bytes a loaded model holds: weights and buffers plus KV cache, of every replica (None when an
    engine is not ours, e.g. a test double)."""
    total = 0
    embedder = getattr(served, "embedder", None)
    if served.engine is None and embedder is not None:  # an embedding model: its weights
        module = getattr(embedder, "module", None)
        return sum(p.numel() * p.element_size() for p in module.parameters()) if module is not None else None
    for engine in [served.engine, *(getattr(served, "replicas", None) or [])]:
        model, runner = getattr(engine, "model", None), getattr(engine, "runner", None)
        if model is None or runner is None:
            return None
        tensors = [*model.parameters(), *model.buffers()]
        tensors += [t for t in (getattr(runner, "k_cache", None), getattr(runner, "v_cache", None)) if t is not None]
        total += sum(t.numel() * t.element_size() for t in tensors)
    return total


class UnknownModel(LookupError):
    """No model of that name is registered."""


class NoRoom(RuntimeError):
    """Loading would exceed the budget and every loaded model is busy."""


class LoadFailed(RuntimeError):
    """The model's loader raised; the message carries the diagnosis."""


@dataclass
class RegistryEntry:
    spec: ModelSpec
    size_bytes: int  # the on-disk estimate until loaded, then what the loaded model holds
    keep_alive: float | None  # seconds idle before unloading; None = until evicted
    state: State = "available"
    served: Any = None  # ServedModel once loaded
    engine: AsyncEngine | DataParallelEngine | None = None  # None for an embedding model
    embedding_queue: EmbeddingQueue | None = None  # /v1/embeddings requests batched together
    in_flight: int = 0
    last_used: float = 0.0
    idle_since: float | None = None
    measured: bool = False  # size_bytes is what the loaded model held, not an estimate
    error: str | None = None  # the last load's failure
    loading: asyncio.Future | None = None

    @property
    def name(self) -> str:
        return self.spec.name

    @property
    def is_adapter(self) -> bool:
        return self.spec.base is not None

    def expired(self, now: float) -> bool:
        return (self.state == "loaded" and self.in_flight == 0 and self.keep_alive is not None
                and self.idle_since is not None and now - self.idle_since >= self.keep_alive)


@dataclass
class RegistryEvents:
    """Hooks the server wires to its metrics and logs (all optional)."""

    observer: Callable[[str], RequestObserver | None] = lambda name: None
    on_loaded: Callable[[RegistryEntry, float], None] = lambda entry, seconds: None
    on_unloaded: Callable[[RegistryEntry, str], None] = lambda entry, reason: None
    after_unload: Callable[[], None] = lambda: None  # e.g. the device layer's empty_cache


@dataclass
class ModelRegistry:
    specs: list[ModelSpec]
    loader: Loader
    keep_alive: float | None = None  # after a request that sets none (one that does: for it only)
    max_loaded: int | None = None  # None = no limit on the count
    budget_bytes: int | None = None  # None = no memory limit
    events: RegistryEvents = field(default_factory=RegistryEvents)
    measure: Callable[[Any], int | None] = served_memory_bytes  # bytes a loaded model holds

    def __post_init__(self) -> None:
        names = [s.name for s in self.specs]
        duplicates = sorted({n for n in names if names.count(n) > 1})
        if duplicates:
            raise ValueError(_("two models are named {names}: give them distinct names with --model "
                               "NAME=PATH").format(names=', '.join(duplicates)))
        self.entries: dict[str, RegistryEntry] = {
            s.name: RegistryEntry(s, estimate_bytes(s) if s.path else 0, self.keep_alive) for s in self.specs
        }
        for entry in self.entries.values():
            if entry.is_adapter and entry.spec.base not in self.entries:
                raise ValueError(_("LoRA adapter {name} runs on {base}, which is not a served model").format(
                                   name=entry.name, base=entry.spec.base))
        self._room = asyncio.Lock()
        self._adapters = asyncio.Lock()

    # ------------------------------------------------------------------ queries

    def names(self) -> list[str]:
        return list(self.entries)

    def get(self, name: str) -> RegistryEntry:
        try:
            return self.entries[name]
        except KeyError:
            raise UnknownModel(name) from None

    def loaded(self) -> list[RegistryEntry]:
        """Loaded models (adapters ride on theirs and are not listed)."""
        return [e for e in self.entries.values() if e.state == "loaded" and not e.is_adapter]

    def used_bytes(self) -> int:
        return sum(e.size_bytes for e in self.entries.values() if e.state != "available" and not e.is_adapter)

    def describe_loaded(self) -> str:
        busy = [_("{name} ({in_flight} in flight, {gib:.2f} GiB)").format(name=e.name, in_flight=e.in_flight,
                                                                           gib=e.size_bytes / 2**30)
                for e in self.entries.values() if e.state != "available" and not e.is_adapter]
        return ", ".join(busy) or _("nothing")

    # ------------------------------------------------------------------ use

    async def acquire(self, name: str, keep_alive: float | None | Literal["default"] = "default") -> RegistryEntry:
        """The loaded entry for `name`, counted as in flight until `release`. Loads it if needed.
        `keep_alive` holds after this request only (Ollama's rule): a later request without one
        brings back the registry's default."""
        entry = self.get(name)
        entry.keep_alive = self.keep_alive if keep_alive == "default" else keep_alive
        base = await self.acquire(entry.spec.base) if entry.is_adapter else None  # in flight on its base too
        if base is not None and self.entries.get(name) is not entry:  # removed while its base loaded
            self.release(base)
            raise UnknownModel(name)
        entry.in_flight += 1  # from here on nothing evicts it
        try:
            if base is not None:
                await self._ensure_adapter(entry, base)
            else:
                await self._ensure_loaded(entry)
        except BaseException:
            self._done_with(entry)
            if base is not None:
                self.release(base)
            raise
        entry.last_used = time.monotonic()
        entry.idle_since = None
        return entry

    def release(self, entry: RegistryEntry) -> None:
        """A request on `entry` ended; with keep-alive 0 the model unloads now."""
        self._done_with(entry)
        if entry.expired(time.monotonic()):
            asyncio.get_running_loop().create_task(self._unload_if_expired(entry))
        if entry.is_adapter:
            self.release(self.get(entry.spec.base))

    def _done_with(self, entry: RegistryEntry) -> None:
        entry.in_flight = max(0, entry.in_flight - 1)
        entry.last_used = time.monotonic()
        if entry.in_flight == 0:
            entry.idle_since = entry.last_used

    async def load(self, name: str) -> RegistryEntry:
        """Load without a request (start-up, POST /models/load)."""
        entry = await self.acquire(name)
        self._done_with(entry)
        if entry.is_adapter:
            self._done_with(self.get(entry.spec.base))
        return entry

    async def unload(self, name: str, reason: str = "requested") -> bool:
        """Unload now, if idle. False when requests are in flight (it unloads when they end only if
        its keep-alive says so)."""
        entry = self.get(name)
        if entry.state == "loading" and entry.loading is not None:
            await asyncio.shield(entry.loading)
        if entry.state != "loaded":
            return True
        if entry.in_flight:
            return False
        await self._unload(entry, reason)
        return True

    def add_adapter(self, spec: ModelSpec) -> RegistryEntry:
        """A row for a LoRA adapter given while the server runs (POST /v1/load_lora_adapter); it loads
        onto its base's engine on its first request, as a start-up adapter does."""
        if spec.name in self.entries:
            raise ValueError(_("a model or adapter named {name} is already served").format(name=spec.name))
        base = self.entries.get(spec.base or "")
        if base is None or base.is_adapter:
            raise ValueError(_("LoRA adapter {name} runs on {base}, which is not a served model").format(
                               name=spec.name, base=spec.base))
        entry = self.entries[spec.name] = RegistryEntry(spec, 0, self.keep_alive)
        self.specs.append(spec)
        return entry

    async def remove_adapter(self, name: str, poll_s: float = 0.02) -> None:
        """Take an adapter's row out (POST /v1/unload_lora_adapter): new requests for it find no such
        model at once; the requests already running on it finish first, then it leaves its base's engine."""
        entry = self.get(name)
        if not entry.is_adapter:
            raise ValueError(_("{name} is a model, not a LoRA adapter").format(name=name))
        del self.entries[name]
        self.specs.remove(entry.spec)
        while entry.in_flight:  # its requests keep their rows in the batch until they end
            await asyncio.sleep(poll_s)
        engine = entry.engine
        if entry.state != "loaded" or engine is None:
            return
        entry.state, entry.served, entry.engine = "available", None, None
        for _attempt in range(500):  # an aborted request may hold its row until the engine's next step
            if not engine.is_alive:
                break
            try:
                await engine.call(lambda e: e.remove_adapter(name))
                break
            except EngineError:
                await asyncio.sleep(poll_s)
        self.events.on_unloaded(entry, "removed")

    async def reap_forever(self, interval_s: float = 0.5) -> None:
        """Unload models whose keep-alive ran out (a task for the server's lifetime)."""
        while True:
            await asyncio.sleep(interval_s)
            now = time.monotonic()
            for entry in list(self.entries.values()):
                if entry.expired(now):
                    await self._unload_if_expired(entry)

    async def shutdown(self) -> None:
        for entry in self.loaded():
            await self._unload(entry, "shutdown")

    # ------------------------------------------------------------------ loading and eviction

    async def _ensure_loaded(self, entry: RegistryEntry) -> None:
        while entry.state != "loaded":
            if entry.state == "loading" and entry.loading is not None:
                await asyncio.shield(entry.loading)  # someone else's load: wait for it, then re-check
                if entry.state != "loaded":
                    raise LoadFailed(entry.error or _("loading {name} failed").format(name=entry.name))
                return
            async with self._room:
                if entry.state != "available":
                    continue
                await self._make_room(entry)
                entry.state = "loading"
                entry.loading = asyncio.get_running_loop().create_future()
            await self._load(entry)

    async def _ensure_adapter(self, entry: RegistryEntry, base: RegistryEntry) -> None:
        """Add the adapter to its (loaded, held) base's engine unless it is there."""

        async with self._adapters:  # one load per adapter, however many requests ask at once
            if entry.state == "loaded" and entry.engine is base.engine:
                return
            if not hasattr(base.engine, "call") or not hasattr(getattr(base.served, "engine", None), "add_adapter"):
                raise LoadFailed(_("{base}'s engine cannot run LoRA adapters (tensor-parallel workers do "
                                   "not yet)").format(base=base.name))
            entry.state = "loading"
            try:
                weights = await in_daemon_thread(load_lora, entry.spec.path)
                await base.engine.call(lambda engine: engine.add_adapter(entry.name, weights))
            except Exception as exc:
                entry.state, entry.error = "available", f"{type(exc).__name__}: {exc}"
                raise LoadFailed(entry.error) from exc
            entry.served, entry.engine, entry.error, entry.state = base.served, base.engine, None, "loaded"
            entry.size_bytes = sum(m.A.numel() + m.B.numel() for m in weights.modules.values()) * 4
            entry.idle_since = time.monotonic()
            self.events.on_loaded(entry, 0.0)

    async def _load(self, entry: RegistryEntry) -> None:
        started = time.monotonic()
        try:
            served = await in_daemon_thread(self.loader, entry.spec)
            engine = async_engine_for(served, self.events.observer(entry.name)) if served.engine is not None else None
            embedder = getattr(served, "embedder", None)
            entry.embedding_queue = EmbeddingQueue(embedder) if embedder is not None else None
        except BaseException as exc:  # noqa: BLE001 - reported to every waiter and kept for /v1/models

            d = diagnose(exc) if isinstance(exc, Exception) else None
            entry.error = d.line(exc) if d else f"{type(exc).__name__}: {exc}"
            entry.state = "available"
            self._settle(entry)
            if isinstance(exc, Exception):
                raise LoadFailed(entry.error) from exc
            raise
        entry.served, entry.engine, entry.error = served, engine, None
        measured = self.measure(served)
        if measured:
            entry.size_bytes, entry.measured = measured, True
        entry.state = "loaded"
        entry.idle_since = time.monotonic()
        self._settle(entry)
        self.events.on_loaded(entry, time.monotonic() - started)

    @staticmethod
    def _settle(entry: RegistryEntry) -> None:
        if entry.loading is not None and not entry.loading.done():
            entry.loading.set_result(None)
        entry.loading = None

    def _over(self, entry: RegistryEntry) -> str | None:
        """Why loading `entry` now would not fit (None: it fits)."""
        active = [e for e in self.entries.values() if e.state != "available" and e is not entry and not e.is_adapter]
        if self.max_loaded is not None and len(active) + 1 > self.max_loaded:
            return _("--max-loaded-models {count} are loaded").format(count=self.max_loaded)
        if self.budget_bytes is not None:
            own = self._expected_bytes(entry)
            need = sum(e.size_bytes for e in active) + own
            if need > self.budget_bytes:
                return _("{name} needs {own_gib:.2f} GiB and the loaded models hold {held_gib:.2f} GiB of a "
                         "{budget_gib:.2f} GiB budget").format(name=entry.name, own_gib=own / 2**30,
                                                               held_gib=(need - own) / 2**30,
                                                               budget_gib=self.budget_bytes / 2**30)
        return None

    def _expected_bytes(self, entry: RegistryEntry) -> int:
        """What `entry` will hold once loaded: its measured or on-disk size; unknown (0) counts as the
        largest model measured so far (else the largest estimate), so an unsized model cannot slip
        past the budget."""
        measured = [e.size_bytes for e in self.entries.values() if e.measured]
        return entry.size_bytes or max(measured or [e.size_bytes for e in self.entries.values()], default=0)

    async def _make_room(self, entry: RegistryEntry) -> None:
        while (why := self._over(entry)) is not None:
            idle = sorted((e for e in self.loaded() if e.in_flight == 0 and e is not entry),
                          key=lambda e: e.last_used)
            if not idle:
                if self.budget_bytes is not None and self._expected_bytes(entry) > self.budget_bytes:
                    raise NoRoom(_("{name} needs {need_gib:.2f} GiB, more than the whole {budget_gib:.2f} "
                                   "GiB budget: raise --gpu-memory-utilization, quantize it (--quantize "
                                   "int8) or use a device with more memory").format(
                                   name=entry.name, need_gib=self._expected_bytes(entry) / 2**30,
                                   budget_gib=self.budget_bytes / 2**30))
                raise NoRoom(_("cannot load {name}: {why} and every loaded model has requests in flight "
                               "(loaded: {loaded}). Retry shortly, or raise --max-loaded-models").format(
                               name=entry.name, why=why, loaded=self.describe_loaded()))
            await self._unload(idle[0], "evicted")

    async def _unload_if_expired(self, entry: RegistryEntry) -> None:
        if entry.expired(time.monotonic()):
            await self._unload(entry, f"keep-alive ({describe_keep_alive(entry.keep_alive)})")

    async def _unload(self, entry: RegistryEntry, reason: str) -> None:
        engine, queue = entry.engine, entry.embedding_queue
        close = getattr(entry.served, "close", None)
        entry.state, entry.served, entry.engine = "available", None, None  # size_bytes keeps the measured value
        if entry.is_adapter:  # out of its base's engine (if that is still running)
            if engine is not None and engine.is_alive:
                await engine.call(lambda e: e.remove_adapter(entry.name))
            self.events.on_unloaded(entry, reason)
            return
        for adapter in self.entries.values():  # a base's adapters leave with its engine
            if adapter.spec.base == entry.name and adapter.state != "available":
                adapter.state, adapter.served, adapter.engine = "available", None, None
                self.events.on_unloaded(adapter, f"its base {entry.name} unloaded")
        entry.embedding_queue = None
        if queue is not None:
            queue.close()
        if engine is not None:
            engine.stop_accepting()
            await in_daemon_thread(engine.shutdown)
        if close is not None:  # what the model runs on beyond this process (tensor-parallel workers)
            await in_daemon_thread(close)
        gc.collect()
        self.events.after_unload()
        self.events.on_unloaded(entry, reason)
