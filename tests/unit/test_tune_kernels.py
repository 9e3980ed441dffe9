"""benchmarks/tune_kernels.py: the kernel configs each search times (pure planning, run on CPU), and the check each
config passes first (tools/moe_problem.error_against_plan, shared with the GPU kernel tests)."""

import importlib.util
from pathlib import Path

import torch

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.kernels import GemmConfig, KernelConfig, LayerShape, override_config, plan_moe
from samoyeds_vllm.kernels.plan import Device
from samoyeds_vllm.tools.architectures import MoEShape
from samoyeds_vllm.tools.moe_problem import BF16_TOLERANCE, error_against_plan, make_problem, reference, run_sparse

SCRIPT = Path(__file__).parents[2] / "benchmarks" / "tune_kernels.py"
spec = importlib.util.spec_from_file_location("tune_kernels", SCRIPT)
tune_kernels = importlib.util.module_from_spec(spec)
spec.loader.exec_module(tune_kernels)

H100 = Device("NVIDIA H100 80GB HBM3", (9, 0), 132, "sm_90a")
QWEN3 = dict(top_k=8, num_experts=128, hidden=2048, inter=768)
K_TILES = (2048 // 128, 768 // 128)


def activation_configs(tokens: int, pattern: Pattern, fp8: bool) -> dict[str, KernelConfig]:
    plan = plan_moe(LayerShape(tokens, **QWEN3), pattern, torch.bfloat16, H100, fp8)
    configs = dict(tune_kernels.candidates(plan, K_TILES, pattern, True, "activations", fp8))
    assert configs.pop("default") == KernelConfig()
    return configs


def test_the_activations_search_tries_each_gemm_with_and_without_fp8_copies():
    configs = activation_configs(16384, Pattern.parse("samoyeds"), fp8=True)
    assert sorted((c.gate_up.fp8_activations, c.down.fp8_activations) for c in configs.values()) == [
        (False, False),
        (False, True),
        (True, False),
        (True, True),
    ]
    for config in configs.values():  # the rest of the plan stays the heuristics'
        for gemm in (config.gate_up, config.down):
            assert gemm == GemmConfig(fp8_activations=gemm.fp8_activations)
        with override_config(config):
            plan = plan_moe(LayerShape(16384, **QWEN3), Pattern.parse("samoyeds"), torch.bfloat16, H100, True)
        assert (plan.gate_up.fp8_activations, plan.down.fp8_activations) == (
            config.gate_up.fp8_activations,
            config.down.fp8_activations,
        )


def test_the_activations_search_offers_fp8_copies_only_where_a_gemm_can_use_them():
    assert activation_configs(16384, Pattern.parse("samoyeds"), fp8=False) == {}  # bf16 values
    for tokens, pattern in [(1, Pattern.parse("samoyeds")), (16384, Pattern.parse("samoyeds", 32))]:
        # decode blocks (no ws kernel) and 32-input segments: only "both off"
        configs = activation_configs(tokens, pattern, fp8=True)
        assert [(c.gate_up.fp8_activations, c.down.fp8_activations) for c in configs.values()] == [(False, False)]


def test_the_check_uses_the_reference_of_the_plan_and_caches_it():
    """On CPU the op is the reference implementation and nothing is quantized: the plain reference, bf16 tolerance."""
    shape = MoEShape(4, 256, 128, 2)
    problem = make_problem(shape, Pattern.parse("samoyeds"), 5, seed=3, device="cpu")
    refs = {}
    err, tol = error_against_plan(problem, run_sparse(problem), refs)
    assert list(refs) == [(False, False)] and torch.equal(refs[False, False], reference(problem))
    assert err < tol == BF16_TOLERANCE
    cached = refs[False, False]
    error_against_plan(problem, run_sparse(problem), refs)
    assert refs[False, False] is cached


def test_the_tiles_search_tries_every_compiled_token_tile_and_each_plans():
    for pattern, tiles in [(Pattern.parse("samoyeds"), [8, 16, 32, 64]), (Pattern.parse("2:4"), [8, 16, 32, 64, 128])]:
        plan = plan_moe(LayerShape(1024, **QWEN3), pattern, torch.bfloat16, H100, True)
        configs = dict(tune_kernels.candidates(plan, K_TILES, pattern, True, "tiles", True))
        assert configs.pop("default") == KernelConfig()
        assert [c.token_tile for c in configs.values()] == tiles
        for config in configs.values():
            with override_config(config):
                assert plan_moe(LayerShape(1024, **QWEN3), pattern, torch.bfloat16, H100, True).token_tile == (
                    config.token_tile
                )


def test_a_search_within_a_token_tile_keeps_that_tile_in_every_config_but_the_default():
    """--token-tile: e.g. the split-K factors of the 16-token tiles where the heuristics pick 8-token ones."""
    pattern, layer = Pattern.parse("samoyeds"), LayerShape(16, **QWEN3)
    with override_config(KernelConfig(16, one_token=False)):
        plan = plan_moe(layer, pattern, torch.bfloat16, H100, True)
    configs = dict(tune_kernels.candidates(plan, K_TILES, pattern, True, "splits", True, token_tile=16))
    assert configs.pop("default") == KernelConfig()
    assert len(configs) == 6 and all(name.endswith("(token tile 16)") for name in configs)
    for config in configs.values():
        with override_config(config):
            planned = plan_moe(layer, pattern, torch.bfloat16, H100, True)
        assert planned.token_tile == 16
        assert (planned.gate_up.splits, planned.down.splits) == (config.gate_up.splits, config.down.splits)
