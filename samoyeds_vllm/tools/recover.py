"""Recover what pruning lost: `samoyeds-vllm recover`, masked distillation from the dense model.

The student is the sparse checkpoint, unpacked to dense tensors in transformers; the teacher is the dense model
it was pruned from. Training minimises the KL divergence from the teacher's next-token distribution to the
student's, both softened by a temperature T (Hinton et al.: T^2 * KL(softmax(t/T) || softmax(s/T)), averaged over
tokens), plus `ce_weight` times the ordinary next-token loss. Only the routed experts' kept weights train by default
(`train_non_experts` adds everything else but the embeddings); pruned weights stay exactly zero: their gradients
are masked before each step (so AdamW's moments stay zero for them) and the weights are masked after it. The pattern
is checked again when the result is packed.

Built on accelerate: bf16 mixed precision on GPUs, several GPUs through `accelerate launch` with no code change,
and its saved state (model, optimizer, schedule) lets an interrupted run resume where it saved last. Teacher logits
are computed on the fly (no disk cost).
"""

from __future__ import annotations

import json
import math
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..errors import CheckpointError, SamoyedsError
from ..format import QUANT_METHOD, PackedWeight, check_packed, decompress, parse_quantization_config
from ..format.checkpoint import SUFFIXES
from ..format.shards import shard_files
from .architectures import architecture_of
from .checkpoint_io import CheckpointReader, ShardedWriter, check_output_dir, read_config
from .convert import check_against_config, convert, implied_shapes
from .text_data import calibration_windows, load_documents, token_windows

STATE_DIR = "accelerate"  # inside .OUT.recover-state: accelerate's state and our progress
CONFIG_KEYS_IGNORED = ("quantization_config", "torch_dtype", "dtype", "transformers_version", "architectures")


@dataclass(frozen=True)
class RecoverSettings:
    data: str
    steps: int = 200
    seq_len: int = 512
    batch: int = 8
    lr: float = 1e-4
    temperature: float = 1.0
    ce_weight: float = 0.0
    train_non_experts: bool = False
    seed: int = 0
    split: str = "train"
    text_field: str = "text"
    eval_data: str | None = None
    eval_every: int = 50
    save_every: int = 50


class TrainingWindows:
    """Every non-overlapping window of seq_len + 1 tokens of the documents (joined by the separator token), in a
    seeded order that is reshuffled each epoch: step s gets the same batch whether or not the run was resumed."""

    def __init__(self, tokenizer, docs: list[str], settings: RecoverSettings):
        self.all = token_windows(tokenizer, docs, settings.seq_len + 1)
        if len(self.all) < settings.batch:
            raise SamoyedsError(
                f"the training data gives {len(self.all)} windows of {settings.seq_len + 1} tokens, fewer than one "
                f"batch of {settings.batch}; give more text"
            )
        self.batch_size, self.seed = settings.batch, settings.seed
        self._epoch, self._order = -1, None

    def _order_of(self, epoch: int) -> torch.Tensor:
        if epoch != self._epoch:  # one permutation per epoch, not per window
            generator = torch.Generator().manual_seed(self.seed * 1000 + epoch)
            self._epoch, self._order = epoch, torch.randperm(len(self.all), generator=generator)
        return self._order

    def batch(self, step: int) -> list[list[int]]:
        out = []
        for i in range(step * self.batch_size, (step + 1) * self.batch_size):
            epoch, index = divmod(i, len(self.all))
            out.append(self.all[int(self._order_of(epoch)[index])])
        return out


def check_pair(dense_dir: Path, sparse_dir: Path) -> tuple[dict, dict]:
    """Refuse a SPARSE that was not made from a model of DENSE's architecture and shapes."""
    dense, sparse = read_config(dense_dir), read_config(sparse_dir)
    quant = sparse.get("quantization_config") or {}
    if quant.get("quant_method") != QUANT_METHOD or "format_version" not in quant:
        raise CheckpointError(f"{sparse_dir} is not a packed samoyeds checkpoint (convert the dense model first)")
    if quant.get("other_layers"):
        raise CheckpointError(
            f"{sparse_dir} keeps the FP8 layers of the checkpoint it was converted from; recover trains in the "
            "model's dtype: convert the dense bf16 model instead"
        )
    if dense.get("quantization_config"):
        raise CheckpointError(f"{dense_dir} is quantized; the teacher must be the dense model")
    if architecture_of(dense).fused_experts:
        raise CheckpointError(
            f"{dense_dir}: recover does not support checkpoints with fused experts ({dense['model_type']}) yet"
        )
    differ = sorted(
        k
        for k in set(dense) | set(sparse)
        if k not in CONFIG_KEYS_IGNORED and dense.get(k) != sparse.get(k) and not k.startswith("_")
    )
    if differ:
        shown = ", ".join(f"{k}: {dense.get(k)!r} vs {sparse.get(k)!r}" for k in differ[:4])
        raise CheckpointError(
            f"{sparse_dir} was not made from a model like {dense_dir}: their configs differ in {shown}"
        )
    return dense, sparse


