#!/bin/bash
# As run on one H200 (143771 MiB, driver 580.159.04), 2026-11-29 00:50-01:04, main at 411eb8f (harness 4; every
# served load of a server through one `vllm bench serve` client process, tools/serve_client.py), vLLM 0.26.0, torch
# 2.11.0+cu130, one variant after the other on the same GPU. off.sh is ../e2e-mixes-h200/off.sh; bench-e2e-*.log are
# its logs, server-*.log.gz the servers', serve-*.log the client's output per load.
source .ab/setup.sh
MODEL=qwen3-30b-a3b VARIANTS=samoyeds-fp8 DIR=sv1 TL=560 bash .ab/off.sh --stages serving,capacity --concurrency 16,64,256
MODEL=qwen3-30b-a3b VARIANTS=dense-fp8 DIR=sv1 TL=570 bash .ab/off.sh --stages serving,capacity --concurrency 16,64,256
