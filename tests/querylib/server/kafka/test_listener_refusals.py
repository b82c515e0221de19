"""What a refused request leaves behind on a Kafka listener with SASL (DESIGN §12): nothing that
changes what another user may do, and nothing that grows with what strangers send. A refused
AddOffsetsToTxn, TxnOffsetCommit or OffsetCommit claims no group; requests are counted by api
version only for the versions served."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from querylib.kafka import ApiKey, ErrorCode
from querylib.kafka._apis import is_supported

from ._support import ListenerThread, WireClient, make_request, running_listener

A = ApiKey


@pytest.fixture
def served(tmp_path: Path) -> Iterator[ListenerThread]:
    with running_listener(str(tmp_path), sasl=("PLAIN",)) as thread:
        thread.call(thread.backend.create_topic("t", 1))
        yield thread


def login(served: ListenerThread, user: str) -> WireClient:
    client = WireClient(served.port)
    client.authenticate(user, served.call(served.backend.password(f"user:{user}")))
    return client


def offset_commit(group: str, generation: int = -1, member: str = "") -> object:
    return make_request(A.OFFSET_COMMIT, 9, group_id=group,
                        generation_id_or_member_epoch=generation, member_id=member,
                        group_instance_id=None, topics=[{"name": "t", "partitions": [
                            {"partition_index": 0, "committed_offset": 1,
                             "committed_leader_epoch": -1, "committed_metadata": None}]}])


def commit_code(response: object) -> int:
    return response.topics[0].partitions[0].error_code  # type: ignore[attr-defined]


def test_refused_requests_claim_no_group(served: ListenerThread) -> None:
    """Bob's requests for groups nobody has yet, each refused (no such transactional producer,
    no such member): the groups stay free, and alice, who asks next, gets them."""
    with login(served, "bob") as bob:
        added = bob.call(make_request(A.ADD_OFFSETS_TO_TXN, 2, transactional_id="none",
                                      producer_id=1234, producer_epoch=0, group_id="g-add"))
        assert added.error_code == ErrorCode.invalid_producer_id_mapping
        committed = bob.call(make_request(
            A.TXN_OFFSET_COMMIT, 2, transactional_id="none", group_id="g-txn",
            producer_id=1234, producer_epoch=0, topics=[{"name": "t", "partitions": [
                {"partition_index": 0, "committed_offset": 1, "committed_leader_epoch": -1,
                 "committed_metadata": None}]}]))
        assert commit_code(committed) == ErrorCode.invalid_producer_id_mapping
        member = bob.call(offset_commit("g-commit", generation=3, member="stranger"))
        assert commit_code(member) == ErrorCode.unknown_member_id
    with login(served, "alice") as alice:
        for group in ("g-add", "g-txn", "g-commit"):
            assert commit_code(alice.call(offset_commit(group))) == ErrorCode.none, group
    with login(served, "bob") as bob:  # now they are alice's
        refused = bob.call(offset_commit("g-commit"))
        assert commit_code(refused) == ErrorCode.group_authorization_failed


def test_requests_are_counted_only_for_the_versions_served(served: ListenerThread) -> None:
    """Strangers sending made-up api keys and versions, before and after authenticating:
    every connection is closed, and the per-version counters hold only versions the
    listener serves (they would otherwise grow with every pair a client makes up)."""
    metadata = make_request(A.METADATA, 12, topics=None, allow_auto_topic_creation=False,
                            include_topic_authorized_operations=False)
    for i in range(20):
        with WireClient(served.port) as stranger:
            stranger.send(metadata, api_key=1000 + i, version=7 + i)
            assert stranger.is_closed()
        with login(served, "bob") as bob:
            bob.send(metadata, api_key=A.METADATA, version=100 + i)
            assert bob.is_closed()
    counted = served.listener.stats.versions  # type: ignore[union-attr]
    assert counted[A.SASL_HANDSHAKE, 1] == 20
    assert all(is_supported(key, version) for key, version in counted), sorted(counted)
