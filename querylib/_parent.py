"""Dying with the parent: `die_with_parent()` arms Linux's PR_SET_PDEATHSIG, so the kernel
SIGKILLs this process when the thread that started it dies, however it dies (SIGKILL, the OOM
killer), and says whether the parent is still the one expected (it may have died before the
signal was armed: the caller then exits). `tq up`'s executor child and the peers bench's
servers call it; elsewhere than Linux it only does the check.

The executor's launcher and fork server (executor/_launcher.py, _zygote.py) arm the same
signal with their own few lines: they run before anything of tq is importable, or must not
import it.

Must not: import anything of tq (it runs first in a child, before exec in a preexec_fn too).
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["die_with_parent"]

_PR_SET_PDEATHSIG = 1


def die_with_parent(parent: int) -> bool:
    """Be SIGKILLed when the thread that started this process dies. False if `parent` is no
    longer this process's parent (it died first: nobody will signal); OSError if the kernel
    refuses."""
    if sys.platform.startswith("linux"):
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        if libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0) != 0:
            raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    return os.getppid() == parent
