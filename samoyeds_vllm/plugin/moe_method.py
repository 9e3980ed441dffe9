"""The samoyeds fused-MoE method: packed expert parameters, their loading, routing and the sparse-MoE op.

The method routes by itself (`is_monolithic`): on CUDA through vLLM's own router (or its fused top-k softmax
kernel), on CPU, whose vLLM build lacks the router's CUDA ops, through the same routings in tensor ops.
"""

from __future__ import annotations

import torch
from vllm.logger import init_logger
from vllm.model_executor.layers.fused_moe import FusedMoeWeightScaleSupported, RoutedExperts
from vllm.model_executor.layers.fused_moe.activation import MoEActivation
from vllm.model_executor.layers.fused_moe.fused_moe_method_base import FusedMoEMethodBase
from vllm.model_executor.utils import set_weight_attrs
from vllm.platforms import current_platform

from .. import kernels
from ..errors import PatternError
from ..format import (
    FP8,
    FP8_MAX,
    SUFFIXES,
    PackedWeight,
    Pattern,
    check_packed,
    compress,
    nonfinite_count,
    prune,
    quantize,
)
from ..format.fp8_blocks import SCALE_SUFFIX, dequantize_blocks, scale_shape
from . import ops
from .routing import Routing, route

logger = init_logger(__name__)

#: The part of a block-quantized FP8 checkpoint's expert beside its weight: `X.weight_scale_inv`.
_SCALE_INV = "scale_inv"
_PART_NAMES = {"weight": "weight", _SCALE_INV: "weight" + SCALE_SUFFIX, **SUFFIXES}

#: The all-to-all backend the method runs data parallelism over (vLLM's default).
_ALL_GATHER = "allgather_reducescatter"

#: Metadata that names positions (0, 1) in every group: valid, so unloaded (dummy) weights still run.
_VALID_META_FILL = 0x4444


def _check_supported(layer: RoutedExperts) -> Routing:
    """The layer's routing, which vLLM's router computes (on CPU: its paths in tensor ops); refuses what the
    kernels cannot run (they compute SiLU-gated experts without biases) and what the CPU path cannot route."""
    unsupported = []
    if layer.activation != MoEActivation.SILU:
        unsupported.append(f"activation {layer.activation.value!r}")
    if layer.swiglu_limit is not None or layer.swiglu_alpha is not None or layer.swiglu_beta is not None:
        unsupported.append("a clamped SwiGLU (swiglu_limit / alpha / beta, gpt-oss)")
    if layer.moe_config.has_bias:
        unsupported.append("expert biases")
    if layer.apply_router_weight_on_input and layer.top_k != 1:
        # vLLM implements it for top-1 only (its prepare steps assert so): weight * expert(x) == expert(weight * x)
        # holds for no nonlinear expert, and with k > 1 there is no single input to scale
        unsupported.append(f"router weights applied on the input with top_k {layer.top_k} (vLLM does top-1)")
    routing = Routing.of_layer(layer)
    if current_platform.is_cpu() and (what := routing.unsupported_on_cpu()):
        unsupported.append(f"{what} routing on CPU")
    if unsupported:
        raise NotImplementedError(
            f"{layer.layer_name}: the samoyeds method runs SiLU-gated experts without biases, routed by any of "
            f"vLLM's routings for them, not {', '.join(unsupported)}"
        )
    parallel = layer.moe_config.moe_parallel_config
    if (
        (parallel.dp_size > 1 or parallel.is_sequence_parallel)
        and parallel.all2all_backend != _ALL_GATHER
        and not current_platform.is_cpu()  # vLLM's CPU communicator always all-gathers
    ):
        # a method that routes inside its op gets the tokens of every data-parallel rank through the all-to-all
        # manager's dispatch_router_logits, which vLLM implements for all-gather / reduce-scatter only
        raise NotImplementedError(
            f"{layer.layer_name}: the samoyeds method runs data parallelism over vLLM's default all-to-all "
            f"({_ALL_GATHER}), not --all2all-backend {parallel.all2all_backend}"
        )
    return routing


