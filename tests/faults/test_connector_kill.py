"""SIGKILL the ingesting connector process and the broker at random points of a `tq ingest`,
restart whichever died, and go on (a bounded number of rounds): in the end every line is in the
topic exactly once, in order. Duplicates resent after a crash are filtered by message id; data
appended after the last checkpoint is found in the partition itself."""

from __future__ import annotations

import random
import subprocess

import pytest

from tests.conftest import wait_for
from tests.integration.test_connector_ingest import Cluster, lines_file

LINES = 80_000
ROUNDS = 4


@pytest.mark.parametrize(("dialect", "seed"), [("draft", 8), ("released", 9)])
def test_kills_at_random_points_lose_and_double_nothing(processes, tmp_path, dialect, seed):
    rng = random.Random(seed)
    source = lines_file(tmp_path / "in.txt", LINES)
    cluster = Cluster(processes, tmp_path, credits=64)
    cluster.start()
    full = source.stat().st_size * 1.5  # the log holds each line plus its record overhead

    def start_ingest() -> subprocess.Popen:
        return cluster.ingest("kills", source, dialect, "--timeout", "10",
                              stderr=subprocess.DEVNULL)

    ingest = start_ingest()
    # Both kinds of victim, in a random order; each kill waits for the log to have grown to
    # a random point first, so kills land mid-stream rather than before or after it.
    victims = ["broker", "connector"] * (ROUNDS // 2)
    rng.shuffle(victims)
    marks = sorted(rng.uniform(0.05, 0.85) for _ in victims)
    kills = {"broker": 0, "connector": 0}
    for victim, mark in zip(victims, marks, strict=True):
        wait_for(lambda mark=mark, ingest=ingest: cluster.log_bytes("kills") >= mark * full
                 or ingest.poll() is not None, timeout=60, what="ingest progress")
        if ingest.poll() is not None:
            break  # finished before this point: nothing left to interrupt
        kills[victim] += 1
        if victim == "broker":
            cluster.kill()
            cluster.start()  # the connector reconnects to it on its own
        else:
            ingest.kill()
            ingest.wait(10)
            ingest = start_ingest()  # same file and instance: resumes
    assert ingest.wait(120) == 0
    assert kills["broker"] and kills["connector"], kills
    cluster.stop()
    ids, ends, _ = cluster.contents("kills")
    assert ids == list(range(LINES)), "a line is missing or stored twice"
    assert ends == [b"line-0", f"line-{LINES - 1}".encode()]
