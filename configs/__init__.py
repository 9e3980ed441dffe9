"""Model presets (configs/models/*.json) and kernel tables, shipped as package data (samoyeds_vllm.configs)."""
