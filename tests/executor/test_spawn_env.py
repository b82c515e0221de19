"""The pure parts of spawning: environment, entry, work directories, command, sources."""

import pytest

from executor import (
    ExecFailedError,
    FetchFailedError,
    FetchReason,
    InvalidArtifactError,
    SpawnSpec,
    parse_source,
    query_environment,
    resolve_entry,
)
from executor._spawn import LAUNCHER, launch_command, make_work_dir

DIGEST = "ab" * 32


def test_environment_carries_the_tq_variables_and_drops_stale_ones():
    spec = SpawnSpec(query_id=4, process=1, processes=3, workers=2,
                     coordinator="tcp://c:7400", peers=("tcp://a:1", "tcp://b:2"),
                     credentials="/s/credential.json", broker="tcp://127.0.0.1:7500", executor_id=9,
                     env={"USER_VAR": "u", "TQ_QUERY_ID": "forged"}, name="clicks")
    base = {"PATH": "/bin", "TQ_COORDINATOR": "tcp://stale:1", "TQ_HOME": "/h",
            "TQ_SOMETHING": "x"}
    env = query_environment(spec, base=base, work_dir="/w/4-1-0")
    assert env == {
        "PATH": "/bin", "TQ_HOME": "/h", "USER_VAR": "u",
        "TQ_QUERY_ID": "4", "TQ_QUERY_NAME": "clicks", "TQ_PROCESS_INDEX": "1",
        "TQ_PROCESS_COUNT": "3",
        "TQ_WORKERS": "2", "TQ_COORDINATOR": "tcp://c:7400",
        "TQ_PEERS": "tcp://a:1,tcp://b:2", "TQ_CREDENTIALS": "/s/credential.json",
        "TQ_BROKER": "tcp://127.0.0.1:7500", "TQ_EXECUTOR_ID": "9", "TQ_WORK_DIR": "/w/4-1-0",
        "TQ_FAILURE_FILE": "/w/4-1-0/.tq-failure", "PYTHONUNBUFFERED": "1"}


def test_entry_is_named_or_main_or_the_only_file(tmp_path):
    single = tmp_path / "single"
    single.mkdir()
    (single / "job.py").write_text("")
    assert resolve_entry(single) == (single / "job.py").resolve()
    tree = tmp_path / "tree"
    (tree / "pkg").mkdir(parents=True)
    (tree / "__main__.py").write_text("")
    (tree / "pkg" / "run.py").write_text("")
    assert resolve_entry(tree) == (tree / "__main__.py").resolve()
    assert resolve_entry(tree, "pkg/run.py") == (tree / "pkg" / "run.py").resolve()


def test_entry_failures_are_exec_failures(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    (tree / "a.py").write_text("")
    (tree / "b.py").write_text("")
    with pytest.raises(ExecFailedError, match="no __main__.py"):
        resolve_entry(tree)
    with pytest.raises(ExecFailedError, match="no file"):
        resolve_entry(tree, "c.py")
    with pytest.raises(ExecFailedError, match="outside"):
        resolve_entry(tree, "../tree/../../etc/passwd")


def test_work_directories_are_fresh_and_numbered(tmp_path):
    spec = SpawnSpec(query_id=3, process=0)
    first, n0 = make_work_dir(tmp_path, spec)
    (first / "leftover").write_text("")
    second, n1 = make_work_dir(tmp_path, spec)
    other, m0 = make_work_dir(tmp_path, SpawnSpec(query_id=3, process=1))
    assert (first.name, second.name, other.name) == ("3-0-0", "3-0-1", "3-1-0")
    assert (n0, n1, m0) == (0, 1, 0)
    assert list(second.iterdir()) == []


def test_work_directory_failure_is_an_exec_failure(tmp_path):
    (tmp_path / "file").write_text("")
    with pytest.raises(ExecFailedError, match="work directory"):
        make_work_dir(tmp_path / "file", SpawnSpec(query_id=1, process=0))


def test_the_command_goes_through_the_launcher(tmp_path):
    argv = launch_command("/py", tmp_path / "job.py", ["a", "b"], errfd=7, parent_pid=42,
                          launcher_python="/launcher-py")
    assert argv == ["/launcher-py", "-I", "-S", str(LAUNCHER), "7", "42", "--", "/py",
                    str(tmp_path / "job.py"), "a", "b"]


def test_sources_parse_by_scheme():
    assert parse_source(f"sha256:{DIGEST}").kind == "upload"
    assert parse_source(f"sha256:{DIGEST.upper()}").digest == DIGEST
    src = parse_source("file:///srv/job.py", digest=DIGEST)
    assert (src.kind, src.location, src.digest) == ("file", "/srv/job.py", DIGEST)
    assert parse_source("https://h/x/job.py").kind == "http"
    assert parse_source("http://h/x/job.py").digest is None


@pytest.mark.parametrize("source", ["ftp://h/job.py", "job.py", "/abs/job.py",
                                    "file://otherhost/job.py", "file:relative.py", "http://"])
def test_other_sources_are_unsupported(source):
    with pytest.raises(FetchFailedError) as caught:
        parse_source(source)
    assert caught.value.reason == FetchReason.UNSUPPORTED
    assert not caught.value.retriable


@pytest.mark.parametrize("bad", ["sha256:abc", "sha256:" + "g" * 64, "sha256:"])
def test_bad_digests_are_refused(bad):
    with pytest.raises(InvalidArtifactError):
        parse_source(bad)
    with pytest.raises(InvalidArtifactError):
        parse_source("file:///x.py", digest=bad)


def test_upload_source_and_digest_must_agree():
    with pytest.raises(InvalidArtifactError, match="disagree"):
        parse_source(f"sha256:{DIGEST}", digest="cd" * 32)
