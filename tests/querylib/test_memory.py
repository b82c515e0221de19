"""keep_freed_memory: a streaming process reuses the pages of the megabyte buffers it frees
(checked by the page faults of a fresh interpreter), and leaves the user's own settings be;
share_arenas: a broker's threads do not each keep freed megabytes in an arena of their own."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc only")

_PROBE = """
import json, resource, sys
from querylib._memory import keep_freed_memory

ours = keep_freed_memory() if sys.argv[1] == "keep" else None
kept, faults = [], []
for i in range(120):  # what a publisher does: runs joined into a megabyte batch, sent, freed
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    kept.append(b"".join([bytearray(130_000) for _ in range(8)]))
    if len(kept) > 3:
        kept.pop(0)
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(json.dumps({"ours": ours, "faults": sum(faults[20:]) / 100}))
"""


def _probe(mode: str = "keep", **env: str) -> dict:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _PROBE, mode], env={**clean, **env}, check=True,
                         capture_output=True, text=True, timeout=60).stdout
    return json.loads(out)


def test_freed_megabytes_are_reused_without_faulting_pages_in_again() -> None:
    default, kept = _probe("default"), _probe("keep")
    assert kept["ours"] is True
    assert default["faults"] > 20  # of a batch's ~260 pages, glibc gives many back each time
    assert kept["faults"] < 2


def test_a_users_own_malloc_settings_win() -> None:
    assert _probe(MALLOC_TRIM_THRESHOLD_="1000000")["ours"] is False
    assert _probe(GLIBC_TUNABLES="glibc.malloc.mmap_threshold=65536")["ours"] is False


_THREADS_PROBE = """
import json, sys, tempfile, threading

if sys.argv[1] == "broker":  # what a broker's process does first
    from querylib.server.broker import BrokerServer
    BrokerServer(tempfile.mkdtemp(), b"s" * 32)
else:  # what a publisher's or subscriber's process does
    from querylib._memory import keep_freed_memory
    keep_freed_memory()

def resident() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * 4096

barrier = threading.Barrier(8)

def reader() -> None:  # a read thread: megabytes read, held while sent, freed
    held = [bytearray(1_000_000) for _ in range(24)]
    barrier.wait()
    del held

before = resident()
threads = [threading.Thread(target=reader) for _ in range(8)]
for thread in threads:
    thread.start()
for thread in threads:
    thread.join()
print(json.dumps({"kept_mb": (resident() - before) / 1e6}))
"""


def _kept_after_threads(mode: str, **env: str) -> float:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k != "GLIBC_TUNABLES"}
    out = subprocess.run([sys.executable, "-c", _THREADS_PROBE, mode], env={**clean, **env},
                         check=True, capture_output=True, text=True, timeout=60).stdout
    return json.loads(out)["kept_mb"]


def test_a_brokers_threads_share_arenas_so_it_keeps_less_of_what_they_freed() -> None:
    # Each thread's own arena keeps what it freed up to the 32 MiB trim threshold: 8 threads
    # freeing 24 MB each kept all 192 MB; sharing two arenas, about half of it.
    client = _kept_after_threads("client")
    broker = _kept_after_threads("broker")
    assert client > 150
    assert broker < 0.7 * client
    assert _kept_after_threads("broker", MALLOC_ARENA_MAX="8") > 150  # the user's choice wins
