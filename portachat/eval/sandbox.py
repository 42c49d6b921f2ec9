"""Run untrusted Python (model-written code) in a confined subprocess, for HumanEval.

Each program runs under a supervisor process (`_sandbox_supervisor.py`) that kills it at the
timeout and then kills every process it left behind (the supervisor is a child subreaper, so even
processes that called setsid() come back to it). Layers, from the operating system up:

Namespaces (bubblewrap, `bwrap`, for root and ordinary users alike; `available_isolation()` says
whether this machine gives them): the program runs in new user, mount, PID, network, IPC and UTS
namespaces. `/` is mounted read-only; /tmp is a private tmpfs of bounded size holding its work
dir (/tmp/work) and the program; /home, /root, /run and the evaluator's $HOME are empty read-only
tmpfs mounts (no view of anyone's files there); /proc is the new PID namespace's own (the
host's processes, their command lines included, are invisible); /dev holds only null, zero,
random and a bounded /dev/shm; there is no network at all, not even loopback; no capabilities and
no further user namespaces; a new, empty session keyring (the evaluator's keys out of reach).
Model code does not run where these namespaces are unavailable unless the user passes
`--allow-unsandboxed-code` (`SandboxLimits.allow_unsandboxed`).
Also guaranteed (on Linux):
  - wall-clock timeout, then SIGKILL of the program, its PID namespace and every descendant;
  - resource limits with soft = hard (the program cannot raise them): address space (memory
    bombs get MemoryError), CPU seconds, size of any file written, open files, processes
    (RLIMIT_NPROC, counted inside the user namespace: fork bombs stop there), no core dumps;
  - when running as root (as CI does): the program runs as an unprivileged user (`nobody` by
    default) inside the namespaces too; sandboxes running at the same time use different uids
    (`SandboxLimits.slot`), so one's processes neither count against nor can signal another's;
  - the temp dir is deleted afterwards, whatever the program wrote in it.
  `SandboxResult.isolation` says which layers were on ("bubblewrap", "pid-namespace",
  "network-namespace", "read-only-root", "private-tmp", "private-keyring", "uid-N", "rlimits",
  "subreaper").
Best effort (a Python-level guard in `_sandbox_guard.py`, like human-eval's reliability_guard; a
program can get around it - e.g. by re-importing a fresh `posix` - and then meets the layers above):
  os.kill/fork/exec/system are disabled, writing, deleting and renaming files only work inside the
  work dir, importing socket/subprocess/ctypes/signal/multiprocessing/... fails, and sys.exit is
  disabled so a program cannot pass by exiting early.
Not guaranteed: reading world-readable files outside the hidden directories (the installed
system, /etc, checkouts outside $HOME); the machine's CPU is shared (bounded by the CPU and process
limits, not reserved). Without namespaces (`--allow-unsandboxed-code`) only the rlimits, the uid
switch as root and the Python guard remain: the program can then read and, as an ordinary user,
write what that user can.
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
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from portachat.i18n import _

_HERE = Path(__file__).resolve().parent
GUARD = _HERE / "_sandbox_guard.py"
SUPERVISOR = _HERE / "_sandbox_supervisor.py"
OUTPUT_TAIL = 2000  # characters of stdout/stderr kept in a result
ISOLATIONS = ("bubblewrap", "none")  # what `available_isolation()` can answer
# Inside the namespaces: /tmp is the private tmpfs, the program is read-only beside its work dir.
INSIDE_WORK = "/tmp/work"
INSIDE_PROGRAM = "/tmp/program.py"
# Covered by empty read-only tmpfs mounts (with the evaluator's $HOME): other people's files, the
# host's runtime sockets (/run/user/*/bus, /run/docker.sock: a read-only mount does not stop connect()).
HIDDEN = ("/home", "/root", "/run", "/var/tmp", "/mnt", "/media")
SHM_BYTES = 16 << 20


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
    tmp_bytes: int = 64 << 20  # size of the private /tmp (work dir included)
    allow_unsandboxed: bool = False  # run even where namespaces are unavailable (--allow-unsandboxed-code)


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
        try:
            ok = subprocess.run([exe, "-I", "-S", "-c", "import math, json"], preexec_fn=_as_user(uid, gid), cwd="/",
                                capture_output=True, timeout=30).returncode == 0
        except (OSError, subprocess.SubprocessError):
            ok = False
        if ok:
            return exe
    raise RuntimeError(_(
        "no Python interpreter that the sandbox user (uid {uid}) can run (tried {tried}); install one "
        "system-wide (e.g. `apt-get install python3`) or point PORTACHAT_SANDBOX_PYTHON at one").format(
            uid=uid, tried=seen))


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
        raise RuntimeError(_("sandbox user {user} does not exist; create it or set SandboxLimits(user=...) to an "
                             "unprivileged user").format(user=repr(user))) from None
    uid = entry.pw_uid
    for _slot in range(slot):
        uid -= 1
        while _uid_exists(uid):
            uid -= 1
    if uid < 1000:
        raise RuntimeError(_("no unused uid for sandbox slot {slot} below {user}; use fewer workers").format(
            slot=slot, user=repr(user)))
    return uid, entry.pw_gid


def _uid_exists(uid: int) -> bool:
    try:
        pwd.getpwuid(uid)
        return True
    except KeyError:
        return False


class SandboxUnavailable(RuntimeError):
    """Model-written code would run without namespaces and the user did not allow that."""


def unavailable_message() -> str:
    return _("model-written code runs only inside new user, mount, PID and network namespaces, and this machine "
             "gives none to the sandbox: bubblewrap (`bwrap`) is missing or cannot create an unprivileged user "
             "namespace. Install it (`apt-get install bubblewrap`; `bash scripts/setup.sh` does as root) and allow "
             "user namespaces (sysctl kernel.unprivileged_userns_clone=1, user.max_user_namespaces > 0), or pass "
             "--allow-unsandboxed-code to run it with only resource limits and a Python guard (it can then read "
             "and write whatever you can). `portachat doctor` shows the isolation this machine gives.")


def _as_user(uid: int | None, gid: int | None) -> Callable[[], None] | None:
    """A preexec_fn that switches to (uid, gid) between fork and exec; None when there is nothing to switch."""
    if uid is None:
        return None

    def switch() -> None:
        os.setgroups([])
        os.setgid(gid)
        os.setuid(uid)

    return switch


@functools.cache
def _bwrap_disables_userns(bwrap: str) -> bool:
    """bubblewrap 0.8+ can forbid further user namespaces inside (less kernel surface for the program)."""
    try:
        return "--disable-userns" in subprocess.run([bwrap, "--help"], capture_output=True, text=True,
                                                    timeout=10).stdout
    except (OSError, subprocess.SubprocessError):
        return False


def _under(path: str, parent: str) -> bool:
    return path == parent or path.startswith(parent.rstrip("/") + "/")


def bwrap_command(bwrap: str, program: str, python: str, tmp_bytes: int = 64 << 20) -> list[str]:
    """bubblewrap's arguments up to (and including) `--`: the namespaces and mounts the module
    docstring promises. `program` (a host path) is seen read-only at INSIDE_PROGRAM; `python` (the
    interpreter that will run inside) is mounted back when a hidden directory covers it."""
    home = os.path.realpath(os.path.expanduser("~"))
    hidden: list[str] = []
    for d in [*HIDDEN, home]:  # real paths: /home may be a link to /usr/home, $HOME one into /data
        d = os.path.realpath(d)
        if d != "/" and os.path.isdir(d) and not any(_under(d, h) for h in [*hidden, "/tmp"]):
            hidden.append(d)
    args = [bwrap, "--unshare-all", "--unshare-user", "--die-with-parent", "--new-session", "--cap-drop", "ALL"]
    if _bwrap_disables_userns(bwrap):
        args.append("--disable-userns")
    args += ["--ro-bind", "/", "/", "--dev", "/dev", "--size", str(SHM_BYTES), "--tmpfs", "/dev/shm",
             "--remount-ro", "/dev", "--proc", "/proc"]
    for d in hidden:
        args += ["--tmpfs", d]
    args += ["--size", str(tmp_bytes), "--tmpfs", "/tmp", "--dir", INSIDE_WORK, "--ro-bind", program, INSIDE_PROGRAM]
    prefix = str(Path(os.path.realpath(python)).parent.parent)  # .../bin/python3 -> the installation
    if any(_under(prefix, d) for d in [*hidden, "/tmp"]):
        args += ["--ro-bind", prefix, prefix]
    for d in hidden:  # read-only only now: mounting the interpreter back needed its parent dirs made
        args += ["--remount-ro", d]
    return [*args, "--chdir", INSIDE_WORK, "--"]


@functools.cache
def available_isolation(user: str = "nobody") -> str:
    """Which isolation this machine gives model-written code, one of ISOLATIONS: "bubblewrap" when
    `bwrap` can make the namespaces here as the user the program runs as (`user` when the evaluator
    is root), else "none". Tests simulate machines by monkeypatching this function."""
    bwrap = shutil.which("bwrap")
    if sys.platform != "linux" or bwrap is None:
        return "none"
    uid = gid = None
    if os.geteuid() == 0:
        uid, gid = sandbox_ids(user, 0)
    try:
        ok = subprocess.run([*bwrap_command(bwrap, "/dev/null", "/bin/true"), "/bin/true"], cwd="/",
                            stdin=subprocess.DEVNULL, capture_output=True, timeout=30,
                            preexec_fn=_as_user(uid, gid)).returncode == 0
    except (OSError, subprocess.SubprocessError):
        ok = False
    return "bubblewrap" if ok else "none"


def require_isolation(limits: SandboxLimits) -> str:
    """The isolation model code will get; raises SandboxUnavailable when there is none and
    `limits.allow_unsandboxed` is off. Call it before expensive work (generating the completions)."""
    if sys.platform != "linux":
        raise RuntimeError(_("the code sandbox needs Linux (namespaces, resource limits, /proc); run "
                             "`portachat eval humaneval` on a Linux machine"))
    isolation = available_isolation(limits.user)
    if isolation == "none" and not limits.allow_unsandboxed:
        raise SandboxUnavailable(unavailable_message())
    return isolation


def run_program(source: str, limits: SandboxLimits | None = None) -> SandboxResult:
    """Run `source` (a whole Python program) confined; "passed" means it ran to the end without
    raising, within the limits. Never raises for anything the program does."""
    limits = limits or SandboxLimits()
    isolation = require_isolation(limits)
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
        python = sandbox_python(uid, gid)
        wrap = []
        if isolation == "bubblewrap":
            wrap = bwrap_command(shutil.which("bwrap") or "bwrap", str(program), python, limits.tmp_bytes)
        config = {
            "python": python, "guard": str(guard), "program": str(program), "workdir": str(work), "wrap": wrap,
            "inside": {"program": INSIDE_PROGRAM, "workdir": INSIDE_WORK} if wrap else None,
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
