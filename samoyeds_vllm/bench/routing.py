"""`samoyeds-vllm bench routing`: what a routing costs in front of our experts, DeepSeek-V3's against softmax top-k.

One random problem of a real model shape (tools/moe_problem.py: weights pruned and packed once, for every token
count), one draw of router logits ~ N(0, 1) in the activations' dtype, and for each routing and token count T:

- its choice on the first T logits, checked against vLLM's plain-torch path of the same routing (plugin/routing.py
  on CPU, which the unit tests hold to transformers' DeepSeek-V3 router): tokens may differ only where the
  reference's choice was within the logits' precision of a tie;
- µs of the layer as the plugin's method runs it (`route` through vLLM's router, then our experts op; vLLM's
  softmax top-k inside the op, which at one token the kernels take from the logits), of the routing alone and of
  the experts alone on the routing's choice, each captured in CUDA graphs and replayed (bench/timing.py, as `bench
  moe` times);
- how many distinct experts it picked, since the experts' time follows that count and different routings pick
  different experts from the same logits.

The first routing is the baseline: every other one reports its layer's overhead over the baseline's layer, and the
extra time of its routing alone as a share of the baseline's layer (which no choice of experts moves).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import torch

from ..errors import SamoyedsError
from ..plugin.ops import moe_experts, moe_experts_softmax_topk
from ..plugin.routing import Routing, route
from ..tools.architectures import architecture_of, moe_shape
from ..tools.moe_problem import MoEProblem, make_problem
from ..tools.presets import load_preset, preset_family
from .layer import ours_packed, run_header
from .peers import measure
from .timing import time_cuda_graph_captures

#: The routing names --routing takes. "softmax": vLLM's FusedTopKRouter (softmax top-k, renormalised), the
#: routing `bench moe` gives its problems; "deepseek-v3": the router vLLM's DeepSeek-V2/V3 MoE block builds from
#: the shape's config (grouped top-k, its scoring function and score-correction bias), scaling factor 1.0.
ROUTINGS = ("softmax", "deepseek-v3")
_DEEPSEEK = ("deepseek_v2", "deepseek_v3")

#: Spread of the random score-correction bias. A trained one evens out the experts' load; a random one skews it:
#: 0.02 gave DeepSeek-V3's busiest expert 2x the mean load at T = 16384 (softmax: 1.15x). This one keeps the load as
#: even as softmax's, and being nonzero still decides near-ties between experts.
BIAS_STD = 0.002

CHECK_COUNTS = ("differing", "near_ties", "tokens")  # check_routing's counts, summed under the table


def preset_config(shape_name: str) -> dict:
    return load_preset(preset_family(shape_name), shape_name)


def parse_routings(text: str, config: dict, shape_name: str) -> list[str]:
    """--routing's comma-separated names, in order and once each; the first is the baseline."""
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    if not names or any(n not in ROUTINGS for n in names):
        raise SamoyedsError(f"--routing takes some of {', '.join(ROUTINGS)}, not {text!r}")
    if "deepseek-v3" in names and architecture_of(config).model_type not in _DEEPSEEK:
        raise SamoyedsError(
            f"the deepseek-v3 routing reads its groups and scoring from a DeepSeek-V2/V3 config; --shape {shape_name} "
            f"is a {config['model_type']} model"
        )
    return names


def make_routing(name: str, config: dict, bias: torch.Tensor) -> Routing:
    """The Routing the plugin's method gets from vLLM's layer for this config (`bias` where the config's routing
    has a score-correction bias)."""
    shape = moe_shape(config)
    if name == "softmax":
        return Routing(shape.top_k, global_num_experts=shape.num_experts)
    # vLLM's DeepseekV2MoE; the model scales the experts' output itself, so the router gets 1.0 (Routing)
    return Routing(
        shape.top_k,
        config.get("norm_topk_prob", False),  # DeepseekV2Config's default
        config.get("scoring_func", "softmax"),
        use_grouped_topk=True,
        num_expert_group=config.get("n_group", 1),
        topk_group=config.get("topk_group", 1),
        e_score_correction_bias=bias if config.get("topk_method") == "noaux_tc" else None,
        global_num_experts=shape.num_experts,
    )


