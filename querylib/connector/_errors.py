"""Errors of the connector protocol codec and its state machines.

Two families, because the endpoint must treat them differently:

    ProtocolError (catalog.errors)
    └── ConnectorProtocolError      the PEER broke the protocol; str(error) is the ERROR reason
        ├── DialectError            the first bytes are neither the draft nor the released dialect
        ├── FrameTooLargeError      a length prefix beyond the maximum frame size
        ├── MalformedFrameError     truncated field, trailing bytes, out-of-range or non-UTF-8 value
        ├── UnknownTagError         a frame tag the dialect does not define
        ├── HandshakeError
        │   ├── VersionMismatchError    HELLO names another protocol version
        │   └── BadCookieError          HELLO carries the wrong cookie
        ├── UnexpectedFrameError    a (state, frame) pair missing from a state table
        │   ├── UnknownStreamError      a frame for a stream never introduced by NOTIFY
        │   └── StreamClosedError       MESSAGE or EOS on a stream that ended
        ├── CreditExhaustedError    NOTIFY or MESSAGE sent without credit
        └── TooManyStreamsError     more distinct streams than the connection allows

    TqError (catalog.errors)
    └── LocalProtocolError          OUR side asked for something the protocol forbids (a bug in the
        └── NoCreditError           caller: acking an unknown stream, a value out of range...)

A `ConnectorProtocolError` is answered with an ERROR frame and the connection ends; a
`LocalProtocolError` is raised to the caller and nothing is sent. Nothing here does I/O.
"""

from __future__ import annotations

from catalog.errors import ProtocolError, TqError

__all__ = [
    "BadCookieError",
    "ConnectorProtocolError",
    "CreditExhaustedError",
    "DialectError",
    "FrameTooLargeError",
    "HandshakeError",
    "LocalProtocolError",
    "MalformedFrameError",
    "NoCreditError",
    "StreamClosedError",
    "TooManyStreamsError",
    "UnexpectedFrameError",
    "UnknownStreamError",
    "UnknownTagError",
    "VersionMismatchError",
]


class ConnectorProtocolError(ProtocolError):
    """The connector peer sent something the protocol does not allow; the session must end."""

    @property
    def reason(self) -> str:
        """The text to put in the ERROR frame that answers this violation."""
        return str(self)


class DialectError(ConnectorProtocolError):
    """The first frame is neither a draft HELLO ('H') nor a released HELLO (0)."""


class FrameTooLargeError(ConnectorProtocolError):
    """A length prefix announces more bytes than the configured maximum frame size."""


class MalformedFrameError(ConnectorProtocolError):
    """A frame body that does not match its layout (or carries an invalid value)."""


class UnknownTagError(ConnectorProtocolError):
    """A frame tag that the dialect does not define."""


class HandshakeError(ConnectorProtocolError):
    """The HELLO frame was well formed but cannot be accepted."""


class VersionMismatchError(HandshakeError):
    """The HELLO version string is not exactly the one this side speaks."""


class BadCookieError(HandshakeError):
    """The HELLO cookie is not exactly the configured one."""


class UnexpectedFrameError(ConnectorProtocolError):
    """A frame that the connection or stream state table does not allow in the current state."""


class UnknownStreamError(UnexpectedFrameError):
    """A frame for a stream id that no NOTIFY introduced in this session."""


class StreamClosedError(UnexpectedFrameError):
    """A MESSAGE or EOS for a stream that has ended (and was not re-introduced)."""


class CreditExhaustedError(ConnectorProtocolError):
    """The connector sent a NOTIFY or MESSAGE while holding no credit."""


class TooManyStreamsError(ConnectorProtocolError):
    """The connector introduced more distinct streams than this connection keeps state for."""


class LocalProtocolError(TqError):
    """Our own side asked the codec or a state machine for something the protocol forbids.

    This is a bug in the caller (the endpoint or the client library), never the peer's fault, so
    it is deliberately not a `ProtocolError`: catching peer errors must not swallow it.
    """


class NoCreditError(LocalProtocolError):
    """The source tried to send a NOTIFY or MESSAGE without credit; wait for an ACK."""
