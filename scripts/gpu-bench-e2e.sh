#!/usr/bin/env bash
# On the project's GPU machine (vLLM from ../shared/device: `source /tmp/vllm-env.sh` first): `bench e2e` within
# one time-limited call. Results accumulate in $OUT/e2e-NAME; variant files of an earlier call, copied back into
# e2e-run/NAME (copy the returned variant-*.json there: untracked files travel with the working tree), are
# restored first, so a run cut short resumes where it stopped.
#   usage: scripts/gpu-bench-e2e.sh NAME [bench e2e arguments...]
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
OUT="${OUT:-$ROOT/gpu-out}"
NAME="$1"
shift
cd "$ROOT"
python3 -m pip install -q --no-deps --no-build-isolation -e . 2>&1 | tail -2
mkdir -p "$OUT/e2e-$NAME"
cp "e2e-run/$NAME"/variant-*.json "$OUT/e2e-$NAME/" 2>/dev/null || true
export PYTHONUNBUFFERED=1 VLLM_USE_FLASHINFER_SAMPLER=0
timeout "${E2E_TIMEOUT:-540}" python3 -m samoyeds_vllm.cli bench e2e --out "$OUT/e2e-$NAME" "$@" 2>&1 \
  | tr '\r' '\n' | grep -v " it/s\]$\|s/it\]$" | tail -40
# The machine returns only a few files: keep the results, pack the logs.
cd "$OUT/e2e-$NAME" && rm -rf models && tar czf logs.tar.gz --remove-files *.log serve-*.json throughput-*.json 2>/dev/null; ls "$OUT/e2e-$NAME"
