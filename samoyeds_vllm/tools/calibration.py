"""Calibrated pruning, one decoder layer at a time: what `convert --method wanda|sparsegpt` runs.

The dense model is built empty (accelerate's `init_empty_weights`), and only one decoder layer holds weights at a
time: peak memory is about one layer plus the calibration activations, so a model far larger than memory can be
pruned. On a GPU when there is one.

For each MoE layer, in order:
1. the layer runs on the calibration activations that the already-pruned earlier layers produced; its own router
   (transformers' implementation of the family) picks the experts, and our expert module records, per expert,
   the tokens routed to it: H = X^T X of gate/up's inputs (Wanda's input norms are its diagonal);
2. gate and up of every expert are pruned (pruning.py), stacked, so a samoyeds row pair never spans the two;
3. the layer runs again with the pruned gate/up, recording the inputs of down, SiLU(x G^T) * (x U^T) of the same
   tokens: down is pruned against what the pruned gate/up really produce;
4. the layer runs a third time with every expert pruned: its outputs are the next layer's inputs.

Experts that received fewer than `min_tokens` calibration tokens cannot be trusted with a second-order update
fitted to so few inputs: SparseGPT falls back to Wanda for them (to magnitude if they saw no token at all). The
fallbacks are counted in the conversion report. Tokens are not weighted by their routing weights.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from ..errors import CheckpointError, SamoyedsError
from ..format import Pattern, prune
from .architectures import DOWN, GATE, UP, Architecture, text_config
from .checkpoint_io import CheckpointReader
from .pruning import output_error, sparsegpt, wanda_scores
from .text_data import DataError, calibration_windows, load_documents

#: Experts with fewer calibration tokens than this are pruned by Wanda instead of SparseGPT.
MIN_EXPERT_TOKENS = 128
#: Tokens per forward pass of a layer: bounds the activation memory of attention and the experts.
TOKENS_PER_BATCH = 16384
#: Experts pruned at once (their weights and Hessians in float32 at the same time).
EXPERTS_PER_CHUNK = 32


@dataclass
class LayerResult:
    """One MoE layer's pruned expert weights (checkpoint name -> tensor in the checkpoint's dtype, on CPU) and
    what calibration saw."""

    layer: int
    pruned: dict[str, torch.Tensor]
    tokens_per_expert: list[int]
    fallback: dict[str, int] = field(default_factory=dict)  # method -> experts pruned by it instead
    output_error: dict[str, float] = field(default_factory=dict)  # "w13" / "w2" -> ||X(W - P)|| / ||XW||
    seconds: float = 0.0


class _Experts(torch.nn.Module):
    """Stands in for transformers' experts module (`forward(x, top_k_index, top_k_weights)`): computes the experts
    from our own weight tensors, and records each expert's inputs while `record` is set."""

    def __init__(self, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor):
        super().__init__()
        self.gate, self.up, self.down = gate, up, down  # [E, I, H], [E, I, H], [E, H, I]
        self.record: str | None = None  # "w13" or "w2"
        num_experts = gate.shape[0]
        self.tokens = torch.zeros(num_experts, dtype=torch.long)
        self.hessian: torch.Tensor | None = None

    def _accumulate(self, expert: int, x: torch.Tensor) -> None:
        x = x.float()
        if self.hessian is None:
            shape = (self.gate.shape[0], x.shape[-1], x.shape[-1])
            self.hessian = torch.zeros(shape, dtype=torch.float32, device=x.device)
        self.hessian[expert] += x.T @ x

    def _run(self, expert: int, x: torch.Tensor) -> torch.Tensor:
        """One expert's MLP on its tokens, recording their inputs as `record` says."""
        if self.record == "w13":
            self.tokens[expert] += x.shape[0]
            self._accumulate(expert, x)
        h = torch.nn.functional.silu(x @ self.gate[expert].T) * (x @ self.up[expert].T)
        if self.record == "w2":
            self._accumulate(expert, h)
        return h @ self.down[expert].T

    def forward(self, hidden_states: torch.Tensor, top_k_index: torch.Tensor, top_k_weights: torch.Tensor):
        out = torch.zeros_like(hidden_states)
        flat = top_k_index.reshape(-1)
        order = flat.argsort(stable=True)
        counts = torch.bincount(flat, minlength=self.gate.shape[0]).tolist()
        top_k = top_k_index.shape[-1]
        start = 0
        for expert, count in enumerate(counts):
            if not count:
                continue
            slots = order[start : start + count]
            start += count
            tokens = slots // top_k
            y = self._run(expert, hidden_states[tokens])
            y = y * top_k_weights.reshape(-1)[slots, None].to(y.dtype)
            out.index_add_(0, tokens, y.to(out.dtype))
        return out


