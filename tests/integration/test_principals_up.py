"""Identities on a real `tq up` (DESIGN §12): users made by the admin act only on what they
own, query processes act only as their query, only an executor reports its processes' exits
and registers itself, a session belongs to the principal that opened it, and removed or
rotated credentials stop working. Each of these was possible for anyone holding the cluster
secret, which every query process had."""

from __future__ import annotations

import json
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

import querylib
from catalog import NotAuthorizedError, NotOwnerError, QueryState, Resources
from querylib.cluster import Cluster
from querylib.cluster import messages as m
from querylib.rpc import BROKER, BlockingClient, Ping, SecretRejectedError, load_credential
from tests.conftest import wait_for
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(180)

SLEEPER = textwrap.dedent('''
    import time
    import querylib

    def main(ctx):
        while True:
            time.sleep(0.5)

    querylib.execute(main)
''')

# A query that tries to kill another query with whatever credential it finds in its
# environment, and reports what it held.
ATTACKER = textwrap.dedent('''
    import json, os, sys
    import querylib
    from querylib.cluster import Cluster

    def main(ctx):
        held = os.environ.get("TQ_CREDENTIALS") or ""
        principal = ""
        if held:
            from querylib.rpc import load_credential
            principal = load_credential(held).principal
        print("ENV " + json.dumps({
            "principal": principal,
            "secret_file_in_env": "TQ_SECRET_FILE" in os.environ}), flush=True)
        with Cluster.connect() as cluster:
            try:
                cluster.kill_query(int(sys.argv[1]), "attacked")
            except Exception as exc:
                print(f"REFUSED {type(exc).__name__}: {exc}", flush=True)
                return
        print("KILLED", flush=True)

    querylib.execute(main)
''')


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up")) as running:
        yield running


