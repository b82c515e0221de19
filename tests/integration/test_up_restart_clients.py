"""`tq up` restarted (SIGTERM, or SIGKILL) under a running publisher process and a running
subscriber process (plain `querylib.connect()` scripts): both carry on by themselves, and the
subscriber reads every record exactly once, in order, then end of stream once (DESIGN §5,
§5 "Restarts").

The publisher sends the integers 0, 1, 2, ... (ten per logical time, waiting for the
acknowledgements every 50 times, so many requests are in flight when tq up goes down) until
the test asks it to stop, then closes (end of stream) and says how many
it sent. The subscriber writes what it reads as lines, then `eos` at end of stream; the
partition's log must hold exactly one end-of-stream marker, at its end."""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import textwrap
from pathlib import Path

import pytest

from querylib.records import ControlType, control_of, decode_batch, read_header
from tests.conftest import Processes, partition_dir, wait_for
from tests.coordinator._cluster import ROOT, tq_env
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(300)

PUBLISHER = textwrap.dedent('''
    import sys
    from pathlib import Path
    import querylib

    stop, sent = Path(sys.argv[1]), Path(sys.argv[2])
    with querylib.connect() as ctx:
        out = ctx.publish("restarts")
        step = 0
        while not stop.exists() and step < 20_000:
            out.send(step, range(step * 10, step * 10 + 10))
            out.advance_to(step + 1)
            step += 1
            if step % 50 == 0:  # batches and advances of 50 steps in flight at a time
                out.flush()
                sent.write_text(str(step * 10))
        out.close()
    sent.write_text(f"{step * 10} closed")
''')

SUBSCRIBER = textwrap.dedent('''
    import sys
    import querylib

    with open(sys.argv[1], "w") as seen, querylib.connect() as ctx:
        sub = ctx.subscribe("restarts", timeout=60)
        for event in sub:
            if isinstance(event, querylib.Data):
                seen.write("".join(f"{v}\\n" for v in event.records))
                seen.flush()
            elif isinstance(event, querylib.EndOfStream):
                seen.write("eos\\n")
        sub.close()
''')


def _lines(path: Path) -> list[str]:
    try:
        text = path.read_text()
    except FileNotFoundError:
        return []
    return text.splitlines()[:-1] if not text.endswith("\n") else text.splitlines()


def _sent(path: Path) -> int:
    try:
        return int(path.read_text().split()[0] or 0)
    except (FileNotFoundError, ValueError, IndexError):
        return 0


def _start_up(home: Path, listen: str | None) -> Up:
    # Endpoints on any free port: each remembered across the restart like the broker's.
    extra = ["--connector-port", "0", "--kafka-port", "0"]
    if listen is not None:
        extra += ["--listen", listen]
    return Up(home, *extra, slots=1)


def _kill(up: Up) -> None:
    os.killpg(up.proc.pid, signal.SIGKILL)
    up.stop()  # reaps it, reads its stderr
    (up.home / "cluster.json").unlink(missing_ok=True)  # a crashed tq up leaves it behind


def _bound(sock: socket.socket, port: int) -> bool:
    try:
        sock.bind(("127.0.0.1", port))
    except OSError as exc:
        if exc.errno != errno.EADDRINUSE:
            raise
        return False
    return True


def _broker_address(home: Path) -> str:
    """The executor broker's RPC endpoint, as its agent remembers it."""
    return json.loads((home / "executor" / "broker.endpoints").read_text())["broker"]


