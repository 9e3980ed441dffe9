"""Perplexity as vLLM serves the model: `samoyeds-vllm eval`.

vLLM itself scores the text, from prompt log-probabilities (`SamplingParams(prompt_logprobs=0)`), so what is
measured is what is served: the sparse kernels on a GPU, the reference path on CPU, vLLM's own MoE for a dense
checkpoint. The engine is a new one, or a running `vllm serve` of the model (`server`), asked through its
completions API with the same windows.

Windows. Each document is scored on its own, from a separator token (BOS, else end-of-text) that is not scored,
so every token of every document is scored exactly once. A document longer than the window W is scored in
windows of W tokens whose ends advance by the stride S: the first window scores its tokens 1..W-1, every later one
only its last S tokens (those not scored before), each with at least W - S tokens of context. S = W scores
disjoint windows (less context, fastest); the default S = W/2 is the usual compromise.

Reported: perplexity exp(NLL / tokens), bits per byte NLL / ln 2 / UTF-8 bytes of the documents (comparable
across tokenizers), and how many documents and tokens were scored.
"""

from __future__ import annotations

import dataclasses
import json
import math
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from ..errors import SamoyedsError
from ..format.shards import open_shard, shard_files
from .architectures import text_config
from .checkpoint_io import read_config
from .text_data import load_documents, separator_id, tokenize_documents
from .vllm_server import cpu_engine_flags

DEFAULT_WINDOW = 1024


@dataclass(frozen=True)
class Window:
    """One request: `tokens` go to vLLM, the last `scored` of them count."""

    tokens: list[int]
    scored: int

    @property
    def scored_positions(self) -> range:
        return range(len(self.tokens) - self.scored, len(self.tokens))


def windows(ids: list[int], separator: int, window: int, stride: int) -> list[Window]:
    """The windows that score every token of one document once (module docstring)."""
    if window < 2 or not 1 <= stride <= window:
        raise SamoyedsError(f"need a window of at least 2 tokens and 1 <= stride <= window, not {window} / {stride}")
    seq = [separator, *ids]
    ends = list(range(window, len(seq), stride)) + [len(seq)]
    out, scored_until = [], 1
    for end in ends:
        if end <= scored_until:
            continue
        begin = max(0, end - window)
        out.append(Window(seq[begin:end], end - scored_until))
        scored_until = end
    return out


@dataclass
class EvalResult:
    model: str
    data: str
    documents: int
    tokens: int
    bytes: int
    nll: float  # summed negative log-likelihood, nats
    window: int
    stride: int
    seconds: float

    @property
    def perplexity(self) -> float:
        return math.exp(self.nll / self.tokens)

    @property
    def bits_per_byte(self) -> float:
        return self.nll / math.log(2) / self.bytes

    def to_json(self) -> dict:
        return dataclasses.asdict(self) | {"perplexity": self.perplexity, "bits_per_byte": self.bits_per_byte}

    def table(self) -> str:
        return "\n".join(
            [
                f"{'model':<40} {'perplexity':>10} {'bits/byte':>9} {'tokens':>9} {'docs':>6} {'seconds':>8}",
                f"{self.model[-40:]:<40} {self.perplexity:>10.3f} {self.bits_per_byte:>9.4f} {self.tokens:>9} "
                f"{self.documents:>6} {self.seconds:>8.1f}",
            ]
        )


def engine_command(model: str, max_model_len: int, engine_flags: list[str]) -> list[str]:
    """The engine's flags: the model and its window, this machine's (on CPU a small KV cache: a window of text needs
    little), then the user's (the last of a repeated flag wins)."""
    return ["--model", model, "--max-model-len", str(max_model_len), *cpu_engine_flags(), *engine_flags]


def _engine(model: str, max_model_len: int, engine_flags: list[str]):
    from vllm import LLM
    from vllm.engine.arg_utils import EngineArgs
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    args = parser.parse_args(engine_command(model, max_model_len, engine_flags))
    engine_args = EngineArgs.from_cli_args(args)
    return LLM(**{f.name: getattr(engine_args, f.name) for f in dataclasses.fields(engine_args)})


def _engine_logprobs(llm, requests: list[Window]) -> list[list[float]]:
    """The log-probability of each scored token of each window, from a vLLM engine (`vllm.LLM`)."""
    from vllm import SamplingParams, TokensPrompt

    params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0)
    outputs = llm.generate([TokensPrompt(prompt_token_ids=w.tokens) for w in requests], params, use_tqdm=True)
    return [
        [output.prompt_logprobs[pos][w.tokens[pos]].logprob for pos in w.scored_positions]
        for w, output in zip(requests, outputs, strict=True)
    ]


