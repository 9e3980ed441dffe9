"""`bench moe --peers` on CPU: the peers' weight formats against vLLM's own quantizers, the vLLM entry points and
keyword names the peers call (they first run on a GPU elsewhere), skip reasons, the table, the command line."""

import inspect
import subprocess
import sys

import pytest
import torch

from samoyeds_vllm.bench import peers as peers_module
from samoyeds_vllm.bench.layer import _legacy_keys, format_table
from samoyeds_vllm.bench.peers import (
    PEERS,
    PathSkipped,
    PeerInputs,
    format_paths_table,
    parse_peers,
    quantize_int4_gptq,
    run_peers,
    speedups,
)
from samoyeds_vllm.bench.quant import (
    dequantize_int4_rows,
    pack_int4_rows,
    unpack_int4_rows,
)
from samoyeds_vllm.cli import _token_counts, build_parser, main
from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.format import Pattern, compress, prune
from samoyeds_vllm.format.fp8_blocks import BLOCK as FP8_BLOCK
from samoyeds_vllm.format.fp8_blocks import dequantize_blocks
from samoyeds_vllm.tools.architectures import MoEShape
from samoyeds_vllm.tools.fp8_blocks import quantize_blocks
from samoyeds_vllm.tools.moe_problem import _prune_and_pack, make_problem

# --- problems ------------------------------------------------------------------------------------------------


