"""Small helpers shared by the test modules."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import torch
from hypothesis import strategies as st
from safetensors.torch import save_file

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.format.fp8_blocks import SCALE_SUFFIX, dequantize_blocks
from samoyeds_vllm.tools.architectures import Architecture
from samoyeds_vllm.tools.checkpoint_io import DTYPES, CheckpointReader
from samoyeds_vllm.tools.fused_experts import per_expert

PATTERNS = [Pattern.parse("2:4")] + [Pattern.parse("samoyeds", v) for v in (32, 64, 128)]


def read_checkpoint(model_dir: Path, arch: Architecture | None = None) -> dict[str, torch.Tensor]:
    """Every tensor of a model directory (single file or sharded), by name; with the `arch` of a fused-experts
    checkpoint (Llama-4), its experts one [out, in] weight per expert and projection, as the converter reads them."""
    reader = CheckpointReader(model_dir)
    if arch is not None:
        reader = per_expert(reader, arch)
    return {name: reader.get(name) for name in reader.names()}


def rewrite_checkpoint(src: Path, dst: Path, edit) -> Path:
    """Copy a checkpoint, letting `edit(tensors, config)` change its tensors and config."""
    shutil.copytree(src, dst)
    tensors = read_checkpoint(dst)
    config = json.loads((dst / "config.json").read_text())
    edit(tensors, config)
    save_file(tensors, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config))
    return dst


def fp8_experts_only(tensors, config):
    """Leave only the experts block-quantized (vLLM's CPU build has no FP8 block GEMM for the other linears): the
    others dequantized into the model's dtype and listed in modules_to_not_convert."""
    quant = config["quantization_config"]
    for name in [n for n in tensors if n.endswith(SCALE_SUFFIX) and ".experts." not in n]:
        weight = name.removesuffix(SCALE_SUFFIX)
        tensors[weight] = dequantize_blocks(tensors[weight], tensors.pop(name)).to(DTYPES[config["torch_dtype"]])
        quant["modules_to_not_convert"].append(weight.removesuffix(".weight"))


def dense_twin(block: Path, out: Path) -> Path:
    """The dense checkpoint an FP8 block-quantized one stands for, written to `out`: every FP8 tensor dequantized to
    the model's dtype, config.json without the quantization_config, the tokenizer copied."""
    from samoyeds_vllm.tools.fp8_blocks import Fp8BlockReader

    config = json.loads((block / "config.json").read_text())
    quant = config.pop("quantization_config")
    reader = Fp8BlockReader(CheckpointReader(block), quant, DTYPES[config["torch_dtype"]])
    out.mkdir()
    save_file({n: reader.get(n) for n in reader.names()}, str(out / "model.safetensors"))
    shutil.copy(block / "tokenizer.json", out)
    (out / "config.json").write_text(json.dumps(config))
    return out


def leftovers(parent: Path) -> list[str]:
    """Temporary directories an interrupted write could have left next to its target."""
    return sorted(p.name for p in parent.iterdir() if ".partial-" in p.name or ".replaced-" in p.name)


REPO = Path(__file__).resolve().parent.parent
PROMPTS = ["The quick brown fox", "Sparse experts make inference", "Once upon a time, in a land far away"]


def hf_model(model_dir: Path, **kwargs):
    """The transformers model of the class config.json names, and its loading info: a multimodal one whole
    (AutoModelForCausalLM would build only the language model of Llama4ForConditionalGeneration, without the
    checkpoint's `language_model.` names)."""
    import transformers

    architecture = json.loads((Path(model_dir) / "config.json").read_text())["architectures"][0]
    return getattr(transformers, architecture).from_pretrained(str(model_dir), output_loading_info=True, **kwargs)


def hf_greedy_tokens(model_dir: Path, prompts: list[str], max_new_tokens: int) -> list[list[int]]:
    """Greedy continuation token ids from Hugging Face transformers in float32 (the reference for vLLM)."""
    from transformers import AutoTokenizer

    model, _ = hf_model(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    # No end-of-text tokens, as vLLM with ignore_eos: min_new_tokens instead would forbid them (a model that
    # predicts <|im_end|> would continue differently), not just keep generating past them.
    model.generation_config.eos_token_id = None
    results = []
    for prompt in prompts:
        ids = tokenizer(prompt, return_tensors="pt").input_ids
        out = model.generate(ids, max_new_tokens=max_new_tokens, do_sample=False)
        results.append(out[0, ids.shape[1] :].tolist())
    return results


MAX_TOKENS = 12
ENV = dict(os.environ, VLLM_CPU_KVCACHE_SPACE="1", TOKENIZERS_PARALLELISM="false")


def run_engine(
    model: Path, *extra: str, expect_ok: bool = True, env: dict | None = None, dtype: str = "float32"
) -> tuple[list[list[int]] | None, str]:
    """Greedy tokens of PROMPTS from vLLM (examples/offline_generate.py in its own process), or None, and the
    run's log."""
    out = model.parent / f"tokens-{model.name}-{abs(hash((extra, dtype)))}.json"
    cmd = [
        sys.executable,
        str(REPO / "examples" / "offline_generate.py"),
        str(model),
        "--dtype",
        dtype,
        "--max-tokens",
        str(MAX_TOKENS),
        "--json-out",
        str(out),
        *extra,
    ]
    for prompt in PROMPTS:
        cmd += ["--prompt", prompt]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=900, env=dict(ENV, **(env or {})))
    log = result.stdout + result.stderr
    if not expect_ok:
        assert result.returncode != 0, "the engine was expected to refuse this checkpoint"
        return None, log
    assert result.returncode == 0, log[-6000:]
    return [r["token_ids"] for r in json.loads(out.read_text())], log


@st.composite
def weights(draw, pattern=None):
    """A random dense weight [experts?, m, k] whose shape fits a (drawn) pattern."""
    pattern = pattern or draw(st.sampled_from(PATTERNS))
    unit = pattern.segment if pattern.is_samoyeds else 32
    m = 2 * draw(st.integers(1, 12))
    k = unit * draw(st.integers(1, 4))
    lead = draw(st.sampled_from([(), (1,), (3,)]))
    dtype = draw(st.sampled_from([torch.float32, torch.bfloat16, torch.float16]))
    seed = draw(st.integers(0, 2**31 - 1))
    gen = torch.Generator().manual_seed(seed)
    w = torch.randn(*lead, m, k, generator=gen).to(dtype)
    # Sprinkle exact zeros so groups with fewer than two non-zeros occur too.
    zero_frac = draw(st.sampled_from([0.0, 0.3, 0.9]))
    w[torch.rand(w.shape, generator=gen) < zero_frac] = 0
    return pattern, w


def reference_route(logits, top_k, renormalize, groups=None, topk_group=None):
    """Routing spelled out token by token, in float64."""
    weights, ids = [], []
    for row in torch.softmax(logits.double(), -1):
        allowed = torch.ones_like(row, dtype=torch.bool)
        if groups:
            best = row.view(groups, -1).amax(-1).topk(topk_group).indices
            allowed = (
                torch.zeros(groups, dtype=torch.bool).index_fill(0, best, True).repeat_interleave(row.numel() // groups)
            )
        order = sorted(range(row.numel()), key=lambda e: (-float(row[e]) if allowed[e] else 1.0, e))[:top_k]
        w = row[order]
        weights.append(w / w.sum() if renormalize else w)
        ids.append(order)
    return torch.stack(weights), torch.tensor(ids)


def write_calibration_text(directory: Path) -> Path:
    """A directory of real English: the docstrings of some standard-library modules, one file each."""
    import importlib

    directory.mkdir(parents=True, exist_ok=True)
    for name in ("textwrap", "json", "argparse", "functools", "collections", "pathlib", "inspect", "logging"):
        module = importlib.import_module(name)
        docs = [module.__doc__ or ""] + [getattr(module, a).__doc__ or "" for a in sorted(dir(module))]
        (directory / f"{name}.txt").write_text("\n\n".join(d for d in docs if isinstance(d, str) and d))
    return directory
