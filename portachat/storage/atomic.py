"""Atomic writes: a checkpoint is either complete on disk or not there at all.

Everything is written into a hidden temporary sibling directory, fsynced, then renamed into
place. A crash, SIGKILL or full disk mid-write leaves only a `.tmp-*` directory that nothing
points to (and that the next save cleans up). Replacing an existing directory takes two renames
(old aside to `.old-*`, new in); a crash between them leaves only `.old-*`, which the next commit
or read of that directory puts back (`recover_commit`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import secrets
import shutil
from collections.abc import Iterator
from pathlib import Path


class CheckpointError(RuntimeError):
    """A checkpoint could not be written or read; the message says why and what to do."""


def _fsync_tree(root: Path) -> None:
    for dirpath, _dirnames, filenames in os.walk(root):
        for name in filenames:
            with open(os.path.join(dirpath, name), "rb") as f:
                os.fsync(f.fileno())
        fsync_dir(Path(dirpath))


def fsync_dir(path: Path) -> None:
    """Make a rename or a new entry in `path` durable (the directory's own fsync)."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def tmp_dir_for(final: Path) -> Path:
    """The temporary sibling a save of `final` writes into (deterministic, so all ranks agree)."""
    return final.parent / f".tmp-{final.name}"


def disk_full_message(path: Path, exc: OSError) -> str:
    free = shutil.disk_usage(path.parent if path.parent.exists() else Path.cwd()).free
    return (
        f"disk full while writing checkpoint {path} ({exc.strerror}); {free / 2**20:.0f} MiB free. "
        "Nothing was half-written: the previous checkpoint is intact. Free space or point "
        "PORTACHAT_HOME (or --runs-root) at a larger disk, then resume with --resume."
    )


def old_dir_for(final: Path) -> Path:
    """Where commit_tmp moves the directory it replaces until the new one is in place."""
    return final.parent / f".old-{final.name}"


def recover_commit(final: Path) -> None:
    """Undo what a crash inside commit_tmp left: `.old-X` without `X` is the previous checkpoint,
    renamed back (the half-committed new one is dropped with its `.tmp-*`); `.old-X` beside `X`
    is a leftover whose removal the crash cut short."""
    final = Path(final)
    old = old_dir_for(final)
    if not old.is_dir():
        return
    if final.exists():
        shutil.rmtree(old, ignore_errors=True)
        return
    os.rename(old, final)
    fsync_dir(final.parent)


def prepare_tmp(final: Path) -> Path:
    """Create an empty temporary sibling of `final` to write a checkpoint into."""
    recover_commit(final)
    tmp = tmp_dir_for(final)
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    return tmp


def commit_tmp(tmp: Path, final: Path) -> None:
    """fsync everything under `tmp`, then rename it to `final` (replacing an old `final` last)."""
    _fsync_tree(tmp)
    recover_commit(final)
    if final.exists():
        old = old_dir_for(final)
        os.rename(final, old)
        os.rename(tmp, final)
        shutil.rmtree(old)
    else:
        os.rename(tmp, final)
    fsync_dir(final.parent)


def translate_os_error(final: Path, exc: BaseException) -> BaseException:
    """A full disk becomes a CheckpointError that says so; other errors pass through."""
    if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return CheckpointError(disk_full_message(final, exc))
    return exc


@contextlib.contextmanager
def atomic_directory(final: Path) -> Iterator[Path]:
    """Yield a temporary directory; on clean exit fsync it and rename it to `final`."""
    final = Path(final)
    tmp = prepare_tmp(final)
    try:
        yield tmp
        commit_tmp(tmp, final)
    except BaseException as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        translated = translate_os_error(final, exc)
        if translated is exc:
            raise
        raise translated from exc


@contextlib.contextmanager
def atomic_file(path: Path) -> Iterator[Path]:
    """Yield a temporary sibling path for `path`'s new content, written by us or by another program (a
    compiler, a library's file writer); on clean exit fsync it, rename it over `path` and fsync the
    directory, so readers see the old file or the whole new one. The name is unique per call, so
    processes writing the same file at once never share a temporary file."""
    path = Path(path)
    tmp = path.parent / f".tmp-{path.name}.{os.getpid()}.{secrets.token_hex(4)}"
    try:
        yield tmp
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        fsync_dir(path.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text_atomic(path: Path, text: str) -> None:
    """Write a small text file so readers see the old or the new content, never a mix."""
    write_bytes_atomic(path, text.encode("utf-8"))


def write_bytes_atomic(path: Path, data: bytes) -> None:
    """Write a file so readers see the old or the new content, never a mix (through `atomic_file`)."""
    with atomic_file(path) as tmp:
        tmp.write_bytes(data)

