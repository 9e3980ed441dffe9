"""The plugin without an engine: registration through the entry point, the config, routing and the expert op."""

import subprocess
import sys

import pytest
import torch
import torch.nn.functional as F

import samoyeds_vllm
from samoyeds_vllm import ops
from samoyeds_vllm.formats import Pattern, compress, prune
from samoyeds_vllm.quantization import SamoyedsConfig

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
    assert result.stdout.split()[-3:] == ["samoyeds_vllm.quantization", "SamoyedsConfig", "1"]
    samoyeds_vllm.register()
    samoyeds_vllm.register()


def test_config_from_checkpoint_and_defaults():
    packed = SamoyedsConfig.from_config({"quant_method": "samoyeds", "format_version": 1, "pattern": "samoyeds",
                                         "segment": 64, "sparse_modules": ["model.layers.*.mlp.experts.*.up_proj"]})
    assert packed.packed and packed.pattern == Pattern.parse("samoyeds", 64)
    on_load = SamoyedsConfig.from_config({"quant_method": "samoyeds", "pattern": "2:4"})
    assert not on_load.packed and on_load.pattern == Pattern.parse("2:4")
    default = SamoyedsConfig()  # what `--quantization samoyeds` on a dense checkpoint builds
    assert not default.packed and default.pattern == Pattern.parse("samoyeds", 128)
    assert default.get_name() == "samoyeds" and torch.float32 in default.get_supported_act_dtypes()


@pytest.mark.parametrize("config, words", [
    ({"format_version": 2, "pattern": "samoyeds"}, "format_version 2 is not supported"),
    ({"format_version": 1, "pattern": "1:8"}, "unknown sparsity pattern '1:8'"),
    ({"format_version": 1, "pattern": "samoyeds", "segment": 96}, "segment must be one of"),
])
def test_config_rejects_unknown_versions_and_patterns(config, words):
    with pytest.raises(ValueError, match=words):
        SamoyedsConfig.from_config({"quant_method": "samoyeds", **config})


def reference_route(logits, top_k, renormalize, groups=None, topk_group=None):
    """Routing spelled out token by token, in float64."""
    weights, ids = [], []
    for row in torch.softmax(logits.double(), -1):
        allowed = torch.ones_like(row, dtype=torch.bool)
        if groups:
            best = row.view(groups, -1).amax(-1).topk(topk_group).indices
            allowed = torch.zeros(groups, dtype=torch.bool).index_fill(0, best, True).repeat_interleave(
                row.numel() // groups)
        order = sorted(range(row.numel()), key=lambda e: (-float(row[e]) if allowed[e] else 1.0, e))[:top_k]
        w = row[order]
        weights.append(w / w.sum() if renormalize else w)
        ids.append(order)
    return torch.stack(weights), torch.tensor(ids)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("groups", [None, (4, 2)])
def test_routing_matches_the_definition(renormalize, groups):
    logits = torch.randn(37, 16)
    num_groups, topk_group = groups or (None, None)
    weights, ids = ops.route(logits, 3, renormalize, num_groups, topk_group)
    ref_weights, ref_ids = reference_route(logits, 3, renormalize, num_groups, topk_group)
    assert torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values)
    order = ids.argsort(-1)
    assert torch.allclose(weights.gather(-1, order).double(), ref_weights.gather(-1, ref_ids.argsort(-1)),
                          atol=1e-6)
    if groups:  # every token's experts come from at most topk_group groups
        assert all(len(set((row // 4).tolist())) <= topk_group for row in ids)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs an NVIDIA GPU (vLLM's CUDA top-k softmax)")
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("experts,top_k", [(128, 8), (8, 2), (60, 4), (64, 6)])  # Qwen3, Mixtral, Qwen1.5, DS-V2
def test_routing_on_cuda_uses_vllms_fused_kernel_and_matches_the_definition(experts, top_k, renormalize, dtype):
    assert ops._fused_topk_softmax() is not None, "vLLM's CUDA ops are not loaded"
    logits = torch.randn(300, experts, generator=torch.Generator().manual_seed(experts)).to(dtype)
    weights, ids = ops.route(logits.cuda(), top_k, renormalize)
    ref_weights, ref_ids = reference_route(logits.float(), top_k, renormalize)
    assert weights.dtype == torch.float32 and ids.dtype == torch.int64
    weights, ids = weights.cpu(), ids.cpu()
    # bf16 logits tie often (8-bit mantissa), and which of two tied experts is picked is arbitrary: compare the
    # chosen weights there, and the ids too for fp32 logits.
    assert torch.allclose(weights.sort(-1).values.double(), ref_weights.sort(-1).values, atol=1e-5)
    if dtype == torch.float32:
        assert torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values)
    assert ((ids >= 0) & (ids < experts)).all() and all(len(set(row)) == top_k for row in ids.tolist())


def make_experts(pattern, num_experts, hidden, inter, dtype, generator):
    w13 = prune(torch.randn(num_experts, 2 * inter, hidden, generator=generator).to(dtype), pattern)
    w2 = prune(torch.randn(num_experts, hidden, inter, generator=generator).to(dtype), pattern)
    return w13, w2, compress(w13, pattern), compress(w2, pattern)


def dense_moe_reference(x, topk_weights, topk_ids, w13, w2):
    """The MoE layer in float64 with the pruned dense weights: sum_k w_k * W2 (SiLU(W1 x) * W3 x)."""
    out = torch.zeros(x.shape, dtype=torch.float64)
    for t in range(x.shape[0]):
        for w, e in zip(topk_weights[t].tolist(), topk_ids[t].tolist()):
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
    topk_weights, topk_ids = ops.route(torch.randn(tokens, num_experts, generator=gen), top_k, True)
    topk_ids[0, 1] = -1  # an expert that lives on another rank contributes nothing
    out = torch.ops.samoyeds.moe_experts(x, topk_weights, topk_ids, *p13, *p2, pattern.segment or 0)
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
    weights, ids = ops.route(torch.randn(5, 4, generator=gen), 2, False)
    torch.library.opcheck(torch.ops.samoyeds.moe_experts.default, (x, weights, ids, *p13, *p2, 128),
                          test_utils=("test_schema", "test_faketensor"))
