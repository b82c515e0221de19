"""The replication rules of the broker's core (DESIGN §5 "Replication"), sans I/O, as
Admission, Subscriptions and Cohorts are: what a broker's role on a replicated partition is,
where a follower truncates when it (re)joins (KIP-101/279; the leader epochs are the log's,
`PartitionLog.leader_epochs`), and the leader's view of its followers: their fetched ends, the high
watermark, the ISR changes to propose and min.insync.replicas.

`PartitionRole` is what the catalog says about one replicated partition (leader, leader epoch,
replicas, ISR) and, for a follower, where its leader listens. `LeaderReplication` is the
leader's bookkeeping for one partition: `follower_fetch` records a follower's fetch offset (its
log end) and answers a new high watermark, `durable` does the same for the leader's own durable
end, `isr_proposal` says which ISR to ask the coordinator for (a follower that has not reached
the leader's log end for `lag_max_ms` leaves; a replica that reached the high watermark joins,
and counts towards the high watermark from the proposal on: Kafka's maximal ISR), and
`set_role` takes the catalog's answer: only a new role changes the ISR.

Must not: do I/O, read clocks (times are given), or touch logs (the shell truncates and appends
as these rules say).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from querylib.broker._errors import (
    FencedLeaderEpochError,
    NotEnoughReplicasError,
    NotLeaderOrFollowerError,
)
from querylib.log import LeaderEpochCache


@dataclass(frozen=True)
class PartitionRole:
    """What the catalog says about one replicated partition. `leader_address` and
    `leader_curve_key` tell a follower where to fetch (empty on the leader itself)."""

    topic_id: int
    partition: int
    leader_id: int
    leader_epoch: int
    replicas: tuple[int, ...]
    isr: tuple[int, ...]
    leader_address: str = ""
    leader_curve_key: str | None = None

    def __post_init__(self) -> None:
        if self.leader_epoch < 0 or self.partition < 0:
            raise ValueError(f"a role needs a leader epoch and partition >= 0: {self}")
        if len(set(self.replicas)) != len(self.replicas) or len(set(self.isr)) != len(self.isr):
            raise ValueError(f"replicas and ISR name each broker once: {self}")
        if self.leader_id not in self.replicas:
            raise ValueError(f"leader {self.leader_id} is not a replica: {self}")
        if not set(self.isr) <= set(self.replicas):
            raise ValueError(f"ISR {self.isr} is not within replicas {self.replicas}")
        if self.leader_id not in self.isr:
            raise ValueError(f"leader {self.leader_id} is not in its ISR {self.isr}")

    def is_leader(self, broker_id: int) -> bool:
        return broker_id == self.leader_id

    def is_follower(self, broker_id: int) -> bool:
        return broker_id != self.leader_id and broker_id in self.replicas


def follower_truncation(leader_answer: tuple[int, int], own: LeaderEpochCache, *,
                        log_end: int) -> tuple[int, bool]:
    """Where a (re)joining follower truncates (KIP-101/279), given the leader's answer to
    OffsetForLeaderEpoch for the follower's latest epoch (the largest epoch it knows up to
    that one, and where it ended there) and the follower's own epochs: (offset, final).

    Where both logs hold the answered epoch, they part at the lesser of its two ends: final.
    Where the follower lacks it, its records from its next epoch on are not the leader's: it
    truncates there and asks again for its new latest epoch (not final). Everything goes when
    the leader knows no epoch that old, or the follower none as old as the leader's."""
    if leader_answer == LeaderEpochCache.UNDEFINED:
        return 0, True
    epoch, leader_end = leader_answer
    own_epoch, own_end = own.end_offset_for(epoch, log_end=log_end)
    if own_epoch < 0:
        return 0, True
    return min(leader_end, own_end), own_epoch == epoch


@dataclass
class _Follower:
    fetched: int = 0  # its log end, as its last fetch said
    caught_up_ms: int = 0  # the last time its log end reached the leader's
    last_fetch_ms: int = 0  # when its previous fetch came
    last_fetch_leader_end: int = 0  # the leader's log end then