def selection_margins(logits: torch.Tensor, routing: Routing) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, margin) per token, of softmax / sigmoid top-k or grouped top-k in fp32 as vLLM defines them; the
    margin is the smallest relative gap between a score (or group score) the routing chose and the best one it
    passed over. Where it is within rounding, two correct implementations may choose differently."""
    scores = logits.float().softmax(-1) if routing.scoring_func == "softmax" else logits.float().sigmoid()
    bias = routing.e_score_correction_bias
    if bias is not None:
        scores = scores + bias.float().to(scores.device)
    tokens, experts = scores.shape
    gaps = []

    def gap(ranked: torch.Tensor, k: int) -> torch.Tensor:  # k-th best against the next, relative to the k-th
        return (ranked[:, k - 1] - ranked[:, k]) / ranked[:, k - 1].abs().clamp_min(torch.finfo(torch.float32).tiny)

    groups = routing.num_expert_group or 1
    if routing.use_grouped_topk and groups > 1:
        by_group = scores.view(tokens, groups, -1)
        group_scores = by_group.topk(2, -1).values.sum(-1) if bias is not None else by_group.amax(-1)
        ranked = group_scores.topk(min(routing.topk_group + 1, groups), -1)
        if routing.topk_group < groups:
            gaps.append(gap(ranked.values, routing.topk_group))
        kept = torch.zeros_like(group_scores, dtype=torch.bool).scatter(
            1, ranked.indices[:, : routing.topk_group], True
        )
        scores = scores.masked_fill(~kept.repeat_interleave(experts // groups, -1), float("-inf"))
    ranked = scores.topk(min(routing.top_k + 1, experts), -1)
    if routing.top_k < experts:
        gaps.append(gap(ranked.values, routing.top_k))
    margin = torch.stack(gaps).amin(0) if gaps else torch.full((tokens,), float("inf"))
    return ranked.indices[:, : routing.top_k], margin


def check_routing(logits: torch.Tensor, routing: Routing, weights: torch.Tensor, ids: torch.Tensor) -> dict:
    """The routing's (weights, ids) against vLLM's plain-torch path on the same logits (`route` on CPU). Raises
    unless both choose the same experts for every token without a near-tie and give them the same weights, both to
    the logits' precision relative to the scores (vLLM's fused kernels may keep scores and weights in it)."""
    tolerance = max(1e-5, torch.finfo(logits.dtype).eps)
    bias = routing.e_score_correction_bias
    reference = dataclasses.replace(routing, e_score_correction_bias=None if bias is None else bias.cpu())
    ref_weights, ref_ids = route(logits.cpu(), reference)
    ids, weights, ref_ids, ref_weights = ids.cpu().long(), weights.cpu().float(), ref_ids.long(), ref_weights.float()
    order, ref_order = ids.argsort(-1), ref_ids.argsort(-1)
    same = (ids.gather(-1, order) == ref_ids.gather(-1, ref_order)).all(-1)
    near_tie = selection_margins(logits.cpu(), reference)[1] < tolerance
    ours, theirs = weights.gather(-1, order)[same], ref_weights.gather(-1, ref_order)[same]
    weight_diff = ((ours - theirs).abs() / theirs.abs().clamp_min(1e-6)).max() if same.any() else torch.tensor(0.0)
    record = {
        "tokens": len(ids),
        "differing": int((~same).sum()),
        "near_ties": int(near_tie.sum()),
        "tolerance": tolerance,
        "max_weight_rel_diff": float(weight_diff),
    }
    wrong = (~same & ~near_tie).nonzero().flatten().tolist()
    if wrong or not record["max_weight_rel_diff"] <= tolerance:
        t = wrong[0] if wrong else int(same.nonzero()[0])
        raise SamoyedsError(
            f"routing on {logits.device} differs from vLLM's plain-torch path: {len(wrong)} tokens choose other "
            f"experts without a near-tie, weights differ by up to {record['max_weight_rel_diff']:.2e} relative "
            f"(token {t}: experts {ids[t].tolist()}, weights {weights[t].tolist()}; reference "
            f"{ref_ids[t].tolist()}, {ref_weights[t].tolist()})"
        )
    return record


def routed_layer(p: MoEProblem, logits: torch.Tensor, routing: Routing) -> torch.Tensor:
    """What the plugin's method computes (SamoyedsMoEMethod.apply_monolithic, without expert parallelism): vLLM's
    softmax top-k inside the op (at one token the kernels take it from the logits), other routings first."""
    if routing.plain_softmax:
        args = (p.x, logits, routing.top_k, routing.renormalize, p.packed13, p.packed2, p.pattern)
        return moe_experts_softmax_topk(*args)
    weights, ids = route(logits, routing, p.x)
    return moe_experts(p.x, weights, ids, p.packed13, p.packed2, p.pattern)


def launched_kernels(fn) -> list[str] | str:
    """The CUDA kernels one call of `fn` (after a first one: compilation) launches, in order: which implementation
    the routing ran."""
    try:
        from torch.profiler import ProfilerActivity, profile

        fn()
        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            fn()
            torch.cuda.synchronize()
        return [e.name for e in prof.events() if e.device_type == torch.autograd.DeviceType.CUDA]
    except Exception as e:  # the record is informative only: a profiler that cannot run here stops nothing
        return f"not profiled: {type(e).__name__}: {e}"[:200]


def measure_routing(name: str, routing: Routing, problem: MoEProblem, logits: torch.Tensor) -> dict:
    """One routing on the first T tokens of `problem` (x) and their logits: checked, then timed."""
    weights, ids = route(logits, routing, problem.x)
    load = torch.bincount(ids.flatten().long(), minlength=routing.global_num_experts)
    record = {"name": name, "distinct_experts": int((load > 0).sum()), "busiest_expert_tokens": int(load.max())}
    record["check"] = check_routing(logits, routing, weights, ids)
    p = dataclasses.replace(problem, topk_weights=weights, topk_ids=ids)
    experts = ours_packed(p, "experts", "experts")
    layer = dataclasses.replace(experts, name="layer", label="layer", run=lambda: routed_layer(p, logits, routing))
    record["layer"], _ = measure(layer, p)  # error against the fp32 product of the routing's own choice
    record["experts"], _ = measure(experts, p)
    record["route_first_capture_us"], record["route_us"] = time_cuda_graph_captures(lambda: route(logits, routing, p.x))
    return record


def overheads(records: list[dict]) -> tuple[dict[str, float], dict[str, float]]:
    """Per routing but the first (the baseline): its layer's µs over the baseline's layer, and its routing's extra
    µs as a share of the baseline's layer, both in %."""
    base, others = records[0], records[1:]
    layer = {r["name"]: 100 * (r["layer"]["us"] / base["layer"]["us"] - 1) for r in others}
    extra = {r["name"]: 100 * (r["route_us"] - base["route_us"]) / base["layer"]["us"] for r in others}
    return layer, extra


