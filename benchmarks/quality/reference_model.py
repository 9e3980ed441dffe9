"""A real reference MoE, trained from scratch: what the quality table prunes and measures.

    python benchmarks/quality/reference_model.py tokenize CORPUS DATA     # CPU, about a minute
    python benchmarks/quality/reference_model.py train DATA MODEL --minutes 10   # one GPU

`tokenize` trains a byte-level BPE tokenizer (HF `tokenizers`, 8192 entries, `<|endoftext|>` as id 0) on the
corpus's train split (benchmarks/quality/corpus.py), then writes DATA/tokenizer/, the train and validation token
streams as uint16 arrays (documents joined by `<|endoftext|>`), and copies validation/test.jsonl for `eval`.

`train` trains a Qwen3-MoE with HF transformers (8 experts, top-2, renormalised; expert and hidden sizes of 384,
on the kernels' 128-input tiles) for a fixed wall-clock budget: AdamW, bf16 autocast over fp32 weights, linear
warm-up then cosine decay over the number of steps the first steps' speed predicts, transformers' router
load-balancing loss. The validation loss is measured every `--eval-every` steps and the best weights are saved
(bf16 safetensors in shards of at most 15 MB, so they fit the device tool's file limits), with the tokenizer and
MODEL/train_log.json (seed, versions, hashes of the data, the loss curve).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shutil
import time
from pathlib import Path

import numpy as np

VOCAB = 8192
EOS = "<|endoftext|>"


def _texts(path: Path):
    with path.open() as f:
        for line in f:
            yield json.loads(line)["text"]


def tokenize(corpus: Path, out: Path) -> None:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB,
        special_tokens=[EOS],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=True,
    )
    bpe.train_from_iterator(_texts(corpus / "train.jsonl"), trainer)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=bpe, eos_token=EOS, pad_token=EOS, model_max_length=2048)
    out.mkdir(parents=True, exist_ok=True)
    tokenizer.save_pretrained(out / "tokenizer")
    eos = tokenizer.convert_tokens_to_ids(EOS)
    info = {"vocab_size": len(tokenizer), "eos_token_id": eos}
    for split in ("train", "validation"):
        ids: list[int] = []
        for text in _texts(corpus / f"{split}.jsonl"):
            ids += [eos, *tokenizer(text, add_special_tokens=False)["input_ids"]]
        array = np.asarray(ids, dtype=np.uint16)
        np.save(out / f"{split}.npy", array)
        info[f"{split}_tokens"] = len(array)
    for split in ("validation", "test"):
        shutil.copy(corpus / f"{split}.jsonl", out / f"{split}.jsonl")
    shutil.copy(corpus / "manifest.json", out / "corpus-manifest.json")
    (out / "tokens.json").write_text(json.dumps(info, indent=2) + "\n")
    print(json.dumps(info, indent=2))


def model_config(vocab_size: int, eos: int):
    from transformers import Qwen3MoeConfig

    return Qwen3MoeConfig(
        vocab_size=vocab_size,
        hidden_size=384,
        num_hidden_layers=6,
        num_attention_heads=6,
        num_key_value_heads=2,
        head_dim=64,
        num_experts=8,
        num_experts_per_tok=2,
        moe_intermediate_size=384,
        intermediate_size=1024,  # dense MLP size; no layer is dense here
        norm_topk_prob=True,
        decoder_sparse_step=1,
        mlp_only_layers=[],
        max_position_embeddings=2048,
        rope_theta=10000.0,
        tie_word_embeddings=True,
        output_router_logits=True,
        router_aux_loss_coef=0.01,
        bos_token_id=eos,
        eos_token_id=eos,
        pad_token_id=eos,
    )


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def train(
    data: Path,
    out: Path,
    minutes: float,
    seed: int,
    seq_len: int,
    batch: int,
    lr: float,
    eval_every: int,
    max_val_windows: int = 10**9,
):
    import torch
    import transformers
    from transformers import AutoTokenizer, Qwen3MoeForCausalLM

    torch.manual_seed(seed)
    rng = np.random.default_rng(seed)
    device = "cuda" if torch.cuda.is_available() else "cpu"  # CPU: only to try the script out
    tokenizer = AutoTokenizer.from_pretrained(data / "tokenizer")
    train_ids = torch.from_numpy(np.load(data / "train.npy").astype(np.int64))
    val_ids = torch.from_numpy(np.load(data / "validation.npy").astype(np.int64))
    config = model_config(len(tokenizer), tokenizer.eos_token_id)
    model = Qwen3MoeForCausalLM(config).to(device)
    model.config.use_cache = False
    params = sum(p.numel() for p in model.parameters())
    decay = [p for n, p in model.named_parameters() if p.dim() >= 2]
    no_decay = [p for n, p in model.named_parameters() if p.dim() < 2]
    optimizer = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": no_decay, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
        fused=device == "cuda",
    )
    n_windows = (len(train_ids) - 1) // seq_len
    val = val_ids[: (len(val_ids) // seq_len) * seq_len].view(-1, seq_len)

    def batch_at() -> torch.Tensor:
        starts = rng.integers(0, len(train_ids) - seq_len, size=batch)
        return torch.stack([train_ids[s : s + seq_len] for s in starts]).to(device, non_blocking=True)

    @torch.no_grad()
    def validation_loss() -> float:
        model.eval()
        total, count = 0.0, 0
        for i in range(0, min(len(val), max_val_windows), 32):
            x = val[i : i + 32].to(device)
            with torch.autocast(device, dtype=torch.bfloat16):
                logits = model(input_ids=x).logits.float()
            total += float(
                torch.nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), x[:, 1:].flatten(), reduction="sum")
            )
            count += x[:, 1:].numel()
        model.train()
        return total / count

    budget = minutes * 60
    warmup, total_steps = 100, None
    log = {"steps": [], "validation": []}
    best = (math.inf, None, 0)
    start = time.perf_counter()
    step = 0
    model.train()
    while True:
        elapsed = time.perf_counter() - start
        if total_steps is None and step == 50:
            total_steps = int(budget / (elapsed / step))  # the schedule's length, from the speed so far
        if elapsed >= budget or (total_steps and step >= total_steps):
            break
        horizon = total_steps or 10**9
        if step < warmup:
            scale = (step + 1) / warmup
        else:
            scale = 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * min(1.0, (step - warmup) / max(1, horizon - warmup))))
        for group in optimizer.param_groups:
            group["lr"] = lr * scale
        x = batch_at()
        with torch.autocast(device, dtype=torch.bfloat16):
            result = model(input_ids=x, labels=x)
        result.loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        step += 1
        if step % 50 == 0:
            log["steps"].append(
                {"step": step, "loss": float(result.loss.detach()), "seconds": round(time.perf_counter() - start, 1)}
            )
        if step % eval_every == 0:
            loss = validation_loss()
            log["validation"].append(
                {
                    "step": step,
                    "loss": loss,
                    "perplexity": math.exp(loss),
                    "seconds": round(time.perf_counter() - start, 1),
                }
            )
            print(
                f"step {step} / {total_steps}: train {float(result.loss):.3f}, "
                f"validation {loss:.3f} ({math.exp(loss):.2f})",
                flush=True,
            )
            if loss < best[0]:
                best = (
                    loss,
                    {k: v.detach().to("cpu", torch.bfloat16).clone() for k, v in model.state_dict().items()},
                    step,
                )
    loss = validation_loss()
    log["validation"].append(
        {"step": step, "loss": loss, "perplexity": math.exp(loss), "seconds": round(time.perf_counter() - start, 1)}
    )
    if loss < best[0]:
        best = (loss, {k: v.detach().to("cpu", torch.bfloat16).clone() for k, v in model.state_dict().items()}, step)
    model.load_state_dict(best[1])
    model.config.output_router_logits = False
    model.config.use_cache = True
    model.to(torch.bfloat16).save_pretrained(out, max_shard_size="15MB")
    tokenizer.save_pretrained(out)
    log.update(
        {
            "seed": seed,
            "parameters": params,
            "steps_run": step,
            "scheduled_steps": total_steps,
            "tokens_seen": step * batch * seq_len,
            "train_tokens": len(train_ids),
            "epochs": step * batch * seq_len / len(train_ids),
            "windows": n_windows,
            "best_step": best[2],
            "best_validation_loss": best[0],
            "best_validation_perplexity": math.exp(best[0]),
            "seconds": round(time.perf_counter() - start, 1),
            "settings": {"seq_len": seq_len, "batch": batch, "lr": lr, "minutes": minutes, "warmup": warmup},
            "versions": {"torch": torch.__version__, "transformers": transformers.__version__},
            "device": torch.cuda.get_device_name() if device == "cuda" else "cpu",
            "data_sha256": {n: _sha(data / n) for n in ("train.npy", "validation.npy", "test.jsonl")},
        }
    )
    (out / "train_log.json").write_text(json.dumps(log, indent=2) + "\n")
    print(f"saved {out}: best validation perplexity {math.exp(best[0]):.3f} at step {best[2]} of {step}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    p = sub.add_parser("tokenize")
    p.add_argument("corpus", type=Path)
    p.add_argument("data", type=Path)
    p = sub.add_parser("train")
    p.add_argument("data", type=Path)
    p.add_argument("model", type=Path)
    p.add_argument("--minutes", type=float, default=10.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seq-len", type=int, default=512)
    p.add_argument("--batch", type=int, default=64)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--eval-every", type=int, default=250)
    args = parser.parse_args()
    if args.command == "tokenize":
        tokenize(args.corpus, args.data)
    else:
        train(args.data, args.model, args.minutes, args.seed, args.seq_len, args.batch, args.lr, args.eval_every)


if __name__ == "__main__":
    main()
