"""Starting, watching and stopping the tensor-parallel worker processes (rank 0 is the caller).

The command's own process is rank 0: it makes the rendezvous store (a file store in a 0700 directory:
nothing listens on the network; the backend's sockets are bound to loopback), keeps the scheduler and the API,
and holds shard 0. Ranks 1..N-1 are `python -m portachat.engine.workers.worker` processes, placed on
device index = rank through the device layer (LOCAL_RANK), so the vendors' visible-devices variables
apply as the device layer reads them. A thread polls the workers: one that exits while
the group is up is a failure (reported within a poll interval, the others are stopped). Workers watch
their parent in turn and leave when it is gone, so none outlives the server.

With --data-parallel-size D as well, one world holds rank 0 and the D*(N-1) workers, and replica i
runs over its own sub-group [0, its N-1 workers]: rank 0 holds every replica's shard 0 (on device
i*N, as the device layer places it) and drives each replica from that replica's engine thread.
"""

from __future__ import annotations

import atexit
import dataclasses
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable

import torch
import torch.distributed as dist

from portachat.device import Device
from portachat.device.dist import (
    DistEnv,
    destroy_distributed,
    init_distributed,
    private_store,
    shard_device_index,
)
from portachat.engine.workers.tp_runner import _send
from portachat.i18n import _

POLL_S = 0.2
STOP_TIMEOUT_S = 10.0
# A step that has not finished after this long means a worker (or its device) hangs: a dead worker
# breaks the collectives at once, a hung one would hold them until the process group's timeout.
STEP_TIMEOUT_S = float(os.environ.get("PORTACHAT_TP_STEP_TIMEOUT_S", "60"))


def worker_place(global_rank: int, tensor_parallel_size: int) -> tuple[int, int]:
    """(replica, tensor-parallel rank) of worker `global_rank` (>= 1) in the world rank 0 starts."""
    replica, offset = divmod(global_rank - 1, tensor_parallel_size - 1)
    return replica, offset + 1


def replica_groups(tensor_parallel_size: int, data_parallel_size: int) -> list | None:
    """Each replica's process group (rank 0 and the replica's workers); None for a single replica,
    which uses the default group. Every rank of the world must call this, in the same order."""
    if data_parallel_size == 1:
        return None
    per = tensor_parallel_size - 1
    return [dist.new_group([0, *range(1 + i * per, 1 + (i + 1) * per)]) for i in range(data_parallel_size)]


class WorkerFailure(RuntimeError):
    """A tensor-parallel worker died: the model can no longer run."""


def _exit_text(code: int) -> str:
    if code < 0:
        try:
            return _("was killed by {signal}").format(signal=signal.Signals(-code).name)
        except ValueError:
            return _("was killed by signal {number}").format(number=-code)
    return _("exited with status {code}").format(code=code)


class WorkerGroup:
    def __init__(self, procs: list[subprocess.Popen], on_failure: Callable[[str], None] | None,
                 names: list[str] | None = None) -> None:  # fmt: skip
        self.procs = procs  # rank r is procs[r - 1]
        self.names = names or [f"rank {r}" for r in range(1, len(procs) + 1)]  # for messages
        self.on_failure = on_failure
        self.failure: str | None = None
        self.closing = False
        self.runners: list = []
        self.groups: list | None = None  # each replica's process group (None: one replica, the default group)
        self.store_dir: str | None = None  # the rendezvous store's private directory, removed with the workers
        self._lock = threading.Lock()
        self._watch = threading.Thread(target=self._monitor, name="portachat-tp-monitor", daemon=True)
        self._watch.start()
        atexit.register(self.kill)

    @property
    def pids(self) -> list[int]:
        return [p.pid for p in self.procs]

    def watch(self, *runners) -> None:
        """Also fail when a step of one of `runners` (rank 0's TensorParallelRunners) outlasts STEP_TIMEOUT_S."""
        self.runners = list(runners)

    def _monitor(self) -> None:
        while not self.closing:
            for name, proc in zip(self.names, self.procs, strict=True):
                code = proc.poll()
                if code is not None and not self.closing:
                    self._fail(_("tensor-parallel worker {name} (pid {pid}) {exit}; the model cannot run without "
                                 "its shard").format(name=name, pid=proc.pid, exit=_exit_text(code)))
                    return
            now = time.monotonic()
            started = [r.step_started for r in self.runners if r.step_started is not None]
            if any(now - t > STEP_TIMEOUT_S for t in started) and not self.closing:
                self._fail(_("a tensor-parallel step has not finished in {seconds} s: a worker or its device "
                             "hangs; the workers were stopped").format(seconds=f"{STEP_TIMEOUT_S:g}"))
                return
            time.sleep(POLL_S)

    def _fail(self, message: str) -> None:
        with self._lock:
            if self.failure is not None:
                return
            self.failure = message
        print("[portachat] " + _("error: {message}").format(message=message), file=sys.stderr, flush=True)
        self.kill()
        if self.on_failure is not None:
            self.on_failure(message)
        else:  # no server to wind down (generate, chat): rank 0 may be blocked in a collective
            os._exit(1)

    def status(self) -> str | None:
        """Why the model cannot serve (a dead worker), or None while every worker is up."""
        return self.failure

    def kill(self) -> None:
        """Stop every worker now (SIGTERM, then SIGKILL after a short wait)."""
        self.closing = True
        for proc in self.procs:
            if proc.poll() is None:
                proc.terminate()
        deadline = time.monotonic() + 3.0
        for proc in self.procs:
            try:
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        if self.store_dir is not None:
            shutil.rmtree(self.store_dir, ignore_errors=True)

    def close(self, *runners) -> None:
        """Stop the workers: through the step protocol when they are healthy (`runners`: rank 0's
        TensorParallelRunners, idle, one per replica), else by signal; then leave the process group."""
        self.closing = True
        healthy = self.failure is None and all(p.poll() is None for p in self.procs)
        if healthy:
            try:
                stopped = {id(r.group) for r in runners}
                for runner in runners:
                    runner.stop_workers()
                for group in self.groups or [None]:  # replicas whose engine was never built
                    if id(group) not in stopped:
                        _send(("stop",), group)
                for proc in self.procs:
                    proc.wait(STOP_TIMEOUT_S)
            except Exception:  # noqa: BLE001 - a worker that will not stop politely is stopped by signal
                pass
        self.kill()
        atexit.unregister(self.kill)
        if healthy:
            destroy_distributed()


