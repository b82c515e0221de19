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


def _tq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "querylib.cli", *args], capture_output=True,
                          text=True)


def test_version_is_the_installed_one():
    from importlib.metadata import version

    done = _tq("--version")
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"tq {version('tq')}"


def test_help_lists_every_command_once_under_its_group():
    from querylib.cli import build_parser, commands

    out = _tq("--help").stdout
    top = [words[0] for words, _ in commands(build_parser()) if len(words) == 1]
    sections: dict[str, list[str]] = {}
    current = None
    for line in out.splitlines():
        if line.endswith(":") and not line.startswith(" "):
            current = line[:-1]
            sections[current] = []
        elif current is not None and line.startswith("  ") and not line.startswith("   "):
            sections[current].append(line.split()[0])
    assert list(sections)[:4] == ["cluster", "queries", "topics", "tools"], out
    listed = [name for group in ("cluster", "queries", "topics", "tools")
              for name in sections[group]]
    assert sorted(listed) == sorted(top), out  # every command, once, none under "other"
    assert "other" not in sections
    assert "usage: tq [-h] [--version] COMMAND ..." in out


def test_every_command_ends_its_help_with_an_example_that_parses():
    import shlex

    from querylib.cli import build_parser, commands

    found = commands(build_parser())
    assert len(found) > 20
    for words, command in found:
        text = command.format_help()
        assert "\nexample: " in text, f"tq {' '.join(words)} --help has no example"
        example = text.split("\nexample: ", 1)[1].splitlines()[0]
        argv = shlex.split(example.split("#", 1)[0].split("| ", 1)[-1])
        assert argv[0] == "tq" and argv[1:1 + len(words)] == list(words), example
        try:
            build_parser().parse_args(argv[1:])
        except SystemExit as exc:  # argparse refused it: the example is wrong
            raise AssertionError(f"example of tq {' '.join(words)} does not parse: "
                                 f"{example}") from exc