def unpack_to_dense(sparse_dir: Path, out_dir: Path) -> None:
    """Write SPARSE with its packed experts unpacked (zeros where pruned) as a dense checkpoint with hub names."""
    config = read_config(sparse_dir)
    pattern = parse_quantization_config(config["quantization_config"]).pattern
    shapes = implied_shapes(config) or {}
    reader = CheckpointReader(sparse_dir)
    names = set(reader.names())
    suffix = "." + SUFFIXES["values"]
    out_dir.mkdir(parents=True)
    writer = ShardedWriter(out_dir)
    for name in reader.names():
        if name.endswith(suffix):
            prefix = name.removesuffix(suffix)
            parts = {k: f"{prefix}.{s}" for k, s in SUFFIXES.items()}
            packed = PackedWeight(*(reader.get(parts[k]) if parts[k] in names else None for k in SUFFIXES))
            if (shape := shapes.get(f"{prefix}.weight")) is not None:
                check_packed(packed, pattern, shape, f"{sparse_dir}: {prefix}")
            writer.add(f"{prefix}.weight", decompress(packed, pattern))
        elif not any(name.endswith("." + s) for s in SUFFIXES.values()):
            writer.add(name, reader.get(name))
    writer.close()
    dense_config = {k: v for k, v in config.items() if k != "quantization_config"}
    (out_dir / "config.json").write_text(json.dumps(dense_config, indent=2) + "\n")
    for src in sparse_dir.iterdir():
        if src.name.startswith("tokenizer") or src.name in ("special_tokens_map.json", "generation_config.json"):
            shutil.copy2(src, out_dir / src.name)


def _distillation_loss(student_logits, teacher_logits, labels, temperature: float, ce_weight: float):
    t = temperature
    s = torch.log_softmax(student_logits.float() / t, dim=-1)
    p = torch.log_softmax(teacher_logits.float() / t, dim=-1)
    kl = (p.exp() * (p - s)).sum(-1).mean() * t * t
    if not ce_weight:
        return kl, kl
    ce = torch.nn.functional.cross_entropy(student_logits.float().flatten(0, 1), labels.flatten())
    return kl + ce_weight * ce, kl


def _masks(model, train_non_experts: bool) -> dict[str, torch.Tensor]:
    """name -> keep-mask of every trained parameter (all ones for non-expert ones); others are frozen."""
    masks = {}
    for name, param in model.named_parameters():
        is_expert = ".experts." in f".{name}."
        if is_expert:
            masks[name] = param.detach() != 0
        elif train_non_experts and "embed" not in name and "lm_head" not in name:
            masks[name] = torch.ones_like(param, dtype=torch.bool)
        param.requires_grad_(name in masks)
    return masks


def _inputs_of(dense_dir: Path, sparse_dir: Path) -> dict:
    """What identifies the two inputs of a recovery: their folders, and the size and time of each file of their
    weights and configs (a SPARSE converted again in the same folder is another input)."""

    def files(folder: Path) -> dict:
        paths = [folder / "config.json", *shard_files(folder)]
        return {p.name: [p.stat().st_size, p.stat().st_mtime_ns] for p in paths}

    return {
        "dense": str(dense_dir.resolve()),
        "sparse": str(sparse_dir.resolve()),
        "dense_files": files(dense_dir),
        "sparse_files": files(sparse_dir),
    }


def _read_json(path: Path, missing=None):
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return missing


