"""`tq --help` lists the commands; a user error is one line. (`tq demo` itself runs in
tests/integration/test_demo.py: it needs Spark.)"""

import subprocess
import sys


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "querylib.cli", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "demo" in out and "log" in out


def test_user_error_is_one_line_and_nonzero(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "querylib.cli", "log", "dump",
                           str(tmp_path / "missing.log")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "tq: error:" in proc.stderr
