"""Consumer groups in the console (issue 18): a confluent-kafka consumer group on a real
`tq up` shows with its member, what it was assigned, its committed offsets and its lag."""

from __future__ import annotations

import json
import shutil
import urllib.request
from collections.abc import Iterator
from typing import Any

import pytest

from tests.conftest import free_port, wait_for
from tests.integration._up_endpoints import UpWithEndpoints

confluent_kafka = pytest.importorskip("confluent_kafka")

pytestmark = pytest.mark.timeout(240)


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[UpWithEndpoints]:
    with UpWithEndpoints(tmp_path_factory.mktemp("tq-up-console-groups"),
                         "--connector-port", "-1", "--kafka-port", str(free_port()),
                         "--console-port", str(free_port())) as running:
        yield running


def _state(up: UpWithEndpoints) -> dict[str, Any]:
    with urllib.request.urlopen(up.info["console"] + "api/state", timeout=30) as reply:
        return json.loads(reply.read())


def test_a_consumer_group_shows_its_member_offsets_and_lag(up: UpWithEndpoints) -> None:
    producer = confluent_kafka.Producer({"bootstrap.servers": up.info["kafka"]})
    for i in range(100):
        producer.produce("orders", value=f"order {i}".encode())
    assert producer.flush(30) == 0
    consumer = confluent_kafka.Consumer({
        "bootstrap.servers": up.info["kafka"], "group.id": "billing",
        "client.id": "billing-1", "auto.offset.reset": "earliest",
        "enable.auto.commit": False, "session.timeout.ms": 6000})
    try:
        consumer.subscribe(["orders"])
        seen: list[Any] = []
        wait_for(lambda: (m := consumer.poll(0.2)) is not None and not m.error()
                 and seen.append(m) is None and len(seen) >= 60, timeout=60,
                 what="60 records through the group")
        consumer.commit(message=seen[59], asynchronous=False)  # offsets 0..59 are done

        def shown() -> dict[str, Any] | None:
            groups = {g["group_id"]: g for g in _state(up)["groups"]}
            billing = groups.get("billing")
            if billing is None or not billing["members"] or not billing["committed"]:
                return None
            return billing if billing["committed"][0]["lag_records"] is not None else None

        billing = wait_for(shown, timeout=60, interval=0.3,
                           what="the console to show the group with its commit")
        (member,) = billing["members"]
        assert member["client_id"] == "billing-1"
        assert member["assignment"] == {"orders": [0]}
        (committed,) = billing["committed"]
        assert (committed["topic"], committed["partition"], committed["offset"]) == \
            ("orders", 0, 60)
        assert committed["log_end"] >= 100 and committed["lag_records"] == \
            committed["log_end"] - 60
        assert billing["state"] == "Stable"
        (orders,) = [t for t in _state(up)["topics"] if t["short_name"] == "orders"]
        assert [(g["group_id"], g["offset"]) for g in orders["groups"]] == [("billing", 60)]
        # The same figures as metrics.
        from tests.integration.test_metrics_up import scrape, value

        samples = scrape(up.info["console"] + "metrics")
        labels = {"group": "billing", "topic": "orders", "partition": "0"}
        assert value(samples, "tq_consumer_group_committed_offset", **labels) == 60
        assert value(samples, "tq_consumer_group_lag_records", **labels) == \
            committed["log_end"] - 60
        # And tq status, from the coordinator's GetGroups and the brokers' ends.
        out = up.tq("status").stdout
        assert "  group billing [Stable] 1 member" in out, out
        assert f"    orders partition 0: committed 60, lag {committed['log_end'] - 60} records" \
            in out, out
        body = json.loads(up.tq("status", "--json").stdout)
        (group,) = [g for g in body["groups"] if g["group_id"] == "billing"]
        assert group["committed"] == [{"topic": "orders", "partition": 0, "offset": 60,
                                       "lag_records": committed["log_end"] - 60}]
        _screenshot_groups(up)
    finally:
        consumer.close()


def _screenshot_groups(up: UpWithEndpoints) -> None:
    """The groups page in a real browser, kept as an artifact (when chromium is here)."""
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    if chromium is None:
        return
    from playwright.sync_api import sync_playwright

    from tests.integration.test_console_browser import ARTIFACTS, CHROMIUM_ARGS

    errors: list[str] = []
    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=chromium, headless=True,
                                             args=CHROMIUM_ARGS)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 800})
            page.on("pageerror", lambda error: errors.append(str(error)))
            page.goto(up.info["console"] + "#/groups")
            page.wait_for_selector("tr[data-committed='billing/orders/0']", timeout=60_000)
            ARTIFACTS.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(ARTIFACTS / "groups.png"), full_page=True)
        finally:
            browser.close()
    assert errors == [], "the console's script failed in the browser"
