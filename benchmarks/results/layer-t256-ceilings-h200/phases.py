# Where a `bench moe` process's time goes before its timing: each phase's end, seconds since start.
import time

t0 = time.time()


def lap(msg):
    print(f"{time.time() - t0:7.2f} {msg}", flush=True)


import torch  # noqa: E402

lap("import torch")
torch.zeros(1, device="cuda")
lap("cuda init")
from samoyeds_vllm.bench import layer  # noqa: E402
from samoyeds_vllm.bench.timing import measure_ceilings, time_cuda_graph_captures  # noqa: E402
from samoyeds_vllm.format import Pattern  # noqa: E402
from samoyeds_vllm.plugin.ops import moe_reference  # noqa: E402
from samoyeds_vllm.tools.moe_problem import make_problem  # noqa: E402
from samoyeds_vllm.tools.presets import preset_shape  # noqa: E402

lap("import samoyeds_vllm")
shape, pattern = preset_shape("qwen3-30b-a3b"), Pattern.parse("samoyeds", 128)
measure_ceilings()
lap("ceilings")
for t in (256, 4096):
    p = make_problem(shape, pattern, t, torch.bfloat16, seed=t)
    torch.cuda.synchronize()
    lap(f"problem T={t}")
    for v in layer.our_variants(pattern, torch.bfloat16, fp8=True):
        path = v.build(p)
        torch.cuda.synchronize()
        lap(f"  build {v.name}")
        path.run()
        torch.cuda.synchronize()
        lap(f"  first run {v.name}")
        path.run()
        torch.cuda.synchronize()
        lap(f"  second run {v.name}")
        moe_reference(p.x, p.topk_weights, p.topk_ids, path.dequant)
        torch.cuda.synchronize()
        lap(f"  fp32 reference {v.name}")
        us = time_cuda_graph_captures(path.run)
        lap(f"  two graph captures, timed {v.name}: {us[-1]:.1f} us")
    del p
