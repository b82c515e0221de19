"""querylib consumer groups on a real `tq up`: members split a topic's partitions through the
group coordinator on the coordinator's broker, a member that leaves hands its partitions to
the others, and committed offsets outlive the member and a restart of `tq up` on the same data
(the executor's broker keeps its id, the group coordinator its port; at-least-once delivery)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

import querylib
from catalog import Broker
from querylib.api import Hash
from querylib.api._events import Data
from tests.conftest import free_port, wait_for
from tests.integration._up_endpoints import UpWithEndpoints

pytestmark = pytest.mark.timeout(120)

TOPIC_PARTITIONS = 6


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-groups"),
                         "--connector-port", "-1", "--kafka-port", str(free_port())) as running:
        yield running


def _publisher(ctx: querylib.api.Context, topic: str):
    return ctx.publish(topic, partition=Hash(TOPIC_PARTITIONS), serde="json")


def _drain(sub, seen: list[int], limit: float = 0.2) -> None:
    """Everything the subscription delivers within `limit` seconds of quiet."""
    while (event := sub.next_event(timeout=limit)) is not None:
        if isinstance(event, Data):
            seen.extend(event.records)


def test_three_members_split_six_partitions_and_survivors_take_over(up) -> None:
    owner = up.connect()
    pub = _publisher(owner, "g-numbers")
    pub.send(0, list(range(600)))
    contexts = [up.connect() for _ in range(3)]
    seen: list[list[int]] = [[], [], []]
    try:
        subs = [ctx.subscribe("g-numbers", group="g1", serde="json") for ctx in contexts]

        def split_evenly() -> bool:
            for sub, got in zip(subs, seen, strict=True):
                _drain(sub, got, 0.05)
            owned = [sorted(s.member.assignment.get("g-numbers", [])) for s in subs]
            return sorted(p for o in owned for p in o) == list(range(6)) and \
                all(len(o) == 2 for o in owned)

        wait_for(split_evenly, timeout=30, what="three members holding two partitions each")
        wait_for(lambda: split_evenly() and False or sum(map(len, seen)) >= 600, timeout=30,
                 what="all 600 records delivered")
        subs[2].close()  # leaves: its partitions go to the two others
        contexts[2].close()
        pub.send(1, list(range(600, 900)))

        def survivors_hold_all() -> bool:
            for sub, got in zip(subs[:2], seen[:2], strict=True):
                _drain(sub, got, 0.05)
            owned = [p for s in subs[:2] for p in s.member.assignment.get("g-numbers", [])]
            return sorted(owned) == list(range(6))

        wait_for(survivors_hold_all, timeout=30, what="the two survivors holding all six")

        def all_delivered() -> bool:
            for sub, got in zip(subs[:2], seen[:2], strict=True):
                _drain(sub, got, 0.05)
            return set().union(*map(set, seen)) >= set(range(900))

        wait_for(all_delivered, timeout=30, what="every record delivered to some member")
        # At-least-once: duplicates only of records handed out after the last commit before
        # the rebalance; here the leaver committed on close, so none of its records repeat.
        assert set().union(*map(set, seen)) == set(range(900))
        for sub in subs[:2]:
            sub.close()
    finally:
        for ctx in contexts:
            ctx.close()
        pub.close()
        owner.close()


def test_a_new_member_resumes_at_the_commit_after_a_restart(tmp_path) -> None:
    home = tmp_path / "home"
    first = UpWithEndpoints(home, "--connector-port", "-1", "--kafka-port", "-1")
    try:
        with first.connect() as owner, _publisher(owner, "g-resume") as pub:
            pub.send(0, list(range(100)))
            with first.connect() as ctx:
                sub = ctx.subscribe("g-resume", group="g2", serde="json")
                got: list[int] = []
                wait_for(lambda: _drain(sub, got, 0.05) or len(got) >= 100, timeout=30,
                         what="the first member reading all 100")
                sub.close()  # commits the next offsets to read, then leaves
            assert sorted(got) == list(range(100))
            pub.send(1, list(range(100, 130)))  # after the commit: for the next member
        coordinator = _group_coordinator(first)
    finally:
        first.stop()
    # Restarted as an operator would: same data, same coordinator address.
    second = UpWithEndpoints(home, "--connector-port", "-1", "--kafka-port", "-1",
                             "--listen", first.info["coordinator"])
    try:
        # Its Kafka listener (any free port) came back on the same port: the same record.
        assert _group_coordinator(second) == coordinator
        with second.connect() as ctx:
            sub = ctx.subscribe("g-resume", group="g2", serde="json", start="committed")
            later: list[int] = []
            wait_for(lambda: _drain(sub, later, 0.05) or len(later) >= 30, timeout=30,
                     what="the new member reading what came after the commit")
            _drain(sub, later, 0.3)
            sub.close()
        assert sorted(later) == list(range(100, 130))
    finally:
        second.stop()


def _group_coordinator(up: UpWithEndpoints) -> Broker:
    """The coordinator's broker record: the group coordinator and its Kafka address."""
    with up.cluster() as cluster:
        (found,) = [b for b, _ in cluster.snapshot("brokers")["brokers"].records
                    if isinstance(b, Broker) and b.session_id is None]
    return found
