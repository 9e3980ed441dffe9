"""Convert a dense Hugging Face MoE checkpoint into a samoyeds sparse one.

Routed-expert weights are pruned onto the pattern and packed (samoyeds_vllm.format), their kept values quantized to
FP8 when asked; every other tensor is copied unchanged; config.json gains a `quantization_config` that tells vLLM to
load it with the `samoyeds` method. A block-quantized FP8 input (DeepSeek-V3, Qwen3-*-FP8) is read dequantized
(tools/fp8_blocks.py): its experts are pruned from the weights it stands for, and its other FP8 weights are copied
with their block scales (format version 3), so they load as the dense FP8 model's do (vLLM's FP8 block GEMMs) and as
sparsifying that checkpoint on load gives them (or, with `dequantize_other_layers`, in the model's dtype, format
version 1 / 2); the dense export (--export-dense) holds them dequantized.
Everything is checked before anything is written, tensors stream one at a time, and the output appears only
when complete.
"""

from __future__ import annotations

import json
import math
import resource
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from ..errors import CheckpointError, SamoyedsError
from ..format import (
    EXPERT_COUNT_KEYS,
    QUANT_METHOD,
    Pattern,
    compress,
    decompress,
    prune,
    quantization_config,
    quantize,
)
from ..format.fp8_blocks import block_size
from .architectures import Architecture, architecture_of
from .calibration import Calibration, LayerResult, prune_layers
from .checkpoint_io import (
    DEFAULT_MAX_SHARD_BYTES,
    INDEX_NAME,
    CheckpointReader,
    ShardedWriter,
    check_free_space,
    check_output_dir,
    dtype_of,
    read_config,
    staged_dirs,
)
from .fp8_blocks import Fp8BlockReader
from .fused_experts import FusingWriter, PerExpertReader, per_expert
from .model_maker import weight_specs
from .pruning import CALIBRATED, METHODS

REPORT_NAME = "samoyeds_report.json"


