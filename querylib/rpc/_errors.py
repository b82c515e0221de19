"""Errors of the RPC layer, and how any `TqError` crosses the wire and back.

    TqError (catalog.errors)
    ├── UserError
    │   ├── SecretFileError             the cluster secret file is missing, too open or too short
    │   ├── SecretRejectedError         the server answered that our signatures do not verify
    │   └── AddressError                an endpoint we cannot bind or connect to
    ├── ProtocolError
    │   └── RpcProtocolError            a message we cannot accept (`reason` names the counter)
    │       ├── MalformedMessageError   too few frames, undecodable header or body
    │       ├── MessageTooLargeError    too many frames or too many bytes
    │       ├── BadSignatureError       unsigned or badly signed
    │       │   └── UnknownPrincipalKeyError  signed by a principal we hold no key for (yet)
    │       ├── ReplayedMessageError    a sequence number seen before, or a stale timestamp
    │       ├── UnknownMessageTypeError a tag nobody registered, or a kind/tag mismatch
    │       ├── UnsupportedRequestError a known request this server has no handler for
    │       └── UnexpectedReplyError    a reply of another type than the request declared
    └── RpcError                        a call did not complete
        ├── DeadlineExceededError       no reply before the deadline        (REQUEST_TIMED_OUT)
        │   └── ConnectionLostError     the connection dropped before the reply (NETWORK_EXCEPTION)
        ├── ClientClosedError           the client was closed under the call
        ├── ServerBusyError             the server runs too many handlers already (retriable)
        ├── PeerUnreachableError        the server has no route to that client identity
        ├── PeerBusyError               that client's queue is full (retriable)
        ├── InternalServerError         the handler crashed: a bug on the server side
        └── RemoteError                 the handler raised a TqError with no local class

Remote errors travel as `ErrorBody(type, message, retriable, kafka_error_code)`, never pickled.
The client rebuilds an instance of the local class with that full name if it is the request's
declared error type, a subclass of it, or one of this module's classes; else a `RemoteError`
carrying the remote traits. This module must not do I/O.
"""

from __future__ import annotations

from typing import ClassVar

from catalog.errors import ProtocolError, TqError, UserError

from ._messages import ErrorBody, Header

__all__ = [
    "AddressError",
    "BadSignatureError",
    "ClientClosedError",
    "ConnectionLostError",
    "DeadlineExceededError",
    "InternalServerError",
    "MalformedMessageError",
    "MessageTooLargeError",
    "PeerBusyError",
    "PeerUnreachableError",
    "RemoteError",
    "ReplayedMessageError",
    "RpcError",
    "RpcProtocolError",
    "SecretFileError",
    "SecretRejectedError",
    "ServerBusyError",
    "UnexpectedReplyError",
    "UnknownMessageTypeError",
    "UnknownPrincipalKeyError",
    "UnsupportedRequestError",
    "error_body",
    "error_from_body",
]

_MAX_MESSAGE_CHARS = 4096  # an error reply stays small whatever the handler put in its message


class SecretFileError(UserError):
    """The cluster secret file cannot be used; the message says how to fix it."""


class SecretRejectedError(UserError):
    """The server refused our signature: it holds another cluster secret (or we do). Retrying
    cannot help; the message says which secret file to check."""


class AddressError(UserError):
    """An endpoint string zmq rejects, or a bind that fails (address in use, no permission)."""


class RpcProtocolError(ProtocolError):
    """A peer sent a message we cannot accept.

    `reason` is the key of the drop counter it increments. `header` is the decoded header when
    the message was authentic enough to answer (a signed request with a bad body), else None.
    """

    reason: ClassVar[str] = "malformed"

    def __init__(self, message: str, *, reason: str | None = None,
                 header: Header | None = None) -> None:
        super().__init__(message)
        if reason is not None:
            self.reason = reason  # type: ignore[misc]  # instance override of the class default
        self.header = header


class MalformedMessageError(RpcProtocolError):
    """Too few frames, or a header or body that does not decode to its declared type."""


class MessageTooLargeError(RpcProtocolError):
    """More frames or more bytes than the limits allow."""

    reason = "too_large"


class BadSignatureError(RpcProtocolError):
    """No envelope long enough to hold a signature, or a signature that does not verify."""

    reason = "bad_signature"


class UnknownPrincipalKeyError(BadSignatureError):
    """The message names a principal the server has no key for (yet: a server whose keyring
    fetches keys may learn it and decode the message again). Not catalog's
    `UnknownPrincipalError`, a user or executor the catalog does not hold."""

    reason = "unknown_principal"

    def __init__(self, message: str, *, principal: str) -> None:
        super().__init__(message)
        self.principal = principal


