"""The plugin without an engine: registration through the entry point, the config, routing and the expert op."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F
from helpers import reference_route

import samoyeds_vllm
from samoyeds_vllm.format import Pattern, compress, prune
from samoyeds_vllm.plugin import ops
from samoyeds_vllm.plugin.config import SamoyedsConfig
from samoyeds_vllm.plugin.routing import route

PATTERNS = [Pattern.parse("2:4"), Pattern.parse("samoyeds"), Pattern.parse("samoyeds", 64)]


def test_entry_point_registers_in_a_fresh_process():
    """vLLM only logs plugin failures, so check in a new interpreter that the method really is registered."""
    code = (
        "from vllm.plugins import load_general_plugins\n"
        "load_general_plugins(); load_general_plugins()\n"  # idempotent
        "from vllm.model_executor.layers.quantization import get_quantization_config, QUANTIZATION_METHODS\n"
        "cls = get_quantization_config('samoyeds')\n"
        "print(cls.__module__, cls.__name__, QUANTIZATION_METHODS.count('samoyeds'))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split()[-3:] == ["samoyeds_vllm.plugin.config", "SamoyedsConfig", "1"]
    samoyeds_vllm.register()
    samoyeds_vllm.register()


def test_config_from_checkpoint_and_defaults():
    packed = SamoyedsConfig.from_config(
        {
            "quant_method": "samoyeds",
            "format_version": 1,
            "pattern": "samoyeds",
            "segment": 64,
            "sparse_modules": ["model.layers.*.mlp.experts.*.up_proj"],
        }
    )
    assert packed.packed and packed.pattern == Pattern.parse("samoyeds", 64)
    on_load = SamoyedsConfig.from_config({"quant_method": "samoyeds", "pattern": "2:4"})
    assert not on_load.packed and on_load.pattern == Pattern.parse("2:4")
    default = SamoyedsConfig()  # what `--quantization samoyeds` on a dense checkpoint builds
    assert not default.packed and default.pattern == Pattern.parse("samoyeds", 128)
    assert default.get_name() == "samoyeds" and torch.float32 in default.get_supported_act_dtypes()


@pytest.mark.parametrize(
    "config, words",
    [
        ({"format_version": 3, "pattern": "samoyeds"}, "format_version 3 is not supported"),
        ({"format_version": 2, "pattern": "samoyeds"}, "quantized values need values one of float8_e4m3fn"),
        ({"format_version": 1, "values": "float8_e4m3fn"}, "values 'float8_e4m3fn' needs format_version 2"),
        ({"values": "int4"}, "not values 'int4'"),
        ({"format_version": 1, "pattern": "1:8"}, "unknown sparsity pattern '1:8'"),
        ({"format_version": 1, "pattern": "samoyeds", "segment": 96}, "segment must be one of"),
    ],
)
def test_config_rejects_unknown_versions_and_patterns(config, words):
    with pytest.raises(ValueError, match=words):
        SamoyedsConfig.from_config({"quant_method": "samoyeds", **config})


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("groups", [None, (4, 2)])
def test_routing_matches_the_definition(renormalize, groups):
    logits = torch.randn(37, 16)
    num_groups, topk_group = groups or (None, None)
    weights, ids = route(logits, 3, renormalize, num_groups, topk_group)
    ref_weights, ref_ids = reference_route(logits, 3, renormalize, num_groups, topk_group)
    assert torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values)
    order = ids.argsort(-1)
    assert torch.allclose(weights.gather(-1, order).double(), ref_weights.gather(-1, ref_ids.argsort(-1)), atol=1e-6)
    if groups:  # every token's experts come from at most topk_group groups
        assert all(len(set((row // 4).tolist())) <= topk_group for row in ids)


def make_experts(pattern, num_experts, hidden, inter, dtype, generator):
    w13 = prune(torch.randn(num_experts, 2 * inter, hidden, generator=generator).to(dtype), pattern)
    w2 = prune(torch.randn(num_experts, hidden, inter, generator=generator).to(dtype), pattern)
    return w13, w2, compress(w13, pattern), compress(w2, pattern)


def dense_moe_reference(x, topk_weights, topk_ids, w13, w2):
    """The MoE layer in float64 with the pruned dense weights: sum_k w_k * W2 (SiLU(W1 x) * W3 x)."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for w, e in zip(topk_weights[t].tolist(), topk_ids[t].tolist(), strict=True):
            if e < 0:
                continue
            gate, up = (w13[e].double() @ x[t].double()).chunk(2)
            out[t] += w * (w2[e].double() @ (F.silu(gate) * up))
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("pattern", PATTERNS, ids=str)
def test_expert_op_matches_dense_reference(pattern, dtype):
    gen = torch.Generator().manual_seed(7)
    num_experts, hidden, inter, tokens, top_k = 6, 128, 256, 23, 2
    w13, w2, p13, p2 = make_experts(pattern, num_experts, hidden, inter, dtype, gen)
    x = torch.randn(tokens, hidden, generator=gen).to(dtype)
    topk_weights, topk_ids = route(torch.randn(tokens, num_experts, generator=gen), top_k, True)
    topk_ids[0, 1] = -1  # an expert that lives on another rank contributes nothing
    out = ops.moe_experts(x, topk_weights, topk_ids, p13, p2, pattern)
    ref = dense_moe_reference(x, topk_weights, topk_ids, w13, w2)
    assert out.dtype == dtype and out.shape == x.shape
    rel = ((out.double() - ref).norm() / ref.norm()).item()
    assert rel < (1e-6 if dtype == torch.float32 else 1e-2)


def test_expert_op_fake_and_schema():
    """torch.compile traces the op through its fake implementation: check the registration is consistent."""
    pattern = Pattern.parse("samoyeds")
    gen = torch.Generator().manual_seed(0)
    _, _, p13, p2 = make_experts(pattern, 4, 128, 128, torch.float32, gen)
    x = torch.randn(5, 128, generator=gen)
    weights, ids = route(torch.randn(5, 4, generator=gen), 2, False)
    args = (x, weights, ids, *p13, *p2, pattern.name, pattern.segment)
    torch.library.opcheck(torch.ops.samoyeds.moe_experts.default, args, test_utils=("test_schema", "test_faketensor"))