class _InputWeightedExperts(_Experts):
    """Stands in for Llama-4's experts module (`forward(x)`, x [E * T, H]: each expert's copy of the tokens,
    scaled by its router weight, so zero where the expert was not chosen). Runs each expert on its chosen
    tokens only; their recorded inputs are the scaled ones, which is what the expert sees."""

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        x = hidden_states.view(self.gate.shape[0], -1, hidden_states.shape[-1])
        out = torch.zeros_like(x)
        for expert in range(x.shape[0]):
            rows = x[expert].any(dim=-1).nonzero().squeeze(-1)
            if len(rows):
                out[expert, rows] = self._run(expert, x[expert, rows]).to(out.dtype)
        return out.view_as(hidden_states)


def experts_module(arch: Architecture, gate: torch.Tensor, up: torch.Tensor, down: torch.Tensor) -> _Experts:
    """Our stand-in for the family's transformers experts module, on stacked [E, out, in] weights."""
    return (_InputWeightedExperts if arch.weights_on_input else _Experts)(gate, up, down)


def _skeleton(model_dir: Path, dtype: torch.dtype):
    """The language model, without weights (of a multimodal model: its text part, whose tensors the checkpoint
    holds under Architecture.text_prefix)."""
    from accelerate import init_empty_weights
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_dir).get_text_config()
    with init_empty_weights():
        model = AutoModelForCausalLM.from_config(config, dtype=dtype, attn_implementation="sdpa")
    return model.eval()


def _load_module(
    module: torch.nn.Module, prefix: str, reader: CheckpointReader, device, dtype, rename: tuple[str, str] = ("", "")
) -> None:
    """Fill every parameter of `module` from the checkpoint tensor `prefix.<name>`, where a name starting with
    rename[0] is read as starting with rename[1] (transformers may call a checkpoint's module differently), and
    every buffer the checkpoint holds (GLM-4.5's and DeepSeek-V3's score-correction biases, which select the
    experts; in the buffer's own dtype, as transformers keeps them in float32)."""
    from accelerate.utils import set_module_tensor_to_device

    names = set(reader.names())
    old, new = rename

    def checkpoint_name(name: str) -> str:
        return f"{prefix}.{new + name.removeprefix(old) if old and name.startswith(old) else name}"

    for name, _ in list(module.named_parameters()):
        full = checkpoint_name(name)
        if full not in names:
            raise CheckpointError(f"the checkpoint has no tensor {full}, which the model needs")
        set_module_tensor_to_device(module, name, device, value=reader.get(full).to(dtype))
    for name, buffer in list(module.named_buffers()):
        if (full := checkpoint_name(name)) in names:  # the others are computed (rotary frequencies, ...)
            set_module_tensor_to_device(module, name, device, value=reader.get(full).to(buffer.dtype))


class _StopForward(Exception):
    pass


def _first_layer_inputs(model, windows: list[list[int]], batch: int, device) -> list[tuple[torch.Tensor, dict]]:
    """The inputs of decoder layer 0 for each batch of windows: (hidden states, the keyword arguments the model
    passes its layers: rotary embeddings, attention mask, ...)."""
    caught = []

    class Catcher(torch.nn.Module):
        def forward(self, hidden_states, *args, **kwargs):
            caught.append((hidden_states, kwargs))
            raise _StopForward

    layers = model.model.layers
    first = layers[0]
    layers[0] = Catcher()
    try:
        for b in range(0, len(windows), batch):
            ids = torch.tensor(windows[b : b + batch], device=device)
            with contextlib.suppress(_StopForward):
                model.model(input_ids=ids, use_cache=False)
    finally:
        layers[0] = first
    return caught


