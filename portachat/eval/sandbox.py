"""Run untrusted Python (model-written code) in a confined subprocess, for HumanEval.

Each program runs in its own fresh temporary directory (under /run/portachat-sandbox as root, else
the system temp dir), in a new session, under a supervisor
process (`_sandbox_supervisor.py`) that kills it at the timeout and then kills every process it
left behind (the supervisor is a child subreaper, so even processes that called setsid() come back
to it). Layers, from the operating system up:

Guaranteed (on Linux):
  - wall-clock timeout, then SIGKILL of the process group and of every descendant;
  - resource limits with soft = hard (the program cannot raise them): address space (memory
    bombs get MemoryError), CPU seconds, size of any file written, open files, no core dumps;
  - when running as root (as CI does): the program runs as an unprivileged user (`nobody` by
    default), so root does not defeat the limits - RLIMIT_NPROC caps the processes it can start
    (fork bombs stop there), it cannot signal the evaluator or other users' processes, and it can
    write only where that user may: its own temp dir, plus the world-writable dirs (/tmp,
    /var/tmp, /dev/shm, /run/lock), which a private mount namespace covers with empty tmpfs
    mounts that vanish with the program; sandboxes running at the same time use different uids
    (`SandboxLimits.slot`), so one's processes neither count against nor can signal another's;
  - when the kernel allows it (root, or unprivileged user namespaces): a fresh network namespace,
    so no network at all, not even loopback. `SandboxResult.isolation` says which layers were on
    ("network-namespace", "private-tmp", "uid-N", "rlimits", "subreaper").
  - the temp dir is deleted afterwards, whatever the program wrote in it.
Best effort (a Python-level guard in `_sandbox_guard.py`, like human-eval's reliability_guard; a
program can get around it - e.g. by re-importing a fresh `posix` - and then meets the layers above):
  os.kill/fork/exec/system are disabled, writing, deleting and renaming files only work inside the
  temp dir, importing socket/subprocess/ctypes/signal/multiprocessing/... fails, and sys.exit is
  disabled so a program cannot pass by exiting early.
Not guaranteed: reading world-readable files; without root, a program that defeats the Python
guard could signal processes of the same user; the machine's CPU is shared (bounded by the CPU and
process limits, not reserved). Do not run code you would not run on this machine as `nobody`.
"""

from __future__ import annotations

import functools
import json
import os
import pwd
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

_HERE = Path(__file__).resolve().parent
GUARD = _HERE / "_sandbox_guard.py"
SUPERVISOR = _HERE / "_sandbox_supervisor.py"
OUTPUT_TAIL = 2000  # characters of stdout/stderr kept in a result


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0
    cpu_seconds: int = 10
    memory_bytes: int = 1 << 30  # address space, per process
    file_bytes: int = 16 << 20  # largest file the program may write (stdout/stderr included)
    open_files: int = 64
    processes: int = 8  # RLIMIT_NPROC: processes of the sandbox user (enforced when not root)
    user: str = "nobody"  # the user a root evaluator drops to
    slot: int = 0  # concurrent sandboxes use different slots: slot k > 0 runs as an unused uid below `user`'s
    python_guard: bool = True  # False only to test the operating-system layers on their own


@dataclass
class SandboxResult:
    status: str  # "passed" | "failed" | "timeout" | "error"
    returncode: int | None
    stdout: str
    stderr: str
    seconds: float
    isolation: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.status == "passed"


def _tail(path: Path) -> str:
    try:
        with open(path, "rb") as f:
            f.seek(0, os.SEEK_END)
            f.seek(max(0, f.tell() - OUTPUT_TAIL * 4))
            return f.read().decode("utf-8", errors="replace")[-OUTPUT_TAIL:]
    except OSError:
        return ""


def _interpreter() -> str:
    # The base interpreter, not the venv's: the program gets only the standard library (-I -S).
    return os.path.realpath(getattr(sys, "_base_executable", None) or sys.executable)


