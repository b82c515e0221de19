"""Helpers that drive connections into known states with real bytes."""

from __future__ import annotations

from querylib.connector import (
    Dialect,
    SourceConnection,
    WorkerConnection,
    draft,
    released,
)

MODULES = {Dialect.DRAFT: draft, Dialect.RELEASED: released}
COOKIE = b"s3cret"


def module(dialect: Dialect):
    return MODULES[dialect]


def hello_frame(dialect: Dialect, *, version: str | None = None, cookie: bytes = COOKIE):
    mod = module(dialect)
    return mod.Hello((version or mod.VERSION).encode(), cookie, b"prog", b"inst")


def worker(dialect: Dialect | None = None, **kwargs) -> WorkerConnection:
    kwargs.setdefault("cookie", COOKIE)
    if dialect is not None:
        kwargs.setdefault("dialects", (dialect,))
    return WorkerConnection(**kwargs)


def feed(conn, *frames_or_bytes) -> list:
    """Encode (if needed) and feed frames to `conn`; return the events."""
    events = []
    for item in frames_or_bytes:
        if not isinstance(item, bytes):
            item = module(conn.dialect or _dialect_of(item)).encode(item)
        events += conn.receive_data(item)
    return events


def _dialect_of(frame) -> Dialect:
    return Dialect.DRAFT if type(frame).__module__.endswith("draft") else Dialect.RELEASED


def handshaken(dialect: Dialect, **kwargs) -> WorkerConnection:
    conn = worker(dialect, **kwargs)
    events = feed(conn, hello_frame(dialect))
    assert [type(e).__name__ for e in events] == ["Hello"], events
    return conn


def streaming(dialect: Dialect, credits: int = 100, resume=None, **kwargs) -> WorkerConnection:
    conn = handshaken(dialect, **kwargs)
    conn.accept(credits, resume)
    return conn


def notify(dialect: Dialect, stream_id: int, name: bytes = b"s", point: int | None = None):
    mod = module(dialect)
    if point is None:
        point = 0 if dialect is Dialect.DRAFT else released.NOTHING_PROCESSED
    return mod.Notify(stream_id, name, point)


def message(dialect: Dialect, stream_id: int, message_id: int, payload: bytes = b"x", *,
            eos: bool = False, flags: int = 0):
    if dialect is Dialect.DRAFT:
        return draft.Message(stream_id, flags | (4 if eos else 0), message_id, None, payload)
    assert not eos and not flags
    return released.Message(stream_id, message_id, 0, b"", payload)


def end(dialect: Dialect, stream_id: int, message_id: int = 10**6):
    if dialect is Dialect.DRAFT:
        return draft.Message(stream_id, 2 | 4, message_id)
    return released.Eos(stream_id)


def open_stream(conn: WorkerConnection, stream_id: int, processed: int | None = None) -> None:
    events = feed(conn, notify(conn.dialect, stream_id))
    assert [type(e).__name__ for e in events] == ["StreamOpened"], events
    conn.accept_stream(stream_id, processed)


def source(dialect: Dialect, **kwargs) -> SourceConnection:
    kwargs.setdefault("cookie", COOKIE)
    return SourceConnection(dialect, program="prog", instance="inst", **kwargs)


def pair(dialect: Dialect, credits: int = 100):
    """A worker and a source that completed the handshake by exchanging real bytes."""
    w, s = worker(), source(dialect)
    events = w.receive_data(s.hello())
    assert [type(e).__name__ for e in events] == ["Hello"]
    events = s.receive_data(w.accept(credits))
    assert [type(e).__name__ for e in events] == ["Accepted"]
    return w, s


def kinds(events) -> list[str]:
    return [type(e).__name__ for e in events]
