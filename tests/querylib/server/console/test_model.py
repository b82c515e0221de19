"""The console's model: catalog events and samples in, the pages' view out (pure)."""

from __future__ import annotations

from catalog import (
    SYSTEM,
    Executor,
    Publication,
    Query,
    QueryRef,
    QueryState,
    Resources,
    SessionRef,
    Subscription,
    Topic,
    TopicKind,
)
from querylib.cluster import HostLoad, ProcessLoad
from querylib.server.console import ClusterModel, PartitionSample


def query(query_id: int, name: str, state: QueryState = QueryState.RUNNING,
          processes: int = 1) -> Query:
    return Query(query_id=query_id, name=name, program="p.py", args=(), processes=processes,
                 workers=1, executors=(1,) * processes, state=state,
                 exit_codes=(None,) * processes, submitted_at_ms=1)


def topic(topic_id: int, name: str, partitions: int = 1, internal: bool = False,
          owner: object = None) -> Topic:
    return Topic(topic_id=topic_id, name=f"persistent://public/default/{name}",
                 partitions=partitions, record_type="bytes", kind=TopicKind.STREAM,
                 owner=owner or QueryRef(1), locations=(2,) * partitions, internal=internal,
                 created_at_ms=1)


def model_with(*, queries=(), topics=(), publications=(), subscriptions=()) -> ClusterModel:
    model = ClusterModel()
    for name, records in (("queries", queries), ("topics", topics),
                          ("publications", publications), ("subscriptions", subscriptions)):
        model.replace(name, 1, [(r, 1) for r in records])
    return model


def test_the_graph_links_a_publisher_query_through_its_topic_to_a_subscriber() -> None:
    model = model_with(
        queries=[query(1, "primes"), query(2, "sums")],
        topics=[topic(7, "numbers"), topic(8, "__catalog.queries", internal=True, owner=SYSTEM)],
        publications=[Publication(topic_id=7, publisher=QueryRef(1)),
                      Publication(topic_id=8, publisher=SYSTEM)],
        subscriptions=[Subscription(topic_id=7, subscriber=QueryRef(2)),
                       Subscription(topic_id=8, subscriber=SessionRef(5))])
    graph = model.view()["graph"]
    assert {(e["from"], e["to"]) for e in graph["edges"]} == {
        ("query:1", "topic:7"), ("topic:7", "query:2")}
    assert {n["id"] for n in graph["nodes"]} == {"query:1", "query:2", "topic:7"}


def test_ended_queries_leave_the_graph_and_a_diff_takes_records_away() -> None:
    running, finished = query(2, "sums"), query(2, "sums", QueryState.FINISHED)
    model = model_with(queries=[query(1, "primes"), running], topics=[topic(7, "numbers")],
                       publications=[Publication(topic_id=7, publisher=QueryRef(1))],
                       subscriptions=[Subscription(topic_id=7, subscriber=QueryRef(2))])
    model.update("queries", 2, [(running, -1), (finished, 1)])
    view = model.view()
    assert {(e["from"], e["to"]) for e in view["graph"]["edges"]} == {("query:1", "topic:7")}
    assert [q["state"] for q in view["queries"]] == ["running", "finished"]
    assert view["overview"]["queries"] == {"running": 1, "finished": 1}


def test_a_client_session_publishing_is_a_node_of_its_own() -> None:
    model = model_with(topics=[topic(7, "events", owner=SessionRef(3))],
                       publications=[Publication(topic_id=7, publisher=SessionRef(3))])
    graph = model.view()["graph"]
    assert graph["edges"] == [{"from": "session:3", "to": "topic:7", "topic": "events",
                               "records_per_s": 0.0}]
    assert {n["kind"] for n in graph["nodes"]} == {"client", "topic"}


def test_rates_come_from_successive_samples_of_the_end_offsets() -> None:
    model = model_with(topics=[topic(7, "numbers", partitions=2)])
    name = "persistent://public/default/numbers"

    def sample(ends: tuple[int, int], at: float) -> None:
        model.set_partitions([PartitionSample(name, p, 0, end, end * 10, 3, False)
                              for p, end in enumerate(ends)], at)

    sample((100, 50), 10.0)
    assert model.view()["topics"][0]["records_per_s"] == 0.0  # one sample: no rate yet
    sample((300, 150), 12.0)
    (view,) = model.view()["topics"]
    assert view["records_per_s"] == 150.0
    assert view["records"] == 450 and view["bytes"] == 4500
    assert [p["log_end"] for p in view["partitions"]] == [300, 150]
    sample((300, 150), 13.0)
    assert model.view()["topics"][0]["records_per_s"] == 0.0
    assert [h["records_per_s"] for h in model.view()["topics"][0]["history"]] == [150.0, 0.0]
    assert model.view()["overview"]["records_per_s"] == 0.0


