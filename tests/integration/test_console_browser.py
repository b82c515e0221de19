"""The web console in a real browser (issue 18): Debian's chromium, driven by Playwright, on
a real `tq up`. Screenshots go to test-artifacts/console/ (kept by CI as artifacts)."""

from __future__ import annotations

import shutil
import textwrap
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from catalog import QueryState
from querylib.rpc import kafka_password, load_credential, load_secret
from tests.conftest import free_port, wait_for
from tests.coordinator._cluster import ROOT
from tests.integration._up import Up

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
pytestmark = [
    pytest.mark.timeout(300),
    pytest.mark.skipif(CHROMIUM is None, reason="no chromium (scripts/test installs it)"),
]
ARTIFACTS = ROOT / "test-artifacts" / "console"
# What a headless chromium needs on a machine without a network or a display (as root).
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                 "--disable-background-networking", "--disable-component-update",
                 "--disable-sync", "--disable-dev-shm-usage"]
WAIT_MS = 60_000

PUBLISHER = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        print(f"worker {ctx.index} publishes clicks", flush=True)
        with ctx.publish("clicks") as out:
            t = 0
            while not Path(sys.argv[1]).exists():
                out.send(t, list(range(50)))
                t += 1
                out.advance_to(t)
                time.sleep(0.05)

    querylib.execute(main)
''')

SUBSCRIBER = textwrap.dedent('''
    import querylib

    def main(ctx):
        with ctx.subscribe("clicks", timeout=120) as sub, ctx.publish("counts") as out:
            for event in sub:
                if isinstance(event, querylib.Data):
                    out.send(event.time, [len(event.records)])

    querylib.execute(main)
''')


PAGE_ERRORS: list[str] = []  # uncaught errors of the console's script, in any page


class _Browser:
    """A launched chromium whose every page reports its script's uncaught errors."""

    def __init__(self, launched: Any) -> None:
        self.launched = launched

    def new_page(self, **options: Any) -> Any:
        page = self.launched.new_page(**options)
        page.on("pageerror", lambda error: PAGE_ERRORS.append(str(error)))
        return page

    def new_context(self, **options: Any) -> Any:
        context = self.launched.new_context(**options)
        context.on("page", lambda page: page.on(
            "pageerror", lambda error: PAGE_ERRORS.append(str(error))))
        return context


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=CHROMIUM, headless=True,
                                              args=CHROMIUM_ARGS)
        try:
            yield _Browser(launched)
        finally:
            launched.close()


@pytest.fixture(autouse=True)
def no_script_errors() -> Iterator[None]:
    PAGE_ERRORS.clear()
    yield
    assert PAGE_ERRORS == [], "the console's script failed in the browser"


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up"), "--console-port", str(free_port())) as running:
        yield running


def _shot(page: Any, name: str) -> Path:
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    return path


def _log_in(page: Any, base: str, principal: str, password: str) -> None:
    page.goto(base + "login")
    page.fill("input[name=principal]", principal)
    page.fill("input[name=password]", password)
    page.click("button[type=submit]")
    page.wait_for_selector("#me:has-text('logged in as')", timeout=WAIT_MS)


def test_a_submitted_pipeline_appears_on_the_overview_and_in_the_graph_live(
        up: Up, browser: Any, tmp_path: Path) -> None:
    base = up.info["console"]
    page = browser.new_page(viewport={"width": 1280, "height": 800})
    page.goto(base)
    page.wait_for_selector("#status.live", timeout=WAIT_MS)
    page.wait_for_selector("#executors tbody tr", timeout=WAIT_MS)
    (tmp_path / "publisher.py").write_text(PUBLISHER)
    (tmp_path / "subscriber.py").write_text(SUBSCRIBER)
    gate = tmp_path / "gate"
    source = up.submit(tmp_path / "publisher.py", "--name", "clicks-source", "--", str(gate))
    try:
        # No reload: the row comes with the server's next event.
        page.wait_for_selector(f"#queries tr[data-query='{source}']", timeout=WAIT_MS)
        counter = up.submit(tmp_path / "subscriber.py", "--name", "click-counter")
        page.wait_for_selector(f"#queries tr[data-query='{counter}']", timeout=WAIT_MS)
        page.wait_for_function(
            "() => Number(document.querySelector('#card-rate .figure').textContent"
            ".replace(/,/g, '')) > 0", timeout=WAIT_MS)
        _shot(page, "overview")
        page.click("nav a[data-view=graph]")
        topic = page.wait_for_selector("g.node.topic:has-text('clicks')", timeout=WAIT_MS)
        clicks = topic.get_attribute("data-id")
        # query -> topic -> query, each edge drawn between its ends
        page.wait_for_selector(f"g.edge[data-from='query:{source}'][data-to='{clicks}']",
                               timeout=WAIT_MS)
        page.wait_for_selector(f"g.edge[data-from='{clicks}'][data-to='query:{counter}']",
                               timeout=WAIT_MS)
        page.wait_for_selector(f"g.edge[data-from='query:{counter}']", timeout=WAIT_MS)
        _shot(page, "graph")
        # A click on a topic opens its page, with its partitions.
        page.click(f"g.node[data-id='{clicks}']")
        page.wait_for_selector("#partitions tbody tr", timeout=WAIT_MS)
        assert "clicks" in page.text_content("h1")
        _shot(page, "topic")
    finally:
        gate.write_text("")
    assert up.ended(source).state is QueryState.FINISHED
    page.close()


def test_the_kill_button_kills_for_its_owner_and_is_refused_to_others(
        up: Up, browser: Any, tmp_path: Path) -> None:
    base = up.info["console"]
    (tmp_path / "publisher.py").write_text(PUBLISHER)
    query_id = up.submit(tmp_path / "publisher.py", "--name", "doomed", "--",
                         str(tmp_path / "never"))
    wait_for(lambda: up.query(query_id).state is QueryState.RUNNING, timeout=60,
             what="the query to run")
    made = up.tq("user", "add", "carol", "--output", str(tmp_path / "carol.credential"))
    assert made.returncode == 0, made.stderr
    carol = kafka_password(load_credential(tmp_path / "carol.credential"))

    def kill_as(context: Any) -> Any:
        page = context.new_page()
        page.goto(f"{base}#/query/{query_id}")
        page.wait_for_selector("#query-state", timeout=WAIT_MS)
        page.click("#kill")
        return page

    # The query's page shows its output, live.
    anonymous = browser.new_context()
    page = anonymous.new_page()
    page.goto(f"{base}#/query/{query_id}")
    page.wait_for_selector("#logs:has-text('worker 0 publishes clicks')", timeout=WAIT_MS)
    _shot(page, "query")
    page = kill_as(anonymous)
    page.wait_for_selector("#kill-message:has-text('log in')", timeout=WAIT_MS)
    assert up.query(query_id).state is QueryState.RUNNING

    other = browser.new_context()
    page = other.new_page()
    wait_for(lambda: (_log_in(page, base, "carol", carol) or True), timeout=60,
             what="carol to log in")
    page = kill_as(other)
    page.wait_for_selector("#kill-message:has-text('not')", timeout=WAIT_MS)
    _shot(page, "kill-refused")
    assert up.query(query_id).state is QueryState.RUNNING

    owner = browser.new_context()
    _log_in(owner.new_page(), base, "admin", kafka_password(load_secret(up.info["secret_file"])))
    page = kill_as(owner)
    page.wait_for_selector("#query-state.state-killed", timeout=WAIT_MS)
    assert up.ended(query_id).state is QueryState.KILLED
    for context in (anonymous, other, owner):
        context.close()


BULK = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        with ctx.publish("bulk") as out:
            for t in range(20):
                out.send(t, ["x" * 200] * 500)
                out.advance_to(t + 1)
        while not Path(sys.argv[1]).exists():
            time.sleep(0.05)

    querylib.execute(main)
''')


