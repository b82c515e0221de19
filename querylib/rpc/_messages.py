"""Declaring RPC messages: requests, replies, notifies, the wire header and the error body.

A message type is a `msgspec.Struct` with an explicit string tag, and the class is the one
spelling used everywhere (registration, dispatch, decoding); strings appear only on the wire:

    class ProduceReply(Reply, tag="broker.produce.reply"):
        base_offset: int

    class Produce(Request[ProduceReply], tag="broker.produce"):
        error_type: ClassVar[type[TqError]] = StorageError   # default: TqError
        topic: str
        partition: int

`Request[R]` declares the reply type; `error_type` the exceptions the client re-raises as
themselves. A class without `tag=` is abstract (a shared base): it can be subclassed, not sent.
Tags are global; a second class claiming a tag is a TypeError at import time.

This module declares and looks up types. It must not encode frames, sign, or do I/O.
"""

from __future__ import annotations

import enum
import typing
from typing import Any, ClassVar, Generic, TypeVar, cast

import msgspec

from catalog.errors import TqError

__all__ = [
    "Entry",
    "ErrorBody",
    "Header",
    "Kind",
    "Message",
    "Notify",
    "Ping",
    "Pong",
    "Reply",
    "Request",
    "message_type",
]


class Kind(enum.IntEnum):
    """What a message is; the header's first field."""

    REQUEST = 0
    REPLY = 1
    ERROR = 2
    NOTIFY = 3
    BATCH = 4  # several requests, or several replies and errors, in one message (`Entry`)


class Header(msgspec.Struct, array_like=True, frozen=True):
    """The second frame of every message (the first is its signature).

    kind      Kind
    id        request id chosen by the client; a reply or error carries its request's id;
              0 for notifies
    tag       type tag of the body ("" for an error body)
    ttl       seconds left until the request's deadline when it was sent (requests), else 0.
              Relative, so a deadline survives clock skew between hosts.
    session   16 random bytes naming the sending endpoint for its lifetime
    seq       per-session sequence number, 1, 2, 3...: the replay guard's key
    sent_at   sender's wall clock (seconds since the epoch) bounding how long a replay works
    to        the recipient's session on server->client messages (b"" client->server), so a
              server's message to one client cannot be replayed to another
    principal who the client is (DESIGN §12): whose key signs the message, both ways; ""
              on server->client messages
    """

    kind: int
    id: int
    tag: str
    ttl: float
    session: bytes
    seq: int
    sent_at: float
    to: bytes = b""
    principal: str = ""


class Entry(msgspec.Struct, array_like=True, frozen=True):
    """One request, reply or error inside the body of a BATCH message, whose body is a
    MessagePack array of these. The batch's header says who sent it, when, in which session
    with which sequence number (one replay check and one MAC for all its entries); each entry
    has the fields of `Header` that differ between messages:

    kind      Kind.REQUEST (client->server), or Kind.REPLY / Kind.ERROR (server->client)
    id        the request id, as `Header.id`
    tag       the body's type tag ("" for an error body), as `Header.tag`
    ttl       a request's seconds to its deadline, as `Header.ttl` (0 for replies)
    body      the message struct (or `ErrorBody`), MessagePack, embedded as it is
    """

    kind: int
    id: int
    tag: str
    ttl: float
    body: msgspec.Raw


class ErrorBody(msgspec.Struct, array_like=True, frozen=True):
    """The body of an ERROR message: a TqError's class name, message and traits, and the
    attributes its class names in `wire_attributes` (e.g. the offsets of CorruptDataError)."""

    type: str
    message: str
    retriable: bool
    kafka_error_code: int
    attributes: dict[str, int | str] = msgspec.field(default_factory=dict)


