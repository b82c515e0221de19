"""CollectionView, the pure part of a catalog follower: the bytes the writer appends, decoded as a
subscriber decodes them, rebuild each collection exactly; a late follower's snapshot equals what
an early follower accumulated; an aborted change and its compensation count for nothing."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalog import COLLECTIONS, Catalog, CorruptCatalogError, UnknownCollectionError
from coordinator import Persist
from coordinator._journal import TimedUpdate, encode_block, encode_updates, group_updates
from querylib.broker import Data, Progress
from querylib.cluster import CollectionView, Diff, Snapshot
from querylib.cluster import messages as m
from querylib.records import TIME_HEADER, decode_batch, decode_int64

from ._driver import Driver


def data_events(updates: list[TimedUpdate]) -> list[Data]:
    """What a subscriber yields for these updates: runs of records with the same tq.time."""
    return _runs(encode_updates(updates, wall_ms=1))


def block_events(catalog: Catalog, collection: str) -> list[Data]:
    return _runs(encode_block(catalog.version, list(catalog.collection(collection).items()),
                              wall_ms=1))


def _runs(batches: object) -> list[Data]:
    events: list[Data] = []
    for batch in batches:  # type: ignore[attr-defined]
        for record in decode_batch(batch).records:
            time = next(decode_int64(v) for k, v in record.headers if k == TIME_HEADER)
            if events and events[-1].time == time:
                events[-1].records.append(record)
            else:
                events.append(Data(time, [record]))
    return events


def stream(groups: list[list[Persist]], collection: str) -> list[object]:
    """The events of one collection's topic: each group's data, then its frontier."""
    out: list[object] = []
    for group in groups:
        out += data_events(group_updates(group).get(collection, []))
        out.append(Progress(group[-1].version + 1))
    return out


def _driver_with_history() -> Driver:
    d = Driver()
    sessions = [d.session(lease_ms=1000) for _ in range(3)]
    for i, session in enumerate(sessions):
        d.call(m.CreateTopic(session_id=session, name=f"t{i}", partitions=i + 1))
        d.call(m.Publish(session_id=session, name=f"t{i}"))
    d.call(m.Subscribe(session_id=sessions[0], name="t1"))
    d.tick(1.5)  # every lease runs out: publications and subscriptions leave
    d.commit()
    return d


def _catalog_at(d: Driver, version: int) -> Catalog:
    updates = [u for p in d.persisted if p.version <= version for u in p.updates]
    return Catalog.replay(updates)


@pytest.mark.parametrize("collection", list(COLLECTIONS))
def test_a_view_rebuilds_its_collection(collection: str) -> None:
    d = _driver_with_history()
    view = CollectionView(collection)
    events = []
    for event in stream([[p] for p in d.persisted], collection):
        events += view.feed(event)
    assert isinstance(events[0], Snapshot)
    assert all(isinstance(e, Diff) and e.updates for e in events[1:])
    assert view.contents == dict(d.state.catalog.collection(collection).items())
    assert view.version == d.state.catalog.version


def test_late_and_early_followers_agree() -> None:
    d = _driver_with_history()
    groups = [[p] for p in d.persisted]
    events = stream(groups, "publications")
    early = CollectionView("publications")
    for event in events:
        early.feed(event)
    join = d.persisted[len(d.persisted) // 2].version
    late = CollectionView("publications", until=join)
    out = []
    for event in events:
        out += late.feed(event)
        if out and isinstance(out[0], Snapshot) and late.version == out[0].version:
            snapshot = out[0]
            assert snapshot.version >= join
            assert dict(snapshot.records) == dict(
                _catalog_at(d, snapshot.version).publications.items())
    assert isinstance(out[0], Snapshot) and out[0].version >= join
    assert late.contents == early.contents


def test_an_aborted_change_and_its_compensation_net_to_zero() -> None:
    d = Driver()
    session = d.session(lease_ms=1000)
    base = d.state.catalog.version
    d.call(m.CreateTopic(session_id=session, name="lost"))
    aborted = group_updates(d.persisted[-1:])["topics"]
    undo = [TimedUpdate(u.time, u.record, -u.diff) for u in aborted]
    # After the crash the version is reused by another change.
    other = Driver()
    other_session = other.session(lease_ms=1000)
    other.call(m.CreateTopic(session_id=other_session, name="kept"))
    reused = [TimedUpdate(base + 1, u.record, u.diff)
              for u in group_updates(other.persisted[-1:])["topics"]]
    view = CollectionView("topics")
    view.feed(Progress(base + 1))
    for event in [*data_events(aborted), *data_events(undo), *data_events(reused)]:
        view.feed(event)
    (diff,) = view.feed(Progress(base + 2))
    assert isinstance(diff, Diff)
    assert [(r.short_name, n) for r, n in diff.updates] == [("kept", 1)]


def test_updates_wait_for_their_frontier() -> None:
    d = Driver()
    view = CollectionView("sessions")
    assert view.feed(Progress(d.state.catalog.version + 1))[0] == Snapshot(
        "sessions", d.state.catalog.version, [])
    d.session(lease_ms=1000)
    (change,) = d.persisted[-1:]
    for event in data_events(group_updates([change])["sessions"]):
        assert view.feed(event) == []
    assert view.feed(Progress(change.version)) == []  # not past it yet
    (diff,) = view.feed(Progress(change.version + 1))
    assert isinstance(diff, Diff) and diff.updates[0][1] == 1
    assert view.feed(Progress(change.version + 1)) == []  # a frontier never goes back


def test_bad_input_is_a_typed_error() -> None:
    with pytest.raises(UnknownCollectionError):
        CollectionView("nope")
    view = CollectionView("sessions")
    with pytest.raises(CorruptCatalogError):
        view.feed(Data(None, []))
    d = Driver()
    topic = d.state.catalog_topics()["topics"]
    (event,) = data_events([TimedUpdate(1, topic, 1)])
    with pytest.raises(CorruptCatalogError):
        view.feed(event)  # a Topic on the sessions topic
    retraction = data_events([TimedUpdate(1, topic, -1)])
    topics = CollectionView("topics")
    for e in retraction:
        topics.feed(e)
    with pytest.raises(CorruptCatalogError):
        topics.feed(Progress(2))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 4), min_size=1, max_size=10), st.integers(0, 30))
def test_any_grouping_and_any_join_point_give_the_catalog(sizes: list[int], join: int) -> None:
    d = _driver_with_history()
    groups, i = [], 0
    while i < len(d.persisted):
        size = sizes[len(groups) % len(sizes)]
        groups.append(d.persisted[i:i + size])
        i += size
    for collection in ("sessions", "topics", "publications", "counters"):
        view = CollectionView(collection, until=join)
        for event in stream(groups, collection):
            for out in view.feed(event):
                expected = _catalog_at(d, out.version).collection(collection)
                if isinstance(out, Snapshot):
                    assert out.version >= join
                    assert dict(out.records) == dict(expected.items())
        assert view.contents == dict(d.state.catalog.collection(collection).items())


@pytest.mark.parametrize("collection", ["topics", "publications", "subscriptions", "counters"])
def test_a_follower_starting_at_a_checkpoint_block(collection: str) -> None:
    d = _driver_with_history()
    cut = len(d.persisted) // 2
    at = _catalog_at(d, d.persisted[cut - 1].version)
    later = [[p] for p in d.persisted[cut:]]
    # What the topic holds from the block on: the block, a stray frontier, later changes,
    # and another (later) checkpoint's block, which must be skipped.
    events: list[object] = [*block_events(at, collection), Progress(at.version + 1)]
    events += stream(later[:2], collection)
    events += block_events(_catalog_at(d, later[1][-1].version), collection)
    events += stream(later[2:], collection)
    view = CollectionView(collection, block=at.version)
    out = []
    for event in events:
        out += view.feed(event)
    assert isinstance(out[0], Snapshot) and out[0].version == at.version
    assert dict(out[0].records) == dict(at.collection(collection).items())
    assert view.contents == dict(d.state.catalog.collection(collection).items())
    assert view.version == d.state.catalog.version


def test_a_block_start_waits_for_until_and_for_the_whole_block() -> None:
    d = _driver_with_history()
    at = _catalog_at(d, d.persisted[3].version)
    view = CollectionView("counters", until=at.version + 1, block=at.version)
    (marker_and_records,) = block_events(at, "counters")
    assert view.feed(Progress(at.version + 5)) == []  # held until the block is read
    (snapshot,) = view.feed(marker_and_records)
    assert isinstance(snapshot, Snapshot) and snapshot.version == at.version + 4


def test_an_empty_collection_has_a_block_too() -> None:
    at = Catalog()
    view = CollectionView("subscriptions", block=0)
    (event,) = block_events(at, "subscriptions")
    assert view.feed(event) == [Snapshot("subscriptions", 0, [])]


def test_a_block_that_does_not_start_with_its_marker_is_refused() -> None:
    d = _driver_with_history()
    view = CollectionView("topics", block=3)
    with pytest.raises(CorruptCatalogError):
        view.feed(data_events(group_updates(d.persisted[:8])["topics"])[0])


def test_a_follower_from_the_earliest_offset_skips_blocks() -> None:
    d = _driver_with_history()
    cut = len(d.persisted) // 2
    at = _catalog_at(d, d.persisted[cut - 1].version)
    events = stream([[p] for p in d.persisted[:cut]], "topics")
    events += block_events(at, "topics")
    events += stream([[p] for p in d.persisted[cut:]], "topics")
    view = CollectionView("topics")
    for event in events:
        view.feed(event)
    assert view.contents == dict(d.state.catalog.topics.items())
