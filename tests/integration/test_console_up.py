"""The web console of a real `tq up` (issue 18), over HTTP: the live state a page draws,
the server-sent events that carry it, and who may kill a query from it."""

from __future__ import annotations

import http.cookiejar
import json
import ssl
import textwrap
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog import QueryState
from querylib.rpc import kafka_password, load_credential, load_secret
from tests.conftest import free_port, wait_for
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(300)

PUBLISHER = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        with ctx.publish("flow") as out:
            t = 0
            while not Path(sys.argv[1]).exists():
                out.send(t, list(range(100)))
                t += 1
                out.advance_to(t)
                time.sleep(0.05)

    querylib.execute(main)
''')

SUBSCRIBER = textwrap.dedent('''
    import querylib

    def main(ctx):
        with ctx.subscribe("flow", timeout=120) as sub:
            for _ in sub:
                pass

    querylib.execute(main)
''')


class Browserless:
    """HTTP as a browser does it: cookies kept, redirects seen rather than followed."""

    class _NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, *args: Any) -> None:
            return None

    def __init__(self, base: str, ca: Path | None = None) -> None:
        self.base = base.rstrip("/")
        self.jar = http.cookiejar.CookieJar()
        handlers: list[Any] = [urllib.request.HTTPCookieProcessor(self.jar), self._NoRedirect()]
        if ca is not None:
            handlers.append(urllib.request.HTTPSHandler(
                context=ssl.create_default_context(cafile=str(ca))))
        self.opener = urllib.request.build_opener(*handlers)

    def call(self, path: str, *, data: dict[str, str] | None = None,
             headers: dict[str, str] | None = None, method: str | None = None
             ) -> tuple[int, dict[str, str], bytes]:
        body = None if data is None else urllib.parse.urlencode(data).encode()
        request = urllib.request.Request(self.base + path, data=body, headers=headers or {},
                                         method=method)
        try:
            with self.opener.open(request, timeout=30) as reply:
                return reply.status, _lower(reply.headers), reply.read()
        except urllib.error.HTTPError as error:
            return error.code, _lower(error.headers), error.read()

    def state(self) -> dict[str, Any]:
        status, _, body = self.call("/api/state")
        assert status == 200, body
        return json.loads(body)

    def kill(self, query_id: int, header: bool = True) -> tuple[int, dict[str, Any]]:
        status, _, body = self.call(f"/api/queries/{query_id}/kill", method="POST", data={},
                                    headers={"X-Tq-Console": "1"} if header else {})
        return status, json.loads(body)

    def login(self, principal: str, password: str) -> int:
        status, headers, _ = self.call("/login", data={"principal": principal,
                                                       "password": password})
        assert status == 303
        return 0 if "failed" in headers.get("location", "") else 1


def _lower(headers: Any) -> dict[str, str]:
    return {name.lower(): value for name, value in headers.items()}


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up"), "--console-port", str(free_port())) as running:
        yield running


def _pipeline(up: Up, where: Path) -> tuple[int, int, Path]:
    (where / "publisher.py").write_text(PUBLISHER)
    (where / "subscriber.py").write_text(SUBSCRIBER)
    gate = where / "gate"
    publisher = up.submit(where / "publisher.py", "--name", "source", "--", str(gate))
    subscriber = up.submit(where / "subscriber.py", "--name", "sink")
    return publisher, subscriber, gate


def test_the_console_shows_a_pipeline_and_its_rate_live(up: Up, tmp_path: Path) -> None:
    console = Browserless(up.info["console"])
    assert console.call("/")[0] == 200  # on loopback, reading needs no login
    publisher, subscriber, gate = _pipeline(up, tmp_path)
    try:
        def linked() -> dict[str, Any] | None:
            state = console.state()
            edges = {(e["from"], e["to"]) for e in state["graph"]["edges"]}
            (flow,) = [t for t in state["topics"] if t["short_name"] == "flow"] or [None]
            if flow is None:
                return None
            topic = f"topic:{flow['topic_id']}"
            wanted = {(f"query:{publisher}", topic), (topic, f"query:{subscriber}")}
            return state if wanted <= edges and flow["records_per_s"] > 0 else None

        state = wait_for(linked, timeout=90, interval=0.3,
                         what="the graph to link source -> flow -> sink, with a rate")
        (flow,) = [t for t in state["topics"] if t["short_name"] == "flow"]
        assert flow["records"] > 0 and flow["partitions"][0]["log_end"] > 0
        assert state["overview"]["executors"] == 1
        assert state["overview"]["records_per_s"] > 0
        (source,) = [q for q in state["queries"] if q["query_id"] == publisher]
        assert source["state"] == "running" and source["name"] == "source"
        # The same state, as the page gets it: server-sent events.
        request = urllib.request.Request(up.info["console"].rstrip("/") + "/api/events")
        with urllib.request.urlopen(request, timeout=30) as stream:
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            assert stream.readline() == b"event: state\n"
            event = json.loads(stream.readline().removeprefix(b"data: "))
            assert {q["query_id"] for q in event["queries"]} >= {publisher, subscriber}
    finally:
        gate.write_text("")
    assert up.ended(publisher).state is QueryState.FINISHED


def test_killing_needs_a_login_and_the_principals_right(up: Up, tmp_path: Path) -> None:
    console = Browserless(up.info["console"])
    (tmp_path / "publisher.py").write_text(PUBLISHER)
    query_id = up.submit(tmp_path / "publisher.py", "--name", "victim", "--",
                         str(tmp_path / "never"))
    wait_for(lambda: up.query(query_id).state is QueryState.RUNNING, timeout=60,
             what="the query to run")
    # Nobody logged in: refused, and the query runs on.
    assert console.kill(query_id)[0] == 401
    # A wrong password logs nobody in.
    assert console.login("admin", "0" * 32) == 0
    assert console.kill(query_id)[0] == 401
    # A user may log in, but not kill the admin's query: the coordinator refuses it.
    made = up.tq("user", "add", "bob", "--output", str(tmp_path / "bob.credential"))
    assert made.returncode == 0, made.stderr
    bob = kafka_password(load_credential(tmp_path / "bob.credential"))
    wait_for(lambda: console.login("bob", bob), timeout=30, interval=0.2,
             what="the console to know bob (the users collection)")
    status, body = console.kill(query_id)
    assert (status, body["kind"]) == (403, "NotOwnerError"), body
    # Without the action header (what a cross-site form sends): refused.
    admin = Browserless(up.info["console"])
    assert admin.login("admin", kafka_password(load_secret(up.info["secret_file"]))) == 1
    assert admin.kill(query_id, header=False)[0] == 403
    assert up.query(query_id).state is QueryState.RUNNING
    status, body = admin.kill(query_id)
    assert (status, body["state"]) == (200, "killed"), body
    assert up.ended(query_id).state is QueryState.KILLED
    assert "killed from the console by admin" in up.query(query_id).reason


def test_bound_to_another_address_every_page_asks_for_a_login(tmp_path: Path) -> None:
    port = free_port()
    with Up(tmp_path / "home", "--console-port", str(port), "--console-host", "0.0.0.0",
            "--insecure") as up:
        console = Browserless(f"http://127.0.0.1:{port}")  # traffic stays on loopback
        status, headers, _ = console.call("/")
        assert (status, headers["location"]) == (303, "/login")
        assert console.call("/api/state")[0] == 401
        assert console.call("/api/events")[0] == 401
        assert console.call("/static/console.js")[0] == 200  # the page's own files are public
        assert console.call("/login")[0] == 200
        assert console.login("admin", kafka_password(load_secret(up.info["secret_file"])))
        assert console.state()["me"] == "admin"
        assert console.call("/logout", method="POST", data={})[0] == 303
        assert console.call("/api/state")[0] == 401


def test_minus_one_means_no_console_and_a_named_taken_port_is_refused(tmp_path: Path) -> None:
    with Up(tmp_path / "none", "--console-port", "-1") as up:
        assert up.info.get("console", "") == ""
    # A port the user named that is taken is refused, naming the flag.
    with Up(tmp_path / "first", "--console-port", str(port := free_port())) as first:
        assert first.info["console"] == f"http://127.0.0.1:{port}/"
        home = tmp_path / "second"
        home.mkdir()
        second = subprocess_up(home, "--console-port", str(port))
        assert second.returncode != 0
        assert f"port {port}" in second.stderr and "--console-port" in second.stderr


def subprocess_up(home: Path, *extra: str) -> Any:
    import subprocess
    import sys

    from tests.coordinator._cluster import ROOT, tq_env

    return subprocess.run([sys.executable, "-m", "querylib.cli", "up", "--listen",
                           f"tcp://127.0.0.1:{free_port()}", "--kafka-port", "-1",
                           "--connector-port", "-1", *extra], env=tq_env(home), cwd=ROOT,
                          capture_output=True, text=True, timeout=120)


def test_deleting_a_topic_needs_a_login_and_the_principals_right(up: Up,
                                                                  tmp_path: Path) -> None:
    from querylib.cluster import Cluster

    with Cluster.connect(up.info["coordinator"], secret_file=up.info["secret_file"]) as cluster:
        cluster.create_topic("scratch")
    name = "persistent://public/default/scratch"
    path = f"/api/topics/{urllib.parse.quote(name, safe='')}/delete"
    console = Browserless(up.info["console"])
    wait_for(lambda: any(t["name"] == name for t in console.state()["topics"]), timeout=30,
             what="the console to know the topic")
    assert console.call(path, method="POST", data={})[0] == 401
    made = up.tq("user", "add", "dave", "--output", str(tmp_path / "dave.credential"))
    assert made.returncode == 0, made.stderr
    dave = kafka_password(load_credential(tmp_path / "dave.credential"))
    wait_for(lambda: console.login("dave", dave), timeout=30, interval=0.2,
             what="the console to know dave")
    status, _, body = console.call(path, method="POST", data={},
                                   headers={"X-Tq-Console": "1"})
    assert status == 403, body
    admin = Browserless(up.info["console"])
    assert admin.login("admin", kafka_password(load_secret(up.info["secret_file"])))
    status, _, body = admin.call(path, method="POST", data={}, headers={"X-Tq-Console": "1"})
    assert status == 200, body
    wait_for(lambda: all(t["name"] != name for t in admin.state()["topics"]), timeout=30,
             what="the topic to leave the console")


def test_a_query_id_no_query_can_have_is_refused_as_bad_input(up: Up) -> None:
    """A kill naming a query id past 64 bits: refused as bad input, not answered with a 500
    and a traceback in tq up's log (the coordinator's messages cannot carry it)."""
    admin = Browserless(up.info["console"])
    assert admin.login("admin", kafka_password(load_secret(up.info["secret_file"])))
    tracebacks = up.stderr().count("Traceback")
    for ref in (str(2**64), "9" * 30):
        status, _, body = admin.call(f"/api/queries/{ref}/kill", method="POST", data={},
                                     headers={"X-Tq-Console": "1"})
        assert status == 400, body
        assert "query id" in json.loads(body)["error"]
    assert admin.state()["me"] == "admin"  # and it serves on
    assert up.stderr().count("Traceback") == tracebacks


def test_a_console_beyond_loopback_needs_tls_or_insecure(tmp_path: Path) -> None:
    """Logins (the admin's token link, users' passwords) and their cookies would cross the
    network in clear: refused at start, as the connector endpoint and Kafka listener are."""
    done = subprocess_up(tmp_path, "--console-port", str(free_port()),
                         "--console-host", "0.0.0.0")
    assert done.returncode == 2, done.stderr
    assert "--insecure" in done.stderr and "--console-tls-cert" in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1, done.stderr


def test_the_console_over_tls(tmp_path: Path) -> None:
    """With a certificate the console speaks only HTTPS, its login cookie only goes back
    over HTTPS (Secure), and tq up prints an https:// link."""
    from tests.integration.test_connector_tls_up import _certificates

    cert, key, ca = _certificates(tmp_path)
    port = free_port()
    with Up(tmp_path / "home", "--console-port", str(port), "--console-tls-cert", str(cert),
            "--console-tls-key", str(key)) as up:
        link = up.info["console"]
        assert link == f"https://127.0.0.1:{port}/", link
        console = Browserless(link, ca=ca)
        status, headers, _ = console.call("/login", data={
            "principal": "admin",
            "password": kafka_password(load_secret(up.info["secret_file"]))})
        assert status == 303 and "secure" in headers["set-cookie"].lower(), headers
        assert console.state()["me"] == "admin"
        with pytest.raises((urllib.error.URLError, ConnectionError)):  # no TLS: no answer
            Browserless(f"http://127.0.0.1:{port}").call("/api/state")
