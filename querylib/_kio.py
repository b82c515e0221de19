"""What kio raises for bytes it cannot read: the one list every Kafka codec edge catches.

kio's readers raise SerialError for most bad input, ValueError for a negative array length or
bad UTF-8, KeyError for a tagged field they do not know (Kafka would skip it; the clients tested
send only the tags of Kafka's schemas, which kio knows), OverflowError and IndexError for
numbers and offsets out of range. Each edge that decodes with kio (the listener's requests,
`__consumer_offsets` records, the consumer protocol's subscriptions and assignments, a client's
responses) catches exactly these and raises its own TqError `from` them; anything else kio
raises is a bug to see, not bytes to refuse. Light: imports only kio's error types, so clients
may use it without loading a server.
"""

from __future__ import annotations

from kio.serial.errors import SerialError

__all__ = ["KIO_DECODE_ERRORS"]

KIO_DECODE_ERRORS: tuple[type[Exception], ...] = (
    SerialError, ValueError, OverflowError, KeyError, IndexError)
