"""Benchmarks behind `samoyeds-vllm bench`: the MoE layer against vLLM's fused MoE (layer.py, timed by timing.py) and
whole models in vLLM, dense against sparse (e2e.py); what vLLM's profiler traces hold (trace.py). Only the CLI and
the scripts in benchmarks/ import them."""
