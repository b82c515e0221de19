"""BrokerBackend, the one Kafka backend (what `tq up`, `tq broker --kafka-port` and `tq kafka`
run), over a real BrokerServer in this process with no RPC socket (standalone: the broker alone
is the cluster): partitions already on disk are served, topics are created and refused as
Kafka's rules say, producer batches go through the broker's door (its core admits them, its
lane writes the log) and read back as the stored bytes, idempotent retries are answered with
the original offset, reads stop at what subscribers may see, a waiting fetch wakes on an
append, and producer ids, the cluster id, committed offsets and groups survive a restart."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import pytest

from catalog.errors import (
    InvalidPartitionsError,
    InvalidTopicNameError,
    ReservedTopicNameError,
    StorageError,
    TopicExistsError,
    TqError,
)
from querylib.broker import (
    BatchTooLargeError,
    EndStreamRequest,
    OpenProducerRequest,
    StreamEndedError,
    TopicAuthorizationError,
)
from querylib.errors import CorruptRecordError, OffsetOutOfRangeError
from querylib.kafka import OutOfOrderSequenceError, UnknownPartitionError
from querylib.log import LogConfig, PartitionLog
from querylib.records import decode_batch, encode_batch, iter_batches
from querylib.server.broker import BrokerLimits, BrokerServer
from querylib.server.kafka import (
    OFFSETS_TOPIC,
    BrokerBackend,
    CommittedOffset,
    GroupMemberRecord,
    GroupRecord,
    KafkaConfig,
)
from querylib.server.kafka._broker_backend import META_FILE
from tests._fsync import assert_synced_then_its_folder, record_fsyncs
from tests.integration._broker_helpers import AliceOwnsMine

T = TypeVar("T")
SECRET = b"0123456789abcdef0123456789abcdef"


def run(data_dir: Path, body: Callable[[BrokerBackend], Awaitable[T]], *,
        secret: bytes | None = SECRET, log_config: LogConfig | None = None,
        limits: BrokerLimits | None = None, directory: Any = None, **config: Any) -> T:
    async def main() -> T:
        server = BrokerServer(data_dir, SECRET, log_config=log_config or LogConfig(),
                              limits=limits, directory=directory)
        await server.start(None)
        backend = await BrokerBackend(server.port, KafkaConfig(port=0, **config),
                                      secret=secret).open()
        try:
            return await body(backend)
        finally:
            await backend.close()
            await server.close()

    return asyncio.run(main())


def batch(*values: bytes, ts: int = 1_700_000_000_000, **kwargs) -> bytes:
    return encode_batch([(ts + i, b"k", v, ()) for i, v in enumerate(values)], **kwargs)


def test_partitions_on_disk_are_served_and_the_offsets_topic_is_made(tmp_path: Path) -> None:
    with PartitionLog.open(tmp_path / "numbers-0") as log:
        log.append(batch(b"a", b"b"))
    with PartitionLog.open(tmp_path / "numbers-1") as log:
        log.append(batch(b"c"))

    async def body(backend: BrokerBackend):
        return await backend.topics(), await backend.offsets("numbers", 0)

    topics, offsets = run(tmp_path, body)
    assert [(t.name, len(t.partitions), t.internal) for t in topics] == [
        (OFFSETS_TOPIC, 1, True), ("numbers", 2, False)]
    assert (offsets.log_start_offset, offsets.high_watermark) == (0, 2)
    assert (tmp_path / f"{OFFSETS_TOPIC}-0").is_dir()


def test_create_topic_and_its_refusals(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> None:
        created = await backend.create_topic("acme/lab/raw", 2)
        assert [p.index for p in created.partitions] == [0, 1]
        with pytest.raises(TopicExistsError):
            await backend.create_topic("acme/lab/raw", 1)
        with pytest.raises(ReservedTopicNameError):
            await backend.create_topic("__mine", 1)
        with pytest.raises(InvalidTopicNameError):
            await backend.create_topic("bad name")
        with pytest.raises(InvalidPartitionsError):
            await backend.create_topic("zero", 0)
        names = [t.name for t in await backend.topics()]
        assert "acme/lab/raw" in names and OFFSETS_TOPIC in names

    run(tmp_path, body)
    assert sorted(os.listdir(tmp_path)) == [
        f"{OFFSETS_TOPIC}-0", "acme%2Flab%2Fraw-0", "acme%2Flab%2Fraw-1"]


def test_appends_go_through_the_broker_and_read_back_as_stored(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> None:
        await backend.create_topic("t", 2)
        first = await backend.append("t", 1, [batch(b"a", b"b")], acks=-1)
        second = await backend.append("t", 1, [batch(b"c")], acks=1)
        assert (first.base_offset, second.base_offset) == (0, 2)
        offsets = await backend.offsets("t", 1)
        assert offsets.high_watermark == offsets.last_stable_offset == 3
        read = await backend.read("t", 1, 1, 1 << 20)
        try:
            data = b"".join(c if isinstance(c, bytes) else c.read() for c in read.chunks)
        finally:
            read.close()
        assert data == backend.port.log(("t", 1)).read(0, 1 << 20)
        assert [r.value for b in iter_batches(data) for r in b.records] == [b"a", b"b", b"c"]
        empty = await backend.read("t", 1, 3, 1 << 20)
        assert empty.chunks == [] and empty.size == 0
        with pytest.raises(OffsetOutOfRangeError):
            await backend.read("t", 1, 4, 100)
        with pytest.raises(UnknownPartitionError):
            await backend.read("nothing", 0, 0, 100)
        corrupt = bytearray(batch(b"x"))
        corrupt[-1] ^= 1
        with pytest.raises(CorruptRecordError):
            await backend.append("t", 0, [bytes(corrupt)], acks=1)

    run(tmp_path, body)


def test_the_broker_core_admits_kafka_writes(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> None:
        # tq's own topics are tq's: 29, TOPIC_AUTHORIZATION_FAILED
        with pytest.raises(TopicAuthorizationError) as refused:
            await backend.append(OFFSETS_TOPIC, 0, [batch(b"x")], acks=1)
        assert refused.value.kafka_error_code == 29
        # a batch over the broker's maximum: 10, MESSAGE_TOO_LARGE
        await backend.create_topic("t", 1)
        with pytest.raises(BatchTooLargeError) as large:
            await backend.append("t", 0, [batch(b"x" * 70_000)], acks=1)
        assert large.value.kafka_error_code == 10
        # Kafka's auto-creation makes topics, not partitions of a topic that exists
        with pytest.raises(TqError) as unknown:
            await backend.append("t", 3, [batch(b"x")], acks=1)
        assert unknown.value.kafka_error_code == 3  # UNKNOWN_TOPIC_OR_PARTITION
        assert (await backend.append("new", 0, [batch(b"x")], acks=1)).base_offset == 0

    run(tmp_path, body, limits=BrokerLimits(max_batch_bytes=64 * 1024))


def test_without_auto_creation_a_producer_makes_nothing(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> None:
        with pytest.raises(TqError) as unknown:
            await backend.append("new", 0, [batch(b"x")], acks=1)
        assert unknown.value.kafka_error_code == 3
        assert not backend.port.hosts(("new", 0))

    run(tmp_path, body, auto_create_topics=False)


def test_a_kafka_write_after_the_end_of_a_stream_is_refused(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> None:
        server_port = backend.port
        await backend.create_topic("t", 1)
        link = server_port.link("admin")
        await link.start()
        await link.request(OpenProducerRequest(session=link.session, topic="t", partition=0))
        await link.request(EndStreamRequest(session=link.session, topic="t", partition=0))
        assert server_port.info(("t", 0)).ended
        with pytest.raises(StreamEndedError) as ended:
            await backend.append("t", 0, [batch(b"late")], acks=1)
        assert ended.value.kafka_error_code == 44  # POLICY_VIOLATION
        await link.close()

    run(tmp_path, body)


def test_idempotent_retries_and_gaps(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> None:
        await backend.create_topic("t", 1)
        pid = await backend.allocate_producer_id()
        assert pid >> 32 == 0  # the standalone broker is node 0
        b0 = batch(b"a", b"b", producer_id=pid, producer_epoch=0, base_sequence=0)
        b1 = batch(b"c", producer_id=pid, producer_epoch=0, base_sequence=2)
        assert (await backend.append("t", 0, [b0], acks=-1)).base_offset == 0
        assert (await backend.append("t", 0, [b1], acks=-1)).base_offset == 2
        assert (await backend.append("t", 0, [b0], acks=-1)).base_offset == 0  # a retry
        with pytest.raises(OutOfOrderSequenceError):
            await backend.append("t", 0, [batch(b"d", producer_id=pid, producer_epoch=0,
                                                base_sequence=9)], acks=-1)
        assert (await backend.offsets("t", 0)).high_watermark == 3

    run(tmp_path, body)


def test_a_retry_is_acknowledged_only_to_a_writer_of_the_topic(tmp_path: Path) -> None:
    """Bob sends a batch under alice's producer id and sequence, to alice's topic: he is
    refused as any write of his there is, not told his batch is stored at her offset."""
    async def body(backend: BrokerBackend) -> None:
        pid = await backend.allocate_producer_id()
        hers = batch(b"alice", producer_id=pid, producer_epoch=0, base_sequence=0)
        assert (await backend.append("mine", 0, [hers], acks=-1,
                                     principal="user:alice")).base_offset == 0
        his = batch(b"bob", producer_id=pid, producer_epoch=0, base_sequence=0)
        with pytest.raises(TopicAuthorizationError):
            await backend.append("mine", 0, [his], acks=-1, principal="user:bob")
        assert (await backend.append("mine", 0, [hers], acks=-1,
                                     principal="user:alice")).base_offset == 0  # a retry
        assert (await backend.offsets("mine", 0)).high_watermark == 1

    run(tmp_path, body, directory=AliceOwnsMine())


def test_refused_writes_keep_no_producer_state(tmp_path: Path) -> None:
    """Writes refused by the broker (no such partition, tq's own topic, another's topic)
    keep nothing per partition: what the backend holds grows with what is written, not with
    what clients ask for."""
    async def body(backend: BrokerBackend) -> None:
        await backend.create_topic("t", 1)
        one = batch(b"x", producer_id=await backend.allocate_producer_id(),
                    producer_epoch=0, base_sequence=0)
        for partition in range(1, 50):
            with pytest.raises(TqError):
                await backend.append("t", partition, [one], acks=1)
        with pytest.raises(TopicAuthorizationError):
            await backend.append(OFFSETS_TOPIC, 0, [one], acks=1)
        with pytest.raises(TopicAuthorizationError):
            await backend.append("mine", 0, [one], acks=1, principal="user:bob")
        assert (await backend.append("t", 0, [one], acks=1)).base_offset == 0
        assert len(backend._producers) == 1  # noqa: SLF001 (only t-0's producers)

    run(tmp_path, body, directory=AliceOwnsMine())


def test_offset_for_timestamp(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> None:
        await backend.create_topic("t", 1)
        await backend.append("t", 0, [batch(b"a", b"b", ts=1000)], acks=1)
        await backend.append("t", 0, [batch(b"c", ts=5000)], acks=1)
        assert await backend.offset_for_timestamp("t", 0, 1001) == (1, 1001)
        assert await backend.offset_for_timestamp("t", 0, 1002) == (2, 5000)
        assert await backend.offset_for_timestamp("t", 0, 5001) is None

    run(tmp_path, body)


def test_a_waiting_fetch_wakes_on_an_append(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> None:
        await backend.create_topic("t", 1)
        # The fetch would wait 60 s; only the append can end it within the 30 s below.
        waiting = asyncio.ensure_future(backend.wait_for_data([("t", 0, 0)], 60.0))
        await asyncio.sleep(0)  # let the wait register before the append
        assert not waiting.done()
        await backend.append("t", 0, [batch(b"a")], acks=1)
        await asyncio.wait_for(waiting, 30.0)
        # Data already there: no wait at all (else the 10 s bound below runs out).
        await asyncio.wait_for(backend.wait_for_data([("t", 0, 0)], 60.0), 10.0)

    run(tmp_path, body)


def test_interval_flush_makes_data_visible_without_another_append(tmp_path: Path) -> None:
    async def body(backend: BrokerBackend) -> None:
        await backend.create_topic("t", 1)
        await backend.append("t", 0, [batch(b"a")], acks=1)
        await asyncio.wait_for(backend.wait_for_data([("t", 0, 0)], 60), 10)
        assert (await backend.offsets("t", 0)).high_watermark == 1

    run(tmp_path, body, log_config=LogConfig(flush="interval", flush_interval_ms=50))


def test_ids_and_the_group_store_survive_a_restart(tmp_path: Path) -> None:
    member = GroupMemberRecord("m", None, "c", "/h", 300, 100, b"sub", b"asg")
    group = GroupRecord("g", "consumer", 3, "range", "m", 42, (member,))

    async def store(backend: BrokerBackend):
        ids = [await backend.allocate_producer_id() for _ in range(3)]
        await backend.store_offsets("g", [CommittedOffset("t", 0, 10, -1, "m", 1)])
        await backend.store_offsets("g", [CommittedOffset("t", 0, 12, -1, "", 2),
                                          CommittedOffset("t", 1, 5, -1, "", 2)])
        await backend.store_group(group)
        return ids, backend.cluster_id

    async def load(backend: BrokerBackend):
        return (await backend.allocate_producer_id(), backend.cluster_id,
                await backend.committed_offsets("g"), await backend.stored_groups())

    # Without a cluster secret (`tq kafka`) the cluster id is made once and kept.
    ids, cluster = run(tmp_path, store, secret=None)
    next_id, cluster_again, committed, groups = run(tmp_path, load, secret=None)
    assert next_id > max(ids)  # producer ids are never handed out twice
    assert cluster_again == cluster and len(cluster) == 22
    assert {k: v.offset for k, v in committed.items()} == {("t", 0): 12, ("t", 1): 5}
    assert groups == [group]
    # and the records are Kafka's formats in a real partition log
    with PartitionLog.open(tmp_path / f"{OFFSETS_TOPIC}-0") as log:
        data = log.read(0, 1 << 20)
    keys = [r.key[:2] for b in iter_batches(data) if not b.is_control for r in b.records]
    assert keys == [b"\x00\x01", b"\x00\x01", b"\x00\x01", b"\x00\x02"]
    assert decode_batch(data).records[0].value[:2] == b"\x00\x03"


@pytest.mark.parametrize("content", [
    b'{"next_producer_id": -5, "cluster_id": "abc"}',        # would hand out negative ids
    b'{"next_producer_id": 4294967296, "cluster_id": "abc"}',  # into the next node's ids
    b'{"next_producer_id": 1.5, "cluster_id": "abc"}',
    b'{"next_producer_id": true, "cluster_id": "abc"}',
    b'{"next_producer_id": Infinity, "cluster_id": "abc"}',
    b'{"next_producer_id": 0, "cluster_id": {}}',
])
def test_a_damaged_producer_id_file_stops_the_start_in_one_line(tmp_path: Path,
                                                                 content: bytes) -> None:
    """`.tq-kafka.json` keeps the next producer id: one not a counter of this node's ids is
    refused (StorageError naming the file), not taken and not a traceback."""
    async def nothing(backend: BrokerBackend) -> None:
        pass

    run(tmp_path, nothing, secret=None)
    (tmp_path / META_FILE).write_bytes(content)
    with pytest.raises(StorageError, match=META_FILE):
        run(tmp_path, nothing, secret=None)


def test_a_link_planted_at_the_producer_id_files_temporary_name_is_not_followed(
        tmp_path: Path) -> None:
    """`.tq-kafka.json.tmp` was the temporary name: a link planted there made the reserved
    producer ids land in its target (and the link take the file's place)."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    data = tmp_path / "data"
    data.mkdir()
    (data / f"{META_FILE}.tmp").symlink_to(victim)

    async def allocate(backend: BrokerBackend) -> int:
        return await backend.allocate_producer_id()

    first = run(data, allocate)
    assert victim.read_text() == "precious\n"
    assert not (data / META_FILE).is_symlink()
    assert run(data, allocate) > first  # the reservation was kept in the file itself


def test_the_producer_id_file_is_fsynced_then_its_directory(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Producer ids are never handed out twice: a power loss after a reservation must not
    bring back the file before it (an old `next_producer_id`), so the directory is fsynced
    after the rename, as the file is before it."""
    async def allocate(backend: BrokerBackend) -> list[tuple[int, int]]:
        synced = record_fsyncs(monkeypatch)
        await backend.allocate_producer_id()  # the first reserves a block: writes the file
        monkeypatch.undo()
        return synced

    synced = run(tmp_path, allocate)
    assert_synced_then_its_folder(synced, tmp_path / META_FILE)


def test_markers_on_another_broker_go_in_one_request_per_broker(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A transaction's markers for partitions of another broker (as the coordinator's broker
    writes them into an executor's under `tq up`) cross in one WriteMarkersRequest, which
    appends a COMMIT marker to each of them; a partition that broker does not have needs
    none."""
    from querylib.server.kafka._backend import PartitionInfo as KafkaPartition
    from querylib.server.kafka._backend import TopicInfo
    from querylib.server.kafka._broker_backend import StandaloneCluster

    async def main() -> tuple[list[str], list[list[tuple[int, bool]]]]:
        far = BrokerServer(tmp_path / "far", SECRET, log_config=LogConfig())
        address = await far.start("tcp://127.0.0.1:0")
        near = BrokerServer(tmp_path / "near", SECRET, log_config=LogConfig())
        await near.start(None)
        for partition in (0, 1):
            await far.port.ensure("t", partition, create=True)

        class Cluster(StandaloneCluster):
            """Topic "t" has three partitions, all led by the far broker (node 7)."""

            async def kafka_topics(self, names: Any) -> list[TopicInfo]:
                if names == ["t"]:
                    return [TopicInfo("t", tuple(KafkaPartition(i, 7) for i in range(3)))]
                return await super().kafka_topics(names)

            def broker_address(self, node_id: int) -> str | None:
                return address if node_id == 7 else None

        config = KafkaConfig(port=0)
        backend = await BrokerBackend(near.port, config, secret=SECRET,
                                      cluster=Cluster(near.port, config)).open()
        sent: list[str] = []
        try:
            writer = await backend._remote_writer(address)
            request = writer.link.request

            async def spy(req: Any, **kwargs: Any) -> Any:
                sent.append(type(req).__name__)
                return await request(req, **kwargs)

            writer.link.request = spy  # type: ignore[method-assign]
            await backend.write_markers([("t", 0), ("t", 1), ("t", 2)], 42, 3, True)
            markers = []
            for partition in (0, 1):
                pid = ("t", partition)
                log, end = far.port.log(pid), far.port.info(pid).high_watermark
                markers.append([(b.producer_id, b.is_control)
                                for b in iter_batches(log.read(0, end))])
        finally:
            await backend.close()
            await near.close()
            await far.close()
        return sent, markers

    with caplog.at_level("WARNING", logger="querylib.kafka"):
        sent, markers = asyncio.run(main())
    assert sent == ["WriteMarkersRequest"]
    assert markers == [[(42, True)], [(42, True)]]
    assert "no transaction marker in t-2" in caplog.text


def test_markers_for_another_broker_fence_the_older_epoch_there(tmp_path: Path) -> None:
    """As under `tq up` (the transaction coordinator on the coordinator's broker, the data on
    the executor's): the markers for the other broker's partitions go there in one
    WriteMarkersRequest, every partition gets its marker, and the producer's older epoch is
    refused there afterwards."""
    from querylib.kafka import InvalidProducerEpochError
    from querylib.server.kafka._backend import PartitionInfo as KafkaPartition
    from querylib.server.kafka._backend import TopicInfo
    from querylib.server.kafka._broker_backend import StandaloneCluster

    async def main() -> tuple[list[str], list[list[tuple[int, bool]]], TqError | None]:
        far = BrokerServer(tmp_path / "far", SECRET, log_config=LogConfig())
        address = await far.start("tcp://127.0.0.1:0")
        near = BrokerServer(tmp_path / "near", SECRET, log_config=LogConfig())
        await near.start(None)
        config = KafkaConfig(port=0)
        far_backend = await BrokerBackend(far.port, config, secret=SECRET).open()
        for partition in (0, 1):
            await far.port.ensure("t", partition, create=True)
        # An open transaction of producer 42, epoch 3, in t-0, through the far listener.
        await far_backend.append("t", 0, [batch(b"a", producer_id=42, producer_epoch=3,
                                                base_sequence=0, is_transactional=True)],
                                 acks=-1)

        class Cluster(StandaloneCluster):
            """Topic "t" has three partitions, all led by the far broker (node 7)."""

            async def kafka_topics(self, names: Any) -> list[TopicInfo]:
                if names == ["t"]:
                    return [TopicInfo("t", tuple(KafkaPartition(i, 7) for i in range(3)))]
                return await super().kafka_topics(names)

            def broker_address(self, node_id: int) -> str | None:
                return address if node_id == 7 else None

        backend = await BrokerBackend(near.port, config, secret=SECRET,
                                      cluster=Cluster(near.port, config)).open()
        remote: list[str] = []
        remote_writer = backend._remote_writer

        async def spy(where: str) -> Any:
            remote.append(where)
            return await remote_writer(where)

        backend._remote_writer = spy  # type: ignore[method-assign]
        fenced: TqError | None = None
        try:
            await backend.write_markers([("t", 0), ("t", 1), ("t", 2)], 42, 4, True)
            markers = []
            for partition in (0, 1):
                pid = ("t", partition)
                markers.append([(b.producer_id, b.is_control)
                                for b in iter_batches(far.port.log(pid).read(0, 1 << 20))])
            try:
                await far_backend.append("t", 0, [batch(
                    b"late", producer_id=42, producer_epoch=3, base_sequence=1,
                    is_transactional=True)], acks=-1)
            except TqError as exc:
                fenced = exc
        finally:
            await backend.close()
            await far_backend.close()
            await near.close()
            await far.close()
        return remote, markers, fenced

    remote, markers, fenced = asyncio.run(main())
    assert len(remote) == 1  # one request for both of the far broker's partitions
    assert markers == [[(42, False), (42, True)], [(42, True)]]
    assert isinstance(fenced, InvalidProducerEpochError)


async def _begin_in_a_and_b(backend: BrokerBackend) -> tuple[int, int]:
    """Transactional id "t" opens a transaction and writes a batch in partitions a-0 and
    b-0, each added first (AddPartitionsToTxn): its producer id and epoch."""
    txns = backend.transactions
    pid, epoch = await txns.init_producer_id("t", 60_000, "anonymous")
    for topic in ("a", "b"):
        await backend.port.ensure(topic, 0, create=True)
        await txns.add_partitions("t", pid, epoch, [(topic, 0)], "anonymous")
        await backend.append(topic, 0, [batch(topic.encode(), producer_id=pid,
                                              producer_epoch=epoch, base_sequence=0,
                                              is_transactional=True)], acks=-1)
    return pid, epoch


def test_a_transaction_whose_last_ongoing_record_was_lost_is_aborted(tmp_path: Path) -> None:
    """The coordinator's Ongoing records are answered once written (no fsync): a power loss
    may take the last one (here: partition b added). The coordinator restarted on that log
    must not commit the transaction without b: it aborts it in a (its epoch bumped, so the
    producer's commit is fenced), and b's records stay behind its last stable offset until
    the broker aborts them there: a read_committed reader sees none of the transaction. The
    transactional id gets a new producer id, so no later transaction extends b's."""
    from querylib.kafka._errors import InvalidProducerIdMappingError
    from querylib.log._config import BOOT_ID_FILE, CLEAN_SHUTDOWN_FILE
    from querylib.server.kafka._txn import EMPTY, TRANSACTIONS_TOPIC
    from tests.conftest import wait_for_async

    config = LogConfig(flush="always")

    pid, epoch = run(tmp_path, _begin_in_a_and_b, log_config=config)
    # The power loss: the last record of __transaction_state gone, no clean close, and a new
    # boot (the kernel that opened the log is not the one running now).
    state_dir = tmp_path / f"{TRANSACTIONS_TOPIC}-0"
    with PartitionLog.open(state_dir, config) as log:
        log.truncate_to(log.log_end_offset - 1)
    (state_dir / CLEAN_SHUTDOWN_FILE).unlink()
    (state_dir / BOOT_ID_FILE).write_text("a boot before this one\n")

    async def restarted(backend: BrokerBackend) -> None:
        txns = backend.transactions
        await wait_for_async(lambda: txns.txns["t"].producer_id != pid, timeout=30,
                             what="the restarted coordinator to end the transaction")
        assert txns.txns["t"].state == EMPTY
        with pytest.raises(InvalidProducerIdMappingError):
            await txns.end_txn("t", pid, epoch, True, "anonymous")
        port = backend.port
        # a: aborted by its marker; b: open, so its last stable offset stays before it.
        assert port.aborted_transactions(("a", 0), 0, port.info(("a", 0)).high_watermark) \
            == [(pid, 0)]
        assert port.info(("b", 0)).log_end == 0 < port.info(("b", 0)).high_watermark

    run(tmp_path, restarted, log_config=config)


def test_a_coordinator_process_that_died_keeps_its_transactional_ids(tmp_path: Path) -> None:
    """A process that dies (SIGKILL: no clean close) loses no write, fsynced or not: the page
    cache keeps them while the kernel runs. The restarted coordinator (same boot) replays its
    Ongoing records as they are: the transaction is still open with both partitions under its
    producer id, and the producer commits it."""
    from querylib.log._config import CLEAN_SHUTDOWN_FILE
    from querylib.server.kafka._txn import ONGOING, TRANSACTIONS_TOPIC
    from tests.conftest import wait_for_async

    config = LogConfig(flush="always")

    pid, epoch = run(tmp_path, _begin_in_a_and_b, log_config=config)
    (tmp_path / f"{TRANSACTIONS_TOPIC}-0" / CLEAN_SHUTDOWN_FILE).unlink()  # the process died

    async def restarted(backend: BrokerBackend) -> None:
        txns = backend.transactions
        txn = txns.txns["t"]
        assert (txn.producer_id, txn.state) == (pid, ONGOING)
        assert sorted(p[0] for p in txn.partitions) == ["a", "b"]
        await txns.end_txn("t", pid, epoch, True, "anonymous")
        port = backend.port
        # The markers written: nothing open below either partition's end any more.
        await wait_for_async(lambda: all(port.info((t, 0)).log_end == port.info((t, 0))
                                         .high_watermark > 1 for t in ("a", "b")),
                             timeout=30, what="both partitions' commit markers")
        assert txns.txns["t"].producer_id == pid

    run(tmp_path, restarted, log_config=config)
