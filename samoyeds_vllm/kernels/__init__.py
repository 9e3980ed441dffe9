"""The host side of the CUDA kernels in csrc/: what they can run, the plan of a forward, building and launching.

- geometry.py: the numbers shared with csrc/config.cuh, block shapes, template names;
- params.py:   MoEParams, the one parameter struct every kernel takes (csrc/params.cuh);
- plan.py:     token tiles, block shapes and split-K factors from the shapes alone, tuned tables, overrides;
- build.py:    compiling csrc/ at first use (NVRTC through CuPy, cached on disk);
- weights.py:  the kernels' layout of packed weights, and which weights they run;
- launch.py:   one forward.
It imports the format layer only (never the plugin, the tools or the benchmarks); torch and numpy at import, CuPy
when a kernel is first built.
"""

from .launch import moe_experts, moe_experts_from_logits, routes_logits
from .plan import GemmConfig, KernelConfig, LayerShape, MoEPlan, device_of, override_config, plan_moe
from .weights import check_weights, checkpoint_layout, prepare_weights, supports

__all__ = [
    "GemmConfig",
    "KernelConfig",
    "LayerShape",
    "MoEPlan",
    "check_weights",
    "checkpoint_layout",
    "device_of",
    "moe_experts",
    "moe_experts_from_logits",
    "override_config",
    "plan_moe",
    "prepare_weights",
    "routes_logits",
    "supports",
]
