#!/usr/bin/env bash
# Run the tests on any machine with Python 3.11 and PyPI access: builds (or reuses) the CPU environment with
# real vLLM 0.26.0 (scripts/env.sh), then runs pytest in it. Extra arguments go to pytest.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/env.sh" | tail -n 1)"
cd "$ROOT"
exec "$VENV/bin/python" -m pytest "$@"