@pytest.mark.parametrize("fault", ["sigterm", "sigkill", "sigkill-port-taken"])
def test_publisher_and_subscriber_survive_a_restart_of_tq_up(
        processes: Processes, tmp_path: Path, fault: str) -> None:
    """With "port-taken", something else holds the broker's port when tq up comes back: the
    broker listens elsewhere, and both clients find it through the catalog."""
    home = tmp_path / "home"
    squatter = socket.socket()
    (publisher := tmp_path / "publisher.py").write_text(PUBLISHER)
    (subscriber := tmp_path / "subscriber.py").write_text(SUBSCRIBER)
    stop, sent, seen = tmp_path / "stop", tmp_path / "sent", tmp_path / "seen"
    up = _start_up(home, None)
    try:
        env = tq_env(home)
        pub = processes.python(str(publisher), str(stop), str(sent), env=env, cwd=ROOT,
                               stderr=subprocess.PIPE, text=True)
        sub = processes.python(str(subscriber), str(seen), env=env, cwd=ROOT,
                               stderr=subprocess.PIPE, text=True)
        wait_for(lambda: len(_lines(seen)) >= 2000, timeout=60,
                 what="the subscriber reading the first records")
        before, broker = up.info, _broker_address(home)
        if fault == "sigterm":
            up.stop()
            assert not (home / "cluster.json").exists()
        else:
            _kill(up)
        if fault.endswith("port-taken"):
            squatter.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            # The killed broker's process may still be exiting (its listener open while the
            # kernel frees its memory; its clients already reconnecting to it).
            wait_for(lambda: _bound(squatter, int(broker.rpartition(":")[2])), timeout=30,
                     what="the killed broker's port to be free")
            squatter.listen()
        up = _start_up(home, before["coordinator"])
        # The endpoints came back where they were, and so did the broker if it could.
        assert up.info["connector"] == before["connector"]
        assert up.info["kafka"] == before["kafka"]
        assert (_broker_address(home) == broker) != fault.endswith("port-taken")
        # Both carry on: records the publisher sent after the restart reach the subscriber.
        resumed = _sent(sent) + 2000
        try:
            wait_for(lambda: len(_lines(seen)) >= resumed, timeout=120,
                     what=f"the subscriber reading past record {resumed} after the restart")
        except AssertionError as exc:
            raise AssertionError(f"{exc}; read {len(_lines(seen))}, sent {_sent(sent)}\n"
                                 + _what_clients_said(pub, sub)) from None
        stop.write_text("")
        assert pub.wait(timeout=60) == 0, pub.stderr.read()  # type: ignore[union-attr]
        assert sub.wait(timeout=60) == 0, sub.stderr.read()  # type: ignore[union-attr]
        total = _sent(sent)
        assert sent.read_text().endswith("closed")
        lines = _lines(seen)
        assert lines[-1] == "eos", lines[-5:]
        values = [int(v) for v in lines[:-1]]
        # Nothing lost, nothing twice, in order.
        assert len(values) == total, (len(values), total)
        assert values == list(range(total))
    finally:
        err = up.stop()
        squatter.close()
    assert "Traceback" not in err, err
    directory = partition_dir(home / "executor", "restarts-0")
    assert directory is not None
    controls = _controls(directory)
    assert controls[-1:] == ["end"] and controls.count("end") == 1
    assert "reopen" not in controls  # the publisher rejoined its stream, never reopened it


def _what_clients_said(*clients: subprocess.Popen[str]) -> str:
    """The stderr of clients that did not get on (stopped first, so reading it ends)."""
    said = []
    for client in clients:
        if client.poll() is None:
            client.send_signal(signal.SIGTERM)
            try:
                client.wait(timeout=10)
            except subprocess.TimeoutExpired:
                client.kill()
                client.wait()
        said.append(f"pid {client.pid} exit {client.returncode}: "
                    f"{client.stderr.read()[-3000:]}")  # type: ignore[union-attr]
    return "\n".join(said)


_KINDS = {ControlType.END_OF_STREAM: "end", ControlType.REOPEN: "reopen"}


def _controls(partition: Path) -> list[str]:
    """The control batches of a partition's log, in order: "end", "reopen" or "frontier"."""
    kinds = []
    for segment in sorted(partition.glob("*.log")):
        data = segment.read_bytes()
        pos = 0
        while pos < len(data):
            header = read_header(data, pos)
            batch = decode_batch(data[pos:pos + header.size])
            if batch.is_control:
                for record in batch.records:
                    kind, _ = control_of(record)
                    kinds.append(_KINDS.get(kind, "frontier"))
            pos += header.size
    return kinds
