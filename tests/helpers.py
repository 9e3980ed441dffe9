"""Small helpers shared by the test modules."""

from pathlib import Path

import torch

from samoyeds_vllm.checkpoint import CheckpointReader


def read_checkpoint(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a model directory (single file or sharded), by name."""
    reader = CheckpointReader(model_dir)
    return {name: reader.get(name) for name in reader.names()}


def leftovers(parent: Path) -> list[str]:
    """Temporary directories an interrupted write could have left next to its target."""
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".replaced-" in p.name)


REPO = Path(__file__).resolve().parent.parent
PROMPTS = ["The quick brown fox", "Sparse experts make inference", "Once upon a time, in a land far away"]


def hf_greedy_tokens(model_dir: Path, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuation token ids from Hugging Face transformers in float32 (the reference for vLLM)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    results = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=max_new_tokens, min_new_tokens=max_new_tokens, do_sample=False)
        results.append(out[0, ids.shape[1]:].tolist())
    return results
