"""The frontier of one partition: the minimum over its live producers, held while a writer
cohort is still incomplete (DESIGN §5 "Collective publishing").

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
  epoch and nobody writes the partition (no live producer, no cohort waiting), a new
  epoch starts: the frontier goes back to 0, remembered cohorts are forgotten, and the REOPEN
  batch carries the epoch, as every FRONTIER batch of the epoch does after it. Readers order
  times by (epoch, time), so the frontier they were promised still holds. A writer naming no
  higher epoch (a rejoin, a second writer of the same run, a writer of a live stream) joins
  the current epoch at its frontier.
- Cohorts (collective publications: every process of a query writes the partition). A
  producer may join as writer `w` of cohort `g` expecting `n` distinct writers. Until `n`
  distinct writer names of `g` have joined, the cohort is pending: the published frontier stays
  where it was (late writers join there, so the frontier never passes a record they may still
  send) and the stream does not end, even when every producer that came has ended.
- A writer that joins again under a name already counted (a restarted process) counts once.
- A pending cohort is released (forgotten, so it holds nothing) when its live producers are
  all gone and one of them vanished: its query is failing, the missing writer will not come.
- A complete cohort is remembered, so a member rejoining it (after a lease expiry) joins as a
  plain producer. A rejoin naming a cohort this partition does not know (the broker restarted,
  or the cohort was released) joins as a plain producer too: it was counted before.
- At most `max_cohorts` cohorts are remembered per partition; beyond that the oldest cohort with
  no live producer is forgotten first (a pending one stops holding), else the join is refused.
- Writers whose processes exited (`settle`, from the catalog's exit codes) never join: with a
  failed or killed query the cohort is released as above; otherwise they count as joined and
  ended, so a cohort whose joined writers all ended cleanly completes and the stream ends.
- Cohorts survive a broker restart while some writer may still write: `pending()` is what the
  shell saves (`revision` says when it changed), and a frontier built with `cohorts=` waits
  for them again. Saved are the cohorts not yet done (incomplete, or complete with a writer
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

MAX_COHORT_NAME = 256
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

# Cohorts of a query's collective publications are named `q<query>/<topic>#<n>` and
# their writers are process indexes (querylib/api/_runtime.py, DESIGN §5 "Collective publishing").
_QUERY_COHORT = re.compile(r"q([0-9]{1,18})/")


def query_of_cohort(cohort: str) -> int | None:
    """The query whose processes write `cohort`, or None for a cohort not named after one."""
    match = _QUERY_COHORT.match(cohort)
    return int(match.group(1)) if match else None


@dataclass(frozen=True, slots=True)
class SavedCohort:
    """A pending cohort as it survives a broker restart."""

    name: str
    writers: int
    joined: tuple[str, ...]


class FrontierRegressionError(ProtocolError):
    """A producer tried to move its frontier backwards."""


class CohortError(ProtocolError):
    """A cohort named badly, with a count other than its members', or one too many."""


