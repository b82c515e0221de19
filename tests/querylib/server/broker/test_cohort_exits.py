"""Cohorts and the exits of their query's processes (DESIGN §5 "Collective
publishing"): a missing writer whose process ended never comes, so the cohort stops waiting
for it; pending cohorts are saved beside the log and wait again after a broker restart."""

from __future__ import annotations

from pathlib import Path

import pytest

from querylib.broker.messages import Done, ProducerOpened
from querylib.errors import StorageError
from querylib.server.broker._cohort_store import (
    COHORTS_FILE,
    LEGACY_FILE,
    load_cohorts,
    save_cohorts,
)
from querylib.server.broker._events import (
    AdvanceFrontier,
    CohortsSaveFailed,
    EndStream,
    OpenProducer,
    OpenSession,
    QueryExits,
    SaveCohorts,
    Tick,
)
from querylib.server.broker._frontier import (
    FrontierAdvanced,
    PartitionFrontier,
    SavedCohort,
    StreamEnded,
    query_of_cohort,
)
from querylib.server.broker._state import BrokerLimits
from tests._fsync import assert_synced_then_its_folder, record_fsyncs

from ._sim import Sim

P = ("t", 0)
G = "q7/merged#1"


def writer(sim: Sim, session: str, name: str, *, rejoin: bool = False,
           lease: float = 10.0) -> object:
    sim.feed(OpenSession(f"os-{session}", session, lease))
    sim.feed(OpenProducer(f"op-{session}", session, P, G, name, 2, rejoin))
    return sim.replies.get(f"op-{session}")


# -- the frontier ------------------------------------------------------------------------------


def test_cohort_names_say_their_query() -> None:
    assert query_of_cohort("q7/merged#1") == 7
    assert query_of_cohort("q7merged") is None and query_of_cohort("x/q7/a") is None


def test_a_missing_writer_that_exited_cleanly_counts_as_ended() -> None:
    f = PartitionFrontier()
    f.join("s0", G, "0", 2)
    f.advance("s0", 5)
    assert f.end("s0") == [] and f.held
    assert f.settle(G, {"1"}, failed=False) == [StreamEnded()]
    assert f.ended and not f.held and f.pending() == ()


def test_a_settled_cohort_with_live_writers_lets_the_frontier_move() -> None:
    f = PartitionFrontier()
    f.join("s0", G, "0", 3)
    f.advance("s0", 4)
    assert f.settle(G, {"2"}, failed=False) == []  # writer 1 may still come
    assert f.held
    assert f.settle(G, {"1", "2"}, failed=False) == [FrontierAdvanced(4)]
    assert f.end("s0") == [StreamEnded()]


def test_a_failed_query_releases_its_cohort_without_ending_the_stream() -> None:
    f = PartitionFrontier()
    f.join("s0", G, "0", 2)
    f.advance("s0", 6)
    assert f.settle(G, set(), failed=True) == [FrontierAdvanced(6)]
    assert not f.held and not f.ended
    assert f.end("s0") == [StreamEnded()]  # a plain producer now


def test_pending_cohorts_are_restored_and_wait_again() -> None:
    f = PartitionFrontier()
    f.join("s0", G, "0", 2)
    revision = f.revision
    f.advance("s0", 5)
    assert f.revision == revision  # the data path never changes what is saved
    f.end("s0")
    saved = f.pending()
    assert saved == (SavedCohort(G, 2, ("0",)),)
    again = PartitionFrontier(f.frontier, cohorts=saved)
    assert again.held
    again.join("s1", G, "1", 2)  # the second writer: the cohort completes only now
    # Still saved while writer 1 writes: after another restart it must rejoin first.
    assert not again.held and again.pending() == (SavedCohort(G, 2, ("0",)),)
    assert again.advance("s1", 3) == [FrontierAdvanced(3)]
    assert again.end("s1") == [StreamEnded()]
    assert again.pending() == ()


