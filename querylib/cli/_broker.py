"""`tq broker`: run a standalone broker in the foreground (development, tests), optionally
with its connector endpoint (`--connector-port`) and Kafka listener (`--kafka-port`); and
`tq broker decommission ID [--force]`, an admin's request to the coordinator to move every
replica off a cluster's broker and retire it (DESIGN §5 "Decommissioning a broker").

A thin adapter over `querylib.broker.run_broker`; also home of the options every broker client
command shares (`--broker`, `--secret-file`) and of the endpoint options `tq executor` and
`tq up` share (`add_connector_options`, `add_kafka_options` and their `*_config`).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from querylib._argtypes import integer, port_or_none, seconds

if TYPE_CHECKING:
    from querylib.kafka import ListenerLimits
    from querylib.server.connector import EndpointConfig


def register(sub: argparse._SubParsersAction) -> None:
    broker = sub.add_parser("broker", help="run a standalone broker (development, tests); "
                            "decommission a cluster's broker")
    broker.add_argument("--data", help="data directory holding the partitions (required to "
                        "run one)")
    broker.add_argument("--listen", default="tcp://127.0.0.1:7500",
                        help="ZeroMQ endpoint to bind (default tcp://127.0.0.1:7500)")
    broker.add_argument("--secret-file", help="cluster secret (default $TQ_HOME/secret, "
                        "created if missing)")
    broker.add_argument("--flush", choices=["never", "interval", "always"], default="never",
                        help="when appends are fsynced before they are acknowledged "
                        "(default never: the OS writes back, as Kafka's default)")
    broker.add_argument("--flush-interval-ms", type=integer(0), default=1000,
                        help="with --flush interval: fsync at most this long after an append")
    broker.add_argument("--segment-bytes", type=int, default=1024 * 1024 * 1024,
                        help="roll a segment at this size (default 1 GiB)")
    broker.add_argument("--retention-bytes", type=integer(-1, 2**63 - 1), default=-1,
                        help="keep at most this many bytes per partition (-1: no limit)")
    add_connector_options(broker, default_port=None)
    add_kafka_options(broker, default_port=None)
    broker.set_defaults(func=_run)
    commands = broker.add_subparsers(dest="broker_command", metavar="ACTION")
    decommission = commands.add_parser(
        "decommission", help="move every replica off a broker gone for good and retire it "
        "(admins)",
        description="Move each replica broker ID holds to a live broker of an executor host "
        "holding none of that partition (the new replica fetches from the leader and joins "
        "the in-sync replicas once caught up), electing a leader from the other in-sync "
        "replicas where ID led. Once ID holds nothing it is retired: placement never uses "
        "it and its id never registers again. Partitions that cannot move are listed with "
        "why (exit code 1).")
    decommission.add_argument("broker_id", type=integer(1), metavar="ID",
                              help="the broker's id (tq topic describe, tq catalog homes)")
    decommission.add_argument("--force", action="store_true",
                              help="decommission a broker that is up: drain it (its "
                              "replicas move, it takes no new ones)")
    decommission.add_argument("--json", action="store_true",
                              help="what moved and what could not, as one JSON object")
    from querylib.cli._catalog import add_cluster_options

    add_cluster_options(decommission)
    decommission.set_defaults(func=_decommission)


def _decommission(args: argparse.Namespace) -> int:
    import json

    import msgspec

    from querylib.cli._catalog import connect

    with connect(args, session=True) as cluster:
        done = cluster.decommission_broker(args.broker_id, force=args.force)
    if args.json:
        print(json.dumps(msgspec.to_builtins(done)))
        return 0 if done.retired else 1
    for move in done.moved:
        print(f"{move.topic}-{move.partition}: moved to broker {move.to}")
    for stuck in done.stuck:
        print(f"{stuck.topic}-{stuck.partition}: stays on broker {done.broker_id}: "
              f"{stuck.reason}")
    moved = f"{len(done.moved)} replica{'s' * (len(done.moved) != 1)} moved"
    if done.retired:
        print(f"broker {done.broker_id} decommissioned ({moved}): it is retired, nothing "
              "is placed on it again; the new replicas catch up from their leaders",
              file=sys.stderr)
        return 0
    print(f"broker {done.broker_id} not retired ({moved}, {len(done.stuck)} could not): "
          "run this again once they can", file=sys.stderr)
    return 1


def add_connector_options(parser: argparse.ArgumentParser, *, default_port: int | None) -> None:
    """The connector endpoint's options; `default_port` None: no endpoint unless asked."""
    shown = "none" if default_port is None else str(default_port)
    parser.add_argument("--connector-port", type=port_or_none, default=default_port, metavar="PORT",
                        help="open the connector endpoint (external sources push streams) on "
                        f"this TCP port; 0: any free port, -1: none (default {shown})")
    parser.add_argument("--connector-host", default="127.0.0.1", metavar="HOST",
                        help="address the connector endpoint binds (default 127.0.0.1)")
    parser.add_argument("--connector-cookie", metavar="COOKIE",
                        help="cookie connectors must present (default: derived from the "
                        "cluster secret, as `tq ingest` derives it)")
    parser.add_argument("--connector-credits", type=integer(1), default=1024, metavar="K",
                        help="frames a connector connection may have unacknowledged "
                        "(default 1024)")
    add_tls_options(parser, "--connector-tls", "the connector endpoint")
    add_insecure(parser)


