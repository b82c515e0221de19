"""Idempotent producers: the pure table (`_producer_state`), the broker core answering a batch
sent again with its first offsets, and the table rebuilt from a real log's tail at open."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from querylib.broker._errors import (
    DuplicateSequenceError,
    OutOfOrderSequenceError,
    StreamEndedError,
)
from querylib.broker.messages import Done, Produced
from querylib.errors import StorageError
from querylib.log import LogConfig, PartitionLog
from querylib.records import encode_batch
from querylib.records._header import HEADER, HEADER_SIZE, LOG_OVERHEAD
from querylib.server.broker._disk import recover_producers
from querylib.server.broker._events import (
    AppendFailed,
    EndStream,
    OpenProducer,
    OpenSession,
    Produce,
)
from querylib.server.broker._idempotence import (
    SEQUENCE_MODULUS,
    BatchMark,
    ProducerStateTable,
    last_sequence,
)

from ._sim import Sim

P = ("t", 0)
PID = 2**62 + 7


def idem_batch(first_seq: int, n: int = 1, producer_id: int = PID, epoch: int = 0) -> bytes:
    """A well-formed header of an idempotent producer's batch of `n` records."""
    return HEADER.pack(0, HEADER_SIZE - LOG_OVERHEAD, -1, 2, 0, 0, n - 1, 0, 0, producer_id,
                       epoch, first_seq, n)


# ----------------------------------------------------------------------------- the table


def test_a_batch_after_the_last_is_new_and_one_sent_again_is_its_earlier_mark() -> None:
    table = ProducerStateTable()
    assert table.check(PID, 0, 0, 9) is None
    table.appended(PID, 0, 0, 9, ticket=1)
    assert table.check(PID, 0, 0, 9) == BatchMark(0, 9, ticket=1)  # in flight
    table.stored(PID, 0, 100, 110)
    assert table.check(PID, 0, 0, 9) == BatchMark(0, 9, 100, 110)
    assert table.check(PID, 0, 10, 19) is None
    with pytest.raises(OutOfOrderSequenceError):
        table.check(PID, 0, 20, 29)  # a gap: 10..19 never came


def test_a_batch_older_than_those_remembered_is_a_duplicate_without_offsets() -> None:
    table = ProducerStateTable()
    for i in range(100):
        table.learn(PID, 0, i, i, i, i + 1)
    assert table.check(PID, 0, 99, 99) == BatchMark(99, 99, 99, 100)
    with pytest.raises(DuplicateSequenceError) as caught:
        table.check(PID, 0, 3, 3)  # only the last 64 batches keep their offsets
    assert caught.value.kafka_error_code == 46


def test_unknown_producers_and_new_epochs_start_anywhere() -> None:
    table = ProducerStateTable()
    assert table.check(PID, 0, 12345, 12345) is None  # forgotten, or before the log's tail
    table.learn(PID, 0, 0, 4, 0, 5)
    assert table.check(PID, 1, 0, 4) is None  # another epoch starts over
    table.learn(PID, 1, 0, 4, 5, 10)
    assert table.last_sequence(PID) == 4


def test_sequences_wrap_after_two_to_the_31() -> None:
    table = ProducerStateTable()
    last = SEQUENCE_MODULUS - 1
    table.learn(PID, 0, last - 9, last, 0, 10)
    assert last_sequence(0, 9) == 9
    assert last_sequence(SEQUENCE_MODULUS - 5, 9) == 4
    assert table.check(PID, 0, 0, 9) is None  # follows 2^31 - 1
    assert table.check(PID, 0, last - 9, last) == BatchMark(last - 9, last, 0, 10)


def test_a_failed_append_is_forgotten_so_sending_it_again_is_new() -> None:
    table = ProducerStateTable()
    table.learn(PID, 0, 0, 0, 0, 1)
    table.appended(PID, 0, 1, 1, ticket=5)
    table.failed(PID, 1)
    assert table.check(PID, 0, 1, 1) is None
    assert table.last_sequence(PID) == 0


def test_the_least_recently_written_producer_is_forgotten_first() -> None:
    table = ProducerStateTable(max_producers=2)
    table.learn(1, 0, 0, 0, 0, 1)
    table.learn(2, 0, 0, 0, 1, 2)
    table.learn(1, 0, 1, 1, 2, 3)
    table.learn(3, 0, 0, 0, 3, 4)
    assert len(table) == 2 and table.last_sequence(2) is None
    assert table.last_sequence(1) == 1 and table.last_sequence(3) == 0


@given(sizes=st.lists(st.integers(1, 50), min_size=1, max_size=80),
       start=st.integers(0, SEQUENCE_MODULUS - 1), data=st.data())
