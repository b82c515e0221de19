"""RPC over ZeroMQ: typed msgspec messages, MAC-signed frames, many requests in flight.

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

from querylib._lazy import lazy_exports as _lazy_exports

# Names are loaded on first use (PEP 562): a client (every query process, on its way to
# registering) needs the codec, the messages and RpcClient, not RpcServer. Every name
# below is still a public export.
_EXPORTS = {
    "MAX_TTL": "_codec",
    "AddressError": "_errors",
    "BadSignatureError": "_errors",
    "BlockingClient": "_blocking",
    "ClientClosedError": "_errors",
    "Codec": "_codec",
    "Context": "_server",
    "DeadlineExceededError": "_errors",
    "ErrorBody": "_messages",
    "Handler": "_server",
    "Header": "_messages",
    "Incoming": "_codec",
    "InternalServerError": "_errors",
    "Kind": "_messages",
    "Limits": "_codec",
    "MalformedMessageError": "_errors",
    "Message": "_messages",
    "MessageTooLargeError": "_errors",
    "Notification": "_client",
    "Notify": "_messages",
    "PeerBusyError": "_errors",
    "PeerUnreachableError": "_errors",
    "Ping": "_messages",
    "Pong": "_messages",
    "RemoteError": "_errors",
    "ReplayGuard": "_codec",
    "ReplayedMessageError": "_errors",
    "Reply": "_messages",
    "Request": "_messages",
    "RequestTracker": "_tracker",
    "RpcClient": "_client",
    "RpcError": "_errors",
    "RpcProtocolError": "_errors",
    "RpcServer": "_server",
    "SecretFileError": "_errors",
    "SecretRejectedError": "_errors",
    "ServerBusyError": "_errors",
    "Signer": "_codec",
    "UnexpectedReplyError": "_errors",
    "UnknownMessageTypeError": "_errors",
    "UnsupportedRequestError": "_errors",
    "default_secret_path": "_secret",
    "error_body": "_errors",
    "error_from_body": "_errors",
    "load_or_create_secret": "_secret",
    "load_secret": "_secret",
    "message_type": "_messages",
}

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


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