def add_kafka_options(parser: argparse.ArgumentParser, *, default_port: int | None) -> None:
    """The Kafka listener's options; `default_port` None: no listener unless asked."""
    shown = "none" if default_port is None else str(default_port)
    parser.add_argument("--kafka-port", type=port_or_none, default=default_port, metavar="PORT",
                        help="open a Kafka-protocol listener (kcat, confluent-kafka, ...) on this "
                        f"TCP port; 0: any free port, -1: none (default {shown})")
    parser.add_argument("--kafka-host", default="127.0.0.1", metavar="HOST",
                        help="address the Kafka listener binds (default 127.0.0.1)")
    parser.add_argument("--advertised-host", metavar="HOST",
                        help="host name Kafka clients are told to connect to (default: "
                        "--kafka-host, or 127.0.0.1 for a wildcard)")
    parser.add_argument("--kafka-sasl", nargs="?", const=",".join(SASL_MECHANISMS),
                        metavar="MECHANISMS",
                        help="Kafka clients must authenticate with SASL as tq users (`tq user "
                        "add`): PLAIN, SCRAM-SHA-256, SCRAM-SHA-512 (default all three; "
                        "comma-separated to choose)")
    add_tls_options(parser, "--kafka-tls",
                     "the Kafka listener (SSL, or SASL_SSL with --kafka-sasl)")
    add_insecure(parser)
    add_kafka_limit_options(parser)
    parser.add_argument("--kafka-auto-create-topics", action=argparse.BooleanOptionalAction,
                        default=True,
                        help="create a topic a Kafka client asks Metadata for or produces to "
                        "when it does not exist (Kafka's auto.create.topics.enable; default on; "
                        "clients may still decline with allow.auto.create.topics=false)")
    parser.add_argument("--kafka-group-initial-delay-ms", type=integer(0), default=3000,
                        metavar="MS",
                        help="a new consumer group's first assignment waits this long for more "
                        "members, again as each joins, up to the rebalance timeout (Kafka's "
                        "group.initial.rebalance.delay.ms; default 3000)")


SASL_MECHANISMS = ("PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512")


def add_tls_options(parser: argparse.ArgumentParser, flag: str, what: str) -> None:
    parser.add_argument(f"{flag}-cert", metavar="FILE",
                        help=f"speak TLS on {what} with this certificate chain (PEM; with "
                        f"{flag}-key)")
    parser.add_argument(f"{flag}-key", metavar="FILE", help=f"the private key of {flag}-cert "
                        "(PEM)")


def add_insecure(parser: argparse.ArgumentParser) -> None:
    if any("--insecure" in action.option_strings for action in parser._actions):
        return
    parser.add_argument("--insecure", action="store_true",
                        help="let a listener bound to an address other than loopback take "
                        "clients it cannot authenticate (Kafka without --kafka-sasl) or "
                        "whose secrets travel in clear (the connector or the console without "
                        "TLS)")


def _loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from elsewhere


def server_tls(cert: str | None, key: str | None, flag: str) -> object | None:
    """A TLS server context from a certificate chain and key (None: no TLS)."""
    if cert is None and key is None:
        return None
    from catalog.errors import UserError

    if cert is None or key is None:
        raise UserError(f"{flag}-cert and {flag}-key go together")
    import ssl

    context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    try:
        context.load_cert_chain(cert, key)
    except (OSError, ssl.SSLError) as exc:
        raise UserError(f"{flag}-cert/{flag}-key: cannot load them: {exc}") from None
    return context


def exposed(host: str, insecure: bool, flag: str, needs: str) -> None:
    """Refuse an unprotected listener on an address others reach, unless --insecure."""
    if not _loopback(host) and not insecure:
        from catalog.errors import UserError

        raise UserError(f"{flag} {host} is reachable from other hosts: {needs}, or accept the "
                        "risk with --insecure")


def add_kafka_limit_options(parser: argparse.ArgumentParser) -> None:
    """Bounds on what Kafka clients may hold (querylib.kafka.ListenerLimits)."""
    parser.add_argument("--kafka-idle-ms", type=integer(1), default=600_000, metavar="MS",
                        help="close a Kafka connection idle this long (Kafka's "
                        "connections.max.idle.ms; default 600000, 10 minutes)")
    parser.add_argument("--kafka-max-connections", type=integer(1), metavar="N",
                        help="Kafka connections held at once (default: what the open-files "
                        "limit allows, minus a reserve)")
    parser.add_argument("--kafka-max-connections-per-ip", type=integer(1), metavar="N",
                        help="Kafka connections from one client address (default: no "
                        "separate limit)")