@pytest.fixture(scope="module")
def users(up: Up, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """alice and bob, made by the admin with `tq user add`."""
    folder = tmp_path_factory.mktemp("credentials")
    made = {}
    for name in ("alice", "bob"):
        path = folder / f"{name}.credential"
        done = up.tq("user", "add", name, "-o", str(path))
        assert done.returncode == 0, done.stderr
        assert "Kafka SASL" in done.stdout and oct(path.stat().st_mode & 0o777) == "0o600"
        made[name] = path
    listed = up.tq("user", "list", "--json")
    assert listed.returncode == 0, listed.stderr
    assert {json.loads(line)["principal"] for line in listed.stdout.splitlines()} >= {
        "user:alice", "user:bob"}
    return made


def _program(tmp_path: Path, name: str, text: str) -> Path:
    path = tmp_path / name
    path.write_text(text)
    return path


def _submit_as(up: Up, credential: Path, program: Path, *args: str) -> int:
    done = up.tq("submit", str(program), "--credentials", str(credential), *args)
    assert done.returncode == 0, done.stderr
    return int(done.stdout.split()[0])


def _running(up: Up, query_id: int) -> bool:
    return up.query(query_id).state is QueryState.RUNNING


def test_a_query_process_cannot_kill_another_query(up: Up, tmp_path: Path) -> None:
    victim = up.submit(_program(tmp_path, "sleeper.py", SLEEPER))
    wait_for(lambda: _running(up, victim), timeout=60, what="the victim to run")
    attacker = up.submit(_program(tmp_path, "attacker.py", ATTACKER), "--", str(victim))
    ended = up.ended(attacker)
    logs = up.tq("logs", str(attacker)).stdout
    assert "REFUSED NotOwnerError" in logs, logs
    assert ended.exit_codes == (0,)
    env = json.loads(next(line for line in logs.splitlines() if "ENV " in line)
                     .split("ENV ", 1)[1])
    # The process held its query's credential, and never the cluster secret.
    assert env == {"principal": f"query:{attacker}", "secret_file_in_env": False}
    assert _running(up, victim)
    assert up.tq("kill", str(victim)).returncode == 0  # the admin may


def test_users_kill_only_what_they_manage(up: Up, users: dict[str, Path],
                                          tmp_path: Path) -> None:
    query = _submit_as(up, users["alice"], _program(tmp_path, "sleeper.py", SLEEPER))
    wait_for(lambda: _running(up, query), timeout=60, what="alice's query to run")
    assert up.query(query).owner == "user:alice"
    refused = up.tq("kill", str(query), "--credentials", str(users["bob"]))
    assert refused.returncode == 2
    assert "user:bob may not kill it" in refused.stderr
    assert _running(up, query)
    done = up.tq("kill", str(query), "--credentials", str(users["alice"]))
    assert done.returncode == 0, done.stderr
    assert up.ended(query).state is QueryState.KILLED


def test_exit_reports_and_registrations_need_the_executor(up: Up, users: dict[str, Path],
                                                          tmp_path: Path) -> None:
    query = _submit_as(up, users["alice"], _program(tmp_path, "sleeper.py", SLEEPER))
    wait_for(lambda: _running(up, query), timeout=60, what="alice's query to run")
    with Cluster.connect(up.info["coordinator"], secret_file=str(users["bob"])) as bob:
        # Reported finished with exit code 0 while it runs: its topics would become deletable.
        with pytest.raises(NotAuthorizedError, match="only that executor reports its exit"):
            bob.report_exit(query, 0, 0)
        with pytest.raises(NotAuthorizedError, match="executor credential"):
            bob.register_broker("evil", "tcp://127.0.0.1:1")
        with pytest.raises(NotAuthorizedError):
            bob.register_executor("evil", 1, Resources(cores=1, memory=1, disk=1, slots=99))
    with pytest.raises(NotAuthorizedError, match="executor credential"):
        Cluster.connect(up.info["coordinator"], secret_file=str(users["bob"]),
                        kind="executor").close()
    assert _running(up, query)
    up.tq("kill", str(query))


def test_a_session_is_its_principals(up: Up, users: dict[str, Path], tmp_path: Path) -> None:
    query = _submit_as(up, users["alice"], _program(tmp_path, "sleeper.py", SLEEPER))
    wait_for(lambda: _running(up, query), timeout=60, what="alice's query to run")
    coordinator = up.info["coordinator"]
    with Cluster.connect(coordinator, secret_file=str(users["alice"])) as alice, \
            Cluster.connect(coordinator, secret_file=str(users["bob"])) as bob:
        # bob names alice's session: he gets nothing of it.
        with pytest.raises(NotAuthorizedError, match="belongs to another principal"):
            bob.request(m.KillQuery(session_id=alice.session_id, query_id=query))
        with pytest.raises(NotAuthorizedError, match="belongs to another principal"):
            bob.request(m.OpenSession(kind="client", peer="me", lease_ms=5000,
                                      resume=alice.session_id))
    assert _running(up, query)
    up.tq("kill", str(query))


def test_naming_anothers_session_does_not_take_its_notifies(up: Up, users: dict[str, Path],
                                                           tmp_path: Path) -> None:
    """The coordinator sends a session's notifies (an executor's SpawnProcesses, with the
    program and its query's sealed key; KillProcesses, DropPartitions) to the socket that
    last spoke for it. A request naming another principal's session is refused, and must not
    make the asker that socket: bob, naming the executor's session again and again while
    alice submits, would get her query's spawn and the executor never would."""
    coordinator = up.info["coordinator"]
    with Cluster.connect(coordinator, secret_file=str(users["bob"])) as bob:
        executors = bob.snapshot("executors")["executors"].records
        session = next(e.session_id for e, _ in executors if e.session_id is not None)
        taken: list[object] = []
        bob.on_notify(m.SpawnProcesses, taken.append)
        bob.on_notify(m.KillProcesses, taken.append)
        stop = threading.Event()
        refusals: list[Exception] = []

        def name_it() -> None:
            while not stop.is_set() and len(refusals) < 2000:
                try:
                    bob.request(m.Heartbeat(session_id=session, lease_ms=5000))
                except NotAuthorizedError as exc:
                    refusals.append(exc)

        naming = threading.Thread(target=name_it, daemon=True)
        naming.start()
        try:
            wait_for(lambda: refusals, timeout=30, what="bob's first refusal")
            query = _submit_as(up, users["alice"], _program(tmp_path, "sleeper.py", SLEEPER))
            wait_for(lambda: _running(up, query), timeout=60, what="alice's query to run")
            up.tq("kill", str(query))
            up.ended(query)
        finally:
            stop.set()
            naming.join(30)
    assert taken == []
    assert all("belongs to another principal" in str(exc) for exc in refusals)


def test_topics_are_deleted_by_their_owner_and_forced_by_admins(
        up: Up, users: dict[str, Path]) -> None:
    alice, bob = (str(users[name]) for name in ("alice", "bob"))
    # A topic alice's script publishes is hers: bob cannot even force it away.
    with querylib.connect(up.info["coordinator"], secret_file=alice) as ctx, \
            ctx.publish("alices-own", serde="json") as pub:
        pub.send(1, {"n": 1})
        refused = up.tq("topic", "delete", "alices-own", "--force", "--credentials", bob)
        assert refused.returncode == 2 and "user:bob may not delete it" in refused.stderr
        unforced = up.tq("topic", "delete", "alices-own")
        assert unforced.returncode == 2 and "an admin deletes it with --force" in \
            unforced.stderr
    assert up.tq("topic", "delete", "alices-own", "--force").returncode == 0
    # An ingest topic alice created: fed by anyone, deleted (forced) by her or an admin.
    created = up.tq("topic", "create", "alices-ingest", "--partitions", "1",
                    "--credentials", alice)
    assert created.returncode == 0, created.stderr
    refused = up.tq("topic", "delete", "alices-ingest", "--force", "--credentials", bob)
    assert refused.returncode == 2 and "by its creator or an admin" in refused.stderr
    done = up.tq("topic", "delete", "alices-ingest", "--force", "--credentials", alice)
    assert done.returncode == 0, done.stderr


def test_a_restarted_script_publishes_to_the_topic_it_owned(up: Up,
                                                            users: dict[str, Path]) -> None:
    """Topics a client creates are its principal's, so a new session of the same principal
    (the script run again) still publishes them; another user's session does not."""
    coordinator = up.info["coordinator"]
    for _ in range(2):  # the admin's script, run twice
        with up.connect() as ctx, ctx.publish("admins-feed", serde="json") as pub:
            pub.send(1, {"n": 1})
    for _ in range(2):
        with querylib.connect(coordinator, secret_file=str(users["alice"])) as ctx, \
                ctx.publish("alice-feed", serde="json") as pub:
            pub.send(1, {"n": 1})
    with querylib.connect(coordinator, secret_file=str(users["bob"])) as ctx, \
            pytest.raises(NotOwnerError, match="owned by user:alice"):
        ctx.publish("alice-feed", serde="json")


def test_rotated_and_removed_credentials_stop_working(up: Up, tmp_path: Path) -> None:
    path = tmp_path / "carol.credential"
    assert up.tq("user", "add", "carol", "-o", str(path)).returncode == 0
    coordinator = up.info["coordinator"]
    Cluster.connect(coordinator, secret_file=str(path)).close()
    rotated = tmp_path / "carol-2.credential"
    assert up.tq("user", "rotate", "carol", "-o", str(rotated)).returncode == 0
    with pytest.raises(SecretRejectedError):
        Cluster.connect(coordinator, secret_file=str(path), connect_timeout=5).close()
    Cluster.connect(coordinator, secret_file=str(rotated)).close()
    # Only admins manage users.
    refused = up.tq("user", "add", "mallory", "--credentials", str(rotated))
    assert refused.returncode == 2 and "admin role" in refused.stderr
    assert up.tq("user", "remove", "carol").returncode == 0
    with pytest.raises(SecretRejectedError):
        Cluster.connect(coordinator, secret_file=str(rotated), connect_timeout=5).close()
    # The executor's broker, which asks the coordinator for keys, refuses her too, at once
    # (it let her wait, unanswered, for ever).
    status = json.loads(up.tq("status", "--json").stdout)
    broker = next(b["address"] for b in status["brokers"] if b["session_id"] is not None)
    with BlockingClient(broker, load_credential(rotated), audience=BROKER) as removed:
        with pytest.raises(SecretRejectedError):
            removed.request(Ping(b"carol"), timeout=20)


def test_a_credential_file_that_cannot_be_written_changes_nothing(up: Up,
                                                                   tmp_path: Path) -> None:
    """`tq user add|rotate` write the key they get into a new file. A path that exists or
    cannot be written is refused before the cluster changes: refused after, the key was lost,
    a user added that no credential anywhere proves, or a rotation that stopped the old key
    with the new one nowhere."""
    taken = tmp_path / "taken.credential"
    taken.write_text("someone else's\n")
    unwritable = [taken, tmp_path / "no-such-folder" / "erin.credential"]
    for path in unwritable:
        refused = up.tq("user", "add", "erin", "-o", str(path))
        assert refused.returncode == 2, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
        assert str(path) in refused.stderr
    assert "user:erin" not in up.tq("user", "list").stdout
    assert taken.read_text() == "someone else's\n"

    path = tmp_path / "erin.credential"
    made = up.tq("user", "add", "erin", "-o", str(path))
    assert made.returncode == 0, made.stderr
    for bad in unwritable:
        refused = up.tq("user", "rotate", "erin", "-o", str(bad))
        assert refused.returncode == 2, refused.stderr
        assert len(refused.stderr.strip().splitlines()) == 1, refused.stderr
    # Not rotated: the credential erin holds still works.
    Cluster.connect(up.info["coordinator"], secret_file=str(path), connect_timeout=10).close()
    listed = [json.loads(line) for line in up.tq("user", "list", "--json").stdout.splitlines()]
    assert [u["generation"] for u in listed if u["principal"] == "user:erin"] == [0]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["erin.credential",
                                                          "taken.credential"]


def test_a_program_pack_is_read_by_who_runs_or_manages_its_query(up: Up, users: dict[str, Path],
                                                                  tmp_path: Path) -> None:
    """A query's program pack (its code, and for querylib.submit the pickled arguments) is
    fetched by the executors that run it, its submitter and admins. Anyone may read the
    catalog, which names the pack's digest: bob, asking for it by that digest, got alice's
    program whole."""
    program = _program(tmp_path, "sleeper.py", SLEEPER + "\nALICES_TOKEN = 'xyzzy-4711'\n")
    query = _submit_as(up, users["alice"], program)
    wait_for(lambda: _running(up, query), timeout=60, what="alice's query to run")
    digest = up.query(query).program.removeprefix("sha256:")
    coordinator = up.info["coordinator"]
    with Cluster.connect(coordinator, secret_file=str(users["bob"])) as bob:
        with pytest.raises(NotAuthorizedError, match="user:bob may not read program pack"):
            bob._call(bob._async.fetch_artifact(digest))
    for secret_file in (str(users["alice"]), up.info["secret_file"]):
        with Cluster.connect(coordinator, secret_file=secret_file) as reader:
            assert b"xyzzy-4711" in reader._call(reader._async.fetch_artifact(digest))
    up.tq("kill", str(query))


def _rss_mib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        return next(int(line.split()[1]) // 1024 for line in status if line.startswith("VmRSS"))


def test_only_executors_leave_their_load_with_the_coordinator(up: Up,
                                                              users: dict[str, Path]) -> None:
    """An executor's heartbeat carries its host's load, which the coordinator keeps for
    placement and tq status. Any session's heartbeat may carry one: kept too, a user's 160
    sessions each sending a 0.7 MiB load (its per-process list made up) had the coordinator
    hold ~150 MiB more for nothing, and more sessions more, until it ran out of memory."""
    load = m.HostLoad(sampled_at_ms=0, cpu_percent=0.0, memory_used=0, memory_available=0,
                      disk_free=0, running=0, per_process=tuple(
                          m.ProcessLoad(query_id=0, process=0, pid=0, rss=0, cpu_percent=0.0,
                                        processes=0) for _ in range(10_000)))
    coordinator = up.proc.pid  # tq up serves the coordinator in its own process
    with Cluster.connect(up.info["coordinator"], secret_file=str(users["bob"])) as bob:
        # As many from one session first: the coordinator's driver keeps its last 32
        # stimuli (for the log of a bug), and its allocator keeps what they took.
        for _ in range(40):
            bob.request(m.Heartbeat(session_id=bob.session_id, load=load))
        before = _rss_mib(coordinator)
        opened = []
        try:
            for _ in range(160):
                session = bob.request(m.OpenSession(kind="client", peer="bob", lease_ms=60_000))
                opened.append(session.session_id)
                bob.request(m.Heartbeat(session_id=session.session_id, load=load))
            grown = _rss_mib(coordinator) - before
        finally:
            for session_id in opened:
                bob.request(m.CloseSession(session_id=session_id))
    assert grown < 48, f"the coordinator grew by {grown} MiB"
    # The executor's own load is kept still.
    with up.cluster() as reader:
        wait_for(reader.loads, timeout=30, interval=0.2, what="the executor's load")


def test_a_user_runs_only_programs_it_uploaded_or_may_read(up: Up, users: dict[str, Path],
                                                          tmp_path: Path) -> None:
    """A query's program may be a file or URL on the executor's host: the executor reads it
    there, as its own OS user. That is the operators' (the admin's) to name. bob named a
    file only the host should read and read its first line in his query's log (a SyntaxError
    shows it); naming alice's uploaded pack by its digest (the catalog shows it) ran her
    program as his query and let him fetch it whole."""
    secret = tmp_path / "host-only.txt"
    secret.write_text("the password is hunter2\n")
    coordinator = up.info["coordinator"]
    alices = _submit_as(up, users["alice"], _program(
        tmp_path, "alices.py", SLEEPER + "\nALICES_TOKEN = 'plugh-0815'\n"))
    digest = up.query(alices).program
    with Cluster.connect(coordinator, secret_file=str(users["bob"])) as bob:
        for program in (secret.as_uri(), "http://127.0.0.1:9/job.py", digest):
            with pytest.raises(NotAuthorizedError, match="may not run program"):
                bob.submit_query("peek", program)
        mine = bob.upload_artifact(*_packed(_program(tmp_path, "bobs.py", SLEEPER)))
        query = bob.submit_query("mine", mine)  # what he uploaded himself, he runs
        bob.kill_query(query.query_id, "done")
    up.tq("kill", str(alices))


def _packed(program: Path) -> tuple[str, bytes]:
    from querylib.artifacts import pack_path, sha256_hex

    pack = pack_path(program, max_bytes=1 << 20)
    return sha256_hex(pack), pack
