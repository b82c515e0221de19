"""The replication_rf3_vs_rf1 bench row (querylib.bench._replication), run small: real broker
processes (a leader, two followers; a broker alone), the pubsub pair, the CPU figures."""

from __future__ import annotations

from querylib.bench._replication import rf3_vs_rf1


def test_rf3_vs_rf1_reports_each_brokers_cpu_per_record_beside_the_rates() -> None:
    row = rf3_vs_rf1(rounds=1, batches=5)
    figures = row["figures"]
    assert row["ratio"] > 0 and figures["rounds"] == 1 and figures["records"] == 5000
    cpu = figures["cpu_s_per_million_records"]
    assert set(cpu) == {"rf1_broker", "rf3_leader", "rf3_follower"}
    for spread in cpu.values():
        assert 0 <= spread["min"] <= spread["median"] <= spread["max"]
