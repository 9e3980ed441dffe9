"""DeepSeek-V2/V3 in vLLM on a GPU, where vLLM runs MLA (its CPU backend does not: tests/integration has the CPU
side, with VLLM_MLA_DISABLE=1).

- float32 (vLLM's MLA kernels have none, so it expands keys and values per head, as on CPU): vLLM's CUDA router
  and the experts' reference op on CUDA give transformers' greedy tokens on the pruned export;
- float16 with MLA, the samoyeds kernels and CUDA graphs: the tokens of vLLM's own fused MoE on the same pruned
  weights under the same engine settings (the experts are the only difference).
"""

import json

import pytest
from helpers import MAX_TOKENS, PROMPTS, hf_greedy_tokens, run_engine

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.tools.convert import convert
from samoyeds_vllm.tools.model_maker import make_model, write_weights

FAMILIES = ["deepseek_v2", "deepseek_v3"]
TORCH_ROTARY = ("--compilation-config", json.dumps({"custom_ops": ["-rotary_embedding"]}))
#: DeepSeek-V2-Lite's attention: vLLM's MLA kernels are built for DeepSeek's head dimensions (a 512 + 64 latent).
MLA_SHAPE = {
    "num_attention_heads": 16,
    "num_key_value_heads": 16,
    "kv_lora_rank": 512,
    "qk_rope_head_dim": 64,
    "qk_nope_head_dim": 128,
    "v_head_dim": 128,
}


def converted(arch: str, root, dtype: str = "float32", **changes):
    """A tiny random model of `arch` (its config changed by `changes`) converted to samoyeds, and its pruned
    export."""
    dense = make_model(arch, "tiny", root / "dense", dtype=dtype, seed=0)
    if changes:  # the same tokenizer and side files, weights of the changed shapes
        config = dict(json.loads((dense / "config.json").read_text()), **changes)
        (dense / "config.json").write_text(json.dumps(config))
        for weights in dense.glob("*.safetensors"):
            weights.unlink()
        write_weights(dense, config)
    sparse, pruned = root / "sparse", root / "pruned"
    convert(dense, sparse, Pattern.parse("samoyeds"), export_dense=pruned, progress=False)
    return sparse, pruned


@pytest.mark.parametrize("arch", FAMILIES)
def test_float32_on_cuda_matches_transformers(arch, tmp_path):
    sparse, pruned = converted(arch, tmp_path)
    tokens, log = run_engine(sparse, *TORCH_ROTARY, env={"VLLM_MLA_DISABLE": "1"})
    assert "quantization=samoyeds" in log
    assert tokens == hf_greedy_tokens(pruned, PROMPTS, MAX_TOKENS)


@pytest.mark.parametrize("arch", FAMILIES)
def test_mla_with_the_kernels_matches_vllms_fused_moe(arch, tmp_path):
    sparse, pruned = converted(arch, tmp_path, dtype="float16", **MLA_SHAPE)
    tokens, log = run_engine(sparse, "--compile", dtype="float16")
    assert "quantization=samoyeds" in log
    assert "reference implementation" not in log  # every experts layer ran the kernels
    reference, _ = run_engine(pruned, "--compile", dtype="float16")
    assert tokens == reference
