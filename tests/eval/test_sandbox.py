"""The HumanEval sandbox contains hostile programs: each is scored as a failure and leaves nothing
behind (no processes, no files outside its temp dir, no connections, the evaluator alive)."""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from portachat.eval import sandbox
from portachat.eval.sandbox import SandboxLimits, run_program

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux-only")

# CPU seconds above the wall-clock timeout: a busy loop always meets the timeout first, whatever the load.
TIGHT = SandboxLimits(timeout_s=2.0, cpu_seconds=3, memory_bytes=512 << 20, processes=8)
IS_ROOT = os.geteuid() == 0


def sandbox_uid_processes() -> int:
    """Processes owned by the sandbox user (only meaningful when the evaluator is root)."""
    uid = pwd.getpwnam(TIGHT.user).pw_uid
    n = 0
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                n += os.stat(f"/proc/{entry}").st_uid == uid
            except OSError:
                pass
    return n


class Listener:
    """A real TCP server on loopback that records whether anything connected."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen()
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def test_a_correct_program_passes_and_can_use_its_own_directory():
    r = run_program("import math, random, hashlib, collections\nopen('scratch.txt', 'w').write('x')\n"
                    "assert open('scratch.txt').read() == 'x'\nassert math.gcd(12, 18) == 6\nprint('ok')", TIGHT)
    assert r.status == "passed", r.stderr
    assert r.stdout.strip() == "ok"
    assert "rlimits" in r.isolation


def test_failures_and_early_exit_count_as_failed():
    assert run_program("assert 1 == 2", TIGHT).status == "failed"
    assert run_program("raise ValueError('no')", TIGHT).status == "failed"
    # exiting with status 0 before the asserts must not pass
    assert run_program("import sys\nsys.exit(0)\nassert False", TIGHT).status == "failed"
    assert run_program("raise SystemExit(0)", TIGHT).status == "failed"


def test_infinite_loop_and_sleep_are_killed_at_the_timeout():
    r = run_program("while True:\n    pass", TIGHT)
    assert r.status == "timeout" and not r.passed
    assert r.seconds < TIGHT.timeout_s + 5


def test_memory_bomb_fails():
    r = run_program("x = bytearray(8 << 30)", TIGHT)
    assert r.status == "failed" and "MemoryError" in r.stderr
    r = run_program("x = []\nwhile True:\n    x.append(bytearray(50 << 20))", TIGHT)
    assert r.status in ("failed", "timeout")


def test_fork_bomb_kill_parent_socket_and_outside_writes_fail(tmp_path):
    outside = tmp_path / "escaped.txt"
    listener = Listener()
    try:
        hostile = {
            "fork bomb": "import os\nwhile True:\n    os.fork()",
            "kill the parent": f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)",
            "socket": f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), timeout=1)",
            "write outside": f"open({str(outside)!r}, 'w').write('x')",
            "write /tmp": "open('/tmp/portachat-sandbox-escape.txt', 'w').write('x')",
            "delete": f"import os\nos.remove({__file__!r})",
            "subprocess": "import subprocess\nsubprocess.run(['true'])",
        }
        for name, source in hostile.items():
            r = run_program(source, TIGHT)
            assert r.status == "failed", (name, r)
    finally:
        listener.close()
    assert listener.connections == 0
    assert not outside.exists() and not os.path.exists("/tmp/portachat-sandbox-escape.txt")
    assert os.path.exists(__file__)


# ---- the operating-system layers on their own (the Python guard off): what root cannot defeat


@pytest.mark.skipif(not IS_ROOT, reason="privilege drop, NPROC and namespaces are the root evaluator's layers")
def test_fork_bomb_without_the_guard_is_capped_and_cleaned_up():
    before = sandbox_uid_processes()
    # children escape the process group with setsid() and keep forking: the subreaper still gets them
    bomb = ("import os, time\nfor _ in range(4):\n    try:\n        if os.fork() == 0:\n            os.setsid()\n"
            "            break\n    except OSError:\n        pass\n"
            "while True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)")
    r = run_program(bomb, SandboxLimits(**{**TIGHT.__dict__, "python_guard": False}))
    assert r.status == "timeout", r
    assert f"uid-{pwd.getpwnam(TIGHT.user).pw_uid}" in r.isolation
    assert sandbox_uid_processes() <= before


@pytest.mark.skipif(not IS_ROOT, reason="privilege drop and namespaces are the root evaluator's layers")
def test_without_the_guard_no_network_no_outside_writes_no_signals():
    limits = SandboxLimits(**{**TIGHT.__dict__, "python_guard": False})
    outside = Path("/var/portachat-sandbox-escape.txt")  # a root-owned directory outside /tmp
    listener = Listener()
    try:
        r = run_program(f"import socket\nsocket.create_connection(('127.0.0.1', {listener.port}), timeout=1)", limits)
        assert r.status == "failed"
        if "network-namespace" in r.isolation:
            assert listener.connections == 0
    finally:
        listener.close()
    try:
        r = run_program(f"open({str(outside)!r}, 'w').write('x')", limits)
        # bubblewrap's read-only root, else the unprivileged uid
        assert r.status == "failed" and ("Read-only file system" in r.stderr or "Permission denied" in r.stderr)
        assert not outside.exists()
    finally:
        outside.unlink(missing_ok=True)
    r = run_program(f"import os, signal\nos.kill({os.getpid()}, signal.SIGKILL)", limits)
    # in a PID namespace the evaluator's pid names nothing; without one, another uid may not signal it
    assert r.status == "failed" and ("No such process" in r.stderr or "Operation not permitted" in r.stderr)
    r = run_program("open('/tmp/portachat-sandbox-escape2.txt', 'w').write('x')", limits)
    if "private-tmp" in r.isolation:
        assert not os.path.exists("/tmp/portachat-sandbox-escape2.txt")
    else:
        os.remove("/tmp/portachat-sandbox-escape2.txt")  # documented: only the guard stops this
    r = run_program("open('big', 'wb').write(b'x' * (64 << 20))", limits)
    assert r.status == "failed" and "File too large" in r.stderr


@pytest.mark.skipif(not IS_ROOT or not shutil.which("setpriv") or not os.path.exists("/usr/bin/python3"),
                    reason="needs root, setpriv and a system python3 to run the evaluator as a plain user")
def test_an_unprivileged_evaluator_gets_the_same_containment():
    """The evaluator itself as `nobody` (no uid to drop to): rlimits, user+network namespaces, guard."""
    script = (
        "import json, os, sys\n"
        f"path = {str(Path(sandbox.__file__))!r}\n"
        "if not os.access(path, os.R_OK):\n"
        "    print('UNREADABLE'); sys.exit(0)\n"
        "from portachat.eval import sandbox as sb\n"
        "L = sb.SandboxLimits(timeout_s=2, cpu_seconds=4, python_guard=False)\n"  # wall clock ends the loop first
        "out = {}\n"
        "for name, src in {'ok': 'print(1)', 'loop': 'while True: pass', 'mem': 'x = bytearray(8 << 30)',\n"
        "                  'net': 'import socket; socket.create_connection((\"127.0.0.1\", 9), timeout=1)'}.items():\n"
        "    r = sb.run_program(src, L)\n"
        "    out[name] = [r.status, r.isolation]\n"
        "print(json.dumps(out))\n"
    )
    repo = str(Path(sandbox.__file__).resolve().parents[2])  # the package (stdlib-only here) from this checkout
    p = subprocess.run(["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "/usr/bin/python3", "-c", script],
                       capture_output=True, text=True, timeout=60, cwd="/",
                       env={"PATH": "/usr/bin:/bin", "PYTHONPATH": repo, "HOME": "/nonexistent"})
    if p.stdout.strip() == "UNREADABLE":
        pytest.skip("the checkout is not readable by nobody")
    assert p.returncode == 0, p.stderr
    out = json.loads(p.stdout.strip().splitlines()[-1])
    assert out["ok"][0] == "passed" and out["loop"][0] == "timeout" and out["mem"][0] == "failed"
    assert out["net"][0] == "failed"
    assert "rlimits" in out["ok"][1] and not any(i.startswith("uid-") for i in out["ok"][1])
    assert {"bubblewrap", "pid-namespace", "network-namespace"} <= set(out["ok"][1])