class ReplayedMessageError(RpcProtocolError):
    """A (session, sequence) seen before, or a timestamp outside the accepted window."""

    reason = "replayed"


class UnknownMessageTypeError(RpcProtocolError):
    """A type tag no message class registered, or a tag of the wrong kind for the header."""

    reason = "unknown_type"


class UnsupportedRequestError(RpcProtocolError):
    """A request type this server registered no handler for."""

    reason = "no_handler"
    kafka_error_code = 35  # UNSUPPORTED_VERSION: the nearest Kafka meaning


class UnexpectedReplyError(RpcProtocolError):
    """The reply's type is not the one its request declared."""

    reason = "unexpected_reply"


class RpcError(TqError):
    """A call did not complete: no reply in time, a closed client, an overloaded peer."""


class DeadlineExceededError(RpcError):
    """No reply arrived before the request's deadline."""

    retriable = True
    kafka_error_code = 7  # REQUEST_TIMED_OUT


class ConnectionLostError(DeadlineExceededError):
    """The connection carrying the request dropped before its reply came (the server's
    process died, or it closed the connection): no reply will come. As with a passed
    deadline, whether the server acted on it is unknown; unlike one, the caller learns at
    once, and the request will not reach the next server behind its back."""

    kafka_error_code = 13  # NETWORK_EXCEPTION


class ClientClosedError(RpcError):
    """The client was closed while the call was in flight, or before it started."""


class ServerBusyError(RpcError):
    """The server already runs its maximum number of handlers; try again later."""

    retriable = True


class PeerUnreachableError(RpcError):
    """The server knows no connected client with that identity (never seen, or gone)."""


class PeerBusyError(RpcError):
    """That client's send queue is full; it is not reading. Retry after it grants credit."""

    retriable = True


class InternalServerError(RpcError):
    """The handler raised something other than a TqError: a bug on the server side."""


class RemoteError(RpcError):
    """The remote handler raised a TqError for which this process has no matching class.

    Carries the remote class name in `remote_type` and the remote traits as instance attributes.
    """

    def __init__(self, message: str, *, remote_type: str = "", retriable: bool = False,
                 kafka_error_code: int = -1) -> None:
        super().__init__(message)
        self.remote_type = remote_type
        self.retriable = retriable
        self.kafka_error_code = kafka_error_code


def _full_name(cls: type) -> str:
    return f"{cls.__module__}.{cls.__qualname__}"


def error_body(exc: TqError) -> ErrorBody:
    """The wire form of `exc`: its class's full name, message and traits."""
    message = str(exc)
    if len(message) > _MAX_MESSAGE_CHARS:
        message = message[:_MAX_MESSAGE_CHARS] + "..."
    attributes = {name: value for name in getattr(exc, "wire_attributes", ())
                  if isinstance(value := getattr(exc, name, None), int | str)
                  and not isinstance(value, bool)}
    return ErrorBody(
        type=getattr(exc, "remote_type", "") or _full_name(type(exc)),
        message=message,
        retriable=bool(exc.retriable),
        kafka_error_code=int(exc.kafka_error_code),
        attributes=attributes,
    )


def _subclasses(root: type[TqError]) -> dict[str, type[TqError]]:
    found: dict[str, type[TqError]] = {}
    stack = [root]
    while stack:
        cls = stack.pop()
        found.setdefault(_full_name(cls), cls)
        stack.extend(cls.__subclasses__())
    return found


def error_from_body(body: ErrorBody, declared: type[TqError] = TqError) -> TqError:
    """Rebuild the exception a remote handler raised, as a local class where one matches.

    Only classes already imported here are candidates (subclasses of `declared`, and the RPC
    errors above); nothing from the wire is ever imported or unpickled. This walks the class
    tree: O(number of TqError subclasses), paid once per error reply, never on the hot path.
    """
    cls = _subclasses(declared).get(body.type)
    if cls is None:
        cls = _subclasses(RpcError).get(body.type) or _subclasses(RpcProtocolError).get(body.type)
    if cls is None or cls is RemoteError:
        return RemoteError(body.message, remote_type=body.type, retriable=body.retriable,
                           kafka_error_code=body.kafka_error_code)
    # Bypass the class's __init__: its signature may want more than a message, and the
    # message is all that crossed the wire.
    exc = cls.__new__(cls)
    BaseException.__init__(exc, body.message)
    if isinstance(exc, RpcProtocolError):
        exc.header = None
    for name in getattr(cls, "wire_attributes", ()):
        value = body.attributes.get(name)
        if isinstance(value, type(getattr(cls, name, None))):
            setattr(exc, name, value)  # only declared names, of the class default's type
    exc.remote_type = body.type  # type: ignore[attr-defined]  # read by error_body
    return exc
