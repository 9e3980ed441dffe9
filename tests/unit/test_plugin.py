"""The plugin without an engine: registration through the entry point, the config, routing and the expert op."""

import subprocess
import sys
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from helpers import reference_route
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.config import FusedMoEParallelConfig

import samoyeds_vllm
from samoyeds_vllm.format import SUFFIXES, Pattern, compress, prune
from samoyeds_vllm.plugin import moe_method, ops
from samoyeds_vllm.plugin.config import SamoyedsConfig
from samoyeds_vllm.plugin.routing import Routing, route

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


def test_a_model_without_routed_experts_is_refused(tiny_models):
    """vLLM hands the model's config over before building it: one without routed experts (a dense Llama) would
    serve dense under --quantization samoyeds without a word, so it is refused; every supported family passes,
    multimodal Llama-4 through its text config."""
    from transformers import AutoConfig, LlamaConfig

    with pytest.raises(ValueError, match=r"model_type 'llama' has no routed experts .*serve this model without it"):
        SamoyedsConfig().maybe_update_config("llama", hf_config=LlamaConfig())
    for model_dir in tiny_models.values():  # raises nothing
        SamoyedsConfig().maybe_update_config(str(model_dir), hf_config=AutoConfig.from_pretrained(model_dir))


def test_a_damaged_checkpoint_file_is_refused_by_name(tiny_models, tmp_path):
    """A shard cut short (a copy that did not finish) failed in vLLM's loader with safetensors' "incomplete
    metadata", naming no file; a shard the index names but the folder lacks, likewise later."""
    import json
    import shutil

    model = shutil.copytree(tiny_models["qwen3_moe"], tmp_path / "model")
    (shard,) = model.glob("*.safetensors")
    SamoyedsConfig().maybe_update_config(str(model))  # whole: raises nothing
    with open(shard, "r+b") as f:
        f.truncate(shard.stat().st_size - 1000)
    with pytest.raises(ValueError, match=rf"{shard.name}: corrupted or truncated .*metadata.*did not finish"):
        SamoyedsConfig().maybe_update_config(str(model))
    shard.unlink()
    index = {"metadata": {}, "weight_map": {"model.embed_tokens.weight": "model-00001-of-00002.safetensors"}}
    (model / "model.safetensors.index.json").write_text(json.dumps(index))
    with pytest.raises(ValueError, match="model-00001-of-00002.safetensors: listed in .*index.json but missing"):
        SamoyedsConfig().maybe_update_config(str(model))
    (model / "model.safetensors.index.json").write_text("{")
    with pytest.raises(ValueError, match="not a valid safetensors index"):
        SamoyedsConfig().maybe_update_config(str(model))


#: An FP8 block-quantized checkpoint's quantization_config (Qwen3-*-FP8).
FP8_BLOCKS = {"quant_method": "fp8", "activation_scheme": "dynamic", "weight_block_size": [128, 128]}


def test_config_of_a_checkpoint_converted_from_fp8_blocks():
    """Format version 3: the packed experts run the method (nothing to dequantize on load), every other layer
    vLLM's FP8 config of the checkpoint it was converted from."""
    from vllm.model_executor.layers.fused_moe import RoutedExperts

    config = SamoyedsConfig.from_config(
        {
            "quant_method": "samoyeds",
            "format_version": 3,
            "values": "float8_e4m3fn",
            "scale": "channel",
            "other_layers": FP8_BLOCKS,
        }
    )
    assert config.packed and config.values == torch.float8_e4m3fn
    assert config.fp8 is not None and config.fp8.weight_block_size == [128, 128]
    assert config.expert_suffixes == {SUFFIXES[p] for p in ("values", "meta", "rowsel", "scale")}
    experts = RoutedExperts.__new__(RoutedExperts)
    experts.moe_config = SimpleNamespace()
    method = config.get_quant_method(experts, "model.layers.0.mlp.experts")
    assert type(method).__name__ == "SamoyedsMoEMethod" and method.fp8_block is None
    bf16_values = SamoyedsConfig.from_config(
        {"quant_method": "samoyeds", "format_version": 3, "other_layers": FP8_BLOCKS}
    )
    assert bf16_values.values is None and bf16_values.fp8 is not None


