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
see `querylib.rpc._codec`; principals, their keys and keyrings: `querylib.rpc._credentials`.
"""

from querylib._lazy import lazy_exports as _lazy_exports

# Names are loaded on first use (PEP 562): a client (every query process, on its way to
# registering) needs the codec, the messages and RpcClient, not RpcServer. Every name
# below is still a public export.
_EXPORTS = {
    "BROKER": "_credentials",
    "COORDINATOR": "_credentials",
    "MAX_TTL": "_codec",
    "AddressError": "_errors",
    "BadSignatureError": "_errors",
    "BlockingClient": "_blocking",
    "ClientClosedError": "_errors",
    "Codec": "_codec",
    "Context": "_server",
    "Credential": "_credentials",
    "DeadlineExceededError": "_errors",
    "ErrorBody": "_messages",
    "Handler": "_server",
    "Header": "_messages",
    "Incoming": "_codec",
    "InternalServerError": "_errors",
    "Keyring": "_credentials",
    "Kind": "_messages",
    "Limits": "_codec",
    "MalformedMessageError": "_errors",
    "MasterKeyring": "_credentials",
    "Message": "_messages",
    "MessageTooLargeError": "_errors",
    "Notification": "_client",
    "Notify": "_messages",
    "PeerBusyError": "_errors",
    "PeerUnreachableError": "_errors",
    "Ping": "_messages",
    "Pong": "_messages",
    "RemoteError": "_errors",
    "RemoteKeyring": "_credentials",
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
    "Signer": "_signer",
    "UnexpectedReplyError": "_errors",
    "UnknownMessageTypeError": "_errors",
    "UnknownPrincipalKeyError": "_errors",
    "UnsupportedRequestError": "_errors",
    "audience_key": "_credentials",
    "handshake_token": "_credentials",
    "kafka_password": "_credentials",
    "default_secret_path": "_secret",
    "error_body": "_errors",
    "error_from_body": "_errors",
    "load_credential": "_credentials",
    "load_or_create_secret": "_secret",
    "load_secret": "_secret",
    "message_type": "_messages",
    "principal_key": "_credentials",
    "seal": "_credentials",
    "unseal": "_credentials",
    "write_credential": "_credentials",
}

__all__ = [
    "BROKER",
    "COORDINATOR",
    "MAX_TTL",
    "AddressError",
    "BadSignatureError",
    "BlockingClient",
    "ClientClosedError",
    "Codec",
    "Context",
    "Credential",
    "DeadlineExceededError",
    "ErrorBody",
    "Handler",
    "Header",
    "Incoming",
    "InternalServerError",
    "Keyring",
    "Kind",
    "Limits",
    "MalformedMessageError",
    "MasterKeyring",
    "Message",
    "MessageTooLargeError",
    "Notification",
    "Notify",
    "PeerBusyError",
    "PeerUnreachableError",
    "Ping",
    "Pong",
    "RemoteError",
    "RemoteKeyring",
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
    "UnknownPrincipalKeyError",
    "UnsupportedRequestError",
    "audience_key",
    "handshake_token",
    "kafka_password",
    "default_secret_path",
    "error_body",
    "error_from_body",
    "load_credential",
    "load_or_create_secret",
    "load_secret",
    "message_type",
    "principal_key",
    "seal",
    "unseal",
    "write_credential",
]


__getattr__, __dir__ = _lazy_exports(__name__, _EXPORTS, globals())
