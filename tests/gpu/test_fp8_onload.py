"""Sparsify on load from an FP8 block-quantized checkpoint on a GPU, where vLLM runs the FP8 block GEMMs of the
layers the experts' method leaves to its Fp8Config (its CPU build has none; tests/integration has the CPU side,
with only the experts quantized).

- experts alone quantized, bfloat16: the samoyeds kernels on the experts dequantized, pruned and packed on load
  give the tokens of the checkpoint converted first;
- every projection quantized (as Qwen3-*-FP8): attention runs vLLM's Fp8LinearMethod on the checkpoint's FP8
  weights, routers and the LM head stay unquantized, the experts run the kernels; the checkpoint converted first
  (format version 3, its other layers' FP8 weights kept) gives the same tokens.
"""

import json
import subprocess
import sys

from helpers import ENV, MAX_TOKENS, PROMPTS, fp8_experts_only, rewrite_checkpoint, run_engine

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.tools.convert import convert
from samoyeds_vllm.tools.model_maker import make_model


def test_fp8_experts_on_load_with_the_kernels_match_converting_first(tmp_path):
    fp8 = make_model("qwen3_moe", "tiny", tmp_path / "fp8", dtype="bfloat16", fp8_block=True)
    experts_only = rewrite_checkpoint(fp8, tmp_path / "experts-only", fp8_experts_only)
    convert(experts_only, tmp_path / "converted", Pattern.parse("samoyeds"), progress=False)
    reference, _ = run_engine(tmp_path / "converted", dtype="bfloat16")
    tokens, log = run_engine(experts_only, "--quantization", "samoyeds", dtype="bfloat16")
    assert "quantization=samoyeds" in log
    assert "reference implementation" not in log  # every experts layer ran the kernels
    assert tokens == reference


def test_fp8_checkpoint_converted_first_matches_sparsify_on_load(tmp_path):
    fp8 = make_model("qwen3_moe", "tiny", tmp_path / "fp8", dtype="bfloat16", fp8_block=True)
    convert(fp8, tmp_path / "converted", Pattern.parse("samoyeds"), progress=False)
    quant = json.loads((tmp_path / "converted" / "config.json").read_text())["quantization_config"]
    assert quant["format_version"] == 3
    reference, converted_log = run_engine(tmp_path / "converted", dtype="bfloat16")
    tokens, log = run_engine(fp8, "--quantization", "samoyeds", dtype="bfloat16")
    assert "reference implementation" not in converted_log + log
    assert tokens == reference


#: An engine in this process (no engine-core process), so apply_model sees the model: each module's method.
METHODS_SCRIPT = """
import json, os, sys
from vllm import LLM, SamplingParams
llm = LLM(sys.argv[1], quantization="samoyeds", dtype="bfloat16", enforce_eager=True, gpu_memory_utilization=0.3)
methods = llm.apply_model(lambda model: {
    name: type(module.quant_method).__name__
    for name, module in model.named_modules() if getattr(module, "quant_method", None) is not None
})[0]
outputs = llm.generate(json.loads(sys.argv[2]), SamplingParams(temperature=0, max_tokens=int(sys.argv[3])))
with open(sys.argv[4], "w") as f:
    json.dump({"methods": methods, "tokens": [o.outputs[0].token_ids for o in outputs]}, f)
os._exit(0)
"""


def test_fp8_checkpoint_keeps_vllms_fp8_linears(tmp_path):
    fp8 = make_model("qwen3_moe", "tiny", tmp_path / "fp8", dtype="bfloat16", fp8_block=True)
    out = tmp_path / "methods.json"
    env = dict(ENV, VLLM_ENABLE_V1_MULTIPROCESSING="0", VLLM_ALLOW_INSECURE_SERIALIZATION="1")
    cmd = [sys.executable, "-c", METHODS_SCRIPT, str(fp8), json.dumps(PROMPTS), str(MAX_TOKENS), str(out)]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=env)
    assert result.returncode == 0, (result.stdout + result.stderr)[-6000:]
    found = json.loads(out.read_text())
    methods = found["methods"]
    for layer in range(2):
        prefix = f"model.layers.{layer}"
        assert methods[f"{prefix}.self_attn.qkv_proj"] == "Fp8LinearMethod"
        assert methods[f"{prefix}.self_attn.o_proj"] == "Fp8LinearMethod"
        assert methods[f"{prefix}.mlp.gate"] == "UnquantizedLinearMethod"
        # the experts layer (vLLM's runner may hold it under .mlp.experts)
        assert {m for n, m in methods.items() if n.startswith(f"{prefix}.mlp.experts")} == {"SamoyedsMoEMethod"}
    assert "reference implementation" not in result.stdout + result.stderr
    assert [len(t) for t in found["tokens"]] == [MAX_TOKENS] * len(PROMPTS)
