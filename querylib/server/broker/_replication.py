"""A replicated partition's leader: its followers' progress, its high watermark and the ISR
changes it asks the controller for (DESIGN §5 "Replication"; Kafka's Partition and Replica
state, KIP-497's AlterPartition).

`LeaderProgress` is one partition's, kept by the broker leading it at one leader epoch:

- each follower's fetch names the offset it wants next, so it holds everything below it (its
  log end): `fetched(replica, offset, leader_end, now)`;
- a follower is caught up when it has asked for the leader's log end as it was at its previous
  fetch (Kafka's lastCaughtUpTime rule: a follower that keeps fetching a busy leader is in sync
  though never exactly at the end);
- the high watermark is the least log end over the ISR, the leader's own counted as its
  durable end: what every in-sync replica has, so what readers may see and producers are told
  is stored; it never goes back within an epoch;
- `proposal(now)`: the ISR the leader should ask for, or None: followers not caught up for
  `lag_ms` leave, replicas outside it that fetch and reached the high watermark join; the
  leader stays.
  The change takes effect only once the controller agrees (the catalog's new ISR comes back
  through `set_isr`); meanwhile the HW keeps counting the old ISR, so an acknowledged record
  is on every replica of the ISR the catalog knows.

Must not: do I/O or read clocks (times come in), or decide leadership (the controller does).
"""

from __future__ import annotations

import msgspec

__all__ = ["LeaderProgress"]


class _Follower(msgspec.Struct):
    end: int = 0                  # the offset it fetches next: it holds everything below
    caught_up_at: float | None = None  # when it last reached the leader's end (None: never)
    end_at_last_fetch: int = 0    # the leader's log end when it last fetched
    fetching: bool = False        # it fetched from this leader at this epoch


class LeaderProgress:
    """The followers of one partition this broker leads at `epoch`."""

    def __init__(self, leader: int, epoch: int, replicas: tuple[int, ...],
                 isr: tuple[int, ...], *, now: float, lag_ms: int = 30_000,
                 high_watermark: int = 0) -> None:
        if leader not in isr or not set(isr) <= set(replicas):
            raise ValueError(f"leader {leader} with ISR {isr} of replicas {replicas}")
        self.leader, self.epoch = leader, epoch
        self.replicas, self.isr = replicas, isr
        self.lag_s = lag_ms / 1000
        # A new leader gives every follower the whole lag time to show up before proposing it
        # out: it cannot know what they fetched from the leader before it.
        self._followers = {r: _Follower(caught_up_at=now) for r in replicas if r != leader}
        self._hw = high_watermark

    @property
    def high_watermark(self) -> int:
        return self._hw

    def fetched(self, replica: int, offset: int, leader_end: int, now: float) -> None:
        """Follower `replica` asks for records from `offset`; the leader's log ends at
        `leader_end`. Raises ValueError for a broker that is no follower of the partition (the
        caller refuses its fetch) or an offset past the leader's end."""
        follower = self._followers.get(replica)
        if follower is None:
            raise ValueError(f"broker {replica} is not a follower of this partition")
        if not 0 <= offset <= leader_end:
            raise ValueError(f"fetch offset {offset} is outside the leader's log [0, "
                             f"{leader_end}]")
        follower.end, follower.fetching = offset, True
        if offset >= leader_end or offset >= follower.end_at_last_fetch:
            follower.caught_up_at = now
        follower.end_at_last_fetch = leader_end

    def advance(self, durable_end: int) -> int:
        """The high watermark given the leader's own durable end: the least end over the ISR,
        never lower than before (a replica's end only grows within an epoch)."""
        ends = [durable_end] + [self._followers[r].end for r in self.isr if r != self.leader]
        self._hw = max(self._hw, min(ends))
        return self._hw

    def set_isr(self, isr: tuple[int, ...]) -> None:
        """The catalog's ISR (after the controller applied a change, or a newer view)."""
        if self.leader not in isr or not set(isr) <= set(self.replicas):
            raise ValueError(f"ISR {isr} without leader {self.leader} or outside "
                             f"{self.replicas}")
        self.isr = isr

    def proposal(self, now: float) -> tuple[int, ...] | None:
        """The ISR to ask the controller for, in replica order, or None when it is right."""
        wanted = []
        for replica in self.replicas:
            if replica == self.leader:
                wanted.append(replica)
                continue
            follower = self._followers[replica]
            lagging = follower.caught_up_at is None or now - follower.caught_up_at > self.lag_s
            if replica in self.isr:
                if not lagging:
                    wanted.append(replica)
            elif follower.fetching and follower.end >= self._hw and not lagging:
                wanted.append(replica)
        proposal = tuple(wanted)
        return None if proposal == self.isr else proposal
