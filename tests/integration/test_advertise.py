"""Advertised addresses (DESIGN §6 "Advertised addresses"), on loopback: a broker bound to
0.0.0.0 registers an address others can connect to, never the wildcard: the address this host
reaches the coordinator from by default, `--advertise HOST` when given (its Kafka listener
too, in Kafka Metadata); `tq up --advertise` does it for its executor's brokers. A wildcard
bind with no address to find is one clear line. (Across hosts: test_multihost_join.py.)"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from confluent_kafka.admin import AdminClient

from catalog import Broker
from tests.conftest import Processes, free_port, wait_for
from tests.coordinator._cluster import ROOT, tq_env
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(180)


def _brokers(up: Up) -> dict[str, Broker]:
    """The registered brokers by address, the coordinator's catalog broker left out."""
    with up.cluster() as cluster:
        records = cluster.snapshot("brokers")["brokers"].records
    return {b.address: b for b, _ in records
            if isinstance(b, Broker) and b.address != up.info["catalog_broker"]}


def _executor(processes: Processes, up: Up, tmp_path: Path, name: str,
              *args: str) -> subprocess.Popen:
    credential = tmp_path / f"{name}.cred"
    made = up.tq("user", "add", name, "--role", "executor", "-o", str(credential))
    assert made.returncode == 0, made.stderr
    return processes.python(
        "-m", "querylib.cli", "executor", "--coordinator", up.info["coordinator"],
        "--credentials", str(credential), "--data", str(tmp_path / name), "--host", name,
        "--slots", "1", "--brokers", "1", *args, env=tq_env(tmp_path / f"home-{name}"),
        cwd=ROOT, stderr=subprocess.DEVNULL)


def test_a_wildcard_broker_registers_the_address_towards_the_coordinator(
        processes: Processes, tmp_path: Path) -> None:
    with Up(tmp_path / "home") as up:
        before = set(_brokers(up))
        _executor(processes, up, tmp_path, "host-w", "--broker-listen", "tcp://0.0.0.0:0")
        (new,) = wait_for(lambda: set(_brokers(up)) - before, timeout=60, interval=0.2,
                          what="the executor's broker to register")
        assert new.startswith("tcp://127.0.0.1:"), new  # the coordinator is on 127.0.0.1


def test_advertise_names_the_broker_and_kafka_addresses(processes: Processes,
                                                        tmp_path: Path) -> None:
    with Up(tmp_path / "home") as up:
        before = set(_brokers(up))
        kafka_port = free_port()
        _executor(processes, up, tmp_path, "host-v", "--broker-listen", "tcp://0.0.0.0:0",
                  "--advertise", "127.0.0.3", "--kafka-host", "0.0.0.0", "--kafka-port",
                  str(kafka_port), "--insecure")
        (new,) = wait_for(lambda: set(_brokers(up)) - before, timeout=60, interval=0.2,
                          what="the executor's broker to register")
        assert new.startswith("tcp://127.0.0.3:"), new
        assert _brokers(up)[new].kafka_address == f"127.0.0.3:{kafka_port}"
        # Kafka clients are told the advertised host in Metadata.
        metadata = AdminClient({"bootstrap.servers": f"127.0.0.1:{kafka_port}"}).list_topics(
            timeout=30)
        hosts = {b.host for b in metadata.brokers.values()}
        assert "127.0.0.3" in hosts and "0.0.0.0" not in hosts, hosts


def test_tq_up_advertise(tmp_path: Path) -> None:
    with Up(tmp_path / "home", "--advertise", "127.0.0.2", "--brokers", "2") as up:
        addresses = set(_brokers(up))
        assert len(addresses) == 2, addresses  # broker 0 and its shard
        assert all(a.startswith("tcp://127.0.0.2:") for a in addresses), addresses
        with up.connect() as ctx:  # clients reach them there
            with ctx.publish("advertised", serde="json") as out:
                out.send(0, [7])
        read = up.tq("consume", "advertised")
        assert read.returncode == 0 and read.stdout.split() == ["7"], read


def test_a_wildcard_bind_with_no_address_to_find_is_one_line(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"x" * 32)
    secret.chmod(0o600)
    done = subprocess.run(
        [sys.executable, "-m", "querylib.cli", "executor", "--coordinator",
         "tcp://no-such-host.invalid:7400", "--credentials", str(secret), "--data",
         str(tmp_path / "data"), "--broker-listen", "tcp://0.0.0.0:0"],
        env=tq_env(tmp_path / "home"), cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2, done.stderr
    assert "--advertise HOST" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert not (tmp_path / "data" / "broker").exists()