@functools.cache
def sandbox_python(uid: int | None, gid: int | None) -> str:
    """A Python interpreter the sandbox user can run: ours when it may (not when it lives under
    /root, as pyenv's does), else a system one; `PORTACHAT_SANDBOX_PYTHON` overrides."""
    candidates = [os.environ.get("PORTACHAT_SANDBOX_PYTHON"), _interpreter(), shutil.which("python3"),
                  "/usr/bin/python3", "/usr/local/bin/python3"]
    seen = []
    for exe in candidates:
        if not exe or exe in seen or not os.path.isfile(exe):
            continue
        seen.append(exe)
        if uid is None:
            return exe

        def as_user() -> None:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

        try:
            ok = subprocess.run([exe, "-I", "-S", "-c", "import math, json"], preexec_fn=as_user, cwd="/",
                                capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return exe
    raise RuntimeError(
        f"no Python interpreter that the sandbox user (uid {uid}) can run (tried {seen}); install one "
        "system-wide (e.g. `apt-get install python3`) or point PORTACHAT_SANDBOX_PYTHON at one"
    )


def _sandbox_base(is_root: bool) -> str | None:
    """Where sandbox dirs go. As root: under /run, outside the world-writable dirs the private mount
    namespace covers (a dir under /tmp would vanish from the program's view); else the temp dir."""
    if is_root and os.path.isdir("/run"):
        base = Path("/run/portachat-sandbox")
        try:
            base.mkdir(mode=0o755, exist_ok=True)
            return str(base)
        except OSError:
            pass  # the supervisor then sees the work dir under /tmp and skips the private /tmp
    return None


def sandbox_ids(user: str, slot: int) -> tuple[int, int]:
    """(uid, gid) a root evaluator drops to. Slot 0 is `user`; slot k is the k-th uid below it that
    no account uses, with `user`'s group. Concurrent sandboxes in different slots count their
    processes separately (one's fork bomb cannot use up another's RLIMIT_NPROC) and cannot signal
    each other."""
    try:
        entry = pwd.getpwnam(user)
    except KeyError:
        raise RuntimeError(f"sandbox user {user!r} does not exist; create it or set "
                           "SandboxLimits(user=...) to an unprivileged user") from None
    uid = entry.pw_uid
    for _ in range(slot):
        uid -= 1
        while _uid_exists(uid):
            uid -= 1
    if uid < 1000:
        raise RuntimeError(f"no unused uid for sandbox slot {slot} below {user!r}; use fewer workers")
    return uid, entry.pw_gid


def _uid_exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


def run_program(source: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `source` (a whole Python program) confined; "passed" means it ran to the end without
    raising, within the limits. Never raises for anything the program does."""
    limits = limits or SandboxLimits()
    if sys.platform != "linux":
        raise RuntimeError("the HumanEval sandbox needs Linux (resource limits, /proc, namespaces); "
                           "run `portachat eval humaneval` on a Linux machine")
    is_root = os.geteuid() == 0
    uid = gid = None
    if is_root:
        uid, gid = sandbox_ids(limits.user, limits.slot)
    start = time.monotonic()
    root = Path(tempfile.mkdtemp(prefix="portachat-sandbox-", dir=_sandbox_base(is_root)))
    try:
        os.chmod(root, 0o755)
        work = root / "work"
        work.mkdir(mode=0o700)
        if is_root:
            os.chown(work, uid, gid)
        program = root / "program.py"
        program.write_text(source, encoding="utf-8")
        guard = root / "guard.py"
        shutil.copyfile(GUARD, guard)
        for p in (program, guard):
            os.chmod(p, 0o644)  # readable, not writable, by the sandbox user
        config = {
            "python": sandbox_python(uid, gid), "guard": str(guard), "program": str(program), "workdir": str(work),
            "stdout": str(root / "stdout"), "stderr": str(root / "stderr"), "timeout_s": limits.timeout_s,
            "cpu_seconds": limits.cpu_seconds, "memory_bytes": limits.memory_bytes,
            "file_bytes": limits.file_bytes, "open_files": limits.open_files, "processes": limits.processes,
            "uid": uid, "gid": gid, "python_guard": limits.python_guard,
        }
        (root / "config.json").write_text(json.dumps(config), encoding="utf-8")
        try:
            proc = subprocess.run(
                [_interpreter(), "-I", "-S", "-B", str(SUPERVISOR), str(root / "config.json")],
                stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=limits.timeout_s + 30,
                start_new_session=True,
            )
            report = json.loads(proc.stdout.strip().splitlines()[-1])
        except (subprocess.TimeoutExpired, json.JSONDecodeError, IndexError) as exc:
            return SandboxResult("error", None, "", f"sandbox supervisor failed: {exc}",
                                 time.monotonic() - start)
        rc = report["returncode"]
        # Stopped by the CPU-time limit (SIGXCPU) is a timeout too: which limit fires first is a race
        # between CPU and wall-clock time.
        cpu_limit = rc == -signal.SIGXCPU
        status = "timeout" if report["timed_out"] or cpu_limit else ("passed" if rc == 0 else "failed")
        return SandboxResult(status, rc, _tail(root / "stdout"), _tail(root / "stderr"),
                             time.monotonic() - start, report["isolation"])
    finally:
        shutil.rmtree(root, ignore_errors=True)
