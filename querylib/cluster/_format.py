"""How the catalog topics' records are laid out beyond Kafka's format: the names the writer
(the coordinator) and the readers (followers here, recovery there) must agree on.

    __catalog.<collection>   one partition; a change's update: value = the record
                             (MessagePack), headers tq.time = catalog version, tq.diff = diff
    checkpoint block         a marker (null value; tq.time = tq.snapshot = S, tq.count = N),
                             then N records (tq.time = tq.snapshot = S, tq.diff = multiplicity):
                             the whole collection at version S
    __catalog_checkpoints    one entry per checkpoint: where each collection's block starts

Constants only (coordinator/_journal documents the protocol in full).
"""

from __future__ import annotations

__all__ = ["CHECKPOINT_TOPIC", "COUNT_HEADER", "SNAPSHOT_HEADER"]

CHECKPOINT_TOPIC = "__catalog_checkpoints"
SNAPSHOT_HEADER = "tq.snapshot"
COUNT_HEADER = "tq.count"
