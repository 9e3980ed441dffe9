"""Offline tools: model families (architectures.py), safetensors checkpoint IO (checkpoint_io.py), the converter
(convert.py) and its pruning scores (pruning.py), random models (model_maker.py, presets.py, tokenizer.py), random
MoE layer problems (moe_problem.py) and running vLLM as a user does (vllm_server.py). They import the format, the
kernels and the plugin; the plugin and the kernels never import them."""