def bench_routing(
    shape_name: str,
    tokens: list[int],
    routings: list[str],
    pattern,
    dtype=torch.bfloat16,
    json_path: Path | None = None,
    config: dict | None = None,
    seed: int = 0,
) -> dict:
    """`config`: the shape's config.json (default: the preset's; tests shrink it)."""
    from tqdm import tqdm

    config = config or preset_config(shape_name)
    shape = moe_shape(config)
    problem = make_problem(shape, pattern, max(tokens), dtype, seed=seed)
    device = problem.x.device
    gen = torch.Generator(device=device).manual_seed(seed + 1)  # not the weights' stream
    logits = torch.randn(max(tokens), shape.num_experts, generator=gen, device=device).to(dtype)
    bias = torch.randn(shape.num_experts, generator=gen, device=device) * BIAS_STD  # float32, as vLLM holds it
    specs = {name: make_routing(name, config, bias) for name in routings}
    result = {
        **run_header(shape_name, shape, pattern, dtype),
        "logits": {"distribution": "N(0, 1)", "dtype": str(logits.dtype)},
        "baseline": routings[0],
        "routings": {name: _describe(routing) for name, routing in specs.items()},
        "rows": [],
    }
    if device.type == "cuda":
        t = min(tokens)
        for name, routing in specs.items():
            result["routings"][name]["kernels"] = launched_kernels(
                lambda r=routing: route(logits[:t], r, problem.x[:t])
            )
    for t in tqdm(tokens, desc=f"bench routing {shape_name} {pattern}"):
        p = dataclasses.replace(problem, x=problem.x[:t])
        records = [measure_routing(name, routing, p, logits[:t]) for name, routing in specs.items()]
        row = {"tokens": t, "routings": records}
        row["overhead_pct"], row["extra_routing_pct"] = overheads(records)
        result["rows"].append(row)
        if json_path:  # after every token count: a run cut short keeps what it measured
            Path(json_path).write_text(json.dumps(result, indent=2) + "\n")
    print(format_table(result))
    return result


