"""vLLM's multi-GPU layouts with sparse experts, on two GPUs (the device's two-GPU kind): tensor parallelism
(TP = 2), expert parallelism (TP = 2 with --enable-expert-parallel: whole experts per GPU) and data parallelism
with expert parallelism (DP = 2, vLLM's default all-to-all), offline and through `vllm serve`.

- float32 (the experts' reference op on CUDA): each layout gives the greedy tokens of one GPU;
- float16 (the samoyeds kernels): each layout gives the tokens of vLLM's own fused MoE on the pruned export under
  the same layout (the experts are the only difference; a reduction across GPUs may round differently from one
  GPU's in half precision).

vLLM's offline LLM runs data parallelism as one process per rank, so DP = 2 runs through `vllm serve` only.
    python3 -m pytest -q tests/gpu/test_parallel.py
"""

import functools
import json
import urllib.request

import pytest
import torch
from helpers import MAX_TOKENS, PROMPTS, run_engine

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.tools.convert import convert
from samoyeds_vllm.tools.model_maker import make_model
from samoyeds_vllm.tools.vllm_server import VllmServer

pytestmark = pytest.mark.skipif(
    torch.cuda.is_available() and torch.cuda.device_count() < 2, reason="needs two GPUs (the device's x2 kind)"
)

LAYOUTS = {
    "tp2": ("--tensor-parallel-size", "2"),
    "ep2": ("--tensor-parallel-size", "2", "--enable-expert-parallel"),
    "dp2-ep": ("--data-parallel-size", "2", "--enable-expert-parallel"),
}
OFFLINE = ("tp2", "ep2")
ONE_GPU = {"CUDA_VISIBLE_DEVICES": "0"}


@pytest.fixture(scope="module", params=["float32", "float16"])
def models(request, tmp_path_factory):
    """(dtype, converted samoyeds checkpoint, its pruned dense export) of a tiny Qwen3-MoE (8 experts, expert width
    256: 128 per GPU under TP = 2, one whole segment)."""
    dtype = request.param
    root = tmp_path_factory.mktemp(f"parallel-{dtype}")
    dense = make_model("qwen3_moe", "tiny", root / "dense", dtype=dtype, seed=0)
    sparse, pruned = root / "sparse", root / "pruned"
    convert(dense, sparse, Pattern.parse("samoyeds"), export_dense=pruned, progress=False)
    return dtype, sparse, pruned


@functools.cache
def expected(models, layout: tuple[str, ...]) -> list[list[int]]:
    """float32: one GPU's tokens of the sparse model; float16: vLLM's own MoE on the pruned weights, same layout.
    Cached: the layouts share the one-GPU run, and a layout's offline and served tests share its reference."""
    dtype, sparse, pruned = models
    if dtype == "float32":
        return one_gpu_tokens(sparse, dtype)
    if "--data-parallel-size" in layout:
        return served_tokens(pruned, dtype, layout)
    return run_engine(pruned, *layout, dtype=dtype)[0]


@functools.cache
def one_gpu_tokens(model, dtype: str) -> list[list[int]]:
    return run_engine(model, dtype=dtype, env=ONE_GPU)[0]


def served_tokens(model, dtype: str, layout: tuple[str, ...]) -> list[list[int]]:
    """Greedy token ids of PROMPTS from `vllm serve` (completions API, ids returned as tokens)."""
    args = [*layout, "--dtype", dtype, "--max-model-len", "1024", "--enforce-eager", "--seed", "0"]
    with VllmServer(model, args, log_path=model.parent / f"serve-{model.name}-{'-'.join(layout)}.log") as server:
        tokens = []
        for prompt in PROMPTS:
            body = {
                "model": str(model),
                "prompt": prompt,
                "max_tokens": MAX_TOKENS,
                "temperature": 0,
                "ignore_eos": True,
                "logprobs": 0,
                "return_tokens_as_token_ids": True,
            }
            request = urllib.request.Request(
                f"{server.url}/v1/completions", json.dumps(body).encode(), {"Content-Type": "application/json"}
            )
            with urllib.request.urlopen(request, timeout=300) as response:
                choice = json.loads(response.read())["choices"][0]
            tokens.append([int(t.removeprefix("token_id:")) for t in choice["logprobs"]["tokens"]])
        return tokens


@pytest.mark.parametrize("layout", OFFLINE)
def test_offline_layouts(models, layout):
    dtype, sparse, _ = models
    tokens, log = run_engine(sparse, *LAYOUTS[layout], dtype=dtype)
    assert "quantization=samoyeds" in log
    assert tokens == expected(models, LAYOUTS[layout]), layout


@pytest.mark.parametrize("layout", LAYOUTS)
def test_served_layouts(models, layout):
    dtype, sparse, _ = models
    assert served_tokens(sparse, dtype, LAYOUTS[layout]) == expected(models, LAYOUTS[layout]), layout