def test_making_a_problem_imports_no_vllm():
    """`bench moe --no-vllm` and ab_moe make their problems in processes that need nothing of vLLM: importing it for
    the routing cost every such process ~15 s on an H200."""
    code = (
        "import sys\n"
        "from samoyeds_vllm.format import Pattern\n"
        "from samoyeds_vllm.tools.architectures import MoEShape\n"
        "from samoyeds_vllm.tools.moe_problem import make_problem\n"
        "p = make_problem(MoEShape(8, 256, 128, 2), Pattern.parse('samoyeds'), 5, device='cpu')\n"
        "assert p.topk_ids.dtype == __import__('torch').int64, p.topk_ids.dtype\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] == 'vllm'))\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "[]"


def test_problem_routing_is_softmax_topk_renormalised():
    problem = make_problem(MoEShape(16, 256, 128, 4), None, 9, torch.bfloat16, seed=1, device="cpu")
    gen = torch.Generator(device="cpu").manual_seed(1)
    torch.randn(16, 2 * 128, 256, generator=gen), torch.randn(16, 256, 128, generator=gen)  # the weights' draws
    torch.randn(9, 256, generator=gen)  # x
    probs = torch.softmax(torch.randn(9, 16, generator=gen), dim=-1)
    top = probs.topk(4, dim=-1)
    assert torch.equal(problem.topk_ids, top.indices)
    torch.testing.assert_close(problem.topk_weights, top.values / top.values.sum(-1, keepdim=True))


@pytest.mark.parametrize("pattern", ["samoyeds", "2:4"])
def test_weights_drawn_and_quantized_by_experts_are_those_made_whole(pattern):
    """DeepSeek-V3's layer on an 80 GB H100 ran out of memory drawing its weights and quantizing its kept values
    whole (float32 drafts of 28 and 14 GiB): both go a few experts at a time, which changes neither."""
    from samoyeds_vllm import kernels
    from samoyeds_vllm.format import FP8, quantize
    from samoyeds_vllm.tools.moe_problem import _random_weights, quantized_by_experts

    gen = torch.Generator().manual_seed(0)
    whole = _random_weights((5, 128, 256), 0.1, gen, torch.bfloat16, "cpu")
    assert torch.equal(whole, (torch.randn(5, 128, 256, generator=torch.Generator().manual_seed(0)) * 0.1).bfloat16())
    by_two = _random_weights(
        (5, 128, 256), 0.1, torch.Generator().manual_seed(0), torch.bfloat16, "cpu", 2 * 128 * 256 * 4
    )
    assert (
        by_two.shape == whole.shape
        and by_two.dtype == torch.bfloat16
        and by_two.std().item() == pytest.approx(0.1, rel=0.05)
    )
    p = Pattern.parse(pattern)
    _, packed = _prune_and_pack(whole.clone(), p)  # in the kernels' layout, as problems hold them
    expected = quantize(kernels.checkpoint_layout(packed), p, FP8)
    chunked = quantized_by_experts(packed, p, FP8, chunk_bytes=2 * packed.values[0].numel() * 4)  # 2 experts a time
    for a, b in zip(chunked, expected, strict=True):
        assert (a is None and b is None) or (
            a.dtype == b.dtype and torch.equal(a.view(torch.uint8), b.view(torch.uint8))
        )


# --- weight formats -------------------------------------------------------------------------------------------


def test_fp8_block_scales_are_block_amax_over_448_and_round_trip():
    torch.manual_seed(0)
    w = (torch.randn(3, 200, 300) * 0.05).to(torch.bfloat16)  # M, K not multiples of 128: edge blocks
    q, scale = quantize_blocks(w, chunk_elements=200 * 300)  # one matrix per chunk
    assert q.dtype == torch.float8_e4m3fn and q.shape == w.shape
    assert scale.dtype == torch.float32 and scale.shape == (3, 2, 3)
    assert scale[1, 1, 2] == w[1, 128:, 256:].float().abs().max() / 448
    assert q[1, 128:, 256:].float().abs().max() == 448
    back = dequantize_blocks(q, scale)
    assert ((back - w.float()).norm() / w.float().norm()) < 0.04  # e4m3: 3 mantissa bits


def test_fp8_block_matches_vllms_quantizer():
    """The same values and scales as vLLM's per_block_cast_to_fp8 (what its tests and DeepGEMM re-quantization use)."""
    deep_gemm = pytest.importorskip("vllm.utils.deep_gemm")
    original = getattr(deep_gemm.per_block_cast_to_fp8, "_torchdynamo_orig_callable", deep_gemm.per_block_cast_to_fp8)
    w = torch.randn(256, 384) * 0.02
    q, scale = quantize_blocks(w)
    q_vllm, scale_vllm = original(w, list(FP8_BLOCK))
    assert torch.equal(scale, scale_vllm) and torch.equal(q.float(), q_vllm.float())


def test_fp8_dequantize_in_bf16_rounds_scale_and_product():
    q, scale = quantize_blocks(torch.randn(2, 128, 128))
    exact, rounded = dequantize_blocks(q, scale), dequantize_blocks(q, scale, dtype=torch.bfloat16)
    assert rounded.dtype == torch.bfloat16
    assert torch.equal(
        rounded, q.to(torch.bfloat16) * scale.to(torch.bfloat16).repeat_interleave(128, 1).repeat_interleave(128, 2)
    )
    assert torch.allclose(rounded.float(), exact, rtol=2**-7)


def test_int4_rows_pack_like_gptq():
    quant_utils = pytest.importorskip("vllm.model_executor.layers.quantization.utils.quant_utils")
    q = torch.randint(0, 16, (64, 48), dtype=torch.int32)
    packed = pack_int4_rows(q)
    assert packed.dtype == torch.int32 and packed.shape == (8, 48)
    assert torch.equal(packed, quant_utils.pack_rows(q, 4, 64, 48))
    assert torch.equal(unpack_int4_rows(packed), q)
    assert torch.equal(unpack_int4_rows(pack_int4_rows(torch.stack([q, 15 - q]))), torch.stack([q, 15 - q]))


def test_int4_gptq_weights_dequantize_to_vllms_reference():
    """The peer's own weights are exactly vLLM's `quantize_weights` reference (the weights Marlin computes with)."""
    quant_utils = pytest.importorskip("vllm.model_executor.layers.quantization.utils.quant_utils")
    from vllm.scalar_type import scalar_types

    w = (torch.randn(2, 192, 256) * 0.05).to(torch.bfloat16)  # [E, out, in]
    packed, scales = quantize_int4_gptq(w)
    assert packed.shape == (2, 32, 192) and scales.shape == (2, 2, 192) and scales.dtype == torch.bfloat16
    for e in range(2):
        ref, *_ = quant_utils.quantize_weights(w[e].T, scalar_types.uint4b8, 128)
        assert torch.equal(dequantize_int4_rows(packed[e], scales[e], 128), ref)
    err = (dequantize_int4_rows(packed, scales, 128).transpose(-1, -2).float() - w.float()).norm() / w.float().norm()
    assert 0.05 < err < 0.15  # 4 bits


def test_marlin_scale_permutation_takes_gptq_scales():
    marlin_utils = pytest.importorskip("vllm.model_executor.layers.quantization.utils.marlin_utils")
    _, scales = quantize_int4_gptq((torch.randn(2, 128, 256) * 0.05).to(torch.bfloat16))
    permuted = marlin_utils.marlin_moe_permute_scales(scales, size_k=256, size_n=128, group_size=128)
    assert permuted.shape == scales.shape and torch.equal(permuted.sort(-1).values, scales.sort(-1).values)


# --- the problem ----------------------------------------------------------------------------------------------


@pytest.mark.parametrize("pattern", ["samoyeds", "2:4"])
def test_pruning_a_few_experts_at_a_time_is_pruning_the_whole(pattern):
    pattern = Pattern.parse(pattern)
    from samoyeds_vllm import kernels

    w = torch.randn(7, 256, 512).to(torch.bfloat16)
    whole = prune(w, pattern)
    packed_whole = kernels.prepare_weights(compress(whole, pattern))
    chunked, packed = _prune_and_pack(w.clone(), pattern, chunk_bytes=3 * 256 * 512 * 2)
    assert torch.equal(chunked, whole)
    for a, b in zip(packed_whole, packed, strict=True):
        assert (a is None and b is None) or (torch.equal(a, b) and a.stride() == b.stride())


def _problem(tokens=5):
    return make_problem(MoEShape(4, 256, 128, 2), None, tokens, torch.bfloat16, seed=tokens, device="cpu")


# --- vLLM's entry points -------------------------------------------------------------------------------------


def _params(fn) -> list[str]:
    return list(inspect.signature(fn).parameters)


def test_the_vllm_entry_points_and_keywords_the_peers_use_exist():
    pytest.importorskip("vllm")
    from vllm import _custom_ops as ops
    from vllm.model_executor.layers.fused_moe.config import fp8_w8a8_moe_quant_config
    from vllm.model_executor.layers.fused_moe.experts.marlin_moe import fused_marlin_moe
    from vllm.model_executor.layers.fused_moe.fused_moe import fused_experts as fused_experts_impl
    from vllm.model_executor.layers.fused_moe.modular_kernel import FusedMoEKernel
    from vllm.model_executor.layers.fused_moe.oracle import fp8
    from vllm.model_executor.layers.quantization.utils.marlin_utils import marlin_moe_permute_scales
    from vllm.v1.worker import workspace

    assert {"hidden_states", "w1", "w2", "topk_weights", "topk_ids", "quant_config"} <= set(_params(fused_experts_impl))
    assert {"w1_scale", "w2_scale", "block_shape"} <= set(_params(fp8_w8a8_moe_quant_config))
    assert {m.name for m in fp8.Fp8MoeBackend} >= {"TRITON", "DEEPGEMM", "VLLM_CUTLASS", "FLASHINFER_CUTLASS", "MARLIN"}
    quant_keywords = {"w1_scale", "w2_scale", "a1_scale", "a2_scale", "block_shape"}
    assert quant_keywords <= set(_params(fp8.make_fp8_moe_quant_config))
    assert _params(fp8.make_fp8_moe_kernel)[:4] == [
        "moe_quant_config",
        "moe_config",
        "experts_cls",
        "fp8_backend",
    ]
    assert _params(fp8.convert_to_fp8_moe_kernel_format)[:8] == [
        "fp8_backend",
        "layer",
        "w13",
        "w2",
        "w13_scale",
        "w2_scale",
        "w13_input_scale",
        "w2_input_scale",
    ]
    assert {
        "hidden_states",
        "w1",
        "w2",
        "topk_weights",
        "topk_ids",
        "activation",
        "global_num_experts",
        "expert_map",
        "apply_router_weight_on_input",
    } <= set(_params(FusedMoEKernel.apply))
    marlin_keywords = {
        "hidden_states",
        "w1",
        "w2",
        "bias1",
        "bias2",
        "w1_scale",
        "w2_scale",
        "topk_weights",
        "topk_ids",
        "quant_type_id",
        "global_num_experts",
        "g_idx1",
        "g_idx2",
        "sort_indices1",
        "sort_indices2",
        "is_k_full",
    }
    assert marlin_keywords <= set(_params(fused_marlin_moe))
    assert {"b_q_weight", "perm", "size_k", "size_n", "num_bits"} <= set(_params(ops.gptq_marlin_moe_repack))
    assert {"s", "size_k", "size_n", "group_size"} <= set(_params(marlin_moe_permute_scales))
    assert callable(workspace.init_workspace_manager) and callable(workspace.is_workspace_manager_initialized)


@pytest.mark.parametrize("name", [n for n, peer in PEERS.items() if peer.fp8 and n != "fp8-triton-fused_experts"])
def test_an_fp8_backend_that_cannot_run_here_is_skipped_with_vllms_reason(name):
    """On CPU every FP8 backend fails vLLM's support check: the peer says so instead of failing. This runs vLLM's
    FusedMoEConfig, backend_to_kernel_cls and is_supported_config with the peers' arguments."""
    pytest.importorskip("vllm")
    with pytest.raises(PathSkipped, match="does not support current device"):
        PEERS[name].build(PeerInputs(_problem()))


def test_vllm_environment_never_raises():
    pytest.importorskip("vllm")
    env = peers_module.vllm_environment(_problem())
    assert set(env) >= {"fp8_block_default_backend"}


def test_tuned_config_names_vllms_file():
    pytest.importorskip("vllm")
    name = peers_module._tuned_config(_problem(), "fp8_w8a8", [128, 128])
    assert "E=4,N=128," in name and name.split(" ")[-1].endswith("config)") or name.endswith(".json")


def test_run_peers_records_skips_and_failures_and_goes_on(monkeypatch):
    def skipped(inputs):
        raise PathSkipped("not on this GPU")

    def broken(inputs):
        raise RuntimeError("kernel exploded\nsecond line")

    fakes = {
        "a": peers_module.Peer("a", "A", "api.a", skipped, fp8=True),
        "b": peers_module.Peer("b", "B", "api.b", broken),
    }
    monkeypatch.setattr(peers_module, "PEERS", fakes)
    records = run_peers(_problem(), ["a", "b"], torch.zeros(5, 256))
    assert [(r["name"], r["status"], r["reason"]) for r in records] == [
        ("a", "skipped", "not on this GPU"),
        ("b", "failed", "RuntimeError: kernel exploded"),
    ]


# --- the table --------------------------------------------------------------------------------------------------


def _ok(name, kind, us, label=None):
    return {
        "name": name,
        "label": label or name,
        "kind": kind,
        "status": "ok",
        "us": us,
        "first_capture_us": us * 1.1,
        "rel_err_own": 3e-3,
        "rel_err_bf16_dense": 0.5 if kind == "ours" else 2e-2,
        "TBps": 1.5,
        "TFLOPs_dense_equiv": 10.0,
    }


def _result():
    paths = [
        _ok("ours-bf16", "ours", 20.0, "ours samoyeds(V=128) bf16"),
        _ok("bf16-triton", "peer", 40.0, "vLLM bf16 Triton"),
        _ok("fp8-triton", "peer", 30.0, "vLLM FP8 Triton"),
        {"name": "fp8-cutlass", "label": "vLLM FP8 CUTLASS", "kind": "peer", "status": "skipped", "reason": "no sm90"},
        {"name": "w4a16-marlin", "label": "vLLM Marlin", "kind": "peer", "status": "failed", "reason": "Boom: x"},
    ]
    row = {"tokens": 16, "paths": paths}
    row["best_peer"], row["speedups"] = speedups(paths)
    row.update(_legacy_keys(row))
    return {
        "shape": "qwen3-30b-a3b",
        "num_experts": 128,
        "hidden": 2048,
        "intermediate": 768,
        "top_k": 8,
        "pattern": "samoyeds(V=128)",
        "dtype": "torch.bfloat16",
        "device": "GPU",
        "ceilings": {"copy_TBps": 2.4, "bf16_matmul_TFLOPs": 700},
        "rows": [row],
    }


def test_speedups_against_each_peer_and_the_best():
    row = _result()["rows"][0]
    assert row["best_peer"] == "fp8-triton"
    assert row["speedups"] == {"ours-bf16": {"bf16-triton": 2.0, "fp8-triton": 1.5, "best": 1.5}}
    assert (row["ours_us"], row["vllm_us"], row["speedup"]) == (20.0, 40.0, 2.0)  # the keys bench moe wrote before


def test_paths_table_names_every_path_and_why_one_did_not_run():
    text = format_paths_table(_result())
    assert "x ours-bf16" in text
    lines = text.splitlines()
    assert any("vLLM bf16 Triton" in line and "2.00x" in line for line in lines)
    assert any("vLLM FP8 CUTLASS" in line and "skipped: no sm90" in line for line in lines)
    assert any("vLLM Marlin" in line and "failed: Boom: x" in line for line in lines)
    best = [line for line in lines if line.strip().startswith("16") and "vLLM FP8 Triton" in line][-1]
    assert "30.0" in best and "1.50x" in best


def test_first_table_still_reads_the_legacy_keys():
    assert "2.00x" in format_table(_result())


def test_tables_without_vllm_show_ours_only():
    """`bench moe --no-vllm --values fp8`: no vLLM columns of NaN, and every variant of ours with its µs."""
    paths = [_ok("ours-bf16", "ours", 20.0, "ours bf16 values"), _ok("ours-fp8", "ours", 16.0, "ours FP8 values")]
    for path in paths:
        del path["rel_err_bf16_dense"]  # no dense problem without vLLM
    paths[1]["rel_err_unquantized"] = 4.6e-2
    row = {"tokens": 1, "paths": paths}
    row["best_peer"], row["speedups"] = speedups(paths)
    row.update(_legacy_keys(row))
    result = {**_result(), "rows": [row]}
    first = format_table(result)
    assert "vLLM" not in first and "nan" not in first and "20.0" in first
    text = format_paths_table(result)
    assert any("ours FP8 values" in line and "16.0" in line and "4.6e-02" in line for line in text.splitlines())
    assert "best peer" not in text and "nan" not in text


# --- the command line -------------------------------------------------------------------------------------------


def test_parse_peers():
    assert parse_peers(None) == ["bf16-triton"]
    assert parse_peers("all") == list(PEERS)
    assert parse_peers("w4a16-marlin, fp8-deepgemm") == ["bf16-triton", "fp8-deepgemm", "w4a16-marlin"]
    with pytest.raises(SamoyedsError, match="unknown peer fp8-magic; choose 'all' or some of bf16-triton, "):
        parse_peers("fp8-magic")


def test_bench_moe_arguments():
    args = build_parser().parse_args(["bench", "moe", "--peers", "--tokens", "1", "16,256", "4096"])
    assert args.peers == "all" and _token_counts(args.tokens) == [1, 16, 256, 4096]
    args = build_parser().parse_args(["bench", "moe", "--tokens", "1,16", "--peers", "fp8-triton"])
    assert args.peers == "fp8-triton" and _token_counts(args.tokens) == [1, 16]
    assert build_parser().parse_args(["bench", "moe"]).peers is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--peers", "--no-vllm"], "cannot go with --no-vllm"),
        (["--peers", "fp8-magic"], "unknown peer fp8-magic"),
        (["--tokens", "1,x"], "--tokens wants token counts"),
    ],
)
def test_bench_moe_refuses_bad_arguments_before_looking_for_a_gpu(capsys, argv, message):
    assert main(["bench", "moe", *argv]) == 2
    assert message in capsys.readouterr().err


