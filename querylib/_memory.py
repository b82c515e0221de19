"""Keep freed megabytes for reuse: glibc's malloc settings for processes that stream records.

Publishers, brokers and subscribers allocate and free a buffer of about a megabyte per batch.
glibc serves an allocation that size with mmap, or (once it has adapted) from the heap but
trims the heap back to the OS whenever 2x that lies free on top; either way each new batch
lands on pages the kernel must fault in again, about 80 faults per megabyte, measured at ~20%
of a publisher's encoding time. `keep_freed_memory()` raises both thresholds (mmap only above
4 MiB; trim only above 32 MiB free), so a streaming process reuses the same pages; the cost is
up to 32 MiB of freed heap it does not give back.

Process-wide and idempotent; does nothing off glibc, or when the user set either threshold
(MALLOC_MMAP_THRESHOLD_, MALLOC_TRIM_THRESHOLD_, or glibc.malloc tunables): theirs win.
"""

from __future__ import annotations

import ctypes
import os
import sys

__all__ = ["keep_freed_memory"]

_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 4 * 1024 * 1024
TRIM_THRESHOLD = 32 * 1024 * 1024
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")

_done = False


def keep_freed_memory() -> bool:
    """Set the thresholds once per process; True if they are ours now."""
    global _done
    if _done:
        return True
    _done = True
    if not sys.platform.startswith("linux") or _user_chose():
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt)
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
                and mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))


def _user_chose() -> bool:
    return (any(name in os.environ for name in _USER_SETTINGS)
            or "glibc.malloc." in os.environ.get("GLIBC_TUNABLES", ""))
