"""How many bytes the process's heap holds now: how the grammar cache learns what a compiled grammar
costs. llguidance gives no size for a compiled grammar, and most of it is built lazily (its lexer
states), so the cache measures the heap before a compile and after the first masks of a probe.

glibc's mallinfo2 counts bytes in use (llguidance allocates through malloc), so memory an earlier
grammar freed and this one reuses still counts; elsewhere the resident set size stands in (it
under-counts reused memory, which is why the cache also keeps a floor per grammar)."""

from __future__ import annotations

import ctypes
import ctypes.util
import sys
from functools import cache

import psutil


class _MallInfo2(ctypes.Structure):
    _fields_ = [(name, ctypes.c_size_t) for name in
                ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks",
                 "keepcost")]


@cache
def _mallinfo2():
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        fn = libc.mallinfo2  # glibc 2.33+; musl has none
    except (OSError, AttributeError):
        return None
    fn.restype = _MallInfo2
    fn.argtypes = []
    return fn


def heap_in_use() -> int:
    """Bytes the heap holds (glibc: allocated chunks plus mmapped blocks; else the RSS)."""
    fn = _mallinfo2()
    if fn is not None:
        info = fn()
        return int(info.uordblks + info.hblkhd)
    return int(psutil.Process().memory_info().rss)