@dataclass(slots=True)
class _Cohort:
    writers: int                                        # distinct writers expected
    joined: set[str] = field(default_factory=set)       # writer names seen (while pending)
    live: set[str] = field(default_factory=set)         # producers of the cohort now joined
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

    def __init__(self, frontier: int = 0, *, ended: bool = False, max_cohorts: int = 64,
                 cohorts: Iterable[SavedCohort] = (), epoch: int = 0) -> None:
        self._published = frontier
        self._ended = ended
        self._epoch = epoch
        self._producers: dict[str, int] = {}
        self._cohorts: dict[str, _Cohort] = {    # insertion order: oldest first
            g.name: _Cohort(g.writers, set(g.joined), ended=set(g.joined)) for g in cohorts}
        self._cohort_of: dict[str, str] = {}     # producer -> its cohort
        self._max_cohorts = max_cohorts
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
        """True while a cohort is incomplete: the frontier and end-of-stream wait."""
        return any(not g.complete for g in self._cohorts.values())

    def pending_cohorts(self) -> dict[str, tuple[int, int]]:
        """Incomplete cohorts: name -> (writers joined, writers expected)."""
        return {name: (len(g.joined), g.writers) for name, g in self._cohorts.items()
                if not g.complete}

    def open_cohorts(self) -> list[str]:
        """Cohorts not done: incomplete, or with a writer that has not ended."""
        return [name for name, g in self._cohorts.items() if not g.done]

    def pending(self) -> tuple[SavedCohort, ...]:
        """The cohorts not done, oldest first, as a restarted broker must know them: with the
        writers that ended (the others must join again)."""
        return tuple(SavedCohort(name, g.writers, tuple(sorted(g.ended)))
                     for name, g in self._cohorts.items() if not g.done)

    @property
    def revision(self) -> int:
        """Changes whenever `pending()` does: the shell saves the cohorts when it moved."""
        return self._revision

    def _touch(self) -> None:
        """A cohort changed: bump the revision if what a restart must know did."""
        view = self.pending()
        if view != self._saved_view:
            self._saved_view = view
            self._revision += 1

    def join(self, producer: str, cohort: str = "", writer: str = "", writers: int = 0, *,
             rejoin: bool = False, reopen: bool = False, epoch: int = 0
             ) -> list[FrontierEvent]:
        """A producer starts writing; it begins at the published frontier. With a `cohort`, it
        is `writer` of a cohort of `writers` (see the module rules). Returns StreamReopened if
        it reopened an ended stream or started epoch `epoch`, and what forgetting an old
        pending cohort to make room released. StreamEndedError if the stream ended and
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
            self._cohorts.clear()
            self._cohort_of.clear()
            self._touch()
        elif self._ended:
            events.append(StreamReopened())
        if cohort:
            events += self._join_cohort(producer, cohort, writer, writers, rejoin)
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
        (and no cohort is still waiting for a writer)."""
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

    def settle(self, cohort: str, ended: Collection[str], *, failed: bool) -> list[FrontierEvent]:
        """The processes behind writers `ended` of `cohort` have exited, so those writers will
        not join. A cohort of a failed query is released (as when a joined writer vanished);
        otherwise they count as joined and ended: a cohort that completes so lets the frontier
        move, and ends the stream when no producer is left."""
        state = self._cohorts.get(cohort)
        if state is None or state.done:
            return []
        if failed:
            del self._cohorts[cohort]
            for producer in state.live:
                del self._cohort_of[producer]  # plain producers from now on
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

    # ------------------------------------------------------------------ cohorts

    def _join_cohort(self, producer: str, cohort: str, writer: str, writers: int,
                    rejoin: bool) -> list[FrontierEvent]:
        if len(cohort) > MAX_COHORT_NAME or not 0 < len(writer) <= MAX_WRITER_NAME:
            raise CohortError(f"a cohort name is 1 to {MAX_COHORT_NAME} characters "
                              f"and a writer name 1 to {MAX_WRITER_NAME}")
        if not 0 < writers <= MAX_WRITERS:
            raise CohortError(f"a cohort expects 1 to {MAX_WRITERS} writers, "
                              f"not {writers}")
        events: list[FrontierEvent] = []
        state = self._cohorts.get(cohort)
        if state is None:
            if rejoin:
                return []  # counted before this broker forgot the cohort: a plain producer
            events = self._make_room(cohort)
            state = self._cohorts[cohort] = _Cohort(writers)
        elif state.writers != writers:
            raise CohortError(f"cohort {cohort!r} expects {state.writers} writers, "
                              f"not {writers}")
        if not state.complete and writer not in state.joined:
            state.joined.add(writer)
        state.ended.discard(writer)  # back (a rejoin, or a restarted process): may write
        state.live.add(producer)
        state.writer_of[producer] = writer
        self._cohort_of[producer] = cohort
        return events

    def _make_room(self, cohort: str) -> list[FrontierEvent]:
        if len(self._cohorts) < self._max_cohorts:
            return []
        for name, state in self._cohorts.items():
            if not state.live:
                del self._cohorts[name]
                self._touch()
                return self._recompute()
        raise CohortError(f"the partition already tracks {self._max_cohorts} cohorts "
                          f"with live producers; cannot start {cohort!r}")

    def _leave(self, producer: str, *, vanished: bool) -> None:
        name = self._cohort_of.pop(producer, None)
        if name is None:
            return
        state = self._cohorts[name]
        state.live.discard(producer)
        writer = state.writer_of.pop(producer, None)
        if not vanished and writer is not None and writer not in state.writer_of.values():
            state.ended.add(writer)
        state.vanished = state.vanished or vanished
        if not state.live and state.vanished and not state.complete:
            del self._cohorts[name]

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
