"""Requests a broker answers outside any session: which partitions it hosts, and moving a
partition's log start (Kafka's DeleteRecords). Blocking, for tools and the coordinator."""

from __future__ import annotations

from querylib.rpc import BROKER, BlockingClient, Credential

from ._session import CLIENT_LIMITS
from .messages import (
    DeleteRecordsRequest,
    ListPartitions,
    ListSubscriptions,
    PartitionInfo,
    SubscriptionInfo,
)

__all__ = ["delete_records", "list_partitions", "list_subscriptions"]


def list_partitions(address: str, secret: bytes | Credential, topic: str = "", *,
                    timeout: float = 10.0) -> list[PartitionInfo]:
    """The partitions a broker hosts (of `topic`, or all)."""
    with BlockingClient(address, secret, limits=CLIENT_LIMITS, timeout=timeout,
                        audience=BROKER) as client:
        return client.request(ListPartitions(topic=topic)).partitions


def delete_records(address: str, secret: bytes | Credential, topic: str, partition: int,
                   offset: int, *, timeout: float = 10.0) -> PartitionInfo:
    """Move a partition's log start up to `offset` (-1: its end) on the broker hosting it
    (Kafka's DeleteRecords; the topic's writers and the admin may): the partition after."""
    with BlockingClient(address, secret, limits=CLIENT_LIMITS, timeout=timeout,
                        audience=BROKER) as client:
        return client.request(DeleteRecordsRequest(topic=topic, partition=partition,
                                                    offset=offset))


def list_subscriptions(address: str, secret: bytes, topic: str = "", *,
                       timeout: float = 10.0) -> list[SubscriptionInfo]:
    """The subscriptions a broker serves (of `topic`, or all): every principal's for the
    admin, the caller's own for anyone else."""
    with BlockingClient(address, secret, limits=CLIENT_LIMITS, timeout=timeout,
                        audience=BROKER) as client:
        return client.request(ListSubscriptions(topic=topic)).subscriptions
