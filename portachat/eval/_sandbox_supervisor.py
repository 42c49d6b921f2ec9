"""Runs one sandboxed program and cleans up after it (see sandbox.py for the guarantees).

A standalone script (stdlib only): `python -I -S _sandbox_supervisor.py CONFIG.json`. It makes
itself a child subreaper, so every process the program starts - even one that left the program's
session - is re-parented to it when its parent dies; it starts the program confined (resource
limits, another user id when it runs as root, then bubblewrap's namespaces when the config's "wrap"
gives its command; without them, only what an unsandboxed run can have: a network namespace when the
kernel allows one and, as root, private world-writable dirs), waits up to the timeout, then kills
the program's process group and every remaining descendant before it prints one JSON line:
{"returncode": int | null, "timed_out": bool, "isolation": [...]}.
"""

import ctypes
import ctypes.util
import json
import os
import platform
import resource
import signal
import subprocess
import sys
import time

PR_SET_CHILD_SUBREAPER = 36
CLONE_NEWUSER = 0x10000000
CLONE_NEWNET = 0x40000000
CLONE_NEWNS = 0x00020000
MS_NOSUID, MS_NODEV, MS_REC, MS_PRIVATE = 2, 4, 16384, 1 << 18
# keyctl(2)'s number: the session keyring is inherited across fork, exec and namespaces, and keys a
# process possesses through it are readable, so the program gets an empty one of its own.
SYS_KEYCTL = {"x86_64": 250, "aarch64": 219, "riscv64": 219, "loongarch64": 219, "ppc64le": 280, "s390x": 280}
KEYCTL_JOIN_SESSION_KEYRING = 1
# World-writable places the sandbox user could write to; each gets a private, empty tmpfs.
SHARED_WRITABLE = ("/tmp", "/var/tmp", "/dev/shm", "/run/lock", "/var/lock")

_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)


def _unshare(flags: int) -> bool:
    return _libc.unshare(flags) == 0


def _private_tmp() -> bool:
    """In a new mount namespace, hide the world-writable directories under empty tmpfs mounts."""
    if _libc.unshare(CLONE_NEWNS) != 0:
        return False
    if _libc.mount(b"none", b"/", None, MS_REC | MS_PRIVATE, None) != 0:  # never propagate to the host
        return False
    for path in SHARED_WRITABLE:
        if os.path.isdir(path) and not os.path.islink(path):
            if _libc.mount(b"tmpfs", path.encode(), b"tmpfs", MS_NOSUID | MS_NODEV, b"size=16m,mode=1777") != 0:
                return False
    return True


def _new_session_keyring() -> bool:
    """Join a new, empty, anonymous session keyring (the evaluator's keys out of reach)."""
    number = SYS_KEYCTL.get(platform.machine())
    return number is not None and _libc.syscall(number, KEYCTL_JOIN_SESSION_KEYRING, None) >= 0


def _children() -> list[int]:
    """Pids whose parent is this process (read from /proc)."""
    me, found = os.getpid(), []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # the command name (field 2) is in parentheses and may hold spaces: split after the last ')'
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 1 and int(fields[1]) == me:
            found.append(int(entry))
    return found


def _kill_descendants(deadline_s: float = 10.0) -> None:
    """SIGKILL and reap every child until none is left (orphans keep arriving while parents die)."""
    end = time.monotonic() + deadline_s
    while time.monotonic() < end:
        pids = _children()
        if not pids:
            return
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for pid in pids:
            try:
                os.waitpid(pid, 0)
            except ChildProcessError:
                pass


