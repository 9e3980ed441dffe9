"""`vllm serve` of a converted checkpoint: the OpenAI API, streaming, concurrency, bad requests, clean shutdown."""

import json
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest
from openai import OpenAI

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.tools.convert import convert
from samoyeds_vllm.tools.vllm_server import VllmServer

pytestmark = pytest.mark.vllm
MAX_MODEL_LEN = 512


@pytest.fixture(scope="module")
def server(tiny_models, tmp_path_factory):
    root = tmp_path_factory.mktemp("serve")
    sparse = root / "sparse"
    convert(tiny_models["qwen3_moe"], sparse, Pattern.parse("samoyeds"), progress=False)
    # No --quantization flag: the method must come from the checkpoint's config.json.
    args = ["--max-model-len", str(MAX_MODEL_LEN), "--gpu-memory-utilization", "0.3", "--enforce-eager"]
    srv = VllmServer(sparse, args, log_path=root / "serve.log", env={"VLLM_CPU_KVCACHE_SPACE": "1"})
    with srv:
        yield srv
    assert srv.process.poll() is not None, "the server process was reaped"


@pytest.fixture(scope="module")
def client(server):
    return OpenAI(base_url=f"{server.url}/v1", api_key="none", max_retries=0, timeout=300)


def post(server, path: str, body: bytes) -> tuple[int, dict]:
    request = urllib.request.Request(f"{server.url}{path}", data=body, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=300) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


def test_served_with_the_samoyeds_method(server):
    assert "quantization=samoyeds" in server.log_path.read_text()


def test_completions_streaming_and_not(client):
    model = client.models.list().data[0].id
    full = client.completions.create(model=model, prompt="The quick brown fox", max_tokens=12, temperature=0)
    assert full.usage.completion_tokens == 12
    chunks = client.completions.create(
        model=model, prompt="The quick brown fox", max_tokens=12, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in chunks) == full.choices[0].text


def test_chat_completions_streaming_and_not(client):
    model = client.models.list().data[0].id
    messages = [{"role": "user", "content": "Tell me about sparse experts."}]
    full = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0)
    assert full.choices[0].message.role == "assistant" and full.usage.prompt_tokens > 5
    chunks = client.chat.completions.create(model=model, messages=messages, max_tokens=10, temperature=0, stream=True)
    assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices) == full.choices[0].message.content


def test_concurrent_clients_get_their_own_answers(client):
    model = client.models.list().data[0].id
    prompts = [f"Client number {i} says" for i in range(6)]

    def ask(prompt):
        return client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0).choices[0].text

    with ThreadPoolExecutor(max_workers=6) as pool:
        concurrent = list(pool.map(ask, prompts))
    assert concurrent == [ask(p) for p in prompts]  # batching does not mix requests up


def test_64_concurrent_streams_each_get_their_whole_answer(client):
    """64 streaming completions at once through the sparse experts: every stream ends whole (8 tokens, stopped by
    length) with the text its prompt gets when asked alone, and afterwards the server answers as before."""
    model = client.models.list().data[0].id
    prompts = [f"Stream {i} of the experts says" for i in range(16)]

    def ask(prompt):
        return client.completions.create(model=model, prompt=prompt, max_tokens=8, temperature=0).choices[0].text

    alone = {p: ask(p) for p in prompts}

    def stream(prompt) -> tuple[str, str, int]:
        chunks = client.completions.create(
            model=model,
            prompt=prompt,
            max_tokens=8,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        text, finish_reason, tokens = [], None, None
        for chunk in chunks:
            for choice in chunk.choices:
                text.append(choice.text)
                finish_reason = choice.finish_reason or finish_reason
            if chunk.usage:
                tokens = chunk.usage.completion_tokens
        return "".join(text), finish_reason, tokens

    requests = prompts * 4  # 64 streams, all open at once
    with ThreadPoolExecutor(max_workers=len(requests)) as pool:
        answers = list(pool.map(stream, requests))
    for prompt, answer in zip(requests, answers, strict=True):
        assert answer == (alone[prompt], "length", 8), prompt
    assert ask(prompts[0]) == alone[prompts[0]]


def test_bad_requests_get_4xx_and_the_server_keeps_serving(server, client):
    """vLLM 0.26 answers each malformed request with a 4xx and an error body saying what is wrong."""
    model = client.models.list().data[0].id
    before = client.completions.create(model=model, prompt="Still there?", max_tokens=4, temperature=0)
    too_long = " ".join(["word"] * (MAX_MODEL_LEN * 2))
    cases = {  # label: (body, status, part of the message)
        "bad JSON": (b'{"model": "x", "prompt": "unterminated', 400, "JSON decode error"),
        "empty prompt": ({"prompt": ""}, 400, "Either prompt or prompt_embeds must be provided and non-empty"),
        "prompt beyond the context": ({"prompt": too_long}, 400, "maximum context length is 512 tokens"),
        "max_tokens beyond the context": (
            {"max_tokens": MAX_MODEL_LEN + 1},
            400,
            f"max_tokens={MAX_MODEL_LEN + 1} cannot be greater than max_model_len",
        ),
        "prompt and max_tokens beyond the context": (
            {"max_tokens": MAX_MODEL_LEN},
            400,
            "maximum context length is 512 tokens",
        ),
        "unknown model": ({"model": "no-such-model"}, 404, "The model `no-such-model` does not exist."),
    }
    for label, (body, expected_status, message) in cases.items():
        if isinstance(body, dict):
            body = json.dumps({"model": model, "prompt": "Hello", "max_tokens": 4} | body).encode()
        status, answer = post(server, "/v1/completions", body)
        assert status == expected_status and answer["error"]["code"] == status, (label, answer)
        assert message in answer["error"]["message"], (label, answer)
    again = client.completions.create(model=model, prompt="Still there?", max_tokens=4, temperature=0)
    assert again.choices[0].text == before.choices[0].text and again.usage.completion_tokens == 4
