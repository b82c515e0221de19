"""Prometheus metrics (issue 18): `tq up` serves its process's metrics at the console's
/metrics, `tq executor --metrics-port` its own; each parsed with prometheus-client's parser
and checked against what the test did."""

from __future__ import annotations

import base64
import os
import subprocess
import textwrap
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client.parser import text_string_to_metric_families

from catalog import QueryState, UnknownQueryError
from querylib.cluster import Cluster
from querylib.rpc import kafka_password, load_secret
from tests.conftest import Processes, free_port, wait_for
from tests.coordinator._cluster import ROOT, CoordinatorProcess, tq_env
from tests.integration._up import Up

pytestmark = pytest.mark.timeout(300)

WRITER = textwrap.dedent('''
    import sys, time
    from pathlib import Path
    import querylib

    def main(ctx):
        with ctx.publish("measured") as out:
            for t in range(10):
                out.send(t, list(range(70)))
                out.advance_to(t + 1)
        while not Path(sys.argv[1]).exists():
            time.sleep(0.05)

    querylib.execute(main)
''')


def scrape(url: str, headers: dict[str, str] | None = None) -> dict[str, list]:
    """{sample name: [(labels, value), ...]} of the exposition at `url`."""
    with urllib.request.urlopen(urllib.request.Request(url, headers=headers or {}),
                                timeout=30) as reply:
        assert reply.headers["Content-Type"].startswith("text/plain")
        text = reply.read().decode()
    names = [line.split()[2] for line in text.splitlines() if line.startswith("# TYPE ")]
    assert len(names) == len(set(names)), "a metric family appears twice"
    samples: dict[str, list] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((sample.labels, sample.value))
    return samples


def value(samples: dict[str, list], name: str, **labels: str) -> float | None:
    found = [v for have, v in samples.get(name, []) if labels.items() <= have.items()]
    return found[0] if len(found) == 1 else None


def total(samples: dict[str, list], name: str, **labels: str) -> float:
    return sum(v for have, v in samples.get(name, []) if labels.items() <= have.items())


@pytest.fixture(scope="module")
def up(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Up]:
    with Up(tmp_path_factory.mktemp("tq-up"), "--console-port", str(free_port())) as running:
        yield running


def test_tq_up_metrics_count_what_a_query_wrote(up: Up, tmp_path: Path) -> None:
    url = up.info["console"] + "metrics"
    (tmp_path / "writer.py").write_text(WRITER)
    gate = tmp_path / "gate"
    query_id = up.submit(tmp_path / "writer.py", "--name", "measured", "--", str(gate))
    try:
        wait_for(lambda: value(scrape(url), "tq_partition_end_offset", topic="measured",
                               partition="0") is not None
                 and value(scrape(url), "tq_partition_end_offset", topic="measured",
                           partition="0") >= 700, timeout=60, interval=0.3,
                 what="the broker's metrics to count the query's 700 records")
        samples = wait_for(
            lambda: (s := scrape(url)) and value(s, "tq_query_process_rss_bytes",
                                                 query=str(query_id), process="0") and s,
            timeout=60, interval=0.3, what="a heartbeat with the query process's load")
        # 700 records and 10 frontiers (control batches) took offsets; frontier 10.
        assert value(samples, "tq_partition_end_offset", topic="measured") >= 700
        assert value(samples, "tq_partition_records_in_total", topic="measured") >= 700
        assert value(samples, "tq_partition_frontier", topic="measured") == 10
        assert value(samples, "tq_partition_size_bytes", topic="measured") > 0
        assert value(samples, "tq_partition_bytes_in_total", topic="measured") > 700 * 8
        # Nobody subscribes to it: nothing out; the catalog's topics are followed: out.
        assert value(samples, "tq_partition_bytes_out_total", topic="measured") == 0
        assert any(v > 0 for labels, v in samples["tq_partition_records_out_total"]
                   if labels["topic"].startswith("__catalog."))
        assert value(samples, "tq_queries", state="running") >= 1
        assert value(samples, "tq_coordinator_sessions", kind="query") >= 1
        assert value(samples, "tq_executors") == 1
        assert value(samples, "tq_executor_slots", state="used") >= 1
        # The query's partition is on one of the host's brokers (shards label theirs).
        assert total(samples, "tq_rpc_requests_total", server="broker",
                     type="broker.produce") >= 10
        assert value(samples, "tq_rpc_requests_total", server="coordinator",
                     type="coord.session.open") >= 1
        produce_count = total(samples, "tq_rpc_handler_seconds_count", server="broker",
                              type="broker.produce")
        assert produce_count == total(samples, "tq_rpc_requests_total", server="broker",
                                      type="broker.produce")
        assert total(samples, "tq_rpc_handler_seconds_bucket", server="broker",
                     type="broker.produce", le="+Inf") == produce_count
        # tq up, its executor child and the executor's broker shards (one broker per core):
        # each its own, the child's and the shards' labelled.
        rss = samples["process_resident_memory_bytes"]
        processes = sorted(labels.get("process", "") for labels, _ in rss)
        assert processes[:2] == ["", "executor"]
        assert processes[2:] == [f"shard-{k}" for k in range(1, len(processes) - 1)]
        assert all(v > 0 for _, v in rss)
    finally:
        gate.write_text("")
    assert up.ended(query_id).state is QueryState.FINISHED


