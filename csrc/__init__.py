"""CUDA sources, shipped as package data (samoyeds_vllm.csrc) and compiled at first use by samoyeds_vllm.kernels."""