def main() -> None:
    with open(sys.argv[1], encoding="utf-8") as f:
        cfg = json.load(f)
    isolation = []
    if _libc.prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0:
        isolation.append("subreaper")
    is_root = os.geteuid() == 0
    wrap = cfg.get("wrap") or []
    can_unshare = can_mount = False
    probe_flags = CLONE_NEWNET if is_root else CLONE_NEWUSER | CLONE_NEWNET
    if wrap:
        isolation += ["bubblewrap", "user-namespace", "mount-namespace", "pid-namespace", "network-namespace",
                      "read-only-root", "private-tmp"]
    else:
        # Probe once in a throwaway child which namespaces this machine allows, so the report is true.
        pid = os.fork()
        if pid == 0:
            os._exit(0 if _unshare(probe_flags) else 1)
        can_unshare = os.waitpid(pid, 0)[1] == 0
        if can_unshare:
            isolation.append("network-namespace")
        hidden = any(cfg["workdir"] == d or cfg["workdir"].startswith(d + "/") for d in SHARED_WRITABLE)
        if is_root and not hidden:  # a work dir under /tmp would be covered too
            pid = os.fork()
            if pid == 0:
                os._exit(0 if _private_tmp() else 1)
            can_mount = os.waitpid(pid, 0)[1] == 0
            if can_mount:
                isolation.append("private-tmp")
    if is_root:
        isolation.append(f"uid-{cfg['uid']}")
    pid = os.fork()
    if pid == 0:
        os._exit(0 if _new_session_keyring() else 1)
    own_keyring = os.waitpid(pid, 0)[1] == 0  # else keyctl is unknown here or refused (as it is to the program)
    if own_keyring:
        isolation.append("private-keyring")
    limits = {
        resource.RLIMIT_AS: cfg["memory_bytes"],
        resource.RLIMIT_CPU: cfg["cpu_seconds"],
        resource.RLIMIT_FSIZE: cfg["file_bytes"],
        resource.RLIMIT_NOFILE: cfg["open_files"],
        resource.RLIMIT_NPROC: cfg["processes"],
        resource.RLIMIT_CORE: 0,
    }
    if wrap and not is_root:
        # Here it would count every process of this user, not the program's: the guard sets it inside
        # the new user namespace, where only the program's processes count.
        del limits[resource.RLIMIT_NPROC]
    isolation.append("rlimits")

    def confine() -> None:  # runs in the child between fork and exec
        if can_unshare:
            _unshare(probe_flags)
        if can_mount:
            _private_tmp()
        for which, value in limits.items():
            resource.setrlimit(which, (value, value))  # soft = hard: the program cannot raise them
        if is_root:
            os.setgroups([])
            os.setgid(cfg["gid"])
            os.setuid(cfg["uid"])
        if own_keyring:
            _new_session_keyring()  # after the switch: the new keyring belongs to the sandbox user

    with open(cfg["guard"], encoding="utf-8") as f:
        guard_source = f.read()
    out = open(cfg["stdout"], "wb")
    err = open(cfg["stderr"], "wb")
    inside = cfg.get("inside") or {"program": cfg["program"], "workdir": cfg["workdir"]}  # paths the program sees
    env = {"PATH": "/usr/bin:/bin", "HOME": inside["workdir"], "TMPDIR": inside["workdir"], "LANG": "C.UTF-8",
           "PYTHONDONTWRITEBYTECODE": "1", "PYTHONHASHSEED": "0"}
    returncode, timed_out = None, False
    try:
        child = subprocess.Popen(
            [*wrap, cfg["python"], "-I", "-S", "-B", "-c", guard_source, inside["program"],
             "--nproc", str(cfg["processes"]), *([] if cfg["python_guard"] else ["--no-guard"])],
            cwd="/" if wrap else cfg["workdir"], env=env, stdin=subprocess.DEVNULL, stdout=out, stderr=err,
            start_new_session=True, preexec_fn=confine, close_fds=True,
        )
        try:
            returncode = child.wait(timeout=cfg["timeout_s"])
        except subprocess.TimeoutExpired:
            timed_out = True
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        if timed_out:
            child.wait()
        elif wrap and returncode is not None and returncode > 128:
            returncode = 128 - returncode  # bubblewrap reports a program killed by signal N as 128 + N
    except OSError as exc:  # could not start it at all
        err.write(f"sandbox could not start the program: {exc}\n".encode())
    finally:
        _kill_descendants()
        out.close()
        err.close()
    print(json.dumps({"returncode": returncode, "timed_out": timed_out, "isolation": isolation}), flush=True)


if __name__ == "__main__":
    main()