def test_every_batch_sent_again_is_recognised_and_every_new_one_accepted(
        sizes: list[int], start: int, data: st.DataObject) -> None:
    """A producer sends batches in order (sequences wrapping anywhere), then resends a suffix
    of them, as after a reconnect: the table knows exactly which were appended."""
    table = ProducerStateTable()
    batches, seq, offset = [], start, 0
    for n in sizes:
        first, last = seq, (seq + n - 1) % SEQUENCE_MODULUS
        assert table.check(PID, 0, first, last) is None
        table.appended(PID, 0, first, last, ticket=len(batches))
        table.stored(PID, first, offset, offset + n)
        batches.append((first, last, offset, offset + n))
        seq, offset = (last + 1) % SEQUENCE_MODULUS, offset + n
    resent = data.draw(st.integers(0, len(batches)))
    for first, last, base, nxt in batches[len(batches) - resent:]:
        if len(batches) - batches.index((first, last, base, nxt)) <= table.max_batches:
            assert table.check(PID, 0, first, last) == BatchMark(first, last, base, nxt)
        else:
            with pytest.raises(DuplicateSequenceError):
                table.check(PID, 0, first, last)
    assert table.check(PID, 0, seq, seq) is None


# ----------------------------------------------------------------------------- the core


def started() -> Sim:
    sim = Sim(auto_durable=False)
    sim.open_partition(P)
    sim.feed(OpenSession("o-p", "p", 10.0))
    sim.feed(OpenProducer("op-p", "p", P))
    return sim


def test_a_batch_sent_again_is_answered_with_its_first_offsets_not_appended() -> None:
    sim = started()
    sim.feed(Produce("a", "p", P, idem_batch(0, 3)))
    sim.complete_append(P)
    sim.flush(P)
    assert sim.replies["a"] == Produced(base_offset=0, next_offset=3)
    out = sim.feed(Produce("a-again", "p", P, idem_batch(0, 3)))
    assert sim.replies["a-again"] == Produced(base_offset=0, next_offset=3)
    assert not sim.appends[P] and len(sim.logs[P]) == 1, out


def test_a_batch_sent_again_while_in_flight_is_answered_with_it_once_durable() -> None:
    sim = started()
    sim.feed(Produce("a", "p", P, idem_batch(0, 2)))
    sim.feed(Produce("a-again", "p", P, idem_batch(0, 2)))  # its reply went missing
    assert len(sim.appends[P]) == 1
    sim.complete_append(P)
    assert "a-again" not in sim.replies  # not durable yet
    sim.flush(P)
    assert sim.replies["a"] == sim.replies["a-again"] == Produced(base_offset=0, next_offset=2)
    sim.feed(Produce("b", "p", P, idem_batch(2, 1)))
    sim.complete_append(P)
    sim.flush(P)
    assert sim.replies["b"] == Produced(base_offset=2, next_offset=3)


def test_a_failed_append_fails_its_duplicates_and_may_be_sent_again() -> None:
    sim = started()
    sim.feed(Produce("a", "p", P, idem_batch(0)))
    sim.feed(Produce("a-again", "p", P, idem_batch(0)))
    (append,) = sim.appends[P]
    sim.appends[P].clear()
    sim.feed(AppendFailed(P, append.ticket, OSError("disk full")))
    assert isinstance(sim.replies["a"], StorageError)
    assert isinstance(sim.replies["a-again"], StorageError)
    sim.feed(Produce("a-third", "p", P, idem_batch(0)))
    assert len(sim.appends[P]) == 1


def test_batches_without_a_producer_are_never_deduplicated() -> None:
    sim = started()
    batch = HEADER.pack(0, HEADER_SIZE - LOG_OVERHEAD, -1, 2, 0, 0, 0, 0, 0, 5, 0, -1, 1)
    sim.feed(Produce("a", "p", P, batch))
    sim.feed(Produce("b", "p", P, batch))
    assert len(sim.appends[P]) == 2


def ended_after(sim: Sim, *batches: bytes) -> None:
    """The producer "p" sends `batches` and its end of stream; all of it is stored and
    answered (the answers then go missing: the producer rejoins, as after a reconnect)."""
    for n, batch in enumerate(batches):
        sim.feed(Produce(f"b{n}", "p", P, batch))
    sim.feed(EndStream("end", "p", P))
    sim.controls(P)
    sim.flush(P)
    assert sim.replies["end"] == Done()


@pytest.mark.parametrize("reopen", [False, True])
def test_an_end_of_stream_sent_again_appends_no_second_one(reopen: bool) -> None:
    sim = started()
    ended_after(sim)
    # Its answer went missing: the producer (which sent no data) rejoins and ends again. Even
    # one that may reopen the stream does not: its end is the one in the log.
    sim.feed(OpenProducer("op-again", "p", P, rejoin=True, reopen=reopen, producer_id=PID,
                          ending=True))
    sim.feed(EndStream("end-again", "p", P))
    assert sim.replies["end-again"] == Done()
    assert sim.controls(P) == [("E", None)]