def _run_layer(layer, experts: _Experts | None, batches: list, record: str | None, keep: bool) -> None:
    """Run one decoder layer over every calibration batch, `experts` recording `record`'s inputs; with `keep`,
    its outputs replace the batches (they become the next layer's inputs)."""
    if experts is not None:
        experts.record = record
    with torch.no_grad():
        for i, (hidden, kwargs) in enumerate(batches):
            out = layer(hidden, **kwargs)
            if keep:
                batches[i] = (out[0] if isinstance(out, tuple) else out, kwargs)


def _expert_weights(reader, arch: Architecture, layer: int, num_experts: int, device, dtype):
    def stack(role: str) -> torch.Tensor:
        proj = arch.projection(role)
        return torch.stack([reader.get(arch.expert_weight_name(layer, e, proj)) for e in range(num_experts)]).to(
            device, dtype
        )

    return stack(GATE), stack(UP), stack(DOWN)


def _prune_stack(
    w: torch.Tensor, hessian: torch.Tensor, tokens: torch.Tensor, pattern: Pattern, method: str, fallback: dict
) -> tuple[torch.Tensor, float, float]:
    """Prune [E, m, k] weights given their inputs' [E, k, k] Hessians X^T X. Returns the pruned float32 weights
    and the output error ||X(W - P)||^2 and reference ||XW||^2, summed over the experts."""
    out = torch.empty(w.shape, dtype=torch.float32, device=w.device)
    err = ref = 0.0
    for c in range(0, w.shape[0], EXPERTS_PER_CHUNK):
        sl = slice(c, c + EXPERTS_PER_CHUNK)
        wc, hc, seen = w[sl].float(), hessian[sl], tokens[sl].to(w.device)
        if method == "magnitude":
            pruned = prune(wc, pattern)
        else:
            norms = hc.diagonal(dim1=-2, dim2=-1).clamp_min(0).sqrt()
            pruned = prune(wc, pattern, scores=wanda_scores(wc, norms))
            if method == "sparsegpt":
                few = seen < MIN_EXPERT_TOKENS
                pruned = torch.where(few[:, None, None], pruned, sparsegpt(wc, hc, pattern))
                if count := int((few & (seen > 0)).sum()):
                    fallback["wanda"] = fallback.get("wanda", 0) + count
            unseen = seen == 0
            if unseen.any():  # no data at all: the input norms are all zero, so keep by magnitude
                pruned[unseen] = prune(wc[unseen], pattern)
                fallback["magnitude"] = fallback.get("magnitude", 0) + int(unseen.sum())
        e, r = output_error(wc, pruned, hc)
        err, ref = err + e, ref + r
        out[sl] = pruned
    return out, err, ref


def available_bytes(device: torch.device) -> int:
    """Memory free for us on `device`: the GPU's free memory, or the host's MemAvailable."""
    if device.type == "cuda":
        return torch.cuda.mem_get_info(device)[0]
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    raise OSError("cannot read MemAvailable from /proc/meminfo")


def peak_bytes(arch: Architecture, reader: CheckpointReader, windows: list[list[int]], dtype: torch.dtype) -> int:
    """An estimate of layer-by-layer pruning's peak memory: the calibration activations (twice, in and out of a
    batch), the largest layer's weights, its experts' Hessians (float32) and the float32 working set of a chunk of
    experts in the OBS sweep (weights, the float64 inverse-Hessian factorisation)."""
    size = torch.tensor([], dtype=dtype).element_size()
    experts = arch.experts_per_layer(reader.names())
    layer, num = max(experts.items(), key=lambda kv: kv[1])
    inter, hidden = reader.shape(arch.expert_weight_name(layer, 0, arch.projection(GATE)))
    layer_bytes = (
        sum(math.prod(reader.shape(n)) for n in reader.names() if n.startswith(f"{arch.layers_prefix}{layer}.")) * size
    )
    activations = 2 * len(windows) * len(windows[0]) * hidden * size
    hessians = num * hidden * hidden * 4
    chunk = min(num, EXPERTS_PER_CHUNK)
    sweep = chunk * (3 * 2 * inter * hidden * 4 + 3 * hidden * hidden * 8) + num * 2 * inter * hidden * 4
    return activations + layer_bytes + hessians + sweep


