"""What vLLM's front end spends detokenizing the made-up models' output, per engine step (no GPU needed).

    python benchmarks/detokenize.py [--preset qwen3-30b-a3b] [--batch 256] [--steps 256] [--prompt-len 1024]
        [--json FILE]

The end-to-end benchmarks serve made-up models (`make-model`, dummy weights) whose tokenizer is trained on a page of
text. Their random weights emit ids all over the model's vocabulary, and every generated id goes through vLLM's
output processor (the LLM's process offline, the API servers when serving) while the engine runs the next step.
This times that processor, vLLM 0.26's own `OutputProcessor` with the fast incremental detokenizer, on `--batch`
requests of `--prompt-len` prompt tokens fed `--steps` steps of one random id each, as the engine would send them
(the detokenizer starts on the whole prompt, so its length matters), with two
tokenizers: the trained one alone (1000 tokens: most ids unknown to it) and the one `make-model` writes, filled to
the model's vocabulary (tools/tokenizer.py, _fill_vocab). Prints a table and writes the ms per step as JSON.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import tempfile
import time
from pathlib import Path

from samoyeds_vllm.tools.architectures import text_config
from samoyeds_vllm.tools.presets import load_preset, preset_family
from samoyeds_vllm.tools.tokenizer import DEFAULT_VOCAB_SIZE, build_tokenizer


def ms_per_step(
    tokenizer_dir: Path, vocab_size: int, batch: int, steps: int, prompt_len: int, seed: int = 0
) -> list[float]:
    """ms of vLLM's output processor for each step of `batch` requests of the tokenizer's own prompt tokens, each
    fed one id below `vocab_size` a step."""
    from vllm import SamplingParams
    from vllm.sampling_params import RequestOutputKind
    from vllm.tokenizers import get_tokenizer
    from vllm.v1.engine import EngineCoreOutput, EngineCoreRequest, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor

    tokenizer = get_tokenizer(str(tokenizer_dir))
    processor = OutputProcessor(tokenizer, log_stats=False)
    rng = random.Random(seed)
    for i in range(batch):
        params = SamplingParams(max_tokens=steps, ignore_eos=True, temperature=1.0)
        params.output_kind = RequestOutputKind.FINAL_ONLY  # as `LLM.generate` asks
        prompt = [rng.randrange(3, len(tokenizer)) for _ in range(prompt_len)]  # the bench's: no special tokens
        request = EngineCoreRequest(
            request_id=str(i),
            external_req_id=str(i),
            prompt_token_ids=prompt,
            mm_features=None,
            sampling_params=params,
            pooling_params=None,
            arrival_time=time.time(),
            lora_request=None,
            cache_salt=None,
            data_parallel_rank=None,
        )
        processor.add_request(request, None)
    times = []
    for step in range(steps):
        finish = FinishReason.LENGTH if step == steps - 1 else None
        outputs = [
            EngineCoreOutput(request_id=str(i), new_token_ids=[rng.randrange(vocab_size)], finish_reason=finish)
            for i in range(batch)
        ]
        start = time.perf_counter()
        processor.process_outputs(outputs, engine_core_timestamp=time.monotonic())
        times.append(1e3 * (time.perf_counter() - start))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--preset", default="qwen3-30b-a3b", help="whose vocabulary the ids are drawn from")
    parser.add_argument("--batch", type=int, default=256, help="requests in every step")
    parser.add_argument("--steps", type=int, default=256, help="tokens generated per request")
    parser.add_argument("--prompt-len", type=int, default=1024, help="prompt tokens per request")
    parser.add_argument("--json", help="write the results here")
    args = parser.parse_args()
    vocab_size = text_config(load_preset(preset_family(args.preset), args.preset))["vocab_size"]
    rows = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, size in (("trained tokens only", DEFAULT_VOCAB_SIZE), ("filled to the vocabulary", vocab_size)):
            build_tokenizer(Path(tmp) / name, size)
            times = ms_per_step(Path(tmp) / name, vocab_size, args.batch, args.steps, args.prompt_len)
            rows[name] = {
                "tokens": min(size, vocab_size),
                "median_ms_per_step": statistics.median(times),
                "mean_ms_per_step": statistics.fmean(times),
                "total_s": sum(times) / 1e3,
            }
    shape = f"{args.batch} requests of {args.prompt_len} prompt tokens x {args.steps} steps"
    print(f"{args.preset} ({vocab_size} ids), {shape}: vLLM's output processor")
    print(f"{'tokenizer':>26} {'tokens':>7} {'median ms/step':>15} {'mean ms/step':>13} {'total s':>8}")
    for name, r in rows.items():
        print(
            f"{name:>26} {r['tokens']:>7} {r['median_ms_per_step']:>15.2f} {r['mean_ms_per_step']:>13.2f}"
            f" {r['total_s']:>8.2f}"
        )
    if args.json:
        record = {"preset": args.preset, "vocab_size": vocab_size, "batch": args.batch, "steps": args.steps}
        record["prompt_len"] = args.prompt_len
        Path(args.json).write_text(json.dumps({**record, "date": time.strftime("%Y-%m-%d"), "results": rows}, indent=2))


if __name__ == "__main__":
    main()
