"""The program `querylib.submit` builds, without a cluster: its pack holds the runner, the
metadata and the pickle; the runner runs the function under `execute`, and refuses a pack from
another Python version or with a tampered pickle with one line and exit code 2."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from catalog.errors import UserError
from querylib.api import _runner
from querylib.api._submit import build_program


def _unpack(pack: bytes, dest: Path) -> list[str]:
    with tarfile.open(fileobj=io.BytesIO(pack)) as tar:
        tar.extractall(dest, filter="data")
        return tar.getnames()


def test_the_pack_is_runner_metadata_and_pickle(tmp_path: Path) -> None:
    offset = 7
    pack = build_program(lambda ctx, n: n + offset, (1,))
    assert _unpack(pack, tmp_path) == ["__main__.py", "function.pkl", "submitted.json"]
    fn, args, kwargs, name = _runner._load(tmp_path)
    assert (fn(None, *args, **kwargs), name) == (8, "test_the_pack_is_runner_metadata_and_"
                                                    "pickle.<locals>.<lambda>")


@pytest.mark.parametrize(("change", "message"), [
    ({"python": [2, 7]}, "pickled on Python 2.7"),
    ({"sha256": "0" * 64}, "does not match its recorded sha256"),
])
def test_the_runner_refuses_a_pack_it_cannot_trust(
        tmp_path: Path, capsys: pytest.CaptureFixture[str], change: dict[str, object],
        message: str) -> None:
    _unpack(build_program(print), tmp_path)
    meta = json.loads((tmp_path / "submitted.json").read_text())
    (tmp_path / "submitted.json").write_text(json.dumps(meta | change))
    with pytest.raises(SystemExit) as exit_info:
        _runner.main(tmp_path)
    assert exit_info.value.code == 2
    (line,) = capsys.readouterr().err.splitlines()
    assert line.startswith("querylib.submit: ") and message in line


def test_the_runner_calls_the_function_once_per_worker(tmp_path: Path,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[object] = []
    monkeypatch.setattr("querylib.execute", lambda main: calls.append(main("ctx")))
    _unpack(build_program(lambda ctx, a, b=0: (ctx, a, b), (1,), {"b": 2}), tmp_path)
    assert _runner.main(tmp_path) == 0
    assert calls == [("ctx", 1, 2)]


def test_what_cannot_be_pickled_is_a_user_error() -> None:
    import threading

    with pytest.raises(UserError, match="cannot pickle"):
        build_program(print, (threading.Lock(),))
    with pytest.raises(UserError, match="needs a function"):
        build_program(42)  # type: ignore[arg-type]
