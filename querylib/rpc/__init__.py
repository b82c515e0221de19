"""RPC over ZeroMQ: typed msgspec messages, HMAC-signed frames, many requests in flight.

Servers bind a ROUTER (`RpcServer`), clients connect a DEALER (`RpcClient`, or
`BlockingClient` from threads and scripts). Declare messages as structs:

    class EchoReply(Reply, tag="demo.echo.reply"):
        text: str

    class Echo(Request[EchoReply], tag="demo.echo"):
        text: str

    server.register(Echo, handle_echo)          # async def handle_echo(req, ctx) -> EchoReply
    reply = await client.request(Echo("hi"), timeout=5)

The sans-I/O core (`Codec`, `Signer`, `ReplayGuard`, `RequestTracker`) holds all the logic and
is usable without sockets; the shells only move frames. Wire format and replay guard:
see `querylib.rpc._codec`.
"""

from ._blocking import BlockingClient
from ._client import Notification, RpcClient
from ._codec import MAX_TTL, Codec, Incoming, Limits, ReplayGuard, Signer
from ._errors import (
    AddressError,
    BadSignatureError,
    ClientClosedError,
    DeadlineExceededError,
    InternalServerError,
    MalformedMessageError,
    MessageTooLargeError,
    PeerBusyError,
    PeerUnreachableError,
    RemoteError,
    ReplayedMessageError,
    RpcError,
    RpcProtocolError,
    SecretFileError,
    SecretRejectedError,
    ServerBusyError,
    UnexpectedReplyError,
    UnknownMessageTypeError,
    UnsupportedRequestError,
    error_body,
    error_from_body,
)
from ._messages import (
    ErrorBody,
    Header,
    Kind,
    Message,
    Notify,
    Ping,
    Pong,
    Reply,
    Request,
    message_type,
)
from ._secret import default_secret_path, load_or_create_secret, load_secret
from ._server import Context, Handler, RpcServer
from ._tracker import RequestTracker

__all__ = [
    "MAX_TTL",
    "AddressError",
    "BadSignatureError",
    "BlockingClient",
    "ClientClosedError",
    "Codec",
    "Context",
    "DeadlineExceededError",
    "ErrorBody",
    "Handler",
    "Header",
    "Incoming",
    "InternalServerError",
    "Kind",
    "Limits",
    "MalformedMessageError",
    "Message",
    "MessageTooLargeError",
    "Notification",
    "Notify",
    "PeerBusyError",
    "PeerUnreachableError",
    "Ping",
    "Pong",
    "RemoteError",
    "ReplayGuard",
    "ReplayedMessageError",
    "Reply",
    "Request",
    "RequestTracker",
    "RpcClient",
    "RpcError",
    "RpcProtocolError",
    "RpcServer",
    "SecretFileError",
    "SecretRejectedError",
    "ServerBusyError",
    "Signer",
    "UnexpectedReplyError",
    "UnknownMessageTypeError",
    "UnsupportedRequestError",
    "default_secret_path",
    "error_body",
    "error_from_body",
    "load_or_create_secret",
    "load_secret",
    "message_type",
]
