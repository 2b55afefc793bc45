"""Whether a range of host addresses is mapped in this process, so that a raw copy through a bad host
pointer raises instead of crashing the interpreter.

Linux answers with ``mincore(2)``, one system call per 256 MiB of range (about a microsecond each): it
fails with ``ENOMEM`` when any page of the range is not mapped. It cannot see the pages' protection,
so a mapped page that may not be read or written (a guard page, read-only code) still faults; on
other platforms nothing is checked.
"""

from __future__ import annotations

import ctypes
import errno
import mmap
import sys
from typing import Any

__all__ = ["is_mapped"]

_PAGE = mmap.PAGESIZE
_CHUNK_PAGES = 1 << 16  # pages per call
# Where mincore writes which pages are resident. Never read, so every thread may share it.
_vector = ctypes.create_string_buffer(_CHUNK_PAGES)
_mincore: Any = None
if sys.platform.startswith("linux"):
    try:
        _mincore = ctypes.CDLL(None, use_errno=True).mincore
        _mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
        _mincore.restype = ctypes.c_int
    except (OSError, AttributeError):  # no C library symbols to look at: nothing is checked
        _mincore = None


def is_mapped(ptr: int, nbytes: int) -> bool:
    """False when some page of ``[ptr, ptr + nbytes)`` is not mapped in this process; True when all
    are, for ``nbytes`` 0, and where this platform cannot tell."""
    if _mincore is None or nbytes <= 0:
        return True
    start = ptr - ptr % _PAGE
    end = ptr + nbytes
    while start < end:
        length = min(end - start, _CHUNK_PAGES * _PAGE)
        if _mincore(start, length, _vector) != 0:
            # ENOMEM: unmapped (or past the user address space); EAGAIN and the like say nothing.
            return ctypes.get_errno() != errno.ENOMEM
        start += length
    return True
