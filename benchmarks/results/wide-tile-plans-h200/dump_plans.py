"""Plans with the GPU's occupancy for many token counts (untracked helper): run once per tree, diff the outputs."""
import torch
import cupy
import samoyeds_vllm
from samoyeds_vllm.format import Pattern
from samoyeds_vllm.kernels import LayerShape, build, plan_moe
from samoyeds_vllm.kernels.plan import device_of
from samoyeds_vllm.tools.presets import preset_shape

print("tree", samoyeds_vllm.__file__)
dev = device_of(torch.device("cuda", 0))
TOKENS = [1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048, 3072, 4096, 8192, 16384]
for name in ("qwen3-30b-a3b", "mixtral-8x7b", "qwen3-235b-a22b", "deepseek-v3"):
    s = preset_shape(name)
    for pat in ("samoyeds", "2:4"):
        pattern = Pattern.parse(pat)
        for fp8 in (True, False):
            with cupy.cuda.Device(0):
                occ = build.occupancy(torch.bfloat16, pattern, dev.arch, fp8)
                for t in TOKENS:
                    shape = LayerShape(t, s.top_k, s.num_experts, s.hidden, s.intermediate)
                    p = plan_moe(shape, pattern, torch.bfloat16, dev, fp8, occ)
                    g, d = p.gate_up, p.down
                    print(name, pat, fp8, t, p.token_tile, g.block, g.splits, g.fp8_activations, d.block, d.splits,
                          d.fp8_activations, flush=True)
