"""Serve samoyeds sparse MoE models with `vllm serve` and query them through the OpenAI client.

    python examples/serve_and_query.py MODEL_DIR [MODEL_DIR ...] [-- extra vllm serve arguments]

Serves each model in turn on a free local port, sends the same completions and a chat completion, stops the
server, and prints the answers side by side (a dense model next to its sparse conversion, say). vLLM picks the
samoyeds method from a converted checkpoint's config.json: `vllm serve MODEL_DIR` needs no flag.
"""

import sys

from openai import OpenAI

from samoyeds_vllm.tools.vllm_server import VllmServer

PROMPTS = ["Return a new", "This module provides", "The quick brown fox"]


def query(model: str, args: list[str]) -> list[str]:
    """The greedy completions of PROMPTS, then the chat answer, from `vllm serve model`."""
    print(f"starting vllm serve {model} ...", flush=True)
    log = f"vllm-serve-{len(model)}-{abs(hash(model)) % 10000}.log"
    with VllmServer(model, args, log_path=log, env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as server:
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
    return answers


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    split = sys.argv.index("--") if "--" in sys.argv else len(sys.argv)
    models, extra = sys.argv[1:split], sys.argv[split + 1 :]
    try:
        import torch

        on_cpu = not torch.cuda.is_available()
    except ImportError:
        on_cpu = True
    args = ["--max-model-len", "1024", *(["--gpu-memory-utilization", "0.3"] if on_cpu else []), *extra]
    answers = {model: query(model, args) for model in models}
    for i, prompt in enumerate([*PROMPTS, "chat: Hello!"]):
        print(f"\n{prompt!r}")
        for model in models:
            print(f"  {model.rstrip('/').rsplit('/', 1)[-1]:>12}: {answers[model][i]!r}")


if __name__ == "__main__":
    main()
