"""querylib._parent: the death signal is armed, and a parent that is not ours is said."""

from __future__ import annotations

import subprocess
import sys

import pytest

_ARMED = """
import ctypes, os, signal
from querylib._parent import die_with_parent
assert die_with_parent(os.getppid())
got = ctypes.c_int()
ctypes.CDLL(None, use_errno=True).prctl(2, ctypes.byref(got), 0, 0, 0)  # PR_GET_PDEATHSIG
print(got.value == signal.SIGKILL)
"""

_NOT_OURS = """
import os
from querylib._parent import die_with_parent
print(die_with_parent(os.getppid() + 1_000_000))
"""


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="PR_SET_PDEATHSIG is Linux's")
def test_the_death_signal_is_armed_in_the_child() -> None:
    done = subprocess.run([sys.executable, "-c", _ARMED], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


def test_a_parent_that_is_not_ours_is_said() -> None:
    done = subprocess.run([sys.executable, "-c", _NOT_OURS], capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "False"