def test_a_topic_page_shows_a_slow_subscribers_lag_rise_and_fall_to_zero(
        up: Up, browser: Any, tmp_path: Path) -> None:
    from querylib.broker import Data, Subscriber
    from querylib.cluster import Cluster

    (tmp_path / "bulk.py").write_text(BULK)
    gate = tmp_path / "gate"
    writer = up.submit(tmp_path / "bulk.py", "--name", "bulk-writer", "--", str(gate))
    try:
        with Cluster.connect(up.info["coordinator"], secret_file=up.info["secret_file"],
                             session=False) as cluster:
            info = wait_for(lambda: _topic(cluster, "bulk"), timeout=60, interval=0.2,
                            what="the bulk topic")
        address = info.brokers[info.topic.locations[0]]
        secret = load_secret(up.info["secret_file"])
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(f"{up.info['console']}#/topic/{info.topic.name}")
        page.wait_for_selector("#partitions tbody tr", timeout=WAIT_MS)
        # A subscriber that takes a little and reads nothing yet: 16 KiB of credit.
        with Subscriber(address, "bulk", [0], secret=secret, credit=16 * 1024,
                        start="earliest") as slow:
            page.wait_for_function(
                "() => [...document.querySelectorAll('#subscriptions tr[data-principal=admin]')]"
                ".some(row => Number(row.dataset.lag) > 5000)", timeout=WAIT_MS)
            _shot(page, "lag-high")
            received = 0
            while received < 10_000:  # read everything: the lag falls to 0
                event = slow.next_event(30)
                assert event is not None, "the subscriber got nothing for 30 s"
                if isinstance(event, Data):
                    received += len(event.records)
            page.wait_for_function(
                "() => [...document.querySelectorAll('#subscriptions tr[data-principal=admin]')]"
                ".some(row => row.dataset.lag === '0')", timeout=WAIT_MS)
            _shot(page, "lag-zero")
        page.close()
    finally:
        gate.write_text("")
    assert up.ended(writer).state is QueryState.FINISHED


def _topic(cluster: Any, name: str) -> Any:
    try:
        return cluster.lookup_topic(name)
    except Exception:  # noqa: BLE001 - not created yet
        return None


def test_a_link_that_does_not_decode_draws_a_page_saying_so(up: Up, browser: Any) -> None:
    """A hand-made or truncated link (`%E0` is half a character) must not stop the page's
    script: it draws the page of no such query or topic, and the navigation still works."""
    page = browser.new_page()
    for link in ("#/query/%E0", "#/topic/%E0%A4"):
        page.goto(up.info["console"] + link)
        page.wait_for_selector("#main h1", timeout=WAIT_MS)
        assert "No such" in page.text_content("#main")
    page.click("nav a[data-view=executors]")
    page.wait_for_selector("nav a.active[data-view=executors]", timeout=WAIT_MS)
    page.close()