def kafka_limits(args: argparse.Namespace, **more: int) -> ListenerLimits:
    """The ListenerLimits the Kafka limit options ask for (UserError for a bad value)."""
    from catalog.errors import UserError
    from querylib.kafka import ListenerLimits

    try:
        return ListenerLimits(idle_timeout_ms=args.kafka_idle_ms,
                              max_connections=args.kafka_max_connections,
                              max_connections_per_address=args.kafka_max_connections_per_ip,
                              **more)
    except ValueError as exc:
        raise UserError(str(exc).replace("ListenerLimits.", "Kafka listener: ")) from exc


def kafka_config(args: argparse.Namespace) -> object | None:
    """The KafkaConfig the Kafka options ask for; None when there is to be no listener."""
    if args.kafka_port is None or args.kafka_port < 0:
        return None
    from catalog.errors import UserError
    from querylib.server.kafka import KafkaConfig

    sasl = tuple(m.strip().upper() for m in (args.kafka_sasl or "").split(",") if m.strip())
    unknown = sorted(set(sasl) - set(SASL_MECHANISMS))
    if unknown:
        raise UserError(f"--kafka-sasl {','.join(unknown)}: tq offers "
                        f"{', '.join(SASL_MECHANISMS)}")
    if not sasl:
        exposed(args.kafka_host, args.insecure, "--kafka-host",
                 "require authentication with --kafka-sasl (and TLS with --kafka-tls-cert)")
    from querylib.server.kafka import GroupConfig

    return KafkaConfig(host=args.kafka_host, port=args.kafka_port,
                       advertised_host=args.advertised_host,
                       auto_create_topics=args.kafka_auto_create_topics,
                       group_config=GroupConfig(
                           initial_rebalance_delay_ms=args.kafka_group_initial_delay_ms),
                       limits=kafka_limits(args),
                       sasl=sasl, ssl_context=server_tls(args.kafka_tls_cert,
                                                         args.kafka_tls_key, "--kafka-tls"))


def connector_config(args: argparse.Namespace) -> EndpointConfig | None:
    """The EndpointConfig the connector options ask for; None when there is to be none."""
    if args.connector_port is None or args.connector_port < 0:
        return None
    from querylib.server.connector import EndpointConfig

    tls = server_tls(args.connector_tls_cert, args.connector_tls_key, "--connector-tls")
    if tls is None:
        exposed(args.connector_host, args.insecure, "--connector-host",
                 "its cookie would travel in clear: speak TLS with --connector-tls-cert")
    return EndpointConfig(host=args.connector_host, port=args.connector_port,
                          cookie=args.connector_cookie, initial_credits=args.connector_credits,
                          ssl_context=tls)


def add_client_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--broker", required=True, metavar="ADDR",
                        help="the broker's endpoint, e.g. tcp://127.0.0.1:7500")
    parser.add_argument("--credentials", "--secret-file", dest="secret_file", metavar="FILE",
                        help="who you are: a credential file from `tq user add`, or the cluster "
                        "secret (default $TQ_CREDENTIALS, else $TQ_HOME/secret)")
    parser.add_argument("--timeout", type=seconds, default=30.0,
                        help="seconds to wait for the broker (default 30)")


def client_secret(args: argparse.Namespace) -> Any:
    """The credential a client of one broker signs with (querylib.rpc.Credential)."""
    import os

    from querylib.rpc import default_secret_path, load_credential

    return load_credential(args.secret_file or os.environ.get("TQ_CREDENTIALS")
                           or default_secret_path())


def _run(args: argparse.Namespace) -> int:
    from querylib._tcp import raise_fd_limit
    from querylib.log import LogConfig
    from querylib.rpc import default_secret_path, load_or_create_secret
    from querylib.server import run_broker

    if args.data is None:
        from catalog.errors import UserError

        raise UserError("tq broker: --data DIR is required to run a standalone broker")
    raise_fd_limit()
    secret = load_or_create_secret(args.secret_file or default_secret_path())
    config = LogConfig(segment_bytes=args.segment_bytes, retention_bytes=args.retention_bytes,
                       flush=args.flush, flush_interval_ms=args.flush_interval_ms)

    def ready(endpoint: str) -> None:
        print(f"tq broker listening on {endpoint} (data {args.data}, flush {args.flush})",
              file=sys.stderr, flush=True)

    def endpoints(opened: object) -> None:
        for what, attr in (("connector endpoint", "connector_address"),
                           ("Kafka listener", "kafka_address")):
            address = getattr(opened, attr, None)
            if address is not None:
                print(f"tq broker: {what} on {address}", file=sys.stderr, flush=True)

    return run_broker(args.data, args.listen, secret, log_config=config, on_ready=ready,
                      connector=connector_config(args),
                      kafka=kafka_config(args), on_endpoints=endpoints)
