"""The same-run comparison of two trees: which figures it compares, and how it is asked."""

from __future__ import annotations

import subprocess
import sys

from querylib.bench._compare import _sides, numeric_figures, row_name


def test_every_number_of_a_row_is_a_figure_under_its_dotted_key() -> None:
    row = {"name": "pubsub_x", "suite": "pubsub", "records": 10,
           "figures": {"records_per_s": 2.5e6, "cpu": {"broker_us": 300}},
           "note": "text", "ok": True, "peers": [1, 2]}
    assert dict(numeric_figures(row)) == {"records": 10.0, "figures.records_per_s": 2.5e6,
                                          "figures.cpu.broker_us": 300.0}


def test_rows_without_a_name_are_told_apart_by_what_identifies_them() -> None:
    # The Kafka suite names a row by "case", the Spark suite by "source" and "query": all of
    # one suite's rows once fell under "?" and their figures were pooled.
    assert row_name({"name": "pubsub_x", "records": 1}) == "pubsub_x"
    assert row_name({"case": "confluent_tuned", "mb_s": 300}) == "confluent_tuned"
    assert row_name({"source": "tq", "query": "count", "rows_s": 9}) == "tq/count"
    assert row_name({"source": "json", "query": "count"}) != row_name(
        {"source": "tq", "query": "count"})
    assert row_name({"records": 1}) == "?"


def test_the_ratio_is_this_tree_over_the_earlier_one_by_medians() -> None:
    out = _sides({"before": [100.0, 300.0, 200.0], "after": [150.0, 50.0, 600.0]})
    assert out["before"] == {"min": 100.0, "median": 200.0, "max": 300.0, "n": 3}
    assert out["after"]["median"] == 150.0
    assert out["ratio"] == 0.75
    assert _sides({"before": [0.0], "after": [1.0]})["ratio"] is None


def test_bad_arguments_get_a_clear_refusal() -> None:
    for argv, said in ((["--rounds", "0", "records"], "not a positive number"),
                       (["--against"], "needs a value"),
                       (["nosuch"], "unknown suite")):
        done = subprocess.run([sys.executable, "-m", "querylib.bench", *argv],
                              capture_output=True, text=True, timeout=60)
        assert done.returncode == 2 and said in done.stderr, (argv, done.stderr)
