"""The frontier of one partition: the minimum over its live producers, held while a writer
group is still incomplete (DESIGN §5 "Collective publishing").

Pure bookkeeping, no I/O: the broker feeds it producer events and appends a control batch for
every `FrontierAdvanced` or `StreamEnded` it returns. The frontier is a logical time (int) below
which no more data will arrive; it only moves forward.

Rules:
- A producer joins at the partition's current frontier (it may not send data for earlier times).
- A producer's own frontier only advances; moving it back is a protocol error.
- A producer that ends (end-of-stream) or is dropped (its lease expired) leaves the minimum, so a
  crashed producer no longer holds readers back.
- When the last live producer ends cleanly, the partition reaches end-of-stream. A producer that
  is merely dropped never ends the stream: a restarted producer may join and go on.
- Nobody joins a partition whose stream ended (StreamEndedError), unless it reopens it
  explicitly (`reopen`): then the stream goes on from the published frontier and the broker
  appends a REOPEN control batch (`StreamReopened`), so readers and recovery see the end was
  superseded.
- Epochs (DESIGN §5 "Epochs"). A reopening writer may name an `epoch` (a later run of the
  topic's publisher: the catalog numbers runs, increasing). When it is above the partition's
  epoch and nobody writes the partition (no live producer, no writer group waiting), a new
  epoch starts: the frontier goes back to 0, remembered groups are forgotten, and the REOPEN
  batch carries the epoch, as every FRONTIER batch of the epoch does after it. Readers order
  times by (epoch, time), so the frontier they were promised still holds. A writer naming no
  higher epoch (a rejoin, a second writer of the same run, a writer of a live stream) joins
  the current epoch at its frontier.
- Writer groups (collective publications: every process of a query writes the partition). A
  producer may join as writer `w` of group `g` expecting `n` distinct writers. Until `n`
  distinct writer names of `g` have joined, the group is pending: the published frontier stays
  where it was (late writers join there, so the frontier never passes a record they may still
  send) and the stream does not end, even when every producer that came has ended.
- A writer that joins again under a name already counted (a restarted process) counts once.
- A pending group is released (forgotten, so it holds nothing) when its live producers are
  all gone and one of them vanished: its query is failing, the missing writer will not come.
- A complete group is remembered, so a member rejoining it (after a lease expiry) joins as a
  plain producer. A rejoin naming a group this partition does not know (the broker restarted,
  or the group was released) joins as a plain producer too: it was counted before.
- At most `max_groups` groups are remembered per partition; beyond that the oldest group with
  no live producer is forgotten first (a pending one stops holding), else the join is refused.
- Writers whose processes exited (`settle`, from the catalog's exit codes) never join: with a
  failed or killed query the group is released as above; otherwise they count as joined and
  ended, so a group whose joined writers all ended cleanly completes and the stream ends.
- Groups survive a broker restart while some writer may still write: `pending()` is what the
  shell saves (`revision` says when it changed), and a frontier built with `groups=` waits
  for them again. Saved are the groups not yet done (incomplete, or complete with a writer
  that has not ended), each with the writers that joined and ended cleanly: a writer that was
  live when the broker went down must rejoin (its producer does, after a reconnect) or exit
  (`settle`) before the frontier moves or the stream ends, so a writer that ends first after
  a restart does not end the stream under a peer that has not rejoined yet.
"""

from __future__ import annotations

import re
from collections.abc import Collection, Iterable
from dataclasses import dataclass, field

from catalog.errors import ProtocolError
from querylib.broker._errors import StreamEndedError

MAX_GROUP_NAME = 256
MAX_WRITER_NAME = 64
MAX_WRITERS = 4096


@dataclass(frozen=True, slots=True)
class FrontierAdvanced:
    frontier: int
    epoch: int = 0


@dataclass(frozen=True, slots=True)
class StreamEnded:
    pass


@dataclass(frozen=True, slots=True)
class StreamReopened:
    epoch: int = 0  # the epoch it starts, or 0: the stream goes on in its epoch


FrontierEvent = FrontierAdvanced | StreamEnded | StreamReopened

# Writer groups of a query's collective publications are named `q<query>/<topic>#<n>` and
# their writers are process indexes (querylib/api/_runtime.py, DESIGN §5 "Collective publishing").
_QUERY_GROUP = re.compile(r"q([0-9]{1,18})/")


def query_of_group(group: str) -> int | None:
    """The query whose processes write `group`, or None for a group not named after one."""
    match = _QUERY_GROUP.match(group)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class SavedGroup:
    """A pending writer group as it survives a broker restart."""

    name: str
    writers: int
    joined: tuple[str, ...]