# --- the whole loop, GPU parts stood in ----------------------------------------------------------------------------


def test_bench_moe_loop_on_cpu(tmp_path, monkeypatch, capsys):
    """bench_moe end to end on CPU: ours through the op's CPU path, timing and ceilings stood in, every peer tried.
    On CPU vLLM's Triton and Marlin ops are absent (failed) and every FP8 backend fails its device check (skipped):
    the loop records them and goes on, writes the JSON and prints both tables."""
    pytest.importorskip("vllm")
    import functools
    import json

    from samoyeds_vllm.bench import layer
    from samoyeds_vllm.tools import moe_problem

    monkeypatch.setattr(layer, "measure_ceilings", lambda: {"copy_TBps": 1.0, "bf16_matmul_TFLOPs": 1.0})
    monkeypatch.setattr(layer, "preset_shape", lambda name: MoEShape(4, 256, 128, 2))
    monkeypatch.setattr(layer, "make_problem", functools.partial(moe_problem.make_problem, device="cpu"))
    monkeypatch.setattr(peers_module, "time_cuda_graph_captures", lambda fn: [fn() is not None and 2.0, 1.0])
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)

    out = tmp_path / "moe.json"
    layer.bench_moe("tiny", [3, 8], Pattern.parse("samoyeds"), json_path=out, peers=parse_peers("all"))
    result = json.loads(out.read_text())
    assert [r["tokens"] for r in result["rows"]] == [3, 8] and set(result["paths"]) == set(PEERS) | {"ours-bf16"}
    for row in result["rows"]:
        status = {r["name"]: r["status"] for r in row["paths"]}
        assert status["ours-bf16"] == "ok" and row["ours_us"] == 1.0 and row["ours_first_capture_us"] == 2.0
        assert row["gib_in_use_before"] == 0.0  # no GPU memory here
        assert row["ours_rel_err"] < 1e-2 and 0.3 < row["paths"][0]["rel_err_bf16_dense"] < 1  # pruned: 75% off
        assert status["bf16-triton"] == status["w4a16-marlin"] == "failed" and "vllm_us" not in row
        assert all(status[n] == "skipped" for n in PEERS if PEERS[n].fp8 and n != "fp8-triton-fused_experts")
        assert row["best_peer"] is None and row["speedups"] == {"ours-bf16": {}}
    printed = capsys.readouterr().out
    assert "vLLM FP8 DeepGEMM" in printed and "skipped: TritonOrDeepGemmExperts" in printed


def test_peers_help_names_every_peer():
    bench = next(a for a in build_parser()._subparsers._group_actions[0].choices["bench"]._actions if a.choices)
    help_text = next(a.help for a in bench.choices["moe"]._actions if a.dest == "peers")
    assert all(name in help_text for name in PEERS)
