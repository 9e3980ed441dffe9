"""samoyeds-vllm: dual-side structured-sparse Mixture-of-Experts for vLLM.

vLLM loads this package through the `vllm.general_plugins` entry point and calls `register()` in every process.

Layers, each importing only those before it: `format` (patterns, packed layout, checkpoint keys) <- `kernels`
(the CUDA kernels' host side) <- `plugin` (the vLLM method) <- `tools` (convert, prune, make models) <- `bench`
<- `cli`.
"""

__version__ = "0.1.0"

_registered = False


def register() -> None:
    """Register the `samoyeds` quantization method with vLLM (idempotent; vLLM calls it once per process)."""
    global _registered
    if _registered:
        return
    from vllm.model_executor.layers.quantization import register_quantization_config

    from .plugin.config import SamoyedsConfig

    register_quantization_config("samoyeds")(SamoyedsConfig)
    _registered = True
