"""storage.atomic.atomic_file: a file is replaced whole or not at all, whoever writes the new content."""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from portachat.storage import atomic
from portachat.storage.atomic import atomic_file, write_text_atomic


class Crash(Exception):
    pass


def test_another_program_writes_the_file_through_the_temporary_path(tmp_path):
    out = tmp_path / "lib.bin"
    with atomic_file(out) as tmp:
        assert tmp.parent == tmp_path and tmp.name.startswith(".tmp-lib.bin.") and not out.exists()
        subprocess.run([sys.executable, "-c", "import sys; open(sys.argv[1], 'wb').write(b'\\x00built')", str(tmp)],
                       check=True)
    assert out.read_bytes() == b"\x00built"
    assert [p.name for p in tmp_path.iterdir()] == ["lib.bin"]


def test_a_failed_write_keeps_the_old_file_and_leaves_no_temporary(tmp_path):
    out = tmp_path / "state.json"
    out.write_text("old")
    with pytest.raises(Crash), atomic_file(out) as tmp:
        tmp.write_text("half of the ne")
        raise Crash
    assert out.read_text() == "old"
    assert [p.name for p in tmp_path.iterdir()] == ["state.json"]


def test_the_new_content_is_fsynced_before_the_rename(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = atomic.os.fsync, atomic.os.replace
    monkeypatch.setattr(atomic.os, "fsync", lambda fd: (events.append("fsync"), real_fsync(fd))[1])
    monkeypatch.setattr(atomic.os, "replace", lambda a, b: (events.append("replace"), real_replace(a, b))[1])
    write_text_atomic(tmp_path / "a.txt", "x")
    assert events == ["fsync", "replace", "fsync"]  # the file, the rename, the directory


def test_concurrent_writers_never_share_a_temporary_file(tmp_path):
    out = tmp_path / "cache.json"
    names, errors = [], []
    barrier = threading.Barrier(8)

    def write(i: int) -> None:
        try:
            with atomic_file(out) as tmp:
                names.append(tmp.name)
                barrier.wait()  # every writer holds its temporary path at once
                tmp.write_text(str(i) * 1000)
        except Exception as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors and len(set(names)) == 8
    text = out.read_text()
    assert len(text) == 1000 and len(set(text)) == 1  # one writer's whole content
