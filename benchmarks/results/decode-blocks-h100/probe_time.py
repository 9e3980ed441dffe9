"""Experiment: the layer's µs under named kernel configs (checked against the fp32 reference first)."""
import argparse, json, sys
import torch
from samoyeds_vllm import kernels
from samoyeds_vllm.bench.timing import time_cuda_graph
from samoyeds_vllm.format import FP8, Pattern
from samoyeds_vllm.kernels import KernelConfig
from samoyeds_vllm.tools.moe_problem import error_against_plan, make_problem, run_sparse
from samoyeds_vllm.tools.presets import preset_shape

ap = argparse.ArgumentParser()
ap.add_argument("--shapes", default="qwen3-30b-a3b")
ap.add_argument("--pattern", default="samoyeds")
ap.add_argument("--tokens", default="16,64")
ap.add_argument("--values", default="fp8")
ap.add_argument("--configs", default='{"default": {}}')
ap.add_argument("--tag", default="")
ap.add_argument("--json")
a = ap.parse_args()
configs = {k: KernelConfig.from_json(v) for k, v in json.loads(a.configs).items()}
rows = []
for s in a.shapes.split(","):
    for t in map(int, a.tokens.split(",")):
        p = make_problem(preset_shape(s), Pattern.parse(a.pattern), t, seed=t, values=FP8 if a.values == "fp8" else None)
        refs, us, err = {}, {}, {}
        for name, c in configs.items():
            try:
                with kernels.override_config(c):
                    e, tol = error_against_plan(p, run_sparse(p), refs)
                    assert e < tol, (name, e, tol)
                    err[name] = e
            except Exception as ex:
                print("skip", s, t, name, repr(ex)[:200], flush=True)
        for rnd in range(2):
            for name in err:
                with kernels.override_config(configs[name]):
                    us.setdefault(name, []).append(round(time_cuda_graph(lambda: run_sparse(p)), 1))
        import cupy
        from samoyeds_vllm.kernels import build
        from samoyeds_vllm.kernels.plan import device_of
        dev = device_of(p.x.device)
        counts = torch.bincount(p.topk_ids.reshape(-1), minlength=p.w13.shape[0]).tolist()
        info = {}
        for name in err:
            with kernels.override_config(configs[name]):
                shape = kernels.LayerShape(t, p.topk_ids.shape[1], p.w13.shape[0], p.x.shape[1], p.w2.shape[2])
                with cupy.cuda.Device(p.x.device.index):
                    plan = kernels.plan_moe(shape, p.pattern, p.x.dtype, dev, True, build.occupancy(p.x.dtype, p.pattern, dev.arch, True))
            tiles = sum(-(-c // plan.token_tile) for c in counts)
            parts = []
            for g in (plan.gate_up, plan.down):
                f = build.kernel(p.x.dtype, p.pattern, dev.arch, True, g.kernel, g.shared_bytes)
                with cupy.cuda.Device(p.x.device.index):
                    cap = cupy.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(f.kernel.ptr, g.threads, g.shared_bytes)
                blocks = g.row_blocks * tiles * g.splits if g.block.kind != "ws" else g.row_blocks * tiles
                parts.append(f"{g.block.kind}{g.block.warps}x{g.block.slabs} z{g.splits} b{blocks} cap{cap} w{blocks / (cap * dev.sms):.2f}")
            info[name] = f"tile{plan.token_tile} " + " | ".join(parts)
        for n, v in info.items():
            print(f"   {n}: {v}", flush=True)
        line = "  ".join(f"{n} {min(v)}" for n, v in us.items())
        print(f"{a.tag} {s} T={t}: {line}", flush=True)
        rows.append({"tag": a.tag, "shape": s, "tokens": t, "us": us, "err": err})
        del p
        torch.cuda.empty_cache()
if a.json:
    open(a.json, "a").write("".join(json.dumps(r) + "\n" for r in rows))
