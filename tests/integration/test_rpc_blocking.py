"""The blocking client: from several threads at once, and from a plain script in a child process."""

from __future__ import annotations

import json
import os
import subprocess
import threading
from pathlib import Path

import pytest

from querylib.rpc import (
    BlockingClient,
    ClientClosedError,
    DeadlineExceededError,
    Ping,
    Pong,
    load_or_create_secret,
)
from tests.conftest import Processes, wait_for
from tests.querylib.rpc._support import (
    SECRET,
    Credit,
    Delivery,
    Fetch,
    FetchReply,
    ServerThread,
    ShelfEmptyError,
    Subscribe,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture
def server() -> ServerThread:
    with ServerThread() as running:
        yield running


def test_requests_errors_and_payloads(server: ServerThread) -> None:
    with BlockingClient(server.endpoint, SECRET, timeout=10.0) as client:
        assert client.request(Ping(b"x")) == Pong(b"x")
        reply, payload = client.exchange(Fetch(1), payload=[b"a", b"b" * 100_000])
        assert reply == FetchReply(1) and [bytes(p) for p in payload] == [b"a", b"b" * 100_000]
        with pytest.raises(ShelfEmptyError):
            client.request(Fetch(2, fail="empty"))
        server.run(lambda: server.handlers.gate(3))
        with pytest.raises(DeadlineExceededError):
            client.request(Fetch(3), timeout=0.2)
        assert client.counters == {}
    with pytest.raises(ClientClosedError):
        client.request(Ping())


def test_many_threads_share_one_client(server: ServerThread) -> None:
    errors: list[BaseException] = []
    with BlockingClient(server.endpoint, SECRET, timeout=20.0) as client:
        def worker(index: int) -> None:
            try:
                for n in range(40):
                    token = index * 1000 + n
                    assert client.request(Fetch(token)) == FetchReply(token)
            except BaseException as exc:  # reported below, with the thread's failure
                errors.append(exc)

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        assert not any(thread.is_alive() for thread in threads)
    assert errors == []


def test_notifies_both_ways(server: ServerThread) -> None:
    with BlockingClient(server.endpoint, SECRET, timeout=10.0) as client:
        assert client.next_notification(timeout=0.05) is None
        client.request(Subscribe(3))
        notes = [client.next_notification(timeout=10) for _ in range(3)]
        assert [n.message for n in notes if n] == [Delivery(0), Delivery(1), Delivery(2)]
        for amount in (5, 6):
            client.notify(Credit(amount))
        wait_for(lambda: server.run(lambda: len(server.handlers.credits)) == 2,
                 what="credits at the server")
        assert server.run(lambda: list(server.handlers.credits)) == [
            (5, client.session), (6, client.session)]


SCRIPT = """
import json, sys
from querylib.rpc import BlockingClient, Ping, load_secret
from tests.querylib.rpc._support import Fetch

endpoint, secret_path = sys.argv[1], sys.argv[2]
with BlockingClient(endpoint, load_secret(secret_path), timeout=20) as client:
    pong = client.request(Ping(b"from a script"))
    tokens = [client.request(Fetch(n)).token for n in range(5)]
print(json.dumps({"pong": pong.data.decode(), "tokens": tokens}))
"""


def test_plain_script_in_a_child_process(tmp_path: Path, processes: Processes) -> None:
    secret_path = tmp_path / "tq" / "secret"
    secret = load_or_create_secret(secret_path)
    with ServerThread(secret=secret) as server:
        child = processes.python("-c", SCRIPT, server.endpoint, str(secret_path),
                                 stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO)})
        out, err = child.communicate(timeout=60)
        assert child.returncode == 0, err.decode()
        assert json.loads(out) == {"pong": "from a script", "tokens": [0, 1, 2, 3, 4]}


def test_script_with_a_too_open_secret_fails_with_one_clear_line(
        tmp_path: Path, processes: Processes) -> None:
    secret_path = tmp_path / "secret"
    load_or_create_secret(secret_path)
    secret_path.chmod(0o644)
    child = processes.python(
        "-c", "import sys; from querylib.rpc import load_secret, SecretFileError\n"
              "try:\n    load_secret(sys.argv[1])\n"
              "except SecretFileError as e:\n    print(e); sys.exit(e.exit_code)",
        str(secret_path), stdout=subprocess.PIPE, cwd=REPO,
        env={**os.environ, "PYTHONPATH": str(REPO)})
    out, _ = child.communicate(timeout=60)
    assert child.returncode == 2
    assert out.decode().strip().endswith(f"run: chmod 600 {secret_path}")
