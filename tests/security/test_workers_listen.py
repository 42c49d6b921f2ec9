"""Issue 26, item 5: nothing the tensor-parallel rendezvous or a worker opens listens beyond loopback
(PyTorch's TCPStore bound every interface whatever address it was given, unauthenticated, and the
step messages are pickled: a host that won the start-up race could run code in the workers)."""

from __future__ import annotations

import ipaddress
import os
import shutil
import signal
import socket
import stat
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from portachat.device import DeviceError
from portachat.device.dist import private_store

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "serve"))
from api_testing import free_port  # noqa: E402
from tp_testing import serve_process, tiny_llama  # noqa: E402


def listeners(pid: int) -> set[tuple[int, str, int]]:
    """(pid, address, port) of every listening TCP socket of `pid` and its descendants."""
    found = set()
    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.Error:
        return found
    for p in procs:
        try:
            for c in p.net_connections("inet"):
                if c.status == psutil.CONN_LISTEN:
                    found.add((p.pid, c.laddr.ip, c.laddr.port))
        except psutil.Error:
            pass
    return found


@pytest.mark.slow
def test_a_tp_2_start_up_listens_on_loopback_only(tmp_path):
    model = tiny_llama(tmp_path / "llama-tp")
    port = free_port()
    proc = serve_process(model, port)
    seen: set[tuple[int, str, int]] = set()
    workers: set[int] = set()
    try:
        deadline, up_at = time.monotonic() + 120, None
        while time.monotonic() < deadline:  # sample all through the start-up, and a moment after it
            seen |= listeners(proc.pid)
            workers |= {c.pid for c in psutil.Process(proc.pid).children(recursive=True)}
            if proc.poll() is not None:
                pytest.fail(f"the server exited: {proc.communicate()[1][-3000:]}")
            if up_at is None:
                try:
                    if httpx.get(f"http://127.0.0.1:{port}/health", timeout=1).status_code == 200:
                        up_at = time.monotonic()
                except httpx.TransportError:
                    pass
            elif time.monotonic() - up_at > 1.0:
                break
            time.sleep(0.05)
        assert up_at is not None, "the server did not come up"
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.communicate(timeout=30)
    assert (proc.pid, "127.0.0.1", port) in seen  # the listing sees sockets: the server's own
    assert workers and any(pid in workers for pid, _ip, _port in seen), "no worker socket was listed"
    wide = [s for s in seen if not ipaddress.ip_address(s[1]).is_loopback]
    assert wide == [], f"listening beyond loopback: {wide}"


def test_the_rendezvous_store_is_a_private_file(tmp_path):
    store, directory = private_store(2, timeout_s=5)
    try:
        assert stat.S_IMODE(os.stat(directory).st_mode) == 0o700
        peer, _ = private_store(2, directory, timeout_s=5)  # a worker opens the same store
        store.set("step", b"hello")
        assert peer.get("step") == b"hello"
    finally:
        shutil.rmtree(directory, ignore_errors=True)
    shared = tmp_path / "shared"
    shared.mkdir(mode=0o755)
    os.chmod(shared, 0o755)
    with pytest.raises(DeviceError, match="0700"):
        private_store(2, str(shared))


def test_worker_groups_pin_the_backend_to_loopback(monkeypatch):
    """gloo binds the address the host name resolves to (a LAN one on many machines) unless told an
    interface: a worker group names the loopback one."""
    import torch.distributed as dist

    from portachat.device import get_device
    from portachat.device.dist import DistEnv, init_distributed, loopback_interface

    dev = get_device(kind="cpu")
    assert dev.dist_backend == "gloo"
    monkeypatch.delenv("GLOO_SOCKET_IFNAME", raising=False)
    calls = []
    monkeypatch.setattr(dist, "is_initialized", lambda: False)
    monkeypatch.setattr(dist, "init_process_group",
                        lambda **kw: calls.append((kw, os.environ.get("GLOO_SOCKET_IFNAME"))))
    store = object()
    init_distributed(dev, env=DistEnv(0, 0, 2, 2), store=store, loopback=True)
    ((kwargs, interface),) = calls
    assert kwargs["store"] is store and interface == loopback_interface()
    assert interface in [name for _i, name in socket.if_nameindex()]
