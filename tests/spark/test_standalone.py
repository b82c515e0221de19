"""The tq source and sink on a real Spark standalone cluster: a master and two workers started
from the pyspark package (`spark-class org.apache.spark.deploy.master.Master` / `...Worker`) on
127.0.0.1, beside a tq coordinator and its broker. The job is run as a user runs one: a driver
script of their own, from their own directory, that builds a plain SparkSession against the
master and never imports querylib, so Spark must find `tq` by itself (pyspark_tq)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from querylib.broker import Producer
from querylib.cluster import Cluster
from querylib.records import encode_batch
from querylib.rpc import load_secret
from querylib.spark import JavaNotFoundError, ensure_java
from tests.conftest import Processes, free_port, wait_for
from tests.coordinator._cluster import CoordinatorProcess

pytestmark = pytest.mark.spark

RECORDS = 1000  # values "0".."999" over 4 partitions


class Standalone:
    def __init__(self, master: str, coordinator: str, secret_file: str) -> None:
        self.master = master
        self.coordinator = coordinator
        self.secret_file = secret_file


def _spark_env(spark_home: str, logs: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env.update(SPARK_HOME=spark_home, SPARK_LOCAL_IP="127.0.0.1", SPARK_LOG_DIR=str(logs),
               PYSPARK_PYTHON=sys.executable, PYSPARK_DRIVER_PYTHON=sys.executable)
    return env


def _alive_workers(web_ui: str) -> int:
    try:
        with urllib.request.urlopen(f"{web_ui}/json/", timeout=5) as answer:
            state = json.load(answer)
    except (OSError, ValueError):  # not up yet, or a page the master has not filled yet
        return 0
    return sum(w["state"] == "ALIVE" for w in state["workers"])


@pytest.fixture(scope="module")
def standalone(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Standalone]:
    """One Spark master with two workers (one core each), and a tq coordinator with topic
    `nums` of 4 partitions written through its broker. Everything is stopped at the end."""
    try:
        ensure_java()
    except JavaNotFoundError as exc:
        pytest.skip(str(exc))
    import pyspark

    spark_home = os.path.dirname(pyspark.__file__)
    spark_class = os.path.join(spark_home, "bin", "spark-class")
    base = tmp_path_factory.mktemp("standalone")
    env = _spark_env(spark_home, base)
    processes = Processes()
    try:
        port, web = free_port(), free_port()
        master = f"spark://127.0.0.1:{port}"
        with open(base / "master.log", "wb") as log:
            processes.start([spark_class, "org.apache.spark.deploy.master.Master", "--host",
                             "127.0.0.1", "--port", str(port), "--webui-port", str(web)],
                            env=env, stdout=log, stderr=subprocess.STDOUT)
        for i in range(2):
            with open(base / f"worker{i}.log", "wb") as log:
                processes.start([spark_class, "org.apache.spark.deploy.worker.Worker", "--host",
                                 "127.0.0.1", "--port", str(free_port()), "--webui-port",
                                 str(free_port()), "--cores", "1", "--memory", "1g",
                                 "--work-dir", str(base / f"work{i}"), master],
                                env=env, stdout=log, stderr=subprocess.STDOUT)

        home = base / "tq"
        home.mkdir()
        CoordinatorProcess(processes, home).start()
        info = json.loads((home / "cluster.json").read_text())
        secret = load_secret(info["secret_file"])
        with Cluster(info["coordinator"], secret) as session:
            topic = session.create_topic("nums", 4, ingest=True)
        broker = topic.brokers[topic.topic.locations[0]]
        for p in range(4):
            with Producer(broker, "nums", p, secret=secret) as producer:
                producer.send_batch(encode_batch([
                    (1000, None, b"%d" % i, ()) for i in range(p, RECORDS, 4)]))
                producer.close(end=False)

        wait_for(lambda: _alive_workers(f"http://127.0.0.1:{web}") == 2, timeout=180,
                 interval=0.2, what="two Spark workers registered with the master")
        yield Standalone(master, info["coordinator"], info["secret_file"])
    finally:
        processes.stop_all()


JOB = '''
import json, sys, time
from pyspark.sql import SparkSession

master, coordinator, secret_file, out = sys.argv[1:]
spark = (SparkSession.builder.master(master).appName("tq on standalone")
         .config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress", "127.0.0.1")
         .config("spark.ui.enabled", "false").config("spark.executor.memory", "512m")
         .config("spark.executor.cores", "1").config("spark.sql.shuffle.partitions", "4")
         .getOrCreate())
spark.sparkContext.setLogLevel("ERROR")
deadline = time.monotonic() + 120
while spark.sparkContext._jsc.sc().getExecutorIds().size() < 2:
    assert time.monotonic() < deadline, "the two workers' executors did not register"
    time.sleep(0.1)
tq = {"coordinator": coordinator, "secretFile": secret_file}

def read(topic):
    return spark.read.format("tq").options(**tq).option("subscribe", topic).load()

def totals(df):
    row = df.selectExpr("count(*) AS n", "sum(CAST(CAST(value AS string) AS long)) AS s").first()
    return [row.n, row.s]

result = {"executors": spark.sparkContext._jsc.sc().getExecutorIds().size()}
nums = read("nums")
result["tasks"] = nums.rdd.getNumPartitions()
result["nums"] = totals(nums)

# write: into a topic that does not exist yet, created with 4 partitions
nums.select("value").write.format("tq").options(**tq).option("topic", "copied") \\
    .option("partitions", "4").mode("append").save()
result["copied"] = totals(read("copied"))

# stream with a checkpoint, into tq: a second run after more was written reads only the rest
def stream():
    query = (spark.readStream.format("tq").options(**tq).option("subscribe", "copied")
             .option("startingOffsets", "earliest").option("maxOffsetsPerTrigger", "300").load()
             .select("value").writeStream.format("tq").options(**tq).option("topic", "streamed")
             .option("checkpointLocation", out + "/checkpoint").trigger(availableNow=True)
             .start())
    query.awaitTermination(300)
    assert query.exception() is None, query.exception()

stream()
result["streamed"] = totals(read("streamed"))
nums.select("value").write.format("tq").options(**tq).option("topic", "copied") \\
    .mode("append").save()
stream()
result["restreamed"] = totals(read("streamed"))
with open(out + "/result.json", "w") as f:
    json.dump(result, f)
spark.stop()
'''


def test_a_job_on_a_standalone_cluster_reads_streams_and_writes(standalone: Standalone,
                                                                tmp_path: Path) -> None:
    job = tmp_path / "job.py"
    job.write_text(JOB)
    env = _spark_env(os.path.dirname(__import__("pyspark").__file__), tmp_path)
    done = subprocess.run([sys.executable, str(job), standalone.master, standalone.coordinator,
                           standalone.secret_file, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=600)
    errors = [line for line in done.stderr.splitlines() if "Error" in line or "Exception" in line]
    assert done.returncode == 0, "\n".join(errors[:20]) or done.stderr[-3000:]
    result = json.loads((tmp_path / "result.json").read_text())
    total = sum(range(RECORDS))
    assert result == {
        "executors": 2,
        "tasks": 4,
        "nums": [RECORDS, total],
        "copied": [RECORDS, total],
        "streamed": [RECORDS, total],
        "restreamed": [2 * RECORDS, 2 * total],
    }
