"""Runs inside the sandbox: disables dangerous Python APIs, then runs the program file given.

A standalone script (stdlib only, no portachat import): the supervisor runs its source as
`python -I -S -c SOURCE PROGRAM.py --nproc N [--no-guard]` in the sandbox's working directory. It
first lowers RLIMIT_NPROC to N (here, inside the sandbox's user namespace, it counts only the
program's processes). Exit status 0 means the program ran to the end without an exception.

This is human-eval's `reliability_guard`, made stricter. It is NOT a security boundary on its own
(Python code can find ways around it); the operating-system limits set by the supervisor (resource
limits, another user id, a network namespace) are the boundary, and this guard makes the common
hostile or careless programs fail fast and cleanly instead of hitting those limits.
"""

import builtins
import io
import os
import posix
import resource
import shutil
import sys

WORKDIR = os.path.realpath(os.getcwd())
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC


def _inside(path, dir_fd=None) -> bool:
    if isinstance(path, int):
        return True  # an already-open descriptor: its opening was checked
    path = os.fspath(path)
    if isinstance(path, bytes):
        path = os.fsdecode(path)
    if dir_fd is not None and not os.path.isabs(path):
        path = os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), path)
    real = os.path.realpath(path)
    return real == WORKDIR or real.startswith(WORKDIR + os.sep)


def _inside_only(name, real, two_paths=False):
    """`real` (an os function taking paths) allowed only on paths inside the sandbox directory."""

    def checked(*args, **kwargs):
        paths = [(args[0] if args else kwargs.get("path", kwargs.get("src")),
                  kwargs.get("dir_fd", kwargs.get("src_dir_fd")))]
        if two_paths:
            paths.append((args[1] if len(args) > 1 else kwargs.get("dst"), kwargs.get("dst_dir_fd")))
        for path, dir_fd in paths:
            if path is not None and not _inside(path, dir_fd):
                raise PermissionError(f"{name} outside the sandbox directory is not allowed: {path!r}")
        return real(*args, **kwargs)

    return checked


def _blocked(name):
    def refuse(*args, **kwargs):
        raise PermissionError(f"{name} is disabled in the portachat sandbox")

    return refuse


def install_guard() -> None:
    real_open, real_os_open = builtins.open, os.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if any(c in mode for c in "wax+") and not _inside(file):
            raise PermissionError(f"writing {file!r} outside the sandbox directory is not allowed")
        return real_open(file, mode, *args, **kwargs)

    def guarded_os_open(path, flags, *args, **kwargs):
        if flags & _WRITE_FLAGS and not _inside(path, kwargs.get("dir_fd")):
            raise PermissionError(f"writing {path!r} outside the sandbox directory is not allowed")
        return real_os_open(path, flags, *args, **kwargs)

    builtins.open = io.open = guarded_open
    os.open = posix.open = guarded_os_open

    names = (
        "kill killpg fork forkpty vfork system popen execv execve execl execle execlp execlpe execvp execvpe "
        "spawnv spawnve spawnl spawnle spawnlp spawnlpe spawnvp spawnvpe posix_spawn posix_spawnp "
        "putenv unsetenv fchmod lchmod chown fchown lchown link symlink chdir fchdir chroot mkfifo mknod "
        "setuid setgid seteuid setegid setreuid setregid setresuid setresgid setgroups setsid setpgid "
        "setpgrp nice sched_setaffinity pidfd_open"
    ).split()
    for name in names:
        for module in (os, posix):
            if hasattr(module, name):
                setattr(module, name, _blocked(f"os.{name}"))
    # Changing files: only inside the sandbox directory (tempfile and scratch files keep working).
    for name in ("remove", "unlink", "rmdir", "mkdir", "truncate", "chmod", "utime"):
        if hasattr(os, name):
            checked = _inside_only(f"os.{name}", getattr(os, name))
            setattr(os, name, checked)
            setattr(posix, name, checked)
    for name in ("rename", "replace"):
        checked = _inside_only(f"os.{name}", getattr(os, name), two_paths=True)
        setattr(os, name, checked)
        setattr(posix, name, checked)
    real_rmtree = shutil.rmtree

    def rmtree(path, *args, **kwargs):
        if not _inside(path):
            raise PermissionError(f"shutil.rmtree outside the sandbox directory is not allowed: {path!r}")
        return real_rmtree(path, *args, **kwargs)

    shutil.rmtree = rmtree
    shutil.chown = _blocked("shutil.chown")
    builtins.exit = builtins.quit = _blocked("exit")  # a program must not "pass" by exiting 0 early
    sys.exit = _blocked("sys.exit")
    os._exit = _blocked("os._exit")
    # Modules that open sockets, start processes, call C directly or lift resource limits.
    for mod in ("socket", "_socket", "ssl", "_ssl", "subprocess", "_posixsubprocess", "multiprocessing",
                "_multiprocessing", "ctypes", "_ctypes", "resource", "pty", "signal", "_signal",
                "asyncio", "selectors", "select", "urllib.request", "http.client", "ftplib", "smtplib",
                "telnetlib", "xmlrpc.client", "webbrowser", "concurrent.futures", "faulthandler", "tkinter",
                "pdb", "bdb"):
        sys.modules[mod] = None  # `import mod` now raises ImportError


def main() -> None:
    args = sys.argv[1:]
    if len(args) not in (3, 4) or args[1] != "--nproc" or not args[2].isdigit() or args[3:] not in ([], ["--no-guard"]):
        print("usage: python -c GUARD_SOURCE PROGRAM.py --nproc N [--no-guard]", file=sys.stderr)
        os._exit(2)
    nproc = int(args[2])
    resource.setrlimit(resource.RLIMIT_NPROC, (nproc, nproc))  # soft = hard: the program cannot raise it
    with open(args[0], encoding="utf-8") as f:
        source = f.read()
    code = compile(source, "program.py", "exec")
    real_exit = os._exit
    if not args[3:]:  # --no-guard exists to test the operating-system layers on their own
        install_guard()
    try:
        exec(code, {"__name__": "__main__", "__builtins__": builtins})
    except BaseException as exc:  # noqa: BLE001 - any failure of the program is a failed sample
        print(f"{type(exc).__name__}: {exc}"[:2000], file=sys.stderr)
        sys.stderr.flush()
        real_exit(1)
    sys.stdout.flush()
    sys.stderr.flush()
    real_exit(0)


if __name__ == "__main__":
    main()
