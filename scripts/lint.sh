#!/usr/bin/env bash
# ruff (configured in pyproject.toml): lint and formatting, in the CPU environment of scripts/env.sh.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
VENV="$(bash "$ROOT/scripts/env.sh" | tail -n 1)"
cd "$ROOT"
"$VENV/bin/ruff" check .
"$VENV/bin/ruff" format --check .