@dataclass
class LeaderReplication:
    """The leader's bookkeeping for one replicated partition it leads."""

    role: PartitionRole
    own_id: int
    lag_max_ms: int
    now_ms: int
    epoch_start: int = 0  # the leader's log end when it took this epoch
    # The core's first append ticket after the append lane took this epoch: appends from it on
    # are stored with this epoch stamped (those already in flight may carry the old one).
    first_ticket: int = 0
    high_watermark: int = 0
    _durable: int = 0
    _followers: dict[int, _Follower] = field(default_factory=dict)
    # Replicas last proposed into the ISR, until a role with another ISR answers (Kafka's
    # maximal ISR, KIP-497): the catalog may name them in sync, and elect one, before this
    # leader hears so, so the high watermark waits for them as for the ISR meanwhile.
    _joining: frozenset[int] = frozenset()

    def __post_init__(self) -> None:
        if not self.role.is_leader(self.own_id):
            raise ValueError(f"broker {self.own_id} does not lead {self.role}")
        self.set_role(self.role, now_ms=self.now_ms)

    def set_role(self, role: PartitionRole, *, now_ms: int) -> None:
        """The catalog's role, again or changed (an ISR the coordinator accepted). A follower
        new to the ISR counts as caught up now."""
        if not role.is_leader(self.own_id):
            raise ValueError(f"broker {self.own_id} does not lead {role}")
        old_isr = set(self.role.isr) if self._followers else set()
        if set(role.isr) != set(self.role.isr):
            self._joining = frozenset()  # the catalog answered: taken in, or not
        self.role = role
        for replica in role.replicas:
            if replica == self.own_id:
                continue
            follower = self._followers.setdefault(replica, _Follower(caught_up_ms=now_ms))
            if replica in role.isr and replica not in old_isr:
                follower.caught_up_ms = now_ms
        for gone in set(self._followers) - set(role.replicas):
            del self._followers[gone]
        self._advance()

    def durable(self, end: int) -> int | None:
        """The leader's own durable log end is `end`: the new high watermark, or None."""
        self._durable = max(self._durable, end)
        return self._advance()

    def follower_fetch(self, replica: int, *, fetch_offset: int, leader_epoch: int,
                       leader_end: int, now_ms: int) -> int | None:
        """A ReplicaFetch from `replica` at `fetch_offset` (its log end), naming
        `leader_epoch`, while the leader's log ends at `leader_end`: fenced when the epochs
        disagree; the new high watermark, or None."""
        if leader_epoch < self.role.leader_epoch:
            raise FencedLeaderEpochError(
                f"leader epoch {leader_epoch} is older than {self.role.leader_epoch}")
        if leader_epoch > self.role.leader_epoch:
            raise NotLeaderOrFollowerError(
                f"leader epoch {leader_epoch} is newer than this leader's {self.role.leader_epoch}")
        if not self.role.is_follower(replica):
            raise NotLeaderOrFollowerError(f"broker {replica} is not a follower of {self.role}")
        follower = self._followers[replica]
        follower.fetched = max(follower.fetched, fetch_offset)
        # Kafka's lastCaughtUpTime: caught up now if the fetch reached the leader's end, else
        # caught up at the previous fetch if it reached the end the leader had then (under a
        # steady stream no fetch ever reaches the end as it is when the fetch arrives).
        if fetch_offset >= leader_end:
            follower.caught_up_ms = max(follower.caught_up_ms, now_ms)
        elif fetch_offset >= follower.last_fetch_leader_end:
            follower.caught_up_ms = max(follower.caught_up_ms, follower.last_fetch_ms)
        follower.last_fetch_ms = now_ms
        follower.last_fetch_leader_end = leader_end
        return self._advance()

    def isr_proposal(self, *, now_ms: int) -> tuple[int, ...] | None:
        """The ISR to ask the coordinator for, or None when the current one stands: without the
        ISR followers not caught up for longer than the lag time, with the replicas whose fetch
        reached the high watermark and the start of this leader's epoch (a new leader's high
        watermark may lag what the last one acknowledged)."""
        isr = []
        for replica in self.role.replicas:
            if replica == self.own_id:
                isr.append(replica)
                continue
            follower = self._followers[replica]
            if replica in self.role.isr:
                if now_ms - follower.caught_up_ms <= self.lag_max_ms:
                    isr.append(replica)
            elif follower.fetched >= max(self.high_watermark, self.epoch_start) \
                    and now_ms - follower.caught_up_ms <= self.lag_max_ms:
                isr.append(replica)
        proposal = tuple(isr)
        joining = frozenset(proposal) - set(self.role.isr)
        if joining != self._joining:
            self._joining = joining
            self._advance()  # one proposed no more (it stopped fetching) is waited for no more
        return None if set(proposal) == set(self.role.isr) else proposal

    def check_min_insync(self, min_insync: int) -> None:
        """Refuse a produce while the ISR is smaller than the topic's min.insync.replicas."""
        if len(self.role.isr) < min_insync:
            raise NotEnoughReplicasError(
                f"partition {self.role.partition} has {len(self.role.isr)} in-sync replicas,"
                f" min.insync.replicas is {min_insync}")

    def _advance(self) -> int | None:
        ends = [self._durable]
        ends += [self._followers[r].fetched for r in {*self.role.isr, *self._joining}
                 if r != self.own_id]
        hw = min(min(ends), self._durable)
        if hw > self.high_watermark:
            self.high_watermark = hw
            return hw
        return None
