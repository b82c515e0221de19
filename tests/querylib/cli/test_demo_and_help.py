"""The README's two entry points stay alive: `tq --help` and `tq demo`."""

import subprocess
import sys


def test_help_lists_commands():
    out = subprocess.run([sys.executable, "-m", "querylib.cli", "--help"], capture_output=True,
                         text=True, check=True).stdout
    assert "demo" in out and "log" in out


def test_demo_writes_reads_back_and_dumps(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "querylib.cli", "demo", "--events", "300"],
                          cwd=tmp_path, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert "wrote and read back 300 records and 11 control batches" in proc.stdout
    assert "compresscodec: zstd" in proc.stdout and "isControl: true" in proc.stdout
    assert list((tmp_path / "tq-data" / "clicks-0").glob("00000000000000000000.log"))


def test_user_error_is_one_line_and_nonzero(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "querylib.cli", "log", "dump",
                           str(tmp_path / "missing.log")], capture_output=True, text=True)
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1 and "tq: error:" in proc.stderr
