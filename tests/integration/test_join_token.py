"""Joining a host with a one-time token (DESIGN §12 "Joining a host"), on one host against
`tq up`: `tq token create`, then `tq executor --join TOKEN` with no credential and no
coordinator address registers an executor that runs queries, and keeps what it got so a
later start needs no token. The same token is refused the second time, as are an expired, a
revoked, a wrong and a mangled one, each with one clear line and no executor registered; of
two joiners racing with one token, one wins. (Across hosts with no address options:
tests/integration/test_multihost.py.)"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from catalog import NotAuthorizedError, QueryState
from executor._join import COORDINATOR_FILE, join_host
from querylib.cluster import Cluster, parse_token
from querylib.rpc import (
    BROKER,
    Credential,
    DeadlineExceededError,
    Ping,
    RpcClient,
    SecretRejectedError,
    write_credential,
)
from tests._fsync import assert_synced_then_its_folder, record_fsyncs
from tests.conftest import Processes, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq, tq_env
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(240)

PROGRAM = textwrap.dedent('''
    import os
    import querylib

    def main(ctx):
        print(f"RAN ON {os.environ['TQ_EXECUTOR_ID']}", flush=True)

    querylib.execute(main)
''')


def _executors(up: Up) -> dict[int, str]:
    done = up.tq("status", "--json")
    assert done.returncode == 0, done.stderr
    return {e["executor_id"]: e["host"] for e in json.loads(done.stdout)["executors"]}


def _users(up: Up) -> list[str]:
    done = up.tq("user", "list", "--json")
    return [json.loads(line)["principal"] for line in done.stdout.splitlines()]


def _create(up: Up, *args: str) -> str:
    done = up.tq("token", "create", *args)
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def _tokens(up: Up) -> dict[int, dict]:
    done = up.tq("token", "list", "--json")
    assert done.returncode == 0, done.stderr
    return {t["token_id"]: t for t in map(json.loads, done.stdout.splitlines())}


def _join(tmp_path: Path, token: str, name: str, *args: str) -> subprocess.CompletedProcess[str]:
    """A `tq executor --join` that must fail: it ends by itself."""
    return subprocess.run(
        [sys.executable, "-m", "querylib.cli", "executor", "--join", token, "--data",
         str(tmp_path / name), "--host", name, *args],
        env=tq_env(tmp_path / f"home-{name}"), cwd=ROOT, capture_output=True, text=True,
        timeout=120)


def _agent(processes: Processes, tmp_path: Path, name: str, *args: str,
           token: str = "") -> subprocess.Popen:
    """`tq executor` for host `name` (`token`: in $TQ_JOIN_TOKEN, as a systemd unit's
    EnvironmentFile gives it)."""
    log = (tmp_path / f"{name}.log").open("a")
    env = {**tq_env(tmp_path / f"home-{name}"), **({"TQ_JOIN_TOKEN": token} if token else {})}
    return processes.python("-m", "querylib.cli", "executor", "--data", str(tmp_path / name),
                            "--host", name, "--slots", "1", "--brokers", "1", *args,
                            env=env, cwd=ROOT, stderr=log)


def test_a_join_token_joins_one_host_once(processes: Processes, tmp_path: Path) -> None:
    with Up(tmp_path / "home") as up:
        (local,) = _executors(up)
        token = _create(up, "--ttl", "10m")
        (token_id,) = _tokens(up)
        agent = _agent(processes, tmp_path, "host-b", "--join", token)
        remote = wait_for(lambda: [e for e, h in _executors(up).items() if h == "host-b"],
                          timeout=60, interval=0.2, what="the joined executor to register")[0]
        assert remote != local
        # It holds its own executor credential, private, and knows where the coordinator is.
        credential = tmp_path / "host-b" / "credential"
        assert stat.S_IMODE(credential.stat().st_mode) == 0o600
        assert json.loads(credential.read_text())["principal"] == "executor:host-b"
        where = json.loads((tmp_path / "host-b" / "coordinator.json").read_text())
        assert where["coordinators"] == [up.info["coordinator"]]
        assert "executor:host-b" in _users(up)
        assert _tokens(up)[token_id]["state"] == "used"
        assert _tokens(up)[token_id]["used_by"] == "executor:host-b"

        program = tmp_path / "where.py"
        program.write_text(PROGRAM)
        query = up.submit(program, "--executor", str(remote))
        assert up.ended(query).state is QueryState.FINISHED
        assert f"RAN ON {remote}" in up.tq("logs", str(query)).stdout

        # The same token a second time: refused, nothing registered, no principal made.
        again = _join(tmp_path, token, "host-c")
        assert again.returncode == 2, again.stderr
        assert "used already (by executor:host-b)" in again.stderr
        assert len(again.stderr.strip().splitlines()) == 1, again.stderr
        assert "executor:host-c" not in _users(up)
        assert not (tmp_path / "host-c" / "credential").exists()

        # A later start needs no token, no coordinator address and no credential option; the
        # used token still in its environment (a unit's EnvironmentFile) is not used again.
        agent.send_signal(signal.SIGTERM)
        assert agent.wait(timeout=30) == 0
        wait_for(lambda: remote not in _executors(up), timeout=30, interval=0.2,
                 what="the stopped executor to leave")
        _agent(processes, tmp_path, "host-b", token=token)
        wait_for(lambda: "host-b" in _executors(up).values(), timeout=60, interval=0.2,
                 what="host-b to register again without a token")
        assert "joined already as executor:host-b" in (tmp_path / "host-b.log").read_text()


def test_expired_revoked_wrong_and_mangled_tokens_are_refused(tmp_path: Path) -> None:
    with Up(tmp_path / "home") as up:
        before = _executors(up)
        expired = _create(up, "--ttl", "1s")
        expired_id = max(_tokens(up))
        wait_for(lambda: _tokens(up)[expired_id]["state"] == "expired", timeout=30,
                 interval=0.2, what="the one-second token to expire")
        refusals = []
        done = _join(tmp_path, expired, "host-x")
        assert done.returncode == 2 and "expired" in done.stderr, done.stderr
        refusals.append(done.stderr)

        revoked = _create(up)
        revoked_id = max(_tokens(up))
        assert up.tq("token", "revoke", str(revoked_id)).returncode == 0
        assert revoked_id not in _tokens(up)
        done = _join(tmp_path, revoked, "host-y")
        assert done.returncode == 2, done.stderr
        assert f"refused join token {revoked_id}" in done.stderr
        refusals.append(done.stderr)

        # Right id, wrong secret: refused at the handshake, before any message.
        good = parse_token(_create(up))
        wrong = revoked.rsplit(".", 2)[0] + f".{good.token_id}." + revoked.rsplit(".", 1)[1]
        done = _join(tmp_path, wrong, "host-z")
        assert done.returncode == 2, done.stderr
        assert f"refused join token {good.token_id}" in done.stderr
        refusals.append(done.stderr)

        done = _join(tmp_path, "tqjoin1.garbage", "host-w")
        assert done.returncode == 2 and "not a join token" in done.stderr, done.stderr
        refusals.append(done.stderr)
        assert all(len(r.strip().splitlines()) == 1 for r in refusals), refusals

        assert _executors(up) == before
        assert not [u for u in _users(up) if u.startswith("executor:")]
        for name in ("host-x", "host-y", "host-z", "host-w"):
            assert not (tmp_path / name / "credential").exists()


def test_a_data_dir_that_cannot_hold_the_credential_leaves_the_token_unused(
        tmp_path: Path) -> None:
    """The credential a join gets is written into the data dir. A data dir that cannot hold
    it (a file where the folder should be) is one line, before the token is redeemed: redeemed
    first, the token was used up and the executor principal made, its key lost."""
    with Up(tmp_path / "home") as up:
        token = _create(up)
        (token_id,) = _tokens(up)
        (tmp_path / "host-f").write_text("not a folder\n")
        done = _join(tmp_path, token, "host-f")
        assert done.returncode == 2, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1, done.stderr
        assert str(tmp_path / "host-f") in done.stderr
        assert _tokens(up)[token_id]["state"] != "used"
        assert "executor:host-f" not in _users(up)


def test_two_joiners_racing_with_one_token_one_wins(processes: Processes,
                                                    tmp_path: Path) -> None:
    with Up(tmp_path / "home") as up:
        token = _create(up)
        racers = {"host-p": _agent(processes, tmp_path, "host-p", "--join", token),
                  "host-q": _agent(processes, tmp_path, "host-q", token=token)}
        loser = wait_for(lambda: [n for n, p in racers.items() if p.poll() is not None],
                         timeout=60, interval=0.1, what="one joiner to be refused")
        (loser_name,) = loser
        assert racers[loser_name].returncode == 2
        assert "used already" in (tmp_path / f"{loser_name}.log").read_text()
        (winner,) = set(racers) - {loser_name}
        wait_for(lambda: winner in _executors(up).values(), timeout=60, interval=0.2,
                 what="the winner to register")
        assert f"executor:{loser_name}" not in _users(up)
        assert racers[winner].poll() is None


def test_only_admins_make_tokens_and_a_token_does_nothing_but_join(tmp_path: Path) -> None:
    with Up(tmp_path / "home") as up:
        alice = tmp_path / "alice.cred"
        assert up.tq("user", "add", "alice", "-o", str(alice)).returncode == 0
        done = up.tq("token", "create", "--credentials", str(alice))
        assert done.returncode == 2 and "admin" in done.stderr, done.stderr
        # The token's holder may not open a session (nor, so, do anything else).
        parsed = parse_token(_create(up))
        held = tmp_path / "token.cred"
        write_credential(held, parsed.credential)
        with pytest.raises(NotAuthorizedError, match="may only join"):
            with Cluster.connect(up.info["coordinator"], secret_file=str(held)):
                pass
        # Brokers do not know it: the catalog broker and the executor's refuse its handshake.
        with up.cluster() as cluster:
            addresses = [b.address for b, _ in cluster.snapshot("brokers")["brokers"].records]
        assert len(addresses) >= 2
        for address in addresses:
            asyncio.run(_refused_by_broker(address, parsed.credential))
        assert os.path.exists(held)


async def _refused_by_broker(address: str, credential: Credential) -> None:
    """The broker at `address` never admits `credential`: refused at the handshake (the
    catalog broker, which derives keys), or left unanswered (an executor's broker, whose
    keyring learns no key for it; DESIGN §2 "Handshake")."""
    async with RpcClient(address, credential.for_audience(BROKER)) as client:
        with pytest.raises((SecretRejectedError, DeadlineExceededError)):
            await client.request(Ping(), timeout=5)


def test_coordinator_json_is_written_durably_and_follows_no_planted_link(
        processes: Processes, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """join_host wrote coordinator.json through `.coordinator.json.<pid>.tmp`, a name anyone
    on the host can predict, and followed a link planted there (the victim was overwritten
    and coordinator.json became that link); nor did it fsync, so a crash could leave the
    file empty. Now the temporary file is new and unguessable, fsynced before the rename,
    the data directory after (the calls to os.fsync are recorded, still made)."""
    coordinator = CoordinatorProcess(processes, tmp_path / "home").start()
    made = tq(coordinator.home, "token", "create", "--ttl", "10m")
    assert made.returncode == 0, made.stderr
    data = tmp_path / "host-b"
    data.mkdir(mode=0o700)
    victim = tmp_path / "victim"
    victim.write_text("precious\n")
    (data / f".{COORDINATOR_FILE}.{os.getpid()}.tmp").symlink_to(victim)
    synced = record_fsyncs(monkeypatch)
    joined = asyncio.run(join_host(made.stdout.strip(), data, "host-b"))
    assert victim.read_text() == "precious\n"
    where = data / COORDINATOR_FILE
    assert not where.is_symlink()
    assert json.loads(where.read_text())["coordinators"] == list(joined.coordinators)
    # The folder is fsynced after the file (and before it too, once the credential is linked).
    assert_synced_then_its_folder(synced, where)
