"""Serve a samoyeds sparse MoE model with `vllm serve` and query it through the OpenAI client.

    python examples/serve_and_query.py MODEL_DIR [-- extra vllm serve arguments]

Starts the server on a free local port, sends a completion and a chat completion, prints the answers and stops
the server. vLLM picks the samoyeds method from the checkpoint's config.json: `vllm serve MODEL_DIR` needs no flag.
"""

import sys

from openai import OpenAI

from samoyeds_vllm.tools.vllm_server import VllmServer


def main() -> None:
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    model, extra = sys.argv[1], [a for a in sys.argv[2:] if a != "--"]
    try:
        import torch

        on_cpu = not torch.cuda.is_available()
    except ImportError:
        on_cpu = True
    args = ["--max-model-len", "1024", *(["--gpu-memory-utilization", "0.3"] if on_cpu else []), *extra]
    print(f"starting vllm serve {model} ...", flush=True)
    with VllmServer(model, args, log_path="vllm-serve.log", env={"VLLM_CPU_KVCACHE_SPACE": "1"}) as server:
        client = OpenAI(base_url=f"{server.url}/v1", api_key="none")
        served = client.models.list().data[0].id
        completion = client.completions.create(model=served, prompt="The quick brown fox", max_tokens=16, temperature=0)
        print(f"completion: {completion.choices[0].text!r}")
        chat = client.chat.completions.create(
            model=served, messages=[{"role": "user", "content": "Hello!"}], max_tokens=16, temperature=0
        )
        print(f"chat:       {chat.choices[0].message.content!r}")
        print(f"usage:      {chat.usage.prompt_tokens} prompt + {chat.usage.completion_tokens} completion tokens")
    print("server stopped (log: vllm-serve.log)")


if __name__ == "__main__":
    main()
