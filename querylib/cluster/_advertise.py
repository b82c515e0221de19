"""Advertised addresses (DESIGN §6 "Advertised addresses"): what a server bound to a wildcard
(0.0.0.0) registers in the catalog for other hosts to connect to, never the wildcard itself.

    advertised_host("0.0.0.0", advertise=None, toward="tcp://10.0.0.1:7400")  -> "10.0.0.2"
    advertise_endpoint("tcp://0.0.0.0:7501", "10.0.0.2")                     -> "tcp://10.0.0.2:7501"

The default is the address this host reaches the coordinator from, as the routing table says:
the one address every other host that reaches the coordinator can most likely reach too.

Must not: keep sockets open (finding the route sends nothing).
"""

from __future__ import annotations

import ipaddress
import socket

from ._errors import AdvertiseError

__all__ = ["AdvertiseError", "advertise_endpoint", "advertised_host", "is_wildcard",
           "local_address_toward"]

WILDCARDS = ("0.0.0.0", "::", "*", "")


def is_wildcard(host: str) -> bool:
    return host.strip("[]") in WILDCARDS


def _host_port(endpoint: str) -> tuple[str, str]:
    host, _, port = endpoint.removeprefix("tcp://").rpartition(":")
    return host.strip("[]"), port


def local_address_toward(endpoint: str) -> str | None:
    """The address this host uses to reach `endpoint` (tcp://HOST:PORT); None when HOST does
    not resolve or no route leads there. A UDP socket's connect sends nothing: it only asks
    the kernel which source address it would use."""
    host, port = _host_port(endpoint)
    try:
        family, kind, proto, _, address = socket.getaddrinfo(
            host, int(port), type=socket.SOCK_DGRAM)[0]
        with socket.socket(family, kind, proto) as probe:
            probe.connect(address)
            found = str(probe.getsockname()[0])
    except (OSError, ValueError, IndexError):
        return None
    return None if ipaddress.ip_address(found).is_unspecified else found


def advertised_host(bound: str, *, advertise: str | None = None,
                    toward: str | None = None, flag: str = "--advertise") -> str:
    """The host to register for a server bound to `bound`: `advertise` when given, the bound
    host when it is no wildcard, else this host's address towards `toward` (AdvertiseError
    when there is none)."""
    if advertise:
        return advertise
    if not is_wildcard(bound):
        return bound
    found = local_address_toward(toward) if toward else None
    if found is None:
        raise AdvertiseError(
            f"listening on {bound or '0.0.0.0'}, but no address of this host leads to "
            f"{toward or 'the coordinator'} to tell other hosts: give {flag} HOST (this "
            "host's address that the others reach)")
    return found


def advertise_endpoint(endpoint: str, host: str) -> str:
    """`endpoint` (tcp://HOST:PORT) with HOST replaced by `host`."""
    _, port = _host_port(endpoint)
    shown = f"[{host}]" if ":" in host else host
    return f"tcp://{shown}:{port}"
