"""A query process registers before it loads what only publishing, subscribing or the submitted
function need (DESIGN §6 "Query process start"): a fresh interpreter that imports the
registration path (`querylib.execute`, the submit runner, the cluster session) has none of the
record codecs, broker clients, catalog follower, Kafka codecs or cloudpickle in `sys.modules`;
and the submit runner unpickles once, before `execute` registers (as a program's own imports
come first), reporting a function that cannot load with exit code 2."""

from __future__ import annotations

import hashlib
import io
import json
import operator
import pickle
import subprocess
import sys
import tarfile
import threading
from pathlib import Path
from typing import Any

import pytest

from querylib.api import _runner
from querylib.api._submit import build_program

# What a query process must not import before it is registered (the start barrier).
HEAVY = ("querylib.records", "querylib.broker._stream", "querylib.broker._blocking",
         "querylib.broker._producer", "querylib.broker._session", "querylib.cluster._follow",
         "querylib.cluster._topic_io", "querylib.cluster._queries", "querylib.kafka",
         "querylib.log", "querylib.api._publisher", "querylib.api._subscription",
         "querylib.api._submit", "querylib.api.serdes", "querylib.rpc._server",
         "querylib.rpc._bench", "crc32c", "cloudpickle", "kio")

# What the submit runner's __main__ runs up to `execute`, and what `execute` runs up to the
# session (resolving every name it calls).
REGISTRATION_PATH = """
import json, sys
import querylib
from querylib.api._runner import main
querylib.execute
from querylib.api._context import Context, _open
from querylib.api._runtime import Runtime
from querylib.cluster import Cluster
Cluster.connect
print(json.dumps(sorted(sys.modules)))
"""


def _unpack(pack: bytes, dest: Path) -> None:
    with tarfile.open(fileobj=io.BytesIO(pack)) as tar:
        tar.extractall(dest, filter="data")


def _fresh_modules(code: str) -> list[str]:
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    return json.loads(done.stdout)


def test_the_registration_path_loads_no_codec_client_or_pickler() -> None:
    loaded = _fresh_modules(REGISTRATION_PATH)
    heavy = [m for m in loaded if any(m == h or m.startswith(h + ".") for h in HEAVY)]
    assert heavy == []
    assert "querylib.cluster._session" in loaded  # the path itself did load


def test_the_lazy_names_still_resolve_in_a_fresh_interpreter() -> None:
    code = ("import json, sys, querylib, querylib.api, querylib.cluster\n"
            "from querylib.cluster import CollectionFollower, Cluster, find_query\n"
            "from querylib.api import Publisher, Subscription, serdes, submit\n"
            "names = [(p.__name__, n) for p in (querylib, querylib.api, querylib.cluster)\n"
            "         for n in p.__all__ if getattr(p, n, None) is None]\n"
            "print(json.dumps(names))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          timeout=60, check=True)
    assert json.loads(done.stdout) == []


class _Unloadable:
    """Unpickles as operator.truediv(1, 0): a function whose load fails on the executor."""

    def __reduce__(self) -> tuple[Any, tuple[int, int]]:
        return (operator.truediv, (1, 0))


def _fake_execute(events: list[str], workers: int) -> Any:
    """Stands for `querylib.execute`: 'registers', then runs main on `workers` threads and
    raises the first failure, as execute does."""

    def execute(main: Any) -> list[Any]:
        events.append("registered")
        errors: list[BaseException] = []

        def run(worker: int) -> None:
            try:
                events.append(f"ran {main(f'ctx{worker}')}")
            except BaseException as exc:  # handed to the caller below
                errors.append(exc)

        threads = [threading.Thread(target=run, args=(w,)) for w in range(workers)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            raise errors[0]
        return []

    return execute


def test_the_runner_unpickles_once_before_it_registers(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[str] = []
    monkeypatch.setattr("querylib.execute", _fake_execute(events, workers=3))
    loads = []
    real_loads = pickle.loads
    monkeypatch.setattr(_runner.pickle, "loads",
                        lambda blob: loads.append(events[:]) or real_loads(blob))
    _unpack(build_program(lambda ctx, n: n, (5,)), tmp_path)
    assert _runner.main(tmp_path) == 0
    assert loads == [[]]  # once for all workers, before registering
    assert sorted(events[1:]) == ["ran 5"] * 3


def test_a_function_that_cannot_load_exits_2_with_one_line(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        capsys: pytest.CaptureFixture[str]) -> None:
    events: list[str] = []
    monkeypatch.setattr("querylib.execute", _fake_execute(events, workers=2))
    _unpack(build_program(print), tmp_path)
    blob = pickle.dumps((_Unloadable(), (), {}))
    (tmp_path / "function.pkl").write_bytes(blob)
    meta = json.loads((tmp_path / "submitted.json").read_text())
    meta["sha256"] = hashlib.sha256(blob).hexdigest()
    (tmp_path / "submitted.json").write_text(json.dumps(meta))
    with pytest.raises(SystemExit) as exit_info:
        _runner.main(tmp_path)
    assert exit_info.value.code == 2
    assert events == []  # the query's start fails: this process never registered
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("querylib.submit: cannot unpickle") and "ZeroDivisionError" in line