@pytest.mark.parametrize("reopen", [False, True])
def test_batches_resent_after_their_stream_ended_get_their_first_offsets(reopen: bool) -> None:
    """The broker stored a producer's batches and its end of stream; the producer heard none
    of it and rejoins: it is answered as the first time, and the stream stays ended once."""
    sim = started()
    ended_after(sim, idem_batch(0, 2), idem_batch(2, 3))
    sim.feed(OpenProducer("op-again", "p", P, rejoin=True, reopen=reopen, producer_id=PID,
                          last_sequence=4, ending=True))
    assert not isinstance(sim.replies["op-again"], Exception), sim.replies["op-again"]
    sim.feed(Produce("b0-again", "p", P, idem_batch(0, 2)))
    sim.feed(Produce("b1-again", "p", P, idem_batch(2, 3)))
    sim.feed(EndStream("end-again", "p", P))
    assert sim.replies["b0-again"] == Produced(base_offset=0, next_offset=2)
    assert sim.replies["b1-again"] == Produced(base_offset=2, next_offset=5)
    assert sim.replies["end-again"] == Done()
    assert sim.controls(P) == [None, None, ("E", None)]


def test_a_rejoined_producer_of_an_ended_stream_writes_nothing_new() -> None:
    sim = started()
    ended_after(sim, idem_batch(0, 2))
    sim.feed(OpenProducer("op-again", "p", P, rejoin=True, producer_id=PID, last_sequence=1,
                          ending=True))
    sim.feed(Produce("new", "p", P, idem_batch(2, 1)))
    assert isinstance(sim.replies["new"], StreamEndedError)
    assert sim.controls(P) == [None, ("E", None)]


def test_a_rejoin_with_batches_the_partition_lacks_follows_the_end_of_stream_rule() -> None:
    """Records of the producer that are not stored (the stream was ended by others after its
    session was dropped): its rejoin is refused, or reopens the stream, as any open is."""
    sim = started()
    ended_after(sim, idem_batch(0, 2))
    sim.feed(OpenSession("o-q", "q", 10.0))
    sim.feed(OpenProducer("refused", "q", P, rejoin=True, producer_id=PID, last_sequence=5,
                          ending=True))
    assert isinstance(sim.replies["refused"], StreamEndedError)
    sim.feed(OpenProducer("not-ending", "q", P, rejoin=True, producer_id=PID,
                          last_sequence=1))
    assert isinstance(sim.replies["not-ending"], StreamEndedError)
    sim.feed(OpenProducer("reopened", "q", P, rejoin=True, reopen=True, producer_id=PID,
                          last_sequence=5, ending=True))
    sim.feed(Produce("b-resent", "q", P, idem_batch(0, 2)))
    sim.feed(Produce("b-lost", "q", P, idem_batch(2, 4)))
    sim.feed(EndStream("end-q", "q", P))
    assert sim.replies["b-resent"] == Produced(base_offset=0, next_offset=2)
    assert sim.controls(P) == [None, ("E", None), ("R", None), None, ("E", None)]


def test_an_end_after_new_data_is_appended() -> None:
    sim = started()
    sim.feed(EndStream("end", "p", P))
    sim.controls(P)
    sim.feed(OpenProducer("op-again", "p", P, reopen=True))
    sim.feed(Produce("a", "p", P, idem_batch(0)))
    sim.feed(EndStream("end-2", "p", P))
    assert sim.controls(P) == [("E", None), ("R", None), None, ("E", None)]


# ----------------------------------------------------------------------------- after a restart


def test_a_restarted_broker_learns_its_producers_from_the_log_tail(tmp_path) -> None:
    """Append, crash before the ack (the reply never left), restart, resend: no duplicate."""
    log = PartitionLog.open(tmp_path / "t-0", LogConfig())
    entries = [(0, None, b"v", ())] * 3
    log.append(encode_batch(entries, producer_id=9, producer_epoch=0, base_sequence=0))
    log.append(encode_batch(entries))  # no producer: not tracked
    log.append(encode_batch(entries, producer_id=PID, producer_epoch=0, base_sequence=40))
    log.append(encode_batch(entries, producer_id=PID, producer_epoch=0, base_sequence=43))
    marks = recover_producers(log, scan_bytes=1 << 20)
    assert marks == ((9, 0, 0, 2, 0, 3), (PID, 0, 40, 42, 6, 9), (PID, 0, 43, 45, 9, 12))
    assert recover_producers(log, scan_bytes=0) == ()
    log.close()

    sim = Sim()
    sim.open_partition(P, producers=marks)  # an empty fake log: only the table matters here
    sim.feed(OpenSession("o", "p", 10.0))
    sim.feed(OpenProducer("op", "p", P, rejoin=True))
    sim.feed(Produce("again", "p", P, idem_batch(43, 3)))
    assert sim.replies["again"] == Produced(base_offset=9, next_offset=12)
    assert not sim.appends[P]
    sim.feed(Produce("next", "p", P, idem_batch(46, 1)))
    assert len(sim.appends[P]) == 1