@dataclass
class LayerStats:
    """Sums over one layer's expert weights, enough for its sparsity and relative reconstruction error."""

    params: int = 0
    nonzeros: int = 0
    dense_sq: float = 0.0
    error_sq: float = 0.0
    pruned_sq: float = 0.0
    quantization_error_sq: float | None = None  # ||stored - pruned||^2 with quantized values
    calibration: LayerResult | None = None

    def add(self, dense: torch.Tensor, pruned: torch.Tensor, stored: torch.Tensor | None = None) -> None:
        """stored: the weight the checkpoint holds when it differs from `pruned` (dequantized values)."""
        d, p = dense.double(), pruned.double()
        self.params += dense.numel()
        self.nonzeros += int((pruned != 0).sum())
        self.dense_sq += float(d.square().sum())
        self.pruned_sq += float(p.square().sum())
        self.error_sq += float((d - (p if stored is None else stored.double())).square().sum())
        if stored is not None:
            self.quantization_error_sq = (self.quantization_error_sq or 0.0) + float(
                (stored.double() - p).square().sum()
            )

    @property
    def sparsity(self) -> float:
        return 1.0 - self.nonzeros / self.params if self.params else 0.0

    @property
    def relative_error(self) -> float:
        """Of the stored weights against the dense ones: pruning, and quantization where values are quantized."""
        return math.sqrt(self.error_sq / self.dense_sq) if self.dense_sq else 0.0

    @property
    def quantization_error(self) -> float | None:
        """Of the quantized values against the pruned weights they store, None without quantization."""
        if self.quantization_error_sq is None:
            return None
        return math.sqrt(self.quantization_error_sq / self.pruned_sq) if self.pruned_sq else 0.0

    def to_json(self) -> dict:
        out = {"sparsity": self.sparsity, "relative_error": self.relative_error, "params": self.params}
        if self.quantization_error is not None:
            out["quantization_error"] = self.quantization_error
        if c := self.calibration:
            tokens = sorted(c.tokens_per_expert)
            out["calibration"] = {
                "tokens_per_expert": {"min": tokens[0], "median": tokens[len(tokens) // 2], "max": tokens[-1]},
                "fallback_experts": c.fallback,
                "output_error": c.output_error,
                "seconds": round(c.seconds, 3),
            }
        return out


@dataclass
class ConversionReport:
    pattern: Pattern
    method: str
    values: torch.dtype | None = None
    calibration: Calibration | None = None
    layers: dict[int, LayerStats] = field(default_factory=dict)
    dense_bytes: int = 0
    sparse_bytes: int = 0
    seconds: float = 0.0
    peak_host_bytes: int = 0
    peak_gpu_bytes: int = 0
    #: a recovered model's quantization_config["recovery"]: its masks came from recovery["from"], and the errors
    #: here are against the recovered weights (which already satisfy the pattern)
    recovery: dict | None = None

    @property
    def fallback_experts(self) -> dict[str, int]:
        """Method -> experts of all layers pruned by it because calibration gave them too few tokens."""
        total: dict[str, int] = {}
        for stats in self.layers.values():
            for method, count in stats.calibration.fallback.items() if stats.calibration else ():
                total[method] = total.get(method, 0) + count
        return total

    def to_json(self) -> dict:
        out = {
            "pattern": self.pattern.to_config(),
            "method": self.recovery["from"] if self.recovery else self.method,
            **({"recovery": self.recovery} if self.recovery else {}),
            "values": str(self.values).removeprefix("torch.") if self.values else None,
            "expert_weight_bytes": {"dense": self.dense_bytes, "sparse": self.sparse_bytes},
            "layers": {str(i): s.to_json() for i, s in sorted(self.layers.items())},
        }
        if self.calibration:
            out["calibration"] = self.calibration.to_json()
            out["fallback_experts"] = self.fallback_experts
        return out | {
            "seconds": round(self.seconds, 2),
            "peak_host_bytes": self.peak_host_bytes,
            "peak_gpu_bytes": self.peak_gpu_bytes,
        }

    def table(self) -> str:
        with_output_error = any(s.calibration and s.calibration.output_error for s in self.layers.values())
        quantized = self.values is not None
        lines = [
            f"{'layer':>5}  {'sparsity':>8}  {'rel. error':>10}"
            + ("  quant. error" if quantized else "")
            + ("  out. error w13 / w2" if with_output_error else "")
        ]
        for i, s in sorted(self.layers.items()):
            line = f"{i:>5}  {s.sparsity:>8.2%}  {s.relative_error:>10.4f}"
            if quantized:
                line += f"  {s.quantization_error:>12.4f}"
            if with_output_error and s.calibration and s.calibration.output_error:
                e = s.calibration.output_error
                line += f"  {e['w13']:>14.4f} / {e['w2']:.4f}"
            lines.append(line)
        nominal = 1.0 - self.pattern.density
        if any(s.sparsity > nominal + 0.005 for s in self.layers.values()):
            lines.append(
                f"sparsity above the pattern's {nominal:.0%}: kept weights that are zero (calibrated methods zero the "
                "weights of inputs the calibration text never reached)"
            )
        if fallback := self.fallback_experts:
            lines.append(
                "experts with too few calibration tokens, pruned by "
                + ", ".join(f"{m}: {n}" for m, n in fallback.items())
            )
        if self.dense_bytes:
            lines.append(
                f"expert weights: {self.dense_bytes / 2**20:.1f} MiB dense -> "
                f"{self.sparse_bytes / 2**20:.1f} MiB packed ({self.sparse_bytes / self.dense_bytes:.2f}x)"
            )
        return "\n".join(lines)


def _check_input(in_dir: Path) -> tuple[dict, Architecture, CheckpointReader | PerExpertReader, Fp8BlockReader | None]:
    """The input's config (without the quantization_config of an FP8 block-quantized input), architecture, a
    reader of its dense weights, one tensor per expert and projection, and for an FP8 block-quantized input its
    reader (its tensors as stored, and its quantization_config)."""
    config = read_config(in_dir)
    quant = config.get("quantization_config")
    block = block_size(quant) if quant else None
    if quant and block is None:
        method = quant.get("quant_method") if isinstance(quant, dict) else quant
        if method == QUANT_METHOD:
            raise CheckpointError(
                f"{in_dir} is already a samoyeds sparse checkpoint (pattern "
                f"{quant.get('pattern')}); convert needs the dense original"
            )
        raise CheckpointError(
            f"{in_dir} is quantized with {method!r}; convert needs a dense or an FP8 block-quantized checkpoint"
        )
    arch = architecture_of(config)
    reader, fp8_reader = CheckpointReader(in_dir), None
    check_against_config(in_dir, config, arch, reader)
    if block is not None:
        config = {k: v for k, v in config.items() if k != "quantization_config"}
        reader = fp8_reader = Fp8BlockReader(reader, quant, dtype_of(config))
    return config, arch, per_expert(reader, arch), fp8_reader


def implied_shapes(config: dict) -> dict[str, tuple[int, ...]] | None:
    """Every tensor config.json implies, with its shape (the hub's names); None for a family, or a config, without a
    known tensor list."""
    # transformers writes the expert count under another key than the hub's config of some families
    count = next((config[key] for key in EXPERT_COUNT_KEYS if key in config), None)
    try:
        specs = weight_specs({key: count for key in EXPERT_COUNT_KEYS} | config if count else config)
    except (SamoyedsError, KeyError):
        return None
    return {name: tuple(shape) for name, shape in specs}


def check_against_config(in_dir: Path, config: dict, arch: Architecture, reader: CheckpointReader) -> None:
    """Every text-model tensor config.json implies is in the checkpoint, in its shape. A checkpoint that lacks one
    (a deleted tensor, a config of more layers or experts than the weights) would convert and then be served as
    noise: vLLM checks for weights it did not load only without a quantization method."""
    if (shapes := implied_shapes(config)) is None:
        return  # vLLM checks the shapes it loads
    stored = set(reader.names())
    specs = [(name, shape) for name, shape in shapes.items() if name.startswith(arch.text_prefix)]
    if missing := [name for name, _ in specs if name not in stored]:
        raise CheckpointError(
            f"{in_dir}: config.json implies {len(missing)} tensor(s) the checkpoint lacks ({', '.join(missing[:3])}"
            f"{', ...' if len(missing) > 3 else ''}); the checkpoint is incomplete or config.json is not its own"
        )
    for name, shape in specs:
        if tuple(reader.shape(name)) != shape:
            raise CheckpointError(
                f"{in_dir}: {name} is {list(reader.shape(name))} in the checkpoint but config.json implies "
                f"{list(shape)}; the checkpoint is damaged or config.json is not its own"
            )


def _output_bytes(
    reader, fp8_reader: Fp8BlockReader | None, expert_re, pattern: Pattern, values, keep_fp8: bool
) -> tuple[int, int]:
    """What the sparse checkpoint and a dense export of the pruned weights take on disk: packed experts, the other
    tensors as they are written (each in the dtype it is read in; an FP8 input's FP8 layers as stored, with
    `keep_fp8`)."""
    sparse = dense = 0
    for name in reader.names():
        shape, size = reader.shape(name), reader.itemsize(name)
        as_read = size * math.prod(shape)
        dense += as_read
        if expert_re.match(name):
            sparse += pattern.packed_bytes(shape, 1 if values is not None else size, scaled=values is not None)
        elif fp8_reader is not None and keep_fp8:
            sparse += fp8_reader.stored_bytes(name)
        else:
            sparse += as_read
    return sparse, dense


def convert(
    in_dir: Path,
    out_dir: Path,
    pattern: Pattern,
    method: str = "magnitude",
    *,
    force: bool = False,
    export_dense: Path | None = None,
    calibration: Calibration | None = None,
    recovery: dict | None = None,
    values: torch.dtype | None = None,
    allow_nonfinite: bool = False,
    dequantize_other_layers: bool = False,
    max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES,
    progress: bool = True,
) -> ConversionReport:
    """Write the sparse checkpoint of `in_dir` to `out_dir` (and the pruned weights as a dense checkpoint
    to `export_dense`, if given). `calibration` is required by the calibrated methods (wanda, sparsegpt), which
    prune layer by layer (tools/calibration.py). `recovery` records, in quantization_config, that the input is a
    recovered model (tools/recover.py) whose weights already satisfy the pattern. `values` (format.FP8) quantizes the
    kept values, one scale per output row (format version 2; 3 for an FP8 input, whose other FP8 layers are kept,
    unless `dequantize_other_layers` writes them in the model's dtype, for vLLM's CPU build, which has no FP8 block
    kernels). Raises SamoyedsError, leaving no output, on bad input."""
    in_dir, out_dir = Path(in_dir), Path(out_dir)
    if method not in METHODS:
        raise SamoyedsError(f"unknown pruning method {method!r}; choose one of {', '.join(METHODS)}")
    config, arch, reader, fp8_reader = _check_input(in_dir)
    if dequantize_other_layers and fp8_reader is None:
        raise SamoyedsError(f"{in_dir} is not FP8 block-quantized: there are no FP8 layers to dequantize")
    kept_fp8 = False  # an FP8 input's other layers hold FP8 weights (else they are all in the model's dtype)
    outputs = [out_dir] + ([Path(export_dense)] if export_dense else [])
    for path in outputs:
        check_output_dir(path, force, inputs=(in_dir,))
    if len({p.resolve() for p in outputs}) != len(outputs):
        raise SamoyedsError("--export-dense must differ from the output directory")
    expert_re = arch.expert_weight_re
    experts = [n for n in reader.names() if expert_re.match(n)]
    if not experts:
        raise CheckpointError(f"{in_dir}: no routed-expert weights named like {arch.expert_weight_name(0, 0, '*')}")
    for name in experts:  # every shape error now, not halfway through
        pattern.check_shape(reader.shape(name), name)
    sparse_bytes, dense_bytes = _output_bytes(
        reader, fp8_reader, expert_re, pattern, values, not dequantize_other_layers
    )
    needs = {out_dir: sparse_bytes} | ({Path(export_dense): dense_bytes} if export_dense else {})
    check_free_space(needs, "the output")

    windows = None
    if method in CALIBRATED:
        if calibration is None:
            raise SamoyedsError(f"--method {method} needs calibration data (--calib-data)")
        windows = calibration.windows(in_dir, config)
    elif calibration is not None:
        raise SamoyedsError(
            f"--method {method} uses no calibration data; --calib-data applies to {', '.join(CALIBRATED)}"
        )

    start = time.perf_counter()
    report = ConversionReport(pattern, method, values, calibration if windows else None, recovery=recovery)
    with staged_dirs(*outputs, replace=force) as staged:
        writers = [ShardedWriter(d, max_shard_bytes) for d in staged]
        if export_dense and isinstance(reader, PerExpertReader):  # the dense export keeps the hub's fused layout
            writers[1] = FusingWriter(writers[1], reader)

        def write_expert(name: str, dense: torch.Tensor, pruned: torch.Tensor) -> None:
            packed = compress(pruned, pattern, name=name)
            stored = None
            if values is not None:
                packed = quantize(packed, pattern, values)
                stored = decompress(packed, pattern)
            for packed_name, packed_tensor in packed.named(name.removesuffix(".weight")).items():
                writers[0].add(packed_name, packed_tensor)
                report.sparse_bytes += packed_tensor.numel() * packed_tensor.element_size()
            report.dense_bytes += dense.numel() * dense.element_size()
            report.layers.setdefault(int(expert_re.match(name)["layer"]), LayerStats()).add(dense, pruned, stored)
            if export_dense:  # what the sparse checkpoint stands for: the pruned weights, dequantized if quantized
                writers[1].add(name, pruned if stored is None else stored.to(pruned.dtype))

        for name in tqdm(reader.names(), desc="converting", unit="tensor", disable=not progress):
            expert = expert_re.match(name)
            # an FP8 input's other layers are read once as stored; dense() gives the tensor checked, exported, and
            # written with dequantize_other_layers
            as_stored = fp8_reader.stored(name) if fp8_reader and not expert else None
            tensor = reader.get(name) if as_stored is None else fp8_reader.dense(name, as_stored)
            if not allow_nonfinite and tensor.is_floating_point() and not bool(torch.isfinite(tensor).all()):
                bad = int((~torch.isfinite(tensor)).sum())
                raise CheckpointError(
                    f"{in_dir}: tensor {name} holds {bad} non-finite values (NaN or Inf); the checkpoint is "
                    "damaged (pass --allow-nonfinite to convert it anyway)"
                )
            if not expert:
                written = {name: tensor} if as_stored is None or dequantize_other_layers else as_stored
                kept_fp8 |= len(written) > 1
                for written_name, written_tensor in written.items():
                    writers[0].add(written_name, written_tensor)
                for writer in writers[1:]:
                    writer.add(name, tensor)
            elif windows is None:
                write_expert(name, tensor, prune(tensor, pattern, name=name))
        if windows is not None:
            for result in prune_layers(
                in_dir, arch, reader, pattern, method, windows, device=calibration.device, progress=progress
            ):
                for name, pruned in result.pruned.items():
                    write_expert(name, reader.get(name), pruned)
                report.layers[result.layer].calibration = result
        for writer in writers:
            writer.close()
        _copy_side_files(in_dir, staged)
        report.seconds = time.perf_counter() - start
        report.peak_host_bytes = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        report.peak_gpu_bytes = torch.cuda.max_memory_allocated() if torch.cuda.is_initialized() else 0
        other_layers = fp8_reader.quantization_config if kept_fp8 else None
        quant = quantization_config(pattern, arch.sparse_module_globs(), method, values, other_layers)
        if recovery:  # a recovered model: its masks came from recovery["from"], then its kept weights trained
            quant |= {"pruning_method": recovery["from"], "recovery": recovery}
        sparse_config = dict(config, quantization_config=quant)
        (staged[0] / "config.json").write_text(json.dumps(sparse_config, indent=2) + "\n")
        (staged[0] / REPORT_NAME).write_text(json.dumps(report.to_json(), indent=2) + "\n")
        if export_dense:
            (staged[1] / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    return report


def _copy_side_files(in_dir: Path, out_dirs: list[Path]) -> None:
    """Copy tokenizer, generation config and the like: everything but the weights and config.json."""
    for src in in_dir.iterdir():
        if src.name in ("config.json", INDEX_NAME) or src.suffix in (".safetensors", ".bin", ".pt", ".pth"):
            continue
        for out in out_dirs:
            if src.is_dir():
                shutil.copytree(src, out / src.name)
            else:
                shutil.copy2(src, out / src.name)