def test_errors_are_counted_by_type(up: Up) -> None:
    url = up.info["console"] + "metrics"
    before = value(scrape(url), "tq_rpc_errors_total", server="coordinator",
                   type="coord.query.kill", error="UnknownQueryError") or 0
    with Cluster.connect(up.info["coordinator"], secret_file=up.info["secret_file"]) as cluster:
        with pytest.raises(UnknownQueryError):
            cluster.kill_query(987654)
    after = value(scrape(url), "tq_rpc_errors_total", server="coordinator",
                  type="coord.query.kill", error="UnknownQueryError")
    assert after == before + 1


def test_bound_elsewhere_metrics_need_a_principals_password(tmp_path: Path) -> None:
    port = free_port()
    with Up(tmp_path / "home", "--console-port", str(port), "--console-host", "0.0.0.0",
            "--insecure") as up:
        url = f"http://127.0.0.1:{port}/metrics"
        with pytest.raises(urllib.error.HTTPError) as refused:
            scrape(url)
        assert refused.value.code == 401
        password = kafka_password(load_secret(up.info["secret_file"]))
        token = base64.b64encode(f"admin:{password}".encode()).decode()
        samples = scrape(url, {"Authorization": f"Basic {token}"})
        assert value(samples, "tq_executors") == 1
        wrong = base64.b64encode(b"admin:" + b"0" * 32).decode()
        with pytest.raises(urllib.error.HTTPError):
            scrape(url, {"Authorization": f"Basic {wrong}"})


def test_an_executor_serves_its_own_metrics(tmp_path: Path) -> None:
    processes = Processes()
    try:
        coordinator = CoordinatorProcess(processes, tmp_path).start()
        port = free_port()
        executor = processes.python(
            "-m", "querylib.cli", "executor", "--coordinator", coordinator.address,
            "--data", str(tmp_path / "executor"), "--slots", "2", "--kafka-port", "-1",
            "--connector-port", "-1", "--metrics-port", str(port), env=tq_env(tmp_path),
            cwd=ROOT, stderr=subprocess.PIPE)
        url = f"http://127.0.0.1:{port}/metrics"

        def served() -> dict[str, list] | None:
            assert executor.poll() is None, executor.stderr.read()  # type: ignore[union-attr]
            try:
                return scrape(url)
            except OSError:
                return None

        samples = wait_for(served, timeout=60, interval=0.2, what="the executor's metrics")
        samples = wait_for(lambda: (s := scrape(url)) and value(s, "tq_host_cpu_percent")
                           is not None and s, timeout=60, interval=0.2,
                           what="a sampled load")
        assert value(samples, "tq_executor_slots", state="free") == 2
        # One series per broker of the host (shards merged in, one broker per core).
        brokers = [labels["broker"] for labels, _ in samples["tq_broker_sessions"]]
        assert len(brokers) == len(set(brokers)) == (os.cpu_count() or 1)
    finally:
        processes.stop_all()


def test_the_shards_metrics_are_merged_into_the_executors(tmp_path: Path) -> None:
    """`tq up --brokers 2`: the shard process's broker serves partitions too; its families
    reach the console's /metrics through the executor's, its process samples labelled."""
    with Up(tmp_path, "--brokers", "2", "--console-port", str(free_port())) as up:
        url = up.info["console"] + "metrics"
        with up.cluster() as cluster:
            (executor,) = [r for r, _ in cluster.snapshot("executors")["executors"].records]
        shard_id, = executor.shards
        with Cluster.connect(up.info["coordinator"],
                             secret_file=up.info["secret_file"]) as cluster:
            cluster.create_topic("spread", 2, ingest=True,
                                 locations=(executor.broker_id, shard_id))
        done = up.tq("produce", "spread", "--partition", "1", stdin="a\nb\nc\n")
        assert done.returncode == 0, done.stderr
        samples = wait_for(
            lambda: (s := scrape(url)) and value(s, "tq_partition_end_offset",
                                                 broker=str(shard_id), topic="spread",
                                                 partition="1") and s,
            timeout=60, interval=0.3, what="the shard's partition in /metrics")
        assert value(samples, "tq_partition_records_in_total", broker=str(shard_id),
                     topic="spread", partition="1") >= 3
        assert value(samples, "tq_broker_sessions", broker=str(shard_id)) is not None
        assert value(samples, "tq_rpc_requests_total", server="broker", process="shard-1",
                     type="broker.produce") >= 1
        rss = samples["process_resident_memory_bytes"]
        assert sorted(labels.get("process", "") for labels, _ in rss) == \
            ["", "executor", "shard-1"]