class SamoyedsMoEMethod(FusedMoEMethodBase):
    """Routed experts with structured-sparse weights: packed parameters, routing and the sparse-MoE op."""

    def __init__(
        self,
        pattern: Pattern,
        packed: bool,
        moe,
        values: torch.dtype | None = None,
        fp8_block: tuple[int, int] | None = None,
    ) -> None:
        super().__init__(moe)
        self.pattern = pattern
        self.packed = packed  # the checkpoint holds packed tensors (else dense ones, packed after loading)
        self.values = values  # quantized value type (FP8, with per-row scales), or None: the model's dtype
        self.fp8_block = fp8_block  # dense experts stored in FP8 with scales per block of this shape

    @property
    def is_monolithic(self) -> bool:
        return True  # routes itself: vLLM's router needs CUDA-only ops that the CPU build lacks

    def get_fused_moe_quant_config(self, layer: torch.nn.Module):
        return None

    def create_weights(
        self,
        layer: RoutedExperts,
        num_experts: int,
        hidden_size: int,
        intermediate_size_per_partition: int,
        params_dtype: torch.dtype,
        **extra_weight_attrs,
    ):
        self.routing = _check_supported(layer)
        tp_size = self.moe.moe_parallel_config.tp_size
        inter = intermediate_size_per_partition
        self.dense_shapes = shapes = {
            "w13": (num_experts, 2 * inter, hidden_size),
            "w2": (num_experts, hidden_size, inter),
        }
        for name, shape in shapes.items():
            try:
                self.pattern.check_shape(shape, f"{layer.layer_name}.{name}_weight")
            except PatternError as e:
                if tp_size > 1:
                    raise ValueError(
                        f"{e}. Tensor parallel size {tp_size} splits the expert intermediate size "
                        f"{self.moe.intermediate_size} into {intermediate_size_per_partition}-wide "
                        f"shards; choose a TP size whose shards fit the pattern"
                    ) from None
                raise
        if self.fp8_block is not None and tp_size > 1 and any(inter % b for b in self.fp8_block):
            raise ValueError(
                f"{layer.layer_name}: tensor parallel size {tp_size} splits the expert intermediate size "
                f"{self.moe.intermediate_size} into {inter}-wide shards, which cut the checkpoint's FP8 scale blocks "
                f"{self.fp8_block}; choose a TP size whose shards are whole blocks"
            )
        self.params_dtype = params_dtype
        for name, shape in shapes.items():
            if self.packed:
                self._register_packed(layer, name, shape, params_dtype, extra_weight_attrs)
                continue
            # dense now, packed in process_weights_after_loading
            loader = _checked_loader(layer, None, extra_weight_attrs["weight_loader"], fp8_block=self.fp8_block)
            param = torch.nn.Parameter(
                torch.empty(shape, dtype=FP8 if self.fp8_block else params_dtype), requires_grad=False
            )
            layer.register_parameter(f"{name}_weight", param)
            set_weight_attrs(param, {**extra_weight_attrs, "weight_loader": loader})
            if self.fp8_block is not None:
                # w13's scales: gate's blocks, then up's (the checkpoint scales each projection in its own blocks)
                halves = 2 if name == "w13" else 1
                rows, cols = scale_shape((shape[1] // halves, shape[2]), self.fp8_block)
                # float32 as stored: vLLM builds the model under its dtype as torch's default, and bf16 scales
                # would dequantize other weights than the checkpoint's (and than `convert` prunes)
                scale = torch.nn.Parameter(
                    torch.ones(num_experts, halves * rows, cols, dtype=torch.float32), requires_grad=False
                )
                layer.register_parameter(f"{name}_weight{SCALE_SUFFIX}", scale)
                # vLLM's expert loader shards tensors named *scale* by this attribute, block scales like weights
                attrs = {"quant_method": FusedMoeWeightScaleSupported.BLOCK.value, "weight_loader": loader}
                set_weight_attrs(scale, {**extra_weight_attrs, **attrs})

    def _register_packed(
        self,
        layer: RoutedExperts,
        name: str,
        dense_shape: tuple[int, ...],
        dtype: torch.dtype,
        extra_weight_attrs: dict,
    ) -> None:
        dtypes = {"values": self.values or dtype, "meta": torch.int16, "rowsel": torch.uint8, "scale": torch.float32}
        fills = {"meta": _VALID_META_FILL, "rowsel": 0, "scale": 1.0}
        loader = _checked_loader(layer, self.pattern, extra_weight_attrs["weight_loader"], self.values is not None)
        label = f"{layer.layer_name}.{name}_weight"
        for part, shape in self.pattern.packed_shapes(dense_shape, label, scaled=self.values is not None).items():
            tensor = (
                torch.empty(shape, dtype=dtypes[part])
                if part == "values"
                else torch.full(shape, fills[part], dtype=dtypes[part])
            )
            param = torch.nn.Parameter(tensor, requires_grad=False)
            layer.register_parameter(f"{name}_{SUFFIXES[part]}", param)
            # vLLM's expert loader puts tensors named *scale* by this attribute: one value per output row
            attrs = {"quant_method": FusedMoeWeightScaleSupported.CHANNEL.value} if part == "scale" else {}
            set_weight_attrs(param, {**extra_weight_attrs, **attrs, "weight_loader": loader})

    def process_weights_after_loading(self, layer: RoutedExperts) -> None:
        if self.packed:
            parts = [p for p in SUFFIXES if p != "scale" or self.values is not None]
        else:
            parts = ["weight", _SCALE_INV] if self.fp8_block else ["weight"]
        from_checkpoint = _check_all_loaded(layer, parts, self.pattern)
        for name in ("w13", "w2"):
            weight = getattr(layer, f"{name}_{SUFFIXES['values']}" if self.packed else f"{name}_weight").data
            if self.fp8_block is not None:
                weight = self._dequantized(layer, name)
            if bad := nonfinite_count(weight):
                raise ValueError(
                    f"{layer.layer_name}.{name}: the checkpoint's expert weights hold "
                    f"{bad} non-finite values (NaN or Inf); the checkpoint is damaged"
                )
            if self.packed and self.values is not None and not from_checkpoint:
                _dummy_fp8(layer, name)
            if not self.packed:
                label = f"{layer.layer_name}.{name}_weight"
                packed = compress(prune(weight, self.pattern, name=label), self.pattern, name=label)
                if self.values is not None:
                    packed = quantize(packed, self.pattern, self.values)
                delattr(layer, f"{name}_weight")
                if self.fp8_block is not None:
                    delattr(layer, f"{name}_weight{SCALE_SUFFIX}")
                for part, tensor in packed._asdict().items():
                    if tensor is not None:
                        layer.register_parameter(
                            f"{name}_{SUFFIXES[part]}", torch.nn.Parameter(tensor, requires_grad=False)
                        )
            check_packed(
                self._packed(layer, name),
                self.pattern,
                self.dense_shapes[name],
                name=f"{layer.layer_name}.{name}_weight",
            )
        w13, w2 = self._packed(layer, "w13"), self._packed(layer, "w2")
        dtype = layer.moe_config.in_dtype
        if not w13.values.is_cuda:
            return  # the reference implementation reads the checkpoint's layout
        if not kernels.supports(dtype, w13, w2):
            logger.warning(
                "%s: the samoyeds GPU kernels need bf16/fp16 activations, values of their dtype or FP8, in whole "
                "64-row and 128-input tiles; this layer runs the slow reference implementation, which also cannot "
                "be captured in CUDA graphs (use --enforce-eager)",
                layer.layer_name,
            )
            return
        for name in ("w13", "w2"):  # the one conversion into the kernels' layout (the op checks it)
            stored = kernels.prepare_weights(self._packed(layer, name))
            for part in ("values", "meta", "rowsel"):
                if getattr(stored, part) is not None:
                    getattr(layer, f"{name}_{SUFFIXES[part]}").data = getattr(stored, part)

    def _dequantized(self, layer: RoutedExperts, name: str) -> torch.Tensor:
        """The dense experts an FP8 block-quantized checkpoint stands for, in the model's dtype: dequantized in
        float32 and rounded once, as the converter reads them, one expert at a time (fp32 temporaries of one)."""
        q, scale = getattr(layer, f"{name}_weight").data, getattr(layer, f"{name}_weight{SCALE_SUFFIX}").data
        halves = 2 if name == "w13" else 1
        dense = torch.empty(q.shape, dtype=self.params_dtype, device=q.device)
        for e in range(q.shape[0]):
            qe, se = q[e].unflatten(0, (halves, -1)), scale[e].unflatten(0, (halves, -1))
            dense[e] = dequantize_blocks(qe, se, self.fp8_block).flatten(0, 1)
        return dense

    def _packed(self, layer: RoutedExperts, name: str) -> PackedWeight:
        return PackedWeight(*(getattr(layer, f"{name}_{SUFFIXES[part]}", None) for part in PackedWeight._fields))

    def apply_monolithic(
        self, layer: RoutedExperts, x: torch.Tensor, router_logits: torch.Tensor, input_ids: torch.Tensor | None = None
    ) -> torch.Tensor:
        w13, w2 = self._packed(layer, "w13"), self._packed(layer, "w2")
        if self.routing.plain_softmax and layer.expert_map is None and not layer.apply_router_weight_on_input:
            # vLLM's softmax top-k inside the op: at one token the kernels take it from the logits themselves
            routing = self.routing
            return ops.moe_experts_softmax_topk(
                x, router_logits, routing.top_k, routing.renormalize, w13, w2, self.pattern
            )
        topk_weights, topk_ids = route(router_logits, self.routing, x)
        if layer.apply_router_weight_on_input:  # top-1 (checked at load): the experts read weight * x, unweighted
            x = x * topk_weights.to(x.dtype)
            topk_weights = torch.ones_like(topk_weights)
        if layer.expert_map is not None:  # expert parallelism: global ids -> local ids, -1 elsewhere
            topk_ids = layer.expert_map[topk_ids]
        return ops.moe_experts(x, topk_weights, topk_ids, w13, w2, self.pattern)


def _checked_loader(
    layer: RoutedExperts,
    pattern: Pattern | None,
    load,
    scaled: bool = False,
    fp8_block: tuple[int, int] | None = None,
):
    """Wraps vLLM's expert weight loader: checks packed tensors' shape and dtype (naming the tensor and the expert)
    and records which (part, shard, local expert) arrived, so that a missing one is an error at the end. `pattern`
    None: a dense checkpoint (sparsify-on-load), recorded only, unless it is block-quantized FP8 (`fp8_block`):
    then its weights' dtype and its scales' shapes are checked; `scaled`: packed values quantized, with scales."""
    hidden, inter = layer.moe_config.hidden_dim, layer.moe_config.intermediate_size
    dense = {"w1": (inter, hidden), "w3": (inter, hidden), "w2": (hidden, inter)}
    if not hasattr(layer, "_samoyeds_loaded"):
        layer._samoyeds_loaded = set()

    def loader(param, loaded_weight, weight_name, shard_id, expert_id, return_success=False):
        if weight_name.endswith(SCALE_SUFFIX):
            part = _SCALE_INV
        else:
            part = next((p for p, suffix in SUFFIXES.items() if weight_name.endswith(suffix)), "weight")
        if fp8_block is not None:
            where = f"expert {expert_id}, {shard_id}"
            _check_fp8_block_tensor(weight_name, where, part, loaded_weight, dense[shard_id], fp8_block)
        if pattern is not None:
            shapes = pattern.packed_shapes(dense[shard_id], weight_name, scaled=scaled)
            if part not in shapes:
                raise ValueError(
                    f"{weight_name} (expert {expert_id}, {shard_id}): the checkpoint has a {part} tensor, which its "
                    f"quantization_config does not name (pattern {pattern}, {'' if scaled else 'un'}quantized values)"
                )
            expected = shapes[part]
            if tuple(loaded_weight.shape) != expected:
                raise ValueError(
                    f"{weight_name} (expert {expert_id}, {shard_id}): checkpoint tensor has shape "
                    f"{tuple(loaded_weight.shape)}, expected {expected} for pattern {pattern}"
                )
            if part != "values" and loaded_weight.dtype != param.dtype:
                raise ValueError(
                    f"{weight_name} (expert {expert_id}, {shard_id}): dtype {loaded_weight.dtype}, "
                    f"expected {param.dtype}"
                )
        success = load(param, loaded_weight, weight_name, shard_id, expert_id, return_success=True)
        if success:
            # A 3-D dense weight holds every local expert from expert_id on (Llama-4's fused checkpoints)
            count = loaded_weight.shape[0] if pattern is None and loaded_weight.dim() == 3 else 1
            layer._samoyeds_loaded.update((part, shard_id, expert_id + e) for e in range(count))
        return success if return_success else None

    return loader


def _check_fp8_block_tensor(
    name: str, where: str, part: str, tensor: torch.Tensor, dense: tuple[int, int], block: tuple[int, int]
) -> None:
    """A block-quantized expert's tensor: an FP8 weight, or float scales, one per block of `dense`. vLLM's loader
    would round a weight of another dtype into FP8 and broadcast scales of a smaller shape, without a word."""
    if part == _SCALE_INV:
        expected = scale_shape(dense, block)
        if tuple(tensor.shape) != expected or not tensor.is_floating_point():
            raise ValueError(
                f"{name} ({where}): block scales of shape {tuple(tensor.shape)} and dtype {tensor.dtype}, expected "
                f"{expected} floats for the {dense} weight in {block[0]} x {block[1]} blocks"
            )
    elif part == "weight" and tensor.dtype != FP8:
        raise ValueError(
            f"{name} ({where}): dtype {tensor.dtype}, but the checkpoint's quantization_config says FP8 in "
            f"{block[0]} x {block[1]} blocks (float8_e4m3fn weights beside weight{SCALE_SUFFIX} scales); an expert "
            "stored unquantized belongs in its modules_to_not_convert"
        )


def _check_all_loaded(layer: RoutedExperts, parts: list[str], pattern: Pattern) -> bool:
    """Every local expert's every projection (and packed part) came from the checkpoint: vLLM checks parameters,
    not the experts inside them, so a checkpoint missing one expert tensor would otherwise run on garbage. Nothing
    recorded means nothing was read through the loaders (load_format=dummy): nothing to check, and False."""
    loaded = getattr(layer, "_samoyeds_loaded", set())
    if not loaded:
        return False
    parts = [p for p in parts if p != "rowsel" or pattern.is_samoyeds]
    missing = [
        (part, shard, expert)
        for expert in range(layer.global_num_experts)
        if layer._map_global_expert_id_to_local_expert_id(expert) != -1
        for shard in ("w1", "w3", "w2")
        for part in parts
        if (part, shard, expert) not in loaded
    ]
    if missing:
        shown = ", ".join(f"expert {e} {s} ({_PART_NAMES[p]})" for p, s, e in missing[:4])
        more = f" and {len(missing) - 4} more" if len(missing) > 4 else ""
        raise ValueError(f"{layer.layer_name}: the checkpoint has no tensor for {shown}{more}")
    del layer._samoyeds_loaded
    return True


def _dummy_fp8(layer: RoutedExperts, name: str) -> None:
    """load_format=dummy filled the FP8 values and scales like every weight, uniform in +-1e-3 (values mostly
    zero in e4m3, scales negative): give the values e4m3's range instead and the scales 1e-3 / FP8_MAX, so the
    experts' weights have the magnitudes of the model's other dummy weights."""
    values = getattr(layer, f"{name}_{SUFFIXES['values']}")
    generator = torch.Generator(device=values.device).manual_seed(1234)
    uniform = torch.empty(values.shape, dtype=torch.float16, device=values.device)
    values.data.copy_(uniform.uniform_(-FP8_MAX, FP8_MAX, generator=generator).to(values.dtype))
    getattr(layer, f"{name}_{SUFFIXES['scale']}").data.fill_(1e-3 / FP8_MAX)
