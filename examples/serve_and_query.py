"""Serve samoyeds sparse MoE models with `vllm serve` and query them through the OpenAI client.

    python examples/serve_and_query.py MODEL_DIR [MODEL_DIR ...] [--eval-data TEXT] [--eval-tokens N]
        [--eval-window N] [-- extra vllm serve arguments]

Serves each model in turn on a free local port, sends the same completions and a chat completion, stops the
server, and prints the answers side by side (a dense model next to its sparse conversion, say). With --eval-data,
each served model's perplexity on that text comes first, measured by `samoyeds-vllm eval` through the same server.
vLLM picks the samoyeds method from a converted checkpoint's config.json: `vllm serve MODEL_DIR` needs no flag.
Each server's log goes to vllm-serve-*.log in the current folder. On a CPU the servers get a KV cache of 1 GiB
(VLLM_CPU_KVCACHE_SPACE) and 0.3 of the RAM: vLLM's CPU default takes most of the machine's memory.
"""

import argparse
import sys

from openai import OpenAI

from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.tools.evaluate import evaluate
from samoyeds_vllm.tools.text_data import load_documents
from samoyeds_vllm.tools.vllm_server import VllmServer

PROMPTS = ["Return a new", "This module provides", "The quick brown fox"]


def query(model: str, args: list[str], options: argparse.Namespace) -> tuple[list[str], float | None]:
    """The greedy completions of PROMPTS, then the chat answer, from `vllm serve model`; and its perplexity on
    `options.eval_data` if given."""
    print(f"starting vllm serve {model} ...", flush=True)
    log = f"vllm-serve-{len(model)}-{abs(hash(model)) % 10000}.log"
    with VllmServer(model, args, log_path=log, env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as server:
        perplexity = None
        if options.eval_data:
            result = evaluate(
                model, options.eval_data, window=options.eval_window, max_tokens=options.eval_tokens, server=server.url
            )
            perplexity = result.perplexity
            print(
                f"  perplexity {perplexity:.3f} on {result.tokens} tokens of {options.eval_data}, windows of "
                f"{result.window} ({result.seconds:.1f} s)"
            )
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        served = client.models.list().data[0].id
        answers = [
            client.completions.create(model=served, prompt=p, max_tokens=16, temperature=0).choices[0].text
            for p in PROMPTS
        ]
        chat = client.chat.completions.create(
            model=served, messages=[{"role": "user", "content": "Hello!"}], max_tokens=16, temperature=0
        )
        answers.append(chat.choices[0].message.content)
        print(
            f"  served; usage of the chat: {chat.usage.prompt_tokens} prompt + {chat.usage.completion_tokens} "
            f"completion tokens (log: {log})"
        )
    return answers, perplexity


def main() -> None:
    split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+", metavar="MODEL_DIR")
    parser.add_argument("--eval-data", help="text to measure each model's perplexity on (a samoyeds-vllm eval SOURCE)")
    parser.add_argument("--eval-tokens", type=int, default=8192, help="score the text up to this many tokens")
    parser.add_argument("--eval-window", type=int, help="tokens per scored window (default: eval's)")
    options, extra = parser.parse_args(sys.argv[1:split]), sys.argv[split + 1 :]
    try:
        import torch

        on_cpu = not torch.cuda.is_available()
    except ImportError:
        on_cpu = True
    args = ["--max-model-len", "1024", *(["--gpu-memory-utilization", "0.3"] if on_cpu else []), *extra]
    try:
        if options.eval_data:  # a missing or empty text said now, not after the first server has started
            load_documents(options.eval_data)
        results = {model: query(model, args, options) for model in options.models}
    except SamoyedsError as e:
        sys.exit(f"serve_and_query: error: {e}")

    def name(model: str) -> str:
        return model.rstrip("/").rsplit("/", 1)[-1]

    if options.eval_data:
        print(f"\nperplexity on {options.eval_data} (samoyeds-vllm eval; lower is better)")
        for model, (_, perplexity) in results.items():
            print(f"  {name(model):>12}: {perplexity:.3f}")
    for i, prompt in enumerate([*PROMPTS, "chat: Hello!"]):
        print(f"\n{prompt!r}")
        for model, (answers, _) in results.items():
            print(f"  {name(model):>12}: {answers[i]!r}")


if __name__ == "__main__":
    main()