class FrontierRegressionError(ProtocolError):
    """A producer tried to move its frontier backwards."""


class WriterGroupError(ProtocolError):
    """A writer group named badly, with a count other than its members', or one too many."""


@dataclass(slots=True)
class _Group:
    writers: int                                        # distinct writers expected
    joined: set[str] = field(default_factory=set)       # writer names seen (while pending)
    live: set[str] = field(default_factory=set)         # producers of the group now joined
    vanished: bool = False                              # one of them was dropped
    ended: set[str] = field(default_factory=set)        # writers that ended (or exited)
    writer_of: dict[str, str] = field(default_factory=dict)  # live producer -> writer

    @property
    def complete(self) -> bool:
        return len(self.joined) >= self.writers

    @property
    def done(self) -> bool:
        """Complete, and every writer ended: nothing a restart must wait for."""
        return self.complete and len(self.ended) >= self.writers


class PartitionFrontier:
    """Tracks the live producers of one partition and the frontier they jointly allow."""

    def __init__(self, frontier: int = 0, *, ended: bool = False, max_groups: int = 64,
                 groups: Iterable[SavedGroup] = (), epoch: int = 0) -> None:
        self._published = frontier
        self._ended = ended
        self._epoch = epoch
        self._producers: dict[str, int] = {}
        self._groups: dict[str, _Group] = {    # insertion order: oldest first
            g.name: _Group(g.writers, set(g.joined), ended=set(g.joined)) for g in groups}
        self._group_of: dict[str, str] = {}     # producer -> its group
        self._max_groups = max_groups
        self._revision = 0                      # bumped whenever pending() changes
        self._saved_view = self.pending()

    @property
    def frontier(self) -> int:
        """The last frontier published for this partition."""
        return self._published

    @property
    def ended(self) -> bool:
        return self._ended

    @property
    def epoch(self) -> int:
        """The epoch the frontier belongs to (0 until a later run starts one)."""
        return self._epoch

    @property
    def producers(self) -> dict[str, int]:
        return dict(self._producers)

    @property
    def held(self) -> bool:
        """True while a writer group is incomplete: the frontier and end-of-stream wait."""
        return any(not g.complete for g in self._groups.values())

    def pending_groups(self) -> dict[str, tuple[int, int]]:
        """Incomplete groups: name -> (writers joined, writers expected)."""
        return {name: (len(g.joined), g.writers) for name, g in self._groups.items()
                if not g.complete}

    def open_groups(self) -> list[str]:
        """Groups not done: incomplete, or with a writer that has not ended."""
        return [name for name, g in self._groups.items() if not g.done]

    def pending(self) -> tuple[SavedGroup, ...]:
        """The groups not done, oldest first, as a restarted broker must know them: with the
        writers that ended (the others must join again)."""
        return tuple(SavedGroup(name, g.writers, tuple(sorted(g.ended)))
                     for name, g in self._groups.items() if not g.done)

    @property
    def revision(self) -> int:
        """Changes whenever `pending()` does: the shell saves the groups when it moved."""
        return self._revision

    def _touch(self) -> None:
        """A group changed: bump the revision if what a restart must know did."""
        view = self.pending()
        if view != self._saved_view:
            self._saved_view = view
            self._revision += 1

    def join(self, producer: str, group: str = "", writer: str = "", writers: int = 0, *,
             rejoin: bool = False, reopen: bool = False, epoch: int = 0
             ) -> list[FrontierEvent]:
        """A producer starts writing; it begins at the published frontier. With a `group`, it
        is `writer` of a group of `writers` (see the module rules). Returns StreamReopened if
        it reopened an ended stream or started epoch `epoch`, and what forgetting an old
        pending group to make room released. StreamEndedError if the stream ended and
        `reopen` is off."""
        if producer in self._producers:
            return []
        if self._ended and not reopen:
            raise StreamEndedError("the stream of this partition ended; nothing more may be "
                                   "written unless its owner reopens it")
        events: list[FrontierEvent] = []
        if reopen and epoch > self._epoch and not self._producers and not self.held:
            events.append(StreamReopened(epoch))
            self._epoch, self._published = epoch, 0
            self._groups.clear()
            self._group_of.clear()
            self._touch()
        elif self._ended:
            events.append(StreamReopened())
        if group:
            events += self._join_group(producer, group, writer, writers, rejoin)
            self._touch()
        self._producers[producer] = self._published
        self._ended = False
        return events

    def advance(self, producer: str, frontier: int) -> list[FrontierEvent]:
        current = self._require(producer)
        if frontier < current:
            raise FrontierRegressionError(
                f"producer {producer!r} moved its frontier back from {current} to {frontier}"
            )
        self._producers[producer] = frontier
        return self._recompute()

    def end(self, producer: str) -> list[FrontierEvent]:
        """The producer closed its stream: it leaves, and the stream ends if it was the last
        (and no writer group is still waiting for a writer)."""
        self._require(producer)
        del self._producers[producer]
        self._leave(producer, vanished=False)
        self._touch()
        if self._producers or self.held:
            return self._recompute()
        self._ended = True
        return [StreamEnded()]

    def drop(self, producer: str) -> list[FrontierEvent]:
        """The producer vanished (lease expired): it leaves the minimum without ending the
        stream."""
        if self._producers.pop(producer, None) is None:
            return []
        self._leave(producer, vanished=True)
        self._touch()
        return self._recompute()

    def settle(self, group: str, ended: Collection[str], *, failed: bool) -> list[FrontierEvent]:
        """The processes behind writers `ended` of `group` have exited, so those writers will
        not join. A group of a failed query is released (as when a joined writer vanished);
        otherwise they count as joined and ended: a group that completes so lets the frontier
        move, and ends the stream when no producer is left."""
        state = self._groups.get(group)
        if state is None or state.done:
            return []
        if failed:
            del self._groups[group]
            for producer in state.live:
                del self._group_of[producer]  # plain producers from now on
            self._touch()
            return self._recompute()
        state.ended |= set(ended)
        missing = set(ended) - state.joined
        if not missing:
            self._touch()
            return []
        state.joined |= missing
        self._touch()
        if self._producers or self.held or self._ended:
            return self._recompute()
        self._ended = True
        return [StreamEnded()]

    # ------------------------------------------------------------------ groups

    def _join_group(self, producer: str, group: str, writer: str, writers: int,
                    rejoin: bool) -> list[FrontierEvent]:
        if len(group) > MAX_GROUP_NAME or not 0 < len(writer) <= MAX_WRITER_NAME:
            raise WriterGroupError(f"a writer group name is 1 to {MAX_GROUP_NAME} characters "
                                   f"and a writer name 1 to {MAX_WRITER_NAME}")
        if not 0 < writers <= MAX_WRITERS:
            raise WriterGroupError(f"a writer group expects 1 to {MAX_WRITERS} writers, "
                                   f"not {writers}")
        events: list[FrontierEvent] = []
        state = self._groups.get(group)
        if state is None:
            if rejoin:
                return []  # counted before this broker forgot the group: a plain producer
            events = self._make_room(group)
            state = self._groups[group] = _Group(writers)
        elif state.writers != writers:
            raise WriterGroupError(f"writer group {group!r} expects {state.writers} writers, "
                                   f"not {writers}")
        if not state.complete and writer not in state.joined:
            state.joined.add(writer)
        state.ended.discard(writer)  # back (a rejoin, or a restarted process): may write
        state.live.add(producer)
        state.writer_of[producer] = writer
        self._group_of[producer] = group
        return events

    def _make_room(self, group: str) -> list[FrontierEvent]:
        if len(self._groups) < self._max_groups:
            return []
        for name, state in self._groups.items():
            if not state.live:
                del self._groups[name]
                self._touch()
                return self._recompute()
        raise WriterGroupError(f"the partition already tracks {self._max_groups} writer groups "
                               f"with live producers; cannot start {group!r}")

    def _leave(self, producer: str, *, vanished: bool) -> None:
        name = self._group_of.pop(producer, None)
        if name is None:
            return
        state = self._groups[name]
        state.live.discard(producer)
        writer = state.writer_of.pop(producer, None)
        if not vanished and writer is not None and writer not in state.writer_of.values():
            state.ended.add(writer)
        state.vanished = state.vanished or vanished
        if not state.live and state.vanished and not state.complete:
            del self._groups[name]

    # ------------------------------------------------------------------ the minimum

    def _require(self, producer: str) -> int:
        try:
            return self._producers[producer]
        except KeyError:
            raise ProtocolError(f"producer {producer!r} has not joined this partition") from None

    def _recompute(self) -> list[FrontierEvent]:
        if not self._producers or self.held:
            return []
        low = min(self._producers.values())
        if low > self._published:
            self._published = low
            return [FrontierAdvanced(low, self._epoch)]
        return []
