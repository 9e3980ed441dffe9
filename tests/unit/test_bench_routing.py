"""`bench routing` on CPU: the routings it builds from a preset, the check of a routing against vLLM's plain-torch
path (near-ties allowed, nothing else), the overheads, the table, the command line, and the whole loop with the
GPU timing stood in."""

import functools
import json

import pytest
import torch

from samoyeds_vllm.bench import peers as peers_module
from samoyeds_vllm.bench import routing as routing_module
from samoyeds_vllm.bench.routing import (
    check_routing,
    format_table,
    make_routing,
    overheads,
    parse_routings,
    preset_config,
    selection_margins,
)
from samoyeds_vllm.cli import build_parser, main
from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.format import Pattern
from samoyeds_vllm.plugin.routing import route
from samoyeds_vllm.tools.moe_problem import make_problem

pytest.importorskip("vllm")


def _bias(config, seed=0):
    experts = config["n_routed_experts"]
    return torch.randn(experts, generator=torch.Generator().manual_seed(seed)) * routing_module.BIAS_STD


def test_routings_are_vllms_for_the_deepseek_v3_preset():
    config = preset_config("deepseek-v3")
    bias = _bias(config)
    softmax, deepseek = (make_routing(name, config, bias) for name in ("softmax", "deepseek-v3"))
    assert type(softmax.router).__name__ == "FusedTopKRouter" and softmax.plain_softmax
    assert type(deepseek.router).__name__ == "GroupedTopKRouter"
    assert (deepseek.top_k, deepseek.num_expert_group, deepseek.topk_group) == (
        config["num_experts_per_tok"],
        config["n_group"],
        config["topk_group"],
    )
    assert deepseek.scoring_func == config["scoring_func"] and deepseek.renormalize == config["norm_topk_prob"]
    assert deepseek.e_score_correction_bias is bias and deepseek.routed_scaling_factor == 1.0
    assert softmax.top_k == deepseek.top_k and softmax.e_score_correction_bias is None


def test_parse_routings():
    config = preset_config("deepseek-v3")
    assert parse_routings("softmax,deepseek-v3", config, "deepseek-v3") == ["softmax", "deepseek-v3"]
    assert parse_routings(" deepseek-v3, softmax,deepseek-v3", config, "deepseek-v3") == ["deepseek-v3", "softmax"]
    with pytest.raises(SamoyedsError, match="--routing takes some of softmax, deepseek-v3, not 'topk'"):
        parse_routings("topk", config, "deepseek-v3")
    with pytest.raises(SamoyedsError, match="--shape qwen3-30b-a3b is a qwen3_moe model"):
        parse_routings("softmax,deepseek-v3", preset_config("qwen3-30b-a3b"), "qwen3-30b-a3b")
    assert parse_routings("softmax", preset_config("qwen3-30b-a3b"), "qwen3-30b-a3b") == ["softmax"]


@pytest.mark.parametrize("name", ["softmax", "deepseek-v3"])
@pytest.mark.parametrize("preset", ["deepseek-v3", "tiny-deepseek_v3", "deepseek-v2-lite"])
def test_selection_margins_choose_what_vllms_routing_chooses(name, preset):
    """The margins are those of the routing's own choice: on fp32 logits (no ties) the ids are vLLM's."""
    config = preset_config(preset)
    routing = make_routing(name, config, _bias(config))
    logits = torch.randn(200, config["n_routed_experts"], generator=torch.Generator().manual_seed(1))
    ids, margin = selection_margins(logits, routing)
    _, ref_ids = route(logits, routing)
    assert torch.equal(ids.sort(-1).values, ref_ids.long().sort(-1).values)
    assert (margin > 0).all()


def test_check_accepts_the_reference_and_a_tied_choice_and_refuses_a_wrong_one():
    config = preset_config("tiny-deepseek_v3")
    routing = make_routing("softmax", config, _bias(config))  # top-4 of 16
    logits = torch.randn(6, 16, generator=torch.Generator().manual_seed(2))
    logits[0] = torch.arange(16.0).flip(0)
    logits[0, 4] = logits[0, 3]  # experts 3 and 4 tie for the last place
    weights, ids = route(logits, routing)
    record = check_routing(logits, routing, weights, ids)
    assert record["differing"] == 0 and record["near_ties"] >= 1 and record["max_weight_rel_diff"] == 0

    tied = ids.clone()
    tied[0] = torch.where(ids[0] == 3, 4, torch.where(ids[0] == 4, 3, ids[0]))  # the other tied one: same weights
    assert check_routing(logits, routing, weights, tied)["differing"] == 1

    wrong = ids.clone()
    wrong[1][ids[1].argmin()] = next(e for e in range(16) if e not in ids[1].tolist())
    with pytest.raises(SamoyedsError, match="1 tokens choose other experts without a near-tie"):
        check_routing(logits, routing, weights, wrong)
    with pytest.raises(SamoyedsError, match="weights differ"):
        check_routing(logits, routing, weights * 2.5, ids)  # the scaling factor applied twice


def test_check_of_grouped_routing_refuses_other_groups():
    config = preset_config("deepseek-v3")
    routing = make_routing("deepseek-v3", config, _bias(config))
    logits = torch.randn(50, 256, generator=torch.Generator().manual_seed(3)).to(torch.bfloat16)
    weights, ids = route(logits, routing)
    assert check_routing(logits, routing, weights, ids)["differing"] == 0
    plain = make_routing("softmax", config, None)  # the same logits without groups choose otherwise
    with pytest.raises(SamoyedsError, match="choose other experts without a near-tie"):
        check_routing(logits, routing, *route(logits, plain))