def _served(url: str, path: str, body: dict | None = None) -> dict:
    """GET (or POST `body` as JSON to) a `vllm serve` endpoint; its errors say what the server answered."""
    data = json.dumps(body).encode() if body is not None else None
    request = urllib.request.Request(f"{url}{path}", data=data, headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(request, timeout=600) as response:
            return json.loads(response.read())
    except urllib.error.HTTPError as e:
        raise SamoyedsError(f"{url}{path} answered {e.code}: {e.read().decode(errors='replace')[:2000]}") from None
    except (urllib.error.URLError, OSError) as e:
        raise SamoyedsError(f"cannot reach the server at {url}: {e}") from None


def served_model(server: str, model: str) -> dict:
    """The entry of /v1/models that is `model`: the server must serve the model whose tokenizer and name the
    result carries (scoring whatever it served labelled a dense model with its sparse twin's perplexity). vLLM
    gives each entry's path as `root`; compared resolved where it is a folder here, else by its last part (a server
    started elsewhere, or under --served-model-name)."""
    entries = _served(server, "/v1/models")["data"]

    def same(entry: dict) -> bool:
        root = Path(entry.get("root") or entry["id"])
        if root.is_dir() and Path(model).is_dir():
            return root.resolve() == Path(model).resolve()
        return root.name == Path(model).name

    for entry in entries:
        if same(entry):
            return entry
    roots = ", ".join(str(e.get("root") or e["id"]) for e in entries)
    raise SamoyedsError(f"{server} serves {roots}, not {model}: start it with `vllm serve {model}`, or evaluate that")


def _served_logprobs(url: str, name: str, requests: list[Window], batch: int = 64) -> list[list[float]]:
    """The same as _engine_logprobs, from a running `vllm serve` (its completions API takes token ids and returns
    prompt log-probabilities keyed by token id), `batch` windows per request."""
    out = []
    for i in range(0, len(requests), batch):
        chunk = requests[i : i + batch]
        body = {"model": name, "prompt": [w.tokens for w in chunk], "max_tokens": 1, "temperature": 0.0}
        choices = _served(url, "/v1/completions", body | {"prompt_logprobs": 0})["choices"]
        for w, choice in zip(chunk, sorted(choices, key=lambda c: c["index"]), strict=True):
            logprobs = choice["prompt_logprobs"]
            out.append([logprobs[pos][str(w.tokens[pos])]["logprob"] for pos in w.scored_positions])
    return out


def evaluate(
    model: str | Path,
    data: str,
    *,
    window: int | None = None,
    stride: int | None = None,
    max_tokens: int | None = None,
    split: str = "test",
    text_field: str = "text",
    engine_flags: list[str] = (),
    server: str | None = None,
) -> EvalResult:
    """Score `data` (a text_data SOURCE) with the model served by vLLM. `max_tokens` keeps the documents, in order,
    up to that many tokens, the last one cut there. `engine_flags` are `vllm serve` engine flags for a new engine;
    `server` is instead the URL of a running `vllm serve` of `model`, which then scores."""
    from transformers import AutoTokenizer

    for flag, value in (("--window", window), ("--stride", stride), ("--max-tokens", max_tokens)):
        if value is not None and value < 1:
            raise SamoyedsError(f"{flag} wants a positive number of tokens, not {value}")
    model = str(model)
    config = read_config(Path(model))
    if not server:  # a damaged weights file is refused by name here, not in the log of an engine that did not start
        for path in shard_files(Path(model)):
            open_shard(path)
    context = int(text_config(config).get("max_position_embeddings") or DEFAULT_WINDOW + 1)
    if server:
        if engine_flags:
            raise SamoyedsError("engine flags apply to a new engine, not to a running server")
        served = served_model(server, model)
        context = min(context, int(served.get("max_model_len") or context))
    window = window if window is not None else min(DEFAULT_WINDOW, context - 1)
    stride = stride if stride is not None else max(1, window // 2)
    if window + 1 > context:
        raise SamoyedsError(f"a window of {window} tokens does not fit the model's context of {context} tokens")
    try:
        tokenizer = AutoTokenizer.from_pretrained(model)
    except Exception as e:
        raise SamoyedsError(f"{model}: cannot load its tokenizer: {e}") from None

    docs = load_documents(data, split=split, text_field=text_field)
    tokenized = tokenize_documents(tokenizer, docs)
    ids, num_bytes, kept = [], [], 0
    for doc_ids, doc_bytes in zip(tokenized.ids, tokenized.num_bytes, strict=True):
        if not doc_ids:
            continue
        if max_tokens is not None and kept + len(doc_ids) > max_tokens:
            # the cap falls inside this document (a plain-text file is one): score its start
            doc_ids = doc_ids[: max_tokens - kept]
            doc_bytes = len(tokenizer.decode(doc_ids).encode("utf-8"))
        ids.append(doc_ids)
        num_bytes.append(doc_bytes)
        kept += len(doc_ids)
        if max_tokens is not None and kept >= max_tokens:
            break
    sep = separator_id(tokenizer)
    requests = [w for doc in ids for w in windows(doc, sep, window, stride)]

    llm = None if server else _engine(model, window + 1, list(engine_flags))
    start = time.perf_counter()
    logprobs = _served_logprobs(server, served["id"], requests) if server else _engine_logprobs(llm, requests)
    seconds = time.perf_counter() - start
    return EvalResult(
        model=model,
        data=str(data),
        documents=len(ids),
        tokens=sum(w.scored for w in requests),
        bytes=sum(num_bytes),
        nll=-sum(map(sum, logprobs)),
        window=window,
        stride=stride,
        seconds=seconds,
    )


def write_result(result: EvalResult, path: Path) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(result.to_json(), indent=2) + "\n")