def test_a_complete_cohort_waits_after_a_restart_for_its_writers_that_were_live() -> None:
    """Both writers joined; writer 0 ended, writer 1 was writing when the broker went down.
    The restarted broker keeps the frontier and the end of stream until writer 1 rejoins
    and ends, however late (before, the cohort was forgotten once complete: a writer ending
    first after the restart ended the stream under the other)."""
    f = PartitionFrontier()
    f.join("s0", G, "0", 2)
    f.join("s1", G, "1", 2)
    f.advance("s1", 4)
    f.end("s0")
    saved = f.pending()
    assert saved == (SavedCohort(G, 2, ("0",)),)
    again = PartitionFrontier(f.frontier, cohorts=saved)
    assert again.held
    again.join("plain")  # another producer of the partition ends before writer 1 is back
    assert again.end("plain") == [] and not again.ended
    again.join("s1b", G, "1", 2, rejoin=True)
    assert again.advance("s1b", 6) == [FrontierAdvanced(6)]
    assert again.end("s1b") == [StreamEnded()]
    assert again.pending() == ()


def test_a_complete_cohort_restored_settles_by_its_writers_exits() -> None:
    f = PartitionFrontier(cohorts=[SavedCohort(G, 2, ("0",))])
    assert f.open_cohorts() == [G]
    assert f.settle(G, {"0", "1"}, failed=False) == [StreamEnded()]  # writer 1 exited
    assert f.pending() == () and f.open_cohorts() == []
    g = PartitionFrontier(cohorts=[SavedCohort(G, 2, ())])
    g.join("s1", G, "1", 2, rejoin=True)
    assert g.settle(G, set(), failed=True) == []  # failed: released, writer 1 is plain
    assert g.pending() == () and g.end("s1") == [StreamEnded()]


# -- the broker state --------------------------------------------------------------------------


def test_the_stream_ends_once_the_process_that_never_published_exits_0() -> None:
    sim = Sim()
    sim.open_partition(P)
    writer(sim, "a", "0")
    sim.feed(AdvanceFrontier("a1", "a", P, 5))
    sim.feed(EndStream("a2", "a", P))
    assert sim.controls(P) == []
    sim.feed(QueryExits(7, (None, 0)))
    assert sim.controls(P) == [("E", None)]
    assert sim.state.partition_info(P).ended


def test_an_exit_reported_before_the_cohort_opens_settles_it_at_once() -> None:
    sim = Sim()
    sim.open_partition(P)
    sim.feed(QueryExits(7, (None, 0)))  # process 1 exited before process 0 published
    writer(sim, "a", "0")
    sim.feed(AdvanceFrontier("a1", "a", P, 5))
    sim.feed(EndStream("a2", "a", P))
    assert sim.controls(P) == [("F", 5), ("E", None)]


def test_exits_of_other_queries_change_nothing() -> None:
    sim = Sim()
    sim.open_partition(P)
    writer(sim, "a", "0")
    sim.feed(EndStream("a2", "a", P))
    sim.feed(QueryExits(8, (0, 0)))
    sim.feed(QueryExits(17, (None, 0)))
    assert sim.controls(P) == [] and sim.state.partition_info(P).ended is False


def test_a_failed_query_no_longer_holds_subscribers_back() -> None:
    sim = Sim()
    sim.open_partition(P)
    sim.feed(OpenSession("os-p", "plain", 10.0))
    sim.feed(OpenProducer("op-p", "plain", P))
    writer(sim, "a", "0")
    sim.feed(AdvanceFrontier("p1", "plain", P, 4))
    sim.feed(AdvanceFrontier("a1", "a", P, 9))
    assert sim.controls(P) == []
    sim.feed(QueryExits(7, (None, 1), failed=True))
    assert sim.controls(P) == [("F", 4)]  # as when a joined writer is killed: released
    # A process of the failed query still alive opens another cohort: it holds nothing.
    sim.feed(OpenSession("os-c", "c", 10.0))
    sim.feed(OpenProducer("op-c", "c", P, "q7/merged#2", "0", 2))
    sim.feed(AdvanceFrontier("p2", "plain", P, 6))
    sim.feed(AdvanceFrontier("c1", "c", P, 6))
    assert sim.controls(P) == [("F", 4), ("F", 6)]