def prune_layers(
    model_dir: Path,
    arch: Architecture,
    reader: CheckpointReader,
    pattern: Pattern,
    method: str,
    windows: list[list[int]],
    *,
    device: str | None = None,
    progress: bool = True,
) -> Iterator[LayerResult]:
    """Prune every MoE layer's experts with `method` on the calibration `windows` (token ids, all of one length),
    layer by layer (module docstring). Yields each layer's result as soon as it is done. "magnitude" runs here too,
    to measure its output error on the same data."""
    device = calibration_device(device)
    dtype_guess = torch.float32 if device.type == "cpu" else torch.bfloat16
    needed, free = peak_bytes(arch, reader, windows, dtype_guess), available_bytes(device)
    if needed > 0.9 * free:
        raise SamoyedsError(
            f"{method} pruning layer by layer needs about {needed / 2**30:.1f} GiB on {device.type}, and "
            f"{free / 2**30:.1f} GiB are free: lower --calib-samples or --calib-seq-len (activations: "
            f"{len(windows)} x {len(windows[0])} tokens), or use another --device"
        )
    experts_per_layer = arch.experts_per_layer(reader.names())
    first = next(iter(experts_per_layer))
    weight_dtype = reader.get(arch.expert_weight_name(first, 0, next(iter(arch.projections)))).dtype
    # bfloat16 matmuls are slow on CPUs; compute there in float32 (the written weights keep the checkpoint dtype).
    dtype = weight_dtype if device.type == "cuda" else torch.float32
    model = _skeleton(model_dir, dtype)
    _load_module(model.model.embed_tokens, f"{arch.text_prefix}model.embed_tokens", reader, device, dtype)
    model.model.rotary_emb.to(device)
    batch = max(1, TOKENS_PER_BATCH // len(windows[0]))
    batches = _first_layer_inputs(model, windows, batch, device)
    model.model.embed_tokens.to("meta")

    bar = tqdm(total=len(model.model.layers), desc=f"{method} pruning", unit="layer", disable=not progress)
    for index, layer in enumerate(model.model.layers):
        start = time.perf_counter()
        # The MoE block as transformers names it (Mixtral's checkpoint says block_sparse_moe, its module mlp).
        moe_name, moe = next(((n, m) for n, m in layer.named_children() if hasattr(m, "experts")), (None, None))
        num_experts = experts_per_layer.get(index)
        experts = None
        if num_experts:
            if moe is None:
                raise CheckpointError(f"layer {index} has expert weights, but transformers' layer has no experts")
            gate, up, down = _expert_weights(reader, arch, index, num_experts, device, dtype)
            experts = experts_module(arch, gate, up, down)
            moe.experts = experts
        rename = (f"{moe_name}.", f"{arch.moe_block}.") if moe_name else ("", "")
        _load_module(layer, f"{arch.layers_prefix}{index}", reader, device, dtype, rename)

        if experts is None:
            _run_layer(layer, experts, batches, None, keep=True)
        else:
            result = LayerResult(index, {}, [])
            _run_layer(layer, experts, batches, "w13", keep=False)
            tokens = experts.tokens.clone()
            result.tokens_per_expert = tokens.tolist()
            hessian13, experts.hessian = experts.hessian, None
            w13 = torch.cat([experts.gate, experts.up], dim=1)
            pruned13, e13, r13 = _prune_stack(w13, hessian13, tokens, pattern, method, result.fallback)
            del hessian13
            inter = gate.shape[1]
            # The next passes see the weights as they are written: rounded to the checkpoint dtype.
            experts.gate = pruned13[:, :inter].to(weight_dtype).to(dtype)
            experts.up = pruned13[:, inter:].to(weight_dtype).to(dtype)
            _run_layer(layer, experts, batches, "w2", keep=False)
            hessian2, experts.hessian = experts.hessian, None
            pruned2, e2, r2 = _prune_stack(experts.down, hessian2, tokens, pattern, method, {})
            del hessian2
            experts.down = pruned2.to(weight_dtype).to(dtype)
            result.output_error = {"w13": (e13 / r13) ** 0.5 if r13 else 0.0, "w2": (e2 / r2) ** 0.5 if r2 else 0.0}
            _run_layer(layer, experts, batches, None, keep=True)
            for role, stacked in ((GATE, pruned13[:, :inter]), (UP, pruned13[:, inter:]), (DOWN, pruned2)):
                proj = arch.projection(role)
                for e in range(num_experts):
                    name = arch.expert_weight_name(index, e, proj)
                    result.pruned[name] = stacked[e].to(weight_dtype).cpu()
            result.seconds = time.perf_counter() - start
            del experts, gate, up, down, pruned13, pruned2
            moe.experts = None
            yield result
        layer.to("meta")
        bar.update()
    bar.close()


def calibration_device(name: str | None) -> torch.device:
    """Where calibrated pruning runs: `name` (--device), by default cuda if there is a GPU, else cpu; a name that is
    no device, or one this machine lacks, refused."""
    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except RuntimeError:
        raise SamoyedsError(f"--device {name!r}: not a device; give cpu, cuda or cuda:N") from None
    if device.type == "cuda":
        count = torch.cuda.device_count()
        if (device.index or 0) >= count:
            gpus = f"{count or 'no'} CUDA GPU{'' if count == 1 else 's'}"
            raise SamoyedsError(f"--device {name}: this machine has {gpus}")
    elif device.type != "cpu":
        raise SamoyedsError(f"--device {name}: calibrated pruning runs on cpu or cuda")
    return device


@dataclass(frozen=True)
class Calibration:
    """Where calibration text comes from and how much of it: `samples` windows of `seq_len` tokens drawn (seeded)
    from a text_data SOURCE."""

    data: str
    samples: int = 128
    seq_len: int = 2048
    seed: int = 0
    split: str = "train"
    text_field: str = "text"
    device: str | None = None

    def to_json(self) -> dict:
        return {k: getattr(self, k) for k in ("data", "samples", "seq_len", "seed", "split", "text_field")}

    def windows(self, model_dir: Path, hf_config: dict) -> list[list[int]]:
        """The token windows, checked against the model: the tokenizer's ids must fit its vocabulary, and
        windows longer than its context are refused."""
        from transformers import AutoTokenizer

        hf_config = text_config(hf_config)
        context = hf_config.get("max_position_embeddings")
        if context and self.seq_len > context:
            raise DataError(f"--calib-seq-len {self.seq_len} is longer than the model's context of {context} tokens")
        try:
            tokenizer = AutoTokenizer.from_pretrained(model_dir)
        except Exception as e:
            raise CheckpointError(
                f"{model_dir}: calibration needs the model's tokenizer, which does not load ({e})"
            ) from None
        docs = load_documents(self.data, split=self.split, text_field=self.text_field)
        try:
            windows = calibration_windows(tokenizer, docs, self.samples, self.seq_len, self.seed)
        except DataError as e:
            raise DataError(f"{e} (--calib-samples, --calib-seq-len)") from None
        vocab = int(hf_config.get("vocab_size") or 0)
        largest = max(max(w) for w in windows)
        if vocab and largest >= vocab:
            raise DataError(
                f"{model_dir}: its tokenizer gives token id {largest}, but the model's vocabulary has {vocab} "
                "entries: the tokenizer does not belong to this model"
            )
        return windows
