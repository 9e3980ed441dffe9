"""`bench routing` on a GPU: DeepSeek-V3's routing (256 experts in 8 groups, top-8) through vLLM's CUDA router and
softmax top-k through vLLM's fused kernel, each checked against vLLM's plain-torch path and then timed with our
experts, on DeepSeek-V3's experts shrunk to a few hundred MB."""

import json

import torch

from samoyeds_vllm.bench.routing import bench_routing, preset_config
from samoyeds_vllm.format import Pattern

BF16_TOLERANCE = 1e-2  # as tests/gpu/test_kernels.py: bf16 operands, fp32 accumulation


def test_bench_routing_checks_and_times_both_routings(tmp_path):
    config = dict(preset_config("deepseek-v3"), hidden_size=1024, moe_intermediate_size=512)
    out = tmp_path / "routing.json"
    tokens = [1, 64, 1000]
    bench_routing("deepseek-v3", tokens, ["softmax", "deepseek-v3"], Pattern.parse("samoyeds"), torch.bfloat16,
                  out, config=config)  # fmt: skip
    result = json.loads(out.read_text())
    assert (result["num_experts"], result["hidden"], result["top_k"]) == (256, 1024, 8)
    assert len(result["routings"]["softmax"]["kernels"]) == 1  # vLLM's fused top-k softmax, one launch
    assert result["routings"]["deepseek-v3"]["kernels"]  # profiled: the list names what vLLM's router ran
    assert [row["tokens"] for row in result["rows"]] == tokens
    k, experts = result["top_k"], result["num_experts"]
    for row in result["rows"]:
        for r in row["routings"]:
            assert r["check"]["tokens"] == row["tokens"] and r["check"]["differing"] <= r["check"]["near_ties"]
            assert k <= r["distinct_experts"] <= min(k * row["tokens"], experts)
            assert r["layer"]["rel_err_own"] < BF16_TOLERANCE and r["experts"]["rel_err_own"] < BF16_TOLERANCE
            assert 0 < r["route_us"] < r["layer"]["us"] and r["experts"]["us"] > 0
        assert set(row["overhead_pct"]) == set(row["extra_routing_pct"]) == {"deepseek-v3"}