def _record(name, layer, route_us, experts, n):
    check = {"tokens": 16, "differing": 1, "near_ties": 3}
    return {"name": name, "layer": {"us": layer}, "route_us": route_us, "experts": {"us": experts},
            "distinct_experts": n, "check": check}  # fmt: skip


def test_overheads_against_the_first_routing():
    records = [_record("softmax", 100.0, 4.0, 96.0, 64), _record("deepseek-v3", 103.0, 6.0, 97.0, 62)]
    layer, extra = overheads(records)
    assert layer == {"deepseek-v3": pytest.approx(3.0)} and extra == {"deepseek-v3": pytest.approx(2.0)}
    assert overheads(records[:1]) == ({}, {})


def test_table_shows_every_routing_and_the_overheads():
    records = [_record("softmax", 100.0, 4.0, 96.0, 64), _record("deepseek-v3", 103.0, 6.0, 97.0, 62)]
    row = {"tokens": 16, "routings": records}
    row["overhead_pct"], row["extra_routing_pct"] = overheads(records)
    result = {
        "shape": "deepseek-v3", "num_experts": 256, "hidden": 7168, "intermediate": 2048, "top_k": 8,
        "pattern": "samoyeds(V=128)", "dtype": "torch.bfloat16", "device": "GPU",
        "logits": {"distribution": "N(0, 1)", "dtype": "torch.bfloat16"},
        "routings": {"softmax": {}, "deepseek-v3": {}}, "rows": [row],
    }  # fmt: skip
    *_, names, header, numbers, checks = format_table(result).splitlines()
    assert names.split() == ["softmax", "deepseek-v3", "deepseek-v3", "vs", "softmax"]
    assert numbers.split() == ["16", "100.0", "4.0", "96.0", "64", "103.0", "6.0", "97.0", "62", "+3.0%", "+2.0%"]
    assert len(numbers) == len(header)  # the header's columns line up with the numbers
    assert checks.endswith("softmax 1 / 3 / 16, deepseek-v3 1 / 3 / 16")


def test_bench_routing_arguments():
    args = build_parser().parse_args(["bench", "routing", "--tokens", "1,16", "64"])
    assert (args.shape, args.routing, args.tokens, args.pattern) == (
        "deepseek-v3",
        "softmax,deepseek-v3",
        ["1,16", "64"],
        "samoyeds",
    )
    assert build_parser().parse_args(["bench", "moe"]).shape == "qwen3-30b-a3b"  # the shared options stay


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--routing", "hash"], "--routing takes some of"),
        (["--shape", "mixtral-8x7b"], "is a mixtral model"),
        (["--tokens", "1,x"], "--tokens wants token counts"),
        ([], "needs an NVIDIA GPU"),
    ],
)
def test_bench_routing_refuses_bad_arguments_then_a_machine_without_gpu(capsys, monkeypatch, argv, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert main(["bench", "routing", *argv]) == 2
    assert message in capsys.readouterr().err


def test_bench_routing_loop_on_cpu(tmp_path, monkeypatch, capsys):
    """bench_routing end to end on CPU (routing and experts through their CPU paths, timing stood in): every
    routing checked and recorded per token count, the JSON rewritten, the table printed."""
    times = {}

    def timed(fn):  # a distinct µs per timed call, so the records can be told apart
        assert fn() is not None
        times[len(times)] = 10.0 + len(times)
        return [times[len(times) - 1] + 0.5, times[len(times) - 1]]

    monkeypatch.setattr(routing_module, "make_problem", functools.partial(make_problem, device="cpu"))
    monkeypatch.setattr(routing_module, "time_cuda_graph_captures", timed)
    monkeypatch.setattr(peers_module, "time_cuda_graph_captures", timed)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *args: "cpu")
    monkeypatch.setattr(torch.cuda, "synchronize", lambda *args: None)

    out = tmp_path / "routing.json"
    routings = ["softmax", "deepseek-v3"]
    routing_module.bench_routing("tiny-deepseek_v3", [3, 40], routings, Pattern.parse("samoyeds"), json_path=out)
    result = json.loads(out.read_text())
    assert [r["tokens"] for r in result["rows"]] == [3, 40] and result["baseline"] == "softmax"
    assert {n: r["router"] for n, r in result["routings"].items()} == {
        "softmax": "FusedTopKRouter",
        "deepseek-v3": "GroupedTopKRouter",
    }
    assert result["routings"]["deepseek-v3"]["e_score_correction_bias"].startswith("N(0, ")
    config = preset_config("tiny-deepseek_v3")
    for row in result["rows"]:
        assert [r["name"] for r in row["routings"]] == routings
        for r in row["routings"]:
            assert r["check"]["tokens"] == row["tokens"] and r["check"]["differing"] == 0
            assert config["num_experts_per_tok"] <= r["distinct_experts"] <= config["n_routed_experts"]
            assert row["tokens"] * config["num_experts_per_tok"] / r["distinct_experts"] <= r["busiest_expert_tokens"]
            assert r["layer"]["rel_err_own"] < 1e-2 and r["experts"]["rel_err_own"] < 1e-2
            assert len({r["layer"]["us"], r["experts"]["us"], r["route_us"]}) == 3
        base, deepseek = row["routings"]
        assert row["overhead_pct"]["deepseek-v3"] == pytest.approx(
            100 * (deepseek["layer"]["us"] / base["layer"]["us"] - 1)
        )
    printed = capsys.readouterr().out
    assert "deepseek-v3 vs softmax" in printed and "tiny-deepseek_v3 (E=16" in printed
