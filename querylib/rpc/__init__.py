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

from __future__ import annotations

from typing import TYPE_CHECKING

from querylib._lazy import lazy_exports

# Names are loaded on first use (PEP 562, querylib/_lazy.py): a query process imports only
# what it touches.
if TYPE_CHECKING:
    from ._blocking import BlockingClient
    from ._client import Notification, RpcClient
    from ._codec import MAX_TTL, Codec, Incoming, Limits, ReplayGuard
    from ._credentials import (
        BROKER,
        COORDINATOR,
        Credential,
        CredentialFile,
        Keyring,
        MasterKeyring,
        RemoteKeyring,
        audience_key,
        handshake_token,
        kafka_password,
        load_credential,
        principal_key,
        seal,
        unseal,
        write_credential,
    )
    from ._curve import (
        CURVE_ENV,
        client_keypair,
        coordinator_public_key,
        curve_forced,
        curve_public,
        leaves_host,
        remember_server_key,
        server_key_of,
        server_keypair,
    )
    from ._errors import (
        AddressError,
        BadSignatureError,
        ClientClosedError,
        ConnectionLostError,
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
        UnknownPrincipalKeyError,
        UnsupportedRequestError,
        error_body,
        error_from_body,
    )
    from ._messages import (
        Entry,
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
    from ._signer import Signer, payload_digest
    from ._stats import LATENCY_BUCKETS, RequestStats, TypeStats
    from ._tracker import RequestTracker

if not TYPE_CHECKING:  # a type checker reads the imports above, not this
    __getattr__, __dir__, __all__ = lazy_exports(__name__, globals())
