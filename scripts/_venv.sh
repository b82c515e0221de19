# Sourced by scripts/*: create or refresh the project's venv and install tq into it.
# Works on a fresh machine: only python3 (>= 3.11) with venv is assumed.
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
VENV="${TQ_VENV:-$ROOT/.venv}"
EXTRAS="${1:-test}"
if [ ! -x "$VENV/bin/python" ]; then
    python3 -m venv "$VENV"
fi
# Reinstall only when the project's metadata changed since the last install.
STAMP="$VENV/.tq-installed-$EXTRAS"
if [ ! -f "$STAMP" ] || [ "$ROOT/pyproject.toml" -nt "$STAMP" ]; then
    "$VENV/bin/python" -m pip install --quiet --upgrade pip
    "$VENV/bin/python" -m pip install --quiet -e "$ROOT[$EXTRAS]"
    touch "$STAMP"
fi
# Byte-compile tq's own modules: query processes start often, and where PYTHONDONTWRITEBYTECODE
# is set nothing else would cache them (stale files are simply recompiled in memory).
"$VENV/bin/python" -m compileall -q -j 0 "$ROOT/catalog" "$ROOT/coordinator" "$ROOT/executor" \
    "$ROOT/querylib" "$ROOT/pyspark_tq.py" >/dev/null || true
export PATH="$VENV/bin:$PATH"
cd "$ROOT"
