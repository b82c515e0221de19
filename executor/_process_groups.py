"""Signalling and emptying a query's process group (its main process and everything it started
that stayed in the group). POSIX only.

A query process is the leader of its own session and group (pgid = its pid), so `killpg`
reaches the grandchildren too. The group id cannot be reused while any member exists, so
signalling it is safe for as long as there is someone to signal.

Zombies count as gone: an orphaned grandchild that exits is reparented to init, and where init
does not reap (some container inits do not), it stays a zombie in the group forever.
"""

from __future__ import annotations

import asyncio
import os
import signal

import psutil

__all__ = ["live_members", "signal_process_group", "terminate_process_group"]


def signal_process_group(pgid: int, sig: int) -> bool:
    """Send `sig` to the group; False if it has no members left."""
    try:
        os.killpg(pgid, sig)
    except ProcessLookupError:
        return False
    return True


def live_members(pgid: int) -> list[int]:
    """Pids of the group's members that are not zombies."""
    if not signal_process_group(pgid, 0):
        return []
    # Someone (maybe only a zombie) is in the group: look closer. O(processes on the host),
    # so callers poll this only while a group is being terminated.
    members = []
    for proc in psutil.process_iter():
        try:
            if os.getpgid(proc.pid) == pgid and proc.status() != psutil.STATUS_ZOMBIE:
                members.append(proc.pid)
        except (ProcessLookupError, psutil.NoSuchProcess):
            continue
    return members


async def terminate_process_group(pgid: int, grace: float, *, poll: float = 0.05) -> bool:
    """SIGTERM to the group; SIGKILL to whatever is left after `grace` seconds. Returns once
    the group is empty (True) or has been sent SIGKILL (False)."""
    if not signal_process_group(pgid, signal.SIGTERM):
        return True
    loop = asyncio.get_running_loop()
    deadline = loop.time() + grace
    while True:
        if not signal_process_group(pgid, 0) or not await asyncio.to_thread(live_members, pgid):
            return True  # the scan of the process table runs off the event loop
        if loop.time() >= deadline:
            break
        await asyncio.sleep(min(poll, max(0.0, deadline - loop.time())))
    signal_process_group(pgid, signal.SIGKILL)
    return False
