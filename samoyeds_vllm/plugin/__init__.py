"""The vLLM plugin: the `samoyeds` quantization config (config.py), its fused-MoE method (moe_method.py), routing
(routing.py) and the expert computation as a torch custom op (ops.py). It imports the format and the kernels,
never the offline tools or the benchmarks."""
