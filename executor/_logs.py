"""Query output as records on the `__logs` topic (DESIGN §6): the supervisor's log sink that
publishes each line through a broker producer, and the reverse mapping for readers.

One line is one record:

    key        b"<query id>/<process index>"   (so `tq logs QUERY` can filter, and a
                                                compacting reader can group by process)
    value      the line, UTF-8, without its newline
    timestamp  when the executor read the line (ms since the epoch)
    headers    ("stream", b"stdout" | b"stderr"), and ("continues", b"1") on every piece of
               an over-long line but the last

The forwarder never raises into the supervisor: when the broker refuses or fails a batch, the
lines in it are lost, the failure is counted and logged, and forwarding goes on with the next
lines. The producer's credit window bounds what is in flight; while it is exhausted the sink
waits, so the query's pipe fills and the query waits too (nothing is buffered without bound).
"""

from __future__ import annotations

import logging

from catalog.errors import TqError
from querylib.broker import AsyncProducer
from querylib.records import Record
from querylib.server.broker import BrokerPort

from ._supervisor import LogLine

__all__ = ["LOGS_TOPIC", "LogForwarder", "line_of_record", "record_of_line"]

logger = logging.getLogger("executor")

LOGS_TOPIC = "__logs"

Headers = tuple[tuple[str, bytes | None], ...]


def record_of_line(line: LogLine) -> tuple[bytes, bytes, Headers, int]:
    """(key, value, headers, timestamp) of the record for one line."""
    headers: Headers = (("stream", line.stream.encode()),)
    if line.continues:
        headers += (("continues", b"1"),)
    return (f"{line.query_id}/{line.process}".encode(), line.text.encode("utf-8"), headers,
            line.timestamp_ms)


def line_of_record(record: Record) -> LogLine | None:
    """The line a `__logs` record carries, or None if the record is not one."""
    try:
        query, process = (record.key or b"").decode().split("/")
        fields = dict(record.headers)
        return LogLine(int(query), int(process), (fields.get("stream") or b"").decode(),
                       (record.value or b"").decode("utf-8", errors="replace"),
                       record.timestamp, fields.get("continues") == b"1")
    except (ValueError, UnicodeDecodeError):
        return None


class LogForwarder:
    """A Supervisor sink publishing lines into one partition of the logs topic, through the
    in-process door of this host's broker, as tq itself ("system": `__logs` is internal).

        forwarder = await LogForwarder(broker.port).start()
        supervisor = Supervisor(work_root=..., sink=forwarder)
        ...
        await forwarder.close()   # after the supervisor closed: sends what is pending

    `close()` does not end the partition's stream: the topic outlives this executor and other
    writers may share the partition.
    """

    def __init__(self, port: BrokerPort, *, topic: str = LOGS_TOPIC, partition: int = 0,
                 linger: float = 0.01, timeout: float = 30.0) -> None:
        self.producer = AsyncProducer(port, topic, partition, principal="system",
                                      linger=linger, timeout=timeout)
        self.topic = topic
        self.forwarded = 0   # lines handed to the producer (not necessarily acknowledged)
        self.failures = 0    # failed sends or batches (their lines are lost)

    async def start(self) -> LogForwarder:
        await self.producer.start()
        return self

    async def __call__(self, line: LogLine) -> None:
        key, value, headers, timestamp = record_of_line(line)
        try:
            await self.producer.send(value, key=key, headers=headers, timestamp=timestamp)
        except TqError as exc:
            # An earlier batch failed (the producer reports it on the next call); this line
            # may still go out. Log output is best effort, the query must go on.
            self.failures += 1
            logger.warning("log forwarding to %s failed: %s", self.topic, exc)
            return
        self.forwarded += 1

    async def flush(self) -> None:
        """Wait until every line sent so far is acknowledged (raises the first failure)."""
        await self.producer.flush()

    async def close(self) -> None:
        """Send what is pending and close the producer session. A failure here (the broker is
        gone) is counted and logged, not raised: the executor is shutting down either way."""
        try:
            await self.producer.close(end=False)
        except TqError as exc:
            self.failures += 1
            logger.warning("closing the log forwarder to %s: %s", self.topic, exc)