def test_exits_are_forgotten_once_every_process_exited_and_bounded() -> None:
    sim = Sim(BrokerLimits(max_query_exits=2))
    sim.open_partition(P)
    for query in (1, 2, 3):
        sim.feed(QueryExits(query, (None, 0)))
    sim.feed(QueryExits(2, (0, 0)))
    assert list(sim.state.cohorts.exits) == [3]


def test_the_reply_to_a_join_waits_until_the_cohort_is_saved() -> None:
    sim = Sim(auto_save=False)
    sim.open_partition(P)
    assert writer(sim, "a", "0") is None
    (save,) = sim.saves
    # Writer 0 is live, not ended: after a restart it must join again like writer 1.
    assert save == SaveCohorts(P, save.revision, (SavedCohort(G, 2, ()),))
    sim.complete_save()
    assert isinstance(sim.replies["op-a"], ProducerOpened)
    # A plain producer changes no cohort: answered at once.
    sim.feed(OpenSession("os-p", "plain", 10.0))
    sim.feed(OpenProducer("op-p", "plain", P))
    assert isinstance(sim.replies["op-p"], ProducerOpened) and sim.saves == []
    # Completing the cohort changes nothing a restart must know (both must rejoin): at once.
    assert isinstance(writer(sim, "b", "1"), ProducerOpened) and sim.saves == []
    sim.feed(EndStream("end-a", "a", P))  # writer 0 ended: saved, nobody waits for that
    assert sim.saves.pop().cohorts == (SavedCohort(G, 2, ("0",)),)
    sim.feed(OpenSession("os-c", "c", 10.0))
    sim.feed(OpenProducer("op-c", "c", P, "q7/other#1", "0", 2))  # a new cohort: must be saved
    sim.feed(CohortsSaveFailed(P, sim.saves.pop().revision, StorageError("disk full")))
    assert isinstance(sim.replies["op-c"], StorageError)


def test_a_partition_saving_its_cohorts_is_busy_for_a_drop() -> None:
    from querylib.broker._errors import PartitionBusyError
    from querylib.server.broker._events import DropPartition

    sim = Sim(auto_save=False)
    sim.open_partition(P)
    writer(sim, "a", "0")
    sim.feed(DropPartition("d1", P))
    assert isinstance(sim.replies["d1"], PartitionBusyError)
    sim.complete_save()
    sim.feed(DropPartition("d2", P))
    assert sim.replies["d2"] == Done()


def test_a_cohort_saved_to_disk_waits_again_after_a_restart(tmp_path: Path) -> None:
    """Writer 0 joins, writes, advances and ends; the broker restarts from its files; writer
    1 joins only then: nothing runs ahead of writer 1, and the stream ends after it."""
    first = Sim()
    first.open_partition(P)
    writer(first, "a", "0")
    first.feed(AdvanceFrontier("a1", "a", P, 9))
    first.feed(EndStream("a2", "a", P))
    assert first.controls(P) == []
    save_cohorts(str(tmp_path), first.saved[P].cohorts)

    second = Sim()  # the restarted broker: the log (no controls) and the saved cohorts
    second.open_partition(P, cohorts=load_cohorts(str(tmp_path)))
    assert second.state.partition_info(P).frontier == 0
    writer(second, "b", "1")
    second.feed(AdvanceFrontier("b1", "b", P, 3))
    assert second.controls(P) == [("F", 3)]  # writer 1's frontier, not past it
    second.feed(EndStream("b2", "b", P))
    assert second.controls(P) == [("F", 3), ("E", None)]
    save_cohorts(str(tmp_path), second.saved[P].cohorts)
    assert not (tmp_path / COHORTS_FILE).exists()  # no cohort waits: no file