_REGISTRY: dict[str, type[Message]] = {}
class _MessageMeta(msgspec.StructMeta):
    """Registers each class that names its tag, and records a request's declared reply type.

    A metaclass rather than __init_subclass__ because msgspec fills in the struct config
    (where the tag lives) only after __init_subclass__ has run.
    """

    def __new__(mcls, name: str, bases: tuple[type, ...], namespace: dict[str, Any],
                **kwargs: Any) -> type:
        tag = kwargs.get("tag")
        if tag is not None and not isinstance(tag, str):
            raise TypeError(f"{name}: an RPC message tag must be a str, not {tag!r}")
        cls = cast("type[Message]", super().__new__(mcls, name, bases, namespace, **kwargs))
        cls.rpc_tag = tag  # None: abstract, cannot be sent
        reply = _declared_reply(cls)
        if reply is not None:
            cast("type[Request[Any]]", cls).reply_type = reply
        if tag is not None:
            _register(cls, tag)
        return cls


def _declared_reply(cls: type) -> type | None:
    """R from a base written `Request[R]`, if this class has one."""
    if _Request is None:
        return None
    for base in cls.__dict__.get("__orig_bases__", ()):
        origin = typing.get_origin(base)
        if isinstance(origin, type) and issubclass(origin, _Request):
            (arg,) = typing.get_args(base)
            if not (isinstance(arg, type) and issubclass(arg, Reply)):
                raise TypeError(f"{cls.__name__}: Request[...] takes a Reply subclass, "
                                f"not {arg!r}")
            return arg
    return None


def _register(cls: type[Message], tag: str) -> None:
    kinds = [k for k in (Request, Reply, Notify) if issubclass(cls, k)]
    if len(kinds) != 1:
        raise TypeError(f"{cls.__name__}: a tagged message must derive from exactly one of "
                        "Request, Reply, Notify")
    old = _REGISTRY.get(tag)
    # Re-running the same class statement (a module reload) is allowed; two classes are not.
    if old is not None and (old.__module__, old.__qualname__) != (cls.__module__,
                                                                   cls.__qualname__):
        raise TypeError(f"RPC tag {tag!r} of {cls.__qualname__} is already used by "
                        f"{old.__module__}.{old.__qualname__}")
    if issubclass(cls, Request) and getattr(cls, "reply_type", None) is None:
        raise TypeError(f"{cls.__name__}: declare the reply type, e.g. "
                        f"class {cls.__name__}(Request[{cls.__name__}Reply], tag=...)")
    cls.rpc_kind = {Request: Kind.REQUEST, Reply: Kind.REPLY, Notify: Kind.NOTIFY}[kinds[0]]
    cls.rpc_decoder = msgspec.msgpack.Decoder(cls)
    _REGISTRY[tag] = cls


def message_type(tag: str) -> type[Message] | None:
    """The message class registered under `tag`, or None."""
    return _REGISTRY.get(tag)


# Set once Request exists: the metaclass runs for the base classes too, before it does.
_Request: type | None = None

R = TypeVar("R", bound="Reply")


class Message(msgspec.Struct, metaclass=_MessageMeta, tag_field="type"):
    """Base of every RPC message. Subclass Request, Reply or Notify, not this."""

    rpc_tag: ClassVar[str | None]
    rpc_kind: ClassVar[Kind]
    rpc_decoder: ClassVar[msgspec.msgpack.Decoder]


class Reply(Message):
    """Base of reply types."""


class Request(Message, Generic[R]):
    """Base of request types: `class X(Request[XReply], tag="...")`."""

    reply_type: ClassVar[type[Reply]]
    error_type: ClassVar[type[TqError]] = TqError


class Notify(Message):
    """Base of one-way messages (either direction); they have no reply."""


_Request = Request


class Pong(Reply, tag="rpc.pong"):
    """Reply to Ping: the same data back (the server echoes payload frames too)."""

    data: bytes = b""


class Ping(Request[Pong], tag="rpc.ping"):
    """Built-in echo request every server answers: liveness checks and benchmarks."""

    data: bytes = b""