def test_a_query_shows_each_process_with_the_load_its_executor_reported() -> None:
    model = model_with(queries=[query(4, "wide", processes=2)])
    model.replace("executors", 1, [(Executor(
        executor_id=1, session_id=None, host="h", broker_id=2, broker="tcp://b",
        resources=Resources(cores=2, memory=1, disk=1, slots=8), registered_at_ms=1), 1)])
    load = HostLoad(sampled_at_ms=1, cpu_percent=50.0, memory_used=10, memory_available=20,
                    disk_free=30, running=1,
                    per_process=(ProcessLoad(query_id=4, process=1, pid=4242, rss=1 << 20,
                                             cpu_percent=99.5, processes=1),))
    model.set_loads({1: load}, 5.0)
    view = model.view()
    (q,) = view["queries"]
    assert [(p["process"], p["pid"], p["cpu_percent"]) for p in q["processes"]] == [
        (0, None, None), (1, 4242, 99.5)]
    (executor,) = view["executors"]
    assert executor["load"]["cpu_percent"] == 50.0
    assert executor["history"] == [{"at": 5.0, "cpu_percent": 50.0, "memory_used": 10}]


def test_a_subscriptions_lag_in_records_and_in_logical_time() -> None:
    from querylib.server.console import SubscriptionSample

    model = model_with(queries=[query(1, "primes"), query(2, "slow")],
                       topics=[topic(7, "numbers")],
                       publications=[Publication(topic_id=7, publisher=QueryRef(1))],
                       subscriptions=[Subscription(topic_id=7, subscriber=QueryRef(2))])
    name = "persistent://public/default/numbers"
    for at, (end, frontier) in enumerate([(100, 1), (200, 2), (300, 3), (400, 4)]):
        model.set_partitions([PartitionSample(name, 0, 0, end, end, frontier, False)], at)
    model.set_subscriptions([SubscriptionSample(name, 0, "query:2", 210),
                             SubscriptionSample(name, 0, "admin", 400)])
    view = model.view()
    (numbers,) = view["topics"]
    slow, caught_up = sorted(numbers["subscriptions"], key=lambda s: s["principal"] != "query:2")
    # 190 records behind; at offset 210 the newest frontier sampled at or before it was 2
    assert (slow["lag_records"], slow["lag_time"], slow["who"]) == (190, 2, "query 2 slow")
    assert (caught_up["lag_records"], caught_up["lag_time"]) == (0, 0)
    (into_slow,) = [e for e in view["graph"]["edges"] if e["to"] == "query:2"]
    assert into_slow["lag_records"] == 190
    # Behind everything sampled: the records are known, the logical time is not.
    model.set_subscriptions([SubscriptionSample(name, 0, "query:2", 50)])
    (sub,) = model.view()["topics"][0]["subscriptions"]
    assert (sub["lag_records"], sub["lag_time"]) == (350, None)


def test_a_consumer_groups_lag_from_its_committed_offsets() -> None:
    model = model_with(topics=[topic(7, "orders")])
    name = "persistent://public/default/orders"
    for at, (end, frontier) in enumerate([(40, 4), (100, 9)]):
        model.set_partitions([PartitionSample(name, 0, 0, end, end, frontier, False)], at)
    model.set_groups([{"group_id": "billing", "state": "Stable", "generation": 1,
                       "protocol": "range", "members": [],
                       "committed": [{"topic": "orders", "partition": 0, "offset": 60},
                                     {"topic": "gone", "partition": 0, "offset": 5}]}])
    view = model.view()
    (billing,) = view["groups"]
    orders, gone = billing["committed"]
    assert (orders["log_end"], orders["lag_records"], orders["lag_time"]) == (100, 40, 5)
    assert (gone["log_end"], gone["lag_records"]) == (None, None)
    assert billing["lag_records"] == 40
    (topic_groups,) = [t["groups"] for t in view["topics"]]
    assert topic_groups == [{"group_id": "billing", "partition": 0, "offset": 60,
                             "lag_time": 5, "lag_records": 40}]