def _describe(routing: Routing) -> dict:
    fields = {f.name: getattr(routing, f.name) for f in dataclasses.fields(routing)}
    fields.pop("custom_routing_function")
    if fields["e_score_correction_bias"] is not None:
        fields["e_score_correction_bias"] = f"N(0, {BIAS_STD}^2), {routing.e_score_correction_bias.dtype}"
    return {"router": type(routing.router).__name__, **fields}


def format_table(result: dict) -> str:
    names = list(result["routings"])
    base, others = names[0], names[1:]
    lines = [
        f"{result['shape']} (E={result['num_experts']}, H={result['hidden']}, I={result['intermediate']}, "
        f"top-{result['top_k']}), {result['pattern']}, {result['dtype']} on {result['device']}; router logits "
        f"{result['logits']['distribution']}, {result['logits']['dtype']}",
        "µs of CUDA-graph replay (bench/timing.py), same x and logits. layer: the routing, then our experts (the "
        "plugin's path);",
        "route: the routing alone; experts: the experts alone on its choice; n: distinct experts it picked. "
        f"vs {base}: the",
        f"layer's overhead over {base}'s layer, and the routing's extra µs over {base}'s routing in % of {base}'s "
        "layer.",
        f"{'':>6}" + "".join(f" {n:^31}" for n in names) + "".join(f" {n + ' vs ' + base:^17}" for n in others),
        f"{'T':>6}"
        + "".join(f" {'layer':>9} {'route':>7} {'experts':>8} {'n':>4}" for _ in names)
        + "".join(f" {'layer':>8} {'route':>8}" for _ in others),
    ]
    for row in result["rows"]:
        cells = "".join(
            f" {r['layer']['us']:>9.1f} {r['route_us']:>7.1f} {r['experts']['us']:>8.1f} {r['distinct_experts']:>4}"
            for r in row["routings"]
        )
        vs = "".join(f" {row['overhead_pct'][n]:>+7.1f}% {row['extra_routing_pct'][n]:>+7.1f}%" for n in others)
        lines.append(f"{row['tokens']:>6}{cells}{vs}")
    done = [r for row in result["rows"] for r in row["routings"]]
    summary = ", ".join(
        f"{n} " + " / ".join(str(sum(r["check"][k] for r in done if r["name"] == n)) for k in CHECK_COUNTS)
        for n in names
    )
    lines.append(
        f"Against vLLM's plain-torch routing, tokens with other experts (near-ties) / near-ties / all: {summary}"
    )
    return "\n".join(lines)
