"""The connector endpoint over TLS on a real `tq up` (DESIGN §12): `tq ingest --tls-ca` feeds
a topic through it; a client that does not speak TLS gets nowhere; an endpoint bound beyond
loopback without TLS needs --insecure."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from querylib.connector import Connector, ConnectorError
from tests.conftest import free_port
from tests.coordinator._cluster import ROOT, tq_env
from tests.integration._up_endpoints import UpWithEndpoints

trustme = pytest.importorskip("trustme")
pytestmark = pytest.mark.timeout(180)


def _certificates(folder: Path) -> tuple[Path, Path, Path]:
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1", "localhost")
    paths = folder / "cert.pem", folder / "key.pem", folder / "ca.pem"
    cert.private_key_and_cert_chain_pem.write_to_path(str(paths[0]))
    cert.private_key_pem.write_to_path(str(paths[1]))
    ca.cert_pem.write_to_path(str(paths[2]))
    return paths


def test_ingest_over_tls(tmp_path: Path) -> None:
    cert, key, ca = _certificates(tmp_path)
    with UpWithEndpoints(tmp_path / "home", "--connector-port", str(free_port()),
                         "--kafka-port", "-1", "--connector-tls-cert", str(cert),
                         "--connector-tls-key", str(key)) as up:
        lines = [f"reading {i}" for i in range(200)]
        done = up.tq("ingest", "secured", "-", "--instance", "tls", "--tls-ca", str(ca),
                     stdin="\n".join(lines))
        assert done.returncode == 0, done.stderr
        assert up.read("secured") == [(None, line.encode()) for line in lines]
        # Without TLS the endpoint's handshake never completes: the client gives up.
        with pytest.raises(ConnectorError):
            Connector(up.info["connector"], timeout=2, reconnect_timeout=2).close()


def test_binding_beyond_loopback_without_tls_needs_insecure(tmp_path: Path) -> None:
    import subprocess

    done = subprocess.run(
        [sys.executable, "-m", "querylib.cli", "up", "--data", str(tmp_path / "data"),
         "--listen", f"tcp://127.0.0.1:{free_port()}", "--connector-host", "0.0.0.0",
         "--connector-port", str(free_port()), "--kafka-port", "-1"],
        capture_output=True, text=True, timeout=60, env=tq_env(tmp_path / "home"), cwd=ROOT)
    assert done.returncode == 2, done.stderr
    assert "--insecure" in done.stderr and "--connector-tls-cert" in done.stderr