def test_a_writer_rejoining_after_a_restart_still_waits_for_the_other(tmp_path: Path) -> None:
    first = Sim(BrokerLimits(min_lease=1.0))
    first.open_partition(P)
    writer(first, "a", "0")
    save_cohorts(str(tmp_path), first.saved[P].cohorts)
    second = Sim(BrokerLimits(min_lease=1.0))
    second.open_partition(P, cohorts=load_cohorts(str(tmp_path)))
    writer(second, "a", "0", rejoin=True)  # its session was forgotten: it rejoins
    second.feed(AdvanceFrontier("a1", "a", P, 9))
    assert second.controls(P) == []  # before: a plain producer, the frontier went to 9
    second.feed(Tick(0.5))
    writer(second, "b", "1")
    second.feed(AdvanceFrontier("b1", "b", P, 2))
    assert second.controls(P) == [("F", 2)]


# -- the store ---------------------------------------------------------------------------------


def test_damaged_or_oversized_saved_cohorts_are_ignored(tmp_path: Path) -> None:
    path = tmp_path / COHORTS_FILE
    for content in (b"{", b'{"cohorts": [["", 2, []]]}', b'{"cohorts": [["g", 0, []]]}',
                    b'{"cohorts": [["g", 2, ["' + b"x" * 100 + b'"]]]}', b"[" * 10_000):
        path.write_bytes(content)
        assert load_cohorts(str(tmp_path)) == ()
    save_cohorts(str(tmp_path), (SavedCohort("g", 2, ("0",)), SavedCohort("h", 3, ())))
    assert load_cohorts(str(tmp_path)) == (SavedCohort("g", 2, ("0",)), SavedCohort("h", 3, ()))
    assert sorted(p.name for p in tmp_path.iterdir()) == [COHORTS_FILE]


def test_a_writer_groups_file_from_before_cohorts_loads_and_is_replaced(tmp_path: Path) -> None:
    """A partition saved before the rename holds `writer-groups.json` (exactly as that code
    wrote it): it loads, and the next save leaves only `cohorts.json`."""
    legacy = tmp_path / LEGACY_FILE
    legacy.write_bytes(b'{"groups":[["q1/m#0",2,["0"]],["q1/n#0",3,[]]]}')
    saved = (SavedCohort("q1/m#0", 2, ("0",)), SavedCohort("q1/n#0", 3, ()))
    assert load_cohorts(str(tmp_path)) == saved
    save_cohorts(str(tmp_path), saved[:1])
    assert sorted(p.name for p in tmp_path.iterdir()) == [COHORTS_FILE]
    assert load_cohorts(str(tmp_path)) == saved[:1]
    # A crash between the new file's rename and the old one's removal: the new one wins.
    legacy.write_bytes(b'{"groups":[["q1/n#0",3,[]]]}')
    assert load_cohorts(str(tmp_path)) == saved[:1]
    # No cohort waits any more: neither file stays.
    save_cohorts(str(tmp_path), ())
    assert list(tmp_path.iterdir()) == []
    legacy.write_bytes(b'{"groups":[["q1/n#0",3,[]]]}')
    save_cohorts(str(tmp_path), ())
    assert list(tmp_path.iterdir()) == []


def test_a_link_planted_at_the_cohorts_temporary_name_is_not_followed(tmp_path: Path) -> None:
    """`cohorts.json.tmp` was the temporary name: a link planted there made the save land in
    its target, and the rename put the link in cohorts.json's place."""
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    part = tmp_path / "t-0"
    part.mkdir()
    (part / f"{COHORTS_FILE}.tmp").symlink_to(victim)
    save_cohorts(str(part), (SavedCohort(G, 2, ("0",)),))
    assert victim.read_text() == "precious\n"
    assert not (part / COHORTS_FILE).is_symlink()
    assert load_cohorts(str(part)) == (SavedCohort(G, 2, ("0",)),)


def test_saved_cohorts_are_fsynced_then_their_directory(tmp_path: Path,
                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    synced = record_fsyncs(monkeypatch)
    save_cohorts(str(tmp_path), (SavedCohort(G, 2, ("0",)),))
    assert_synced_then_its_folder(synced, tmp_path / COHORTS_FILE)