@pytest.mark.parametrize(
    "config, words",
    [
        ({"format_version": 4, "pattern": "samoyeds"}, "format_version 4 is not supported"),
        ({"format_version": 3, "pattern": "samoyeds"}, "format_version 3 needs other_layers"),
        ({"format_version": 3, "other_layers": {"quant_method": "awq"}}, "format_version 3 needs other_layers"),
        (
            {"format_version": 3, "other_layers": {"quant_method": "fp8", "weight_block_size": [128]}},
            "other_layers: fp8 quantization_config: weight_block_size",
        ),
        (
            {"format_version": 2, "values": "float8_e4m3fn", "scale": "channel", "other_layers": FP8_BLOCKS},
            "needs format_version 3",
        ),
        ({"format_version": 2, "pattern": "samoyeds"}, "quantized values need values one of float8_e4m3fn"),
        ({"format_version": 1, "values": "float8_e4m3fn"}, "values 'float8_e4m3fn' needs format_version 2"),
        ({"values": "int4"}, "not values 'int4'"),
        ({"format_version": 1, "pattern": "1:8"}, "unknown sparsity pattern '1:8'"),
        ({"format_version": 1, "pattern": "samoyeds", "segment": 96}, "segment must be one of"),
        # a misspelt key (through --hf-overrides) left the pattern at its default and served 75% unnoticed
        ({"patern": "2:4"}, r"unknown key 'patern' \(it takes format_version, other_layers, pattern, "),
        ({"pattern": "samoyeds", "segment": "128"}, "segment wants a number, not '128'"),
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
    routing = Routing(3, renormalize, use_grouped_topk=bool(groups), num_expert_group=num_groups, topk_group=topk_group)
    weights, ids = route(logits, routing)
    ref_weights, ref_ids = reference_route(logits, 3, renormalize, num_groups, topk_group)
    assert torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values)
    order = ids.argsort(-1)
    assert torch.allclose(weights.gather(-1, order).double(), ref_weights.gather(-1, ref_ids.argsort(-1)), atol=1e-6)
    if groups:  # every token's experts come from at most topk_group groups
        assert all(len(set((row // 4).tolist())) <= topk_group for row in ids)


def assert_same_routing(got, expected):
    """Same experts per token (in any order) and the same weight for each, to float tolerance."""
    (weights, ids), (ref_weights, ref_ids) = got, expected
    assert weights.dtype == torch.float32 and ids.shape == ref_ids.shape
    ids, ref_ids = ids.long(), ref_ids.long()
    assert torch.equal(ids.sort(-1).values, ref_ids.sort(-1).values)
    order, ref_order = ids.argsort(-1), ref_ids.argsort(-1)
    assert torch.allclose(weights.gather(-1, order), ref_weights.float().gather(-1, ref_order), rtol=1e-5, atol=1e-6)


def deepseek_v3_router(experts, top_k, groups, topk_group, renormalize, scale, bias):
    """transformers' DeepSeek-V3 router (GLM-4.5 and Kimi-K2 route the same way) on identity gate weights, so
    that its hidden states are the logits."""
    from transformers.models.deepseek_v3.configuration_deepseek_v3 import DeepseekV3Config
    from transformers.models.deepseek_v3.modeling_deepseek_v3 import DeepseekV3TopkRouter

    config = DeepseekV3Config(
        hidden_size=experts, n_routed_experts=experts, num_experts_per_tok=top_k, n_group=groups,
        topk_group=topk_group, norm_topk_prob=renormalize, routed_scaling_factor=scale,
    )  # fmt: skip
    router = DeepseekV3TopkRouter(config)
    with torch.no_grad():
        router.weight.copy_(torch.eye(experts))
        router.e_score_correction_bias.copy_(bias)
    return lambda logits: router(logits)[1:]


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize(
    "tokens, experts, top_k, groups, topk_group, scale",
    [(33, 256, 8, 8, 4, 2.5), (7, 64, 6, 8, 3, 1.0), (20, 16, 4, 4, 2, 1.5), (5, 32, 4, 1, 1, 1.0)],
    ids=["deepseek-v3", "small-groups", "tiny", "one-group"],
)
def test_sigmoid_bias_grouped_routing_matches_transformers_deepseek_v3(
    tokens, experts, top_k, groups, topk_group, scale, renormalize
):
    """Sigmoid scores, the score-correction bias for selection only, groups scored by their top-2 biased scores,
    the scaling factor: vLLM's grouped (and, with one group, bias-only) router against transformers'."""
    gen = torch.Generator().manual_seed(experts + top_k)
    logits, bias = torch.randn(tokens, experts, generator=gen), torch.rand(experts, generator=gen) * 0.5
    routing = Routing(
        top_k, renormalize, "sigmoid", use_grouped_topk=groups > 1, num_expert_group=groups, topk_group=topk_group,
        e_score_correction_bias=bias, routed_scaling_factor=scale,
    )  # fmt: skip
    assert type(routing.router).__name__ == ("GroupedTopKRouter" if groups > 1 else "FusedTopKBiasRouter")
    expected = deepseek_v3_router(experts, top_k, groups, topk_group, renormalize, scale, bias)(logits)
    assert_same_routing(route(logits, routing), expected)


def vllm_native_grouped_topk():
    """vLLM's GPU grouped top-k in plain torch ops, without the torch.compile wrapper (no compiler run here)."""
    from vllm.model_executor.layers.fused_moe.router import grouped_topk_router

    return grouped_topk_router.grouped_topk._torchdynamo_orig_callable


@pytest.mark.parametrize("bias", [False, True])
@pytest.mark.parametrize("scoring", ["softmax", "sigmoid"])
@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("tokens, experts, top_k, groups, topk_group", [(19, 64, 6, 8, 3), (4, 160, 6, 8, 3)])
def test_grouped_routing_matches_vllms_gpu_grouped_topk(tokens, experts, top_k, groups, topk_group, renormalize,
                                                        scoring, bias):  # fmt: skip
    gen = torch.Generator().manual_seed(tokens)
    logits = torch.randn(tokens, experts, generator=gen)
    correction = torch.randn(experts, generator=gen) * 0.1 if bias else None
    routing = Routing(
        top_k, renormalize, scoring, use_grouped_topk=True, num_expert_group=groups, topk_group=topk_group,
        e_score_correction_bias=correction, routed_scaling_factor=2.0,
    )  # fmt: skip
    expected = vllm_native_grouped_topk()(logits, logits, top_k, renormalize, groups, topk_group, scoring, 2.0,
                                          correction)  # fmt: skip
    assert_same_routing(route(logits, routing), expected)


@pytest.mark.parametrize("renormalize", [True, False])
@pytest.mark.parametrize("tokens, experts, top_k", [(23, 16, 4), (3, 128, 8)])
def test_plain_sigmoid_and_softmax_routing(tokens, experts, top_k, renormalize):
    """vLLM's FusedTopKRouter (its topk_sigmoid / topk_softmax kernels; no scaling factor there, as in vLLM) against
    vLLM's grouped top-k with one group, which reduces to them."""
    logits = torch.randn(tokens, experts, generator=torch.Generator().manual_seed(experts))
    for scoring in ("sigmoid", "softmax"):
        routing = Routing(top_k, renormalize, scoring, routed_scaling_factor=3.0)
        assert type(routing.router).__name__ == "FusedTopKRouter"
        expected = vllm_native_grouped_topk()(logits, logits, top_k, renormalize, 1, 1, scoring)
        assert_same_routing(route(logits, routing), expected)


def test_llama4_custom_routing_matches_transformers():
    """Llama-4: vLLM's custom routing function (sigmoid of the top-1 logit, not renormalised) against
    transformers' Llama4Router on identity gate weights."""
    from transformers.models.llama4.configuration_llama4 import Llama4TextConfig
    from transformers.models.llama4.modeling_llama4 import Llama4Router
    from vllm.model_executor.models.llama4 import Llama4MoE

    logits = torch.randn(29, 16, generator=torch.Generator().manual_seed(4))
    routing = Routing(1, False, "sigmoid", custom_routing_function=Llama4MoE.custom_routing_function)
    router = Llama4Router(Llama4TextConfig(hidden_size=16, num_local_experts=16, num_experts_per_tok=1))
    with torch.no_grad():
        router.weight.copy_(torch.eye(16))
    scores, _ = router(logits)  # [T, E]: sigmoid(-inf) = 0 off the chosen expert
    ref_ids = scores.argmax(-1, keepdim=True)
    assert_same_routing(route(logits, routing), (scores.gather(1, ref_ids), ref_ids))


def moe_config(
    has_bias: bool = False, dp_size: int = 1, use_ep: bool = False, all2all_backend: str = "allgather_reducescatter"
):
    """The parts of vLLM's FusedMoEConfig the method checks; its parallel config is vLLM's own class."""
    parallel = FusedMoEParallelConfig(
        tp_size=1, pcp_size=1, dp_size=dp_size, ep_size=dp_size if use_ep else 1, tp_rank=0, pcp_rank=0, dp_rank=0,
        ep_rank=0, sp_size=1, use_ep=use_ep, all2all_backend=all2all_backend, enable_eplb=False,
    )  # fmt: skip
    return SimpleNamespace(has_bias=has_bias, moe_parallel_config=parallel)


def fake_layer(**changes):
    """The attributes vLLM's RoutedExperts gives the method, for a plain softmax top-2 layer unless changed."""
    attrs = dict(
        layer_name="model.layers.0.mlp.experts", top_k=2, renormalize=True, scoring_func="softmax",
        use_grouped_topk=False, num_expert_group=None, topk_group=None, e_score_correction_bias=None,
        routed_scaling_factor=1.0, custom_routing_function=None, global_num_experts=8,
        activation=MoEActivation.SILU, swiglu_limit=None, swiglu_alpha=None, swiglu_beta=None,
        apply_router_weight_on_input=False, moe_config=moe_config(), expert_map=None,
    )  # fmt: skip
    return SimpleNamespace(**{**attrs, **changes})


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"activation": MoEActivation.GELU}, "activation 'gelu'"),
        ({"activation": MoEActivation.SWIGLUOAI, "swiglu_limit": 7.0}, "clamped SwiGLU"),
        ({"moe_config": moe_config(has_bias=True)}, "expert biases"),
        ({"apply_router_weight_on_input": True}, "router weights applied on the input with top_k 2"),
        ({"scoring_func": "sqrtsoftplus", "e_score_correction_bias": torch.zeros(8)}, "scoring function"),
    ],
)
def test_what_the_kernels_cannot_run_is_refused_at_load(changes, words):
    with pytest.raises(NotImplementedError, match=words):
        moe_method._check_supported(fake_layer(**changes))
    moe_method._check_supported(fake_layer())


@pytest.mark.parametrize("use_ep", [True, False])
def test_data_parallelism_needs_the_default_all_to_all(monkeypatch, use_ep):
    monkeypatch.setattr(moe_method.current_platform, "is_cpu", lambda: False)  # as on a GPU
    for backend in ("deepep_low_latency", "deepep_high_throughput", "flashinfer_nvlink_one_sided"):
        layer = fake_layer(moe_config=moe_config(dp_size=2, use_ep=use_ep, all2all_backend=backend))
        with pytest.raises(NotImplementedError, match=f"default all-to-all .*, not --all2all-backend {backend}"):
            moe_method._check_supported(layer)
        moe_method._check_supported(fake_layer(moe_config=moe_config(use_ep=use_ep, all2all_backend=backend)))
    moe_method._check_supported(fake_layer(moe_config=moe_config(dp_size=2, use_ep=use_ep)))  # tested on two GPUs


def test_router_weight_on_the_input():
    """Llama-4's top-1 experts read weight * x and their output is not weighted again (vLLM's semantics)."""
    pattern = Pattern.parse("2:4")
    gen = torch.Generator().manual_seed(3)
    w13, w2, p13, p2 = make_experts(pattern, 8, 64, 64, torch.float32, gen)
    from vllm.model_executor.models.llama4 import Llama4MoE

    layer = fake_layer(top_k=1, renormalize=False, custom_routing_function=Llama4MoE.custom_routing_function,
                       apply_router_weight_on_input=True)  # fmt: skip
    method = object.__new__(moe_method.SamoyedsMoEMethod)
    method.pattern, method.routing = pattern, moe_method._check_supported(layer)
    for name, packed in (("w13", p13), ("w2", p2)):
        for part, tensor in packed._asdict().items():
            setattr(layer, f"{name}_{SUFFIXES[part]}", tensor)
    x, logits = torch.randn(9, 64, generator=gen), torch.randn(9, 8, generator=gen)
    out = method.apply_monolithic(layer, x, logits)
    weights, ids = route(logits, method.routing)
    ref = dense_moe_reference(x * weights, torch.ones_like(weights), ids, w13, w2)
    assert ((out.double() - ref).norm() / ref.norm()).item() < 1e-6
    weighted_output = dense_moe_reference(x, weights, ids, w13, w2)  # what weighting the output would give
    assert ((out.double() - weighted_output).norm() / ref.norm()).item() > 1e-2


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
    topk_weights, topk_ids = route(torch.randn(tokens, num_experts, generator=gen), Routing(top_k))
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
    weights, ids = route(torch.randn(5, 4, generator=gen), Routing(2, False))
    args = (x, weights, ids, *p13, *p2, pattern.name, pattern.segment)
    torch.library.opcheck(torch.ops.samoyeds.moe_experts.default, args, test_utils=("test_schema", "test_faketensor"))


@pytest.mark.parametrize("renormalize", [True, False])
def test_softmax_topk_op_routes_inside_as_vllm_routes(renormalize):
    """moe_experts_softmax_topk (the method's op for vLLM's softmax top-k routers) is moe_experts after vLLM's
    softmax top-k of the logits, at one token (where the one-token kernels route on the GPU) and at several;
    schema and fake as torch.compile needs them."""
    pattern = Pattern.parse("samoyeds")
    gen = torch.Generator().manual_seed(11)
    _, _, p13, p2 = make_experts(pattern, 8, 128, 128, torch.float32, gen)
    for tokens in (1, 5):
        x, logits = torch.randn(tokens, 128, generator=gen), torch.randn(tokens, 8, generator=gen)
        logits[0, 3] = logits[0, 5] = logits[0].max() + 1  # a tie: the lower expert id first, as vLLM's kernel
        out = ops.moe_experts_softmax_topk(x, logits, 2, renormalize, p13, p2, pattern)
        weights, ids = route(logits, Routing(2, renormalize))
        assert ids[0].tolist() == [3, 5]
        assert torch.equal(out, ops.moe_experts(x, weights, ids, p13, p2, pattern))
        # the CUDA kernel's argument handling (CPU tensors: it routes first and falls back to the reference)
        args = (x, logits, 2, renormalize, *p13, *p2, pattern.name, pattern.segment)
        assert torch.equal(ops._moe_experts_softmax_topk_cuda(*args), out)
    torch.library.opcheck(
        torch.ops.samoyeds.moe_experts_softmax_topk.default, args, test_utils=("test_schema", "test_faketensor")
    )


def test_softmax_topk_routers_route_inside_the_op(monkeypatch):
    """The method hands vLLM's plain softmax top-k to the op with the logits (no expert map, output-side weights);
    other routers, expert parallelism and input-side weights route first."""
    pattern = Pattern.parse("2:4")
    gen = torch.Generator().manual_seed(5)
    _, _, p13, p2 = make_experts(pattern, 8, 64, 64, torch.float32, gen)
    calls = []
    monkeypatch.setattr(ops, "moe_experts_softmax_topk", lambda *a: calls.append("logits") or a[0])
    monkeypatch.setattr(ops, "moe_experts", lambda *a: calls.append("routed") or a[0])
    x, logits = torch.randn(1, 64, generator=gen), torch.randn(1, 8, generator=gen)
    for layer_args, expected in [
        ({"top_k": 2}, "logits"),
        ({"top_k": 2, "scoring_func": "sigmoid"}, "routed"),
        ({"top_k": 2, "expert_map": torch.arange(8)}, "routed"),
    ]:
        layer = fake_layer(**layer_args)
        method = object.__new__(moe_method.SamoyedsMoEMethod)
        method.pattern, method.routing = pattern, moe_method._check_supported(layer)
        for name, packed in (("w13", p13), ("w2", p2)):
            for part, tensor in packed._asdict().items():
                setattr(layer, f"{name}_{SUFFIXES[part]}", tensor)
        method.apply_monolithic(layer, x, logits)
        assert calls.pop() == expected, layer_args


# ------------------------------------------------------------------------- sparsify on load from FP8 blocks

FP8_BLOCK_CONFIG = {
    "quant_method": "fp8",
    "activation_scheme": "dynamic",
    "fmt": "e4m3",
    "weight_block_size": [128, 128],
    "modules_to_not_convert": ["model.layers.0.mlp.gate", *(f"model.layers.1.self_attn.{p}_proj" for p in "qkv")],
}


def test_fp8_checkpoint_config_keeps_vllms_fp8_for_all_but_the_experts(monkeypatch):
    """`--quantization samoyeds` on an FP8 block checkpoint: vLLM lets this config claim it, and every layer but
    the routed experts gets the method vLLM's own Fp8Config gives it (skipped modules stay unquantized)."""
    from vllm.model_executor.layers.attention import Attention
    from vllm.model_executor.layers.linear import QKVParallelLinear, ReplicatedLinear, UnquantizedLinearMethod
    from vllm.model_executor.layers.quantization import fp8

    assert SamoyedsConfig.override_quantization_method(FP8_BLOCK_CONFIG, "samoyeds") == "samoyeds"
    assert SamoyedsConfig.override_quantization_method(FP8_BLOCK_CONFIG, None) is None  # plain fp8 stays fp8
    assert SamoyedsConfig.override_quantization_method({"quant_method": "awq"}, "samoyeds") is None
    config = SamoyedsConfig.from_config(dict(FP8_BLOCK_CONFIG, pattern="2:4"))
    assert not config.packed and config.pattern == Pattern.parse("2:4") and config.values is None
    assert config.fp8.weight_block_size == [128, 128] and config.expert_suffixes == {"weight", "weight_scale_inv"}
    config.packed_modules_mapping = {"qkv_proj": ["q_proj", "k_proj", "v_proj"]}  # as vLLM sets it for Qwen3
    # Fp8LinearMethod reads the model's dtype from the engine's config
    engine = SimpleNamespace(model_config=SimpleNamespace(dtype=torch.bfloat16))
    monkeypatch.setattr(fp8, "get_current_vllm_config", lambda: engine)
    methods = {
        prefix: type(config.get_quant_method(object.__new__(cls), prefix))
        for cls, prefix in [
            (QKVParallelLinear, "model.layers.0.self_attn.qkv_proj"),
            (QKVParallelLinear, "model.layers.1.self_attn.qkv_proj"),
            (ReplicatedLinear, "model.layers.0.mlp.gate"),
            (Attention, "model.layers.0.self_attn.attn"),
        ]
    }
    assert list(methods.values()) == [
        fp8.Fp8LinearMethod, UnquantizedLinearMethod, UnquantizedLinearMethod, fp8.Fp8KVCacheMethod
    ]  # fmt: skip
    assert isinstance(
        SamoyedsConfig().get_quant_method(object.__new__(QKVParallelLinear), "x"), UnquantizedLinearMethod
    )


@pytest.mark.parametrize(
    "changes, words",
    [
        ({"weight_block_size": None}, "FP8 checkpoints quantized in blocks"),
        ({"weight_block_size": [128]}, "weight_block_size \\[128\\] is not two positive integers"),
        ({"format_version": 1}, "format_version \\(packed experts\\) cannot describe an FP8 block-quantized"),
    ],
)
def test_fp8_checkpoint_configs_refused(changes, words):
    with pytest.raises(ValueError, match=words):
        SamoyedsConfig.from_config(dict(FP8_BLOCK_CONFIG, **changes))


def fp8_experts_layer(tensors, layer, pattern, dtype=torch.float32):
    """A method and layer holding one experts layer of a block-quantized checkpoint as vLLM's loader leaves them:
    w13 the gate then the up projection of each expert, their scales likewise."""
    experts = sorted({int(n.split(".")[5]) for n in tensors if f"layers.{layer}.mlp.experts." in n})

    def stacked(projections, suffix):
        name = f"model.layers.{layer}.mlp.experts.{{}}.{{}}.{suffix}"
        return torch.stack([torch.cat([tensors[name.format(e, p)] for p in projections]) for e in experts])

    module = torch.nn.Module()
    module.layer_name = f"model.layers.{layer}.mlp.experts"
    module.moe_config = SimpleNamespace(in_dtype=dtype)
    for name, projections in (("w13", ("gate_proj", "up_proj")), ("w2", ("down_proj",))):
        for suffix in ("weight", "weight_scale_inv"):
            module.register_parameter(f"{name}_{suffix}", torch.nn.Parameter(stacked(projections, suffix), False))
    method = object.__new__(moe_method.SamoyedsMoEMethod)
    method.pattern, method.packed, method.values, method.fp8_block, method.params_dtype = pattern, False, None, (
        128, 128), dtype  # fmt: skip
    method.dense_shapes = {name: tuple(getattr(module, f"{name}_weight").shape) for name in ("w13", "w2")}
    return method, module


def test_fp8_experts_on_load_are_packed_as_the_converter_packs_them(tmp_path):
    """The loaded FP8 experts, dequantized with their block scales, pruned and packed: bit for bit the converter's
    tensors for the same checkpoint."""
    from helpers import read_checkpoint

    from samoyeds_vllm.tools.convert import convert
    from samoyeds_vllm.tools.model_maker import make_model

    model = make_model("qwen3_moe", "tiny", tmp_path / "fp8", fp8_block=True)
    pattern = Pattern.parse("samoyeds", 64)
    convert(model, tmp_path / "sparse", pattern, progress=False)
    method, layer = fp8_experts_layer(read_checkpoint(model), 1, pattern)
    method.process_weights_after_loading(layer)
    assert not hasattr(layer, "w13_weight_scale_inv") and not hasattr(layer, "w2_weight")
    converted = read_checkpoint(tmp_path / "sparse")
    for name, projections in (("w13", ("gate_proj", "up_proj")), ("w2", ("down_proj",))):
        for part in ("values", "meta", "rowsel"):
            suffix = SUFFIXES[part]
            by_expert = [
                torch.cat([converted[f"model.layers.1.mlp.experts.{e}.{p}.{suffix}"] for p in projections])
                for e in range(8)
            ]
            assert torch.equal(getattr(layer, f"{name}_{suffix}"), torch.stack(by_expert)), (name, part)


def test_fp8_expert_block_scales_are_created_float32_under_a_bf16_model(monkeypatch):
    """vLLM builds the layers with the model's dtype as torch's default: block scales made in it (bf16) would
    dequantize other weights than the checkpoint's, and prune other rows than `convert` does."""
    monkeypatch.setattr(moe_method, "_check_supported", lambda layer: None)
    method = object.__new__(moe_method.SamoyedsMoEMethod)
    method.pattern, method.packed, method.values = Pattern.parse("samoyeds", 64), False, None
    method.fp8_block = (128, 128)
    method.moe = SimpleNamespace(moe_parallel_config=SimpleNamespace(tp_size=1), intermediate_size=256)
    layer = torch.nn.Module()
    layer.layer_name = "model.layers.0.mlp.experts"
    layer.moe_config = SimpleNamespace(hidden_dim=256, intermediate_size=256)
    default = torch.get_default_dtype()
    torch.set_default_dtype(torch.bfloat16)
    try:
        method.create_weights(layer, 4, 256, 256, torch.bfloat16, weight_loader=lambda *args, **kw: None)
    finally:
        torch.set_default_dtype(default)
    assert layer.w13_weight.dtype == layer.w2_weight.dtype == torch.float8_e4m3fn
    assert layer.w13_weight_scale_inv.shape == (4, 4, 2) and layer.w2_weight_scale_inv.shape == (4, 2, 2)
    assert layer.w13_weight_scale_inv.dtype == layer.w2_weight_scale_inv.dtype == torch.float32


def test_fp8_expert_tensors_checked_as_they_load():
    layer = SimpleNamespace(moe_config=SimpleNamespace(hidden_dim=128, intermediate_size=256))
    loaded = []
    loader = moe_method._checked_loader(layer, None, lambda *args, **kw: loaded.append(args) or True, fp8_block=(
        128, 128))  # fmt: skip
    scale = "model.layers.0.mlp.experts.w2_weight_scale_inv"
    loader(None, torch.ones(1, 2), scale, "w2", 3)
    loader(None, torch.zeros(256, 128, dtype=torch.float8_e4m3fn), "model.layers.0.mlp.experts.w13_weight", "w1", 3)
    assert len(loaded) == 2 and layer._samoyeds_loaded == {("scale_inv", "w2", 3), ("weight", "w1", 3)}
    with pytest.raises(ValueError, match=f"{scale} \\(expert 3, w2\\): block scales of shape \\(2, 2\\)"):
        loader(None, torch.ones(2, 2), scale, "w2", 3)
    with pytest.raises(ValueError, match="w13_weight \\(expert 3, w3\\): dtype torch.bfloat16, but the checkpoint"):
        loader(None, torch.zeros(256, 128, dtype=torch.bfloat16), "model.layers.0.mlp.experts.w13_weight", "w3", 3)