def recover(dense_dir: Path, sparse_dir: Path, out_dir: Path, settings: RecoverSettings, *, force: bool = False):
    """Distil DENSE into SPARSE's kept weights and write the result as a packed checkpoint OUT. Returns the log."""
    from accelerate import Accelerator
    from accelerate.utils import set_seed
    from transformers import AutoModelForCausalLM, AutoTokenizer

    dense_dir, sparse_dir, out_dir = Path(dense_dir), Path(sparse_dir), Path(out_dir)
    for flag, value in (("--steps", settings.steps), ("--batch", settings.batch), ("--seq-len", settings.seq_len)):
        if value < 1:
            raise SamoyedsError(f"{flag} must be at least 1, not {value}")
    dense_config, sparse_config = check_pair(dense_dir, sparse_dir)
    check_output_dir(out_dir, force, inputs=(dense_dir, sparse_dir))
    # the teacher's files and shapes, before transformers loads it (a damaged file there is a traceback)
    check_against_config(dense_dir, dense_config, architecture_of(dense_config), CheckpointReader(dense_dir))
    quant = sparse_config["quantization_config"]
    parsed = parse_quantization_config(quant)
    pattern = parsed.pattern
    tokenizer = AutoTokenizer.from_pretrained(dense_dir)
    windows = TrainingWindows(
        tokenizer, load_documents(settings.data, split=settings.split, text_field=settings.text_field), settings
    )
    eval_windows = None
    if settings.eval_data:
        eval_docs = load_documents(settings.eval_data, split="validation", text_field=settings.text_field)
        eval_windows = calibration_windows(tokenizer, eval_docs, 16, settings.seq_len + 1, 0)

    # Progress lives beside OUT, named after it, so a rerun with the same OUT resumes.
    work = out_dir.parent / f".{out_dir.name}.recover-state"
    state_dir = work / STATE_DIR
    student_dir = work / "student-init"
    # A rerun resumes only the recovery of the same inputs with the same settings: a state without progress (a run
    # that failed before its first save) is started again, one with progress of other inputs or settings refused.
    run = {"settings": asdict(settings), "inputs": _inputs_of(dense_dir, sparse_dir)}
    saved = _read_json(work / "run.json")
    if saved != run:
        if (state_dir / "progress.json").exists():
            differ = [k for k in ("inputs", "settings") if (saved or {}).get(k) != run[k]] or ["settings"]
            raise SamoyedsError(
                f"{work} holds an interrupted recovery of other {' and '.join(differ)} (saved at step "
                f"{_read_json(state_dir / 'progress.json', {}).get('step', '?')}); remove it, or rerun with the same "
                "DENSE, SPARSE and settings to resume it"
            )
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir(parents=True)
        try:
            unpack_to_dense(sparse_dir, student_dir)
        except BaseException:  # nothing to resume: leave nothing behind
            shutil.rmtree(work, ignore_errors=True)
            raise
        (work / "run.json").write_text(json.dumps(run, indent=2) + "\n")

    accelerator = Accelerator(mixed_precision="bf16" if torch.cuda.is_available() else "no")
    set_seed(settings.seed)
    dtype = torch.float32
    teacher = AutoModelForCausalLM.from_pretrained(
        dense_dir, dtype=torch.bfloat16 if torch.cuda.is_available() else dtype
    )
    teacher.requires_grad_(False).eval()
    student = AutoModelForCausalLM.from_pretrained(student_dir, dtype=dtype)
    student.config.use_cache = False
    masks = _masks(student, settings.train_non_experts)
    trained = [p for n, p in student.named_parameters() if n in masks]
    optimizer = torch.optim.AdamW(trained, lr=settings.lr, betas=(0.9, 0.95), weight_decay=0.0)
    warmup = max(1, settings.steps // 20)

    def lr_at(step: int) -> float:
        if step < warmup:
            return (step + 1) / warmup
        return 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, settings.steps - warmup)))

    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lr_at)
    student, optimizer, schedule = accelerator.prepare(student, optimizer, schedule)
    device = accelerator.device
    teacher.to(device)
    masks = {n: m.to(device) for n, m in masks.items()}
    named = dict(accelerator.unwrap_model(student).named_parameters())

    log = {"steps": [], "eval": [], "seconds": 0.0}
    start_step = 0
    if (state_dir / "progress.json").exists():
        accelerator.load_state(str(state_dir))
        progress = json.loads((state_dir / "progress.json").read_text())
        start_step, log = progress["step"], progress["log"]

    def evaluate() -> float:
        student.eval()
        total, count = 0.0, 0
        with torch.no_grad():
            for i in range(0, len(eval_windows), settings.batch):
                ids = torch.tensor(eval_windows[i : i + settings.batch], device=device)
                with accelerator.autocast():
                    logits = student(input_ids=ids[:, :-1]).logits.float()
                total += float(
                    torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten(), reduction="sum")
                )
                count += ids[:, 1:].numel()
        student.train()
        return math.exp(total / count)

    if eval_windows is not None and not log["eval"]:
        log["eval"].append({"step": 0, "perplexity": evaluate(), "seconds": 0.0})
    began = time.perf_counter() - log["seconds"]
    student.train()
    bar = tqdm(
        range(start_step, settings.steps), desc="recovering", unit="step", disable=not accelerator.is_main_process
    )
    for step in bar:
        batch = torch.tensor(windows.batch(step), device=device)
        inputs, labels = batch[:, :-1], batch[:, 1:]
        with torch.no_grad(), accelerator.autocast():
            teacher_logits = teacher(input_ids=inputs).logits
        with accelerator.autocast():
            student_logits = student(input_ids=inputs).logits
        loss, kl = _distillation_loss(student_logits, teacher_logits, labels, settings.temperature, settings.ce_weight)
        accelerator.backward(loss)
        for name, mask in masks.items():
            if named[name].grad is not None:
                named[name].grad.mul_(mask)
        accelerator.clip_grad_norm_(trained, 1.0)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        with torch.no_grad():
            for name, mask in masks.items():
                named[name].mul_(mask)
        log["seconds"] = time.perf_counter() - began
        log["steps"].append(
            {
                "step": step + 1,
                "loss": float(loss.detach()),
                "kl": float(kl.detach()),
                "seconds": round(log["seconds"], 2),
            }
        )
        bar.set_postfix(kl=f"{log['steps'][-1]['kl']:.4f}")
        if eval_windows is not None and ((step + 1) % settings.eval_every == 0 or step + 1 == settings.steps):
            log["eval"].append({"step": step + 1, "perplexity": evaluate(), "seconds": round(log["seconds"], 2)})
        if (step + 1) % settings.save_every == 0 and step + 1 < settings.steps:
            accelerator.save_state(str(state_dir))
            if accelerator.is_main_process:
                (state_dir / "progress.json").write_text(json.dumps({"step": step + 1, "log": log}) + "\n")
    bar.close()

    if accelerator.is_main_process:
        trained_dir = work / "student-trained"
        shutil.rmtree(trained_dir, ignore_errors=True)
        model = accelerator.unwrap_model(student)
        for name, mask in masks.items():  # the pattern holds: nothing outside the masks moved
            if not torch.equal(named[name].detach() != 0, (named[name].detach() != 0) & mask):
                raise RuntimeError(f"{name}: a pruned weight became non-zero during recovery")
        model.config.use_cache = True
        model.to(_checkpoint_dtype(sparse_config))  # the dtype SPARSE stores its values in
        model.save_pretrained(trained_dir)
        tokenizer.save_pretrained(trained_dir)
        recovery = {
            "from": quant.get("pruning_method"),
            "steps": settings.steps,
            "tokens": settings.steps * settings.batch * settings.seq_len,
            "data": settings.data,
            "temperature": settings.temperature,
            "ce_weight": settings.ce_weight,
            "train_non_experts": settings.train_non_experts,
            "seconds": round(log["seconds"], 1),
        }
        values = parsed.values  # FP8 values stay FP8, quantized from the trained weights
        convert(
            trained_dir, out_dir, pattern, "magnitude", force=force, recovery=recovery, values=values, progress=False
        )
        (out_dir / "recover_log.json").write_text(json.dumps(log, indent=2) + "\n")
        plot_log(log, out_dir)
        shutil.rmtree(work, ignore_errors=True)
    return log


def _checkpoint_dtype(config: dict) -> torch.dtype:
    name = str(config.get("torch_dtype") or config.get("dtype") or "float32")
    return {"bfloat16": torch.bfloat16, "float16": torch.float16}.get(name, torch.float32)


def plot_log(log: dict, out_dir: Path) -> None:
    """recover_loss.png (KL per step) and, with evaluation, recover_perplexity.png (perplexity per step)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.plot([s["step"] for s in log["steps"]], [s["kl"] for s in log["steps"]])
    ax.set_xlabel("step")
    ax.set_ylabel("KL(teacher || student)")
    ax.set_yscale("log")
    fig.tight_layout()
    fig.savefig(out_dir / "recover_loss.png", dpi=110)
    plt.close(fig)
    if log["eval"]:
        fig, ax = plt.subplots(figsize=(6, 3.5))
        ax.plot([e["step"] for e in log["eval"]], [e["perplexity"] for e in log["eval"]], marker="o")
        ax.set_xlabel("step")
        ax.set_ylabel("validation perplexity (transformers)")
        fig.tight_layout()
        fig.savefig(out_dir / "recover_perplexity.png", dpi=110)
        plt.close(fig)