def start_workers(options, device: Device, on_failure: Callable[[str], None] | None = None,
                  timeout_s: float = 600) -> WorkerGroup:  # fmt: skip
    """Start ranks 1..N-1 for `options` (a LoadOptions with tensor_parallel_size N) and join the
    process group as rank 0. The workers load their shards while the caller loads its own."""
    tp, dp = options.tensor_parallel_size, options.data_parallel_size
    devices = tp * dp
    if device.is_accelerator and device.count < devices:
        sizes = (_("--tensor-parallel-size {tp} with --data-parallel-size {dp}") if dp > 1 else
                 _("--tensor-parallel-size {tp}")).format(tp=tp, dp=dp)  # fmt: skip
        raise WorkerFailure(_("{sizes} needs {devices} {kind} devices, but {count} are visible; lower -tp or -dp, "
                              "or make more devices visible").format(
            sizes=sizes, devices=devices, kind=device.kind, count=device.count))
    if not device.supports_distributed:
        raise WorkerFailure(_("{kind} has no collective backend: tensor parallelism needs one ({reason})").format(
            kind=device.kind, reason=device.dist_reason))
    world = 1 + dp * (tp - 1)  # rank 0 holds shard 0 of every replica
    # No TCPStore: it listens on every interface whatever address it is given, unauthenticated.
    store, store_dir = private_store(world, timeout_s=timeout_s)
    # Ranks share the host's cores: without a user setting, each shard takes its part of them.
    threads = max(1, (os.cpu_count() or 1) // devices)
    env = {**os.environ}
    env.setdefault("OMP_NUM_THREADS", str(threads))
    if "OMP_NUM_THREADS" not in os.environ:
        torch.set_num_threads(threads)
    payload = json.dumps(dataclasses.asdict(options))
    procs = []
    for rank in range(1, world):
        local_rank = shard_device_index(*worker_place(rank, tp), tp)
        env_r = {**env, "RANK": str(rank), "LOCAL_RANK": str(local_rank), "WORLD_SIZE": str(world),
                 "LOCAL_WORLD_SIZE": str(devices), "PORTACHAT_TP_STORE": store_dir,
                 "PORTACHAT_TP_PARENT": str(os.getpid())}  # fmt: skip
        procs.append(subprocess.Popen([sys.executable, "-m", "portachat.engine.workers.worker", payload],
                                      env=env_r, stdin=subprocess.DEVNULL))  # fmt: skip
    places = [worker_place(rank, tp) for rank in range(1, world)]
    names = [f"rank {r}" if dp == 1 else f"rank {r} of replica {i}" for i, r in places]
    group = WorkerGroup(procs, on_failure, names)
    group.store_dir = store_dir
    try:
        init_distributed(device, timeout_s, env=DistEnv(0, 0, world, devices), store=store, bind_device=dp == 1,
                         loopback=True)  # fmt: skip
        group.groups = replica_groups(tp, dp)
    except BaseException:
        group.kill()
        raise
    return group
