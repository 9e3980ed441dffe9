"""`samoyeds-vllm bench e2e`: what users run (vLLM's dense MoE in bf16 and FP8) against the samoyeds method in
bf16 and FP8, whole model, same GPU, same engine settings.

Every variant is a config-only model of a real shape with dummy weights (no download), a model maker and the
environment its processes get (VARIANTS): dense bf16 as vLLM serves it; dense FP8 quantized like Qwen3-*-FP8
(128 x 128 blocks), served by vLLM's own FP8 MoE (Triton by default on Hopper, DeepGEMM in `dense-fp8-deepgemm`,
Triton for small batches and DeepGEMM otherwise in `dense-fp8-deepgemm-or-triton`);
and the same config marked as a packed samoyeds or 2:4 checkpoint, bf16 or FP8 values, so vLLM allocates only the
packed experts (`samoyeds-fp8-from-fp8`: as converted from the FP8 checkpoint, its other projections FP8 blocks as
dense FP8's). The variants with FP8 block projections skip vLLM's DeepGEMM warm-up at engine start (over ten
minutes precompiling about a thousand shapes); the untimed runs below compile what the timed runs need instead.

Stages, each variant in its own processes, one engine at a time (the next starts once the GPU memory of the last
is back, so each sizes its KV cache on the same free memory):
- offline: one `vllm.LLM` per variant and input/output mix (bench/offline.py, in a subprocess) runs every batch
  size: for each, an untimed `generate` of the same shape (same number of prompts, same lengths, other random
  tokens), then the timed one; output tokens/s = generated tokens / wall time of the timed generate. So Triton and
  DeepGEMM JIT compilation happen in the untimed run; a timed run that still compiles a kernel (vLLM's JIT
  monitor logs each) is run again, at most three times, and the record says so. `vllm bench throughput` could warm
  up too (`--num-warmups`, same engine), but it starts an engine per call and a call runs one batch size: five
  engine starts per mix where this needs one, and engine starts are most of the time of a run;
- serving: `vllm serve` (API_SERVERS API server processes, prefix caching off: _SERVER_FLAGS) under `vllm bench
  serve` (random tokens, `--ignore-eos`) at each client concurrency C: first an untimed round of C x
  prompts-per-client requests at concurrency C (the same prefill and decode batch shapes; again while it compiled
  a kernel, at most WARMUP_ROUNDS), then the timed run of
  as many (again if it compiled a kernel, as offline); output tokens/s, TTFT and TPOT (mean, median, p99), and
  the server's own mean TTFT, queue, prefill and decode time per request from its /metrics (server_split). Every
  call draws other random prompts (its own seed); the loads of one server go through one long-lived client process
  (tools.serve_client: vLLM's benchmark imported once, not once per load);
- capacity: model weight memory and KV-cache size from the engine log, and the largest number of concurrent
  sequences of a given length served without preemption, measured by probing concurrencies from vLLM's own
  estimate outwards while polling the server's /metrics.
Each variant's results go to OUT/variant-NAME.json after every step, with the environment variables and engine
flags its processes got, what vLLM resolved them to, the device, the date and the versions; the comparison
(results.json, results.md, PNG plots) puts every variant measured side by side, ratios against the best dense
variant at each point.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

from tqdm import tqdm

from ..errors import SamoyedsError
from ..tools.model_maker import FORMS, ModelForm
from ..tools.serve_client import BenchServeClient
from ..tools.vllm_server import (
    JIT_MONITOR_FLAGS,
    VllmServer,
    busiest,
    cpu_engine_flags,
    deep_gemm_cache,
    engine_failure_cause,
    failure_text,
    gpu_memory_used,
    gpu_processes,
    nvidia_smi,
    other_gpus_in_use,
    parse_engine_log,
    wait_for_gpu_memory,
    without_jit,
)

# Results of an earlier harness are not resumed into this one's: 1 had no untimed runs; 2 served through one API
# server process with prefix caching on and warmed each level up with C requests only; 3 made its models with a
# tokenizer of 1000 tokens: most ids the models emit were unknown to it, which slowed vLLM's detokenizer with long
# prompts (tools/tokenizer.py, _fill_vocab), and offline prompts were drawn from those 1000 ids, not the vocabulary.
# 4 took a served level's last timed round once it agreed within 10% with the round before it: rounds of one server
# at 256 clients still differed by up to 9%, so one round could carry a ratio across a target; 5 keeps the median of
# three timed rounds (timed_rounds).
HARNESS = 5
_RERUN_SEEDS = 1000  # serving seeds: 2C timed, 2C + 1 untimed, each + 1000 k for its k-th run, 1e6 + C probes
PROBE_FACTORS = (0.5, 0.75, 0.9, 1.0, 1.1, 1.25)
BATCH_SIZES = (1, 16, 64, 256, 1024)
STAGES = ("offline", "serving", "capacity")
#: API server processes in front of the engine while serving (vLLM's `--api-server-count`). One process saturated
#: its CPU core at 256 streaming clients: on an H200 it held samoyeds FP8 Qwen3-30B-A3B at 11-15k output tokens/s
#: where four gave 16-18.6k, so with one the comparison measures the front end (measured with harness 3, whose
#: tokenizer slowed the detokenizer). A setting a run resumes on: another number starts the variants over.
API_SERVERS = 4
#: The serving flags besides the engine's and the API server count: no prefix caching. `vllm bench serve`'s random
#: prompts are runs of consecutive token ids, and with the made-up models' former 1000-token vocabulary many of them
#: repeated (up to 82% prefix-cache hits were seen), which would skip prefills no real traffic skips.
_SERVER_FLAGS = ("--no-enable-prefix-caching",)


@dataclass(frozen=True)
class Variant:
    """A name, its model and what its processes' environment adds (a value None unsets the variable)."""

    name: str
    model: ModelForm
    env: Mapping[str, str | None] = field(default_factory=dict)


# vLLM picks its FP8 MoE kernels itself unless these are set (an explicit 1 forces DeepGEMM): every variant runs
# with them unset, as a user gets it, except the ones that ask for DeepGEMM.
_VLLM_DEFAULT_MOE = {"VLLM_USE_DEEP_GEMM": None, "VLLM_MOE_USE_DEEP_GEMM": None, "VLLM_USE_DEEP_GEMM_E8M0": None}
_FP8_DENSE = {**_VLLM_DEFAULT_MOE, "VLLM_DEEP_GEMM_WARMUP": "skip"}
_DEEP_GEMM_MOE = {**_FP8_DENSE, "VLLM_USE_DEEP_GEMM": "1", "VLLM_MOE_USE_DEEP_GEMM": "1"}

VARIANTS: dict[str, Variant] = {
    v.name: v
    for v in (
        Variant("dense", FORMS["dense"], _VLLM_DEFAULT_MOE),
        Variant("dense-fp8", FORMS["dense-fp8"], _FP8_DENSE),
        Variant("dense-fp8-deepgemm", FORMS["dense-fp8"], _DEEP_GEMM_MOE),
        # vLLM's DeepGEMM MoE (TritonOrDeepGemmExperts) runs DeepGEMM at every token count while DeepGEMM's E8M0
        # scales are on (vLLM's default, also on Hopper); with them off it takes Triton for batches of fewer tokens
        # than the M alignment of DeepGEMM's contiguous layout (vLLM's _valid_deep_gemm): DeepGEMM's grouped GEMMs
        # in the prefill steps, where they are fastest, Triton in small decode steps, where DeepGEMM is slowest
        # (docs/benchmarks.md, "Which dense FP8 these ratios are against")
        Variant("dense-fp8-deepgemm-or-triton", FORMS["dense-fp8"], {**_DEEP_GEMM_MOE, "VLLM_USE_DEEP_GEMM_E8M0": "0"}),
        *(Variant(name, FORMS[name], _VLLM_DEFAULT_MOE) for name in ("samoyeds", "samoyeds-fp8", "2of4", "2of4-fp8")),
        # what `convert` makes of a Qwen3-*-FP8 checkpoint: its attention and shared projections stay FP8 blocks
        Variant("samoyeds-fp8-from-fp8", ModelForm("samoyeds", fp8=True, from_fp8=True), _FP8_DENSE),
    )
}
DEFAULT_VARIANTS = ("dense", "dense-fp8", "samoyeds", "samoyeds-fp8")


def variant_env(variant: Variant) -> dict[str, str]:
    """The whole environment of a variant's processes."""
    return {k: v for k, v in {**os.environ, **variant.env}.items() if v is not None}


def recorded_env(env: Mapping[str, str]) -> dict[str, str]:
    """What of an environment can change what vLLM runs: its own variables and the visible GPUs."""
    return {k: env[k] for k in sorted(env) if k.startswith("VLLM_") or k == "CUDA_VISIBLE_DEVICES"}


def environment() -> dict:
    """Device, versions and date of a measurement, read without touching the GPU (this process holds no CUDA
    context, so every engine gets the same free memory)."""
    import platform

    import torch

    try:
        from vllm.version import __version__ as vllm_version
    except ImportError:
        vllm_version = None
    device = None
    gpus = [line.strip() for line in (nvidia_smi("gpu=name,memory.total,driver_version") or "").splitlines()]
    gpus = [gpu for gpu in gpus if gpu]
    if gpus:
        device = f"{len(gpus)} x {gpus[0]}" if len(gpus) > 1 else gpus[0]
    if device is None:
        cpu = (
            re.search(r"^model name\s*:\s*(.+)$", Path("/proc/cpuinfo").read_text(), re.M)
            if os.path.exists("/proc/cpuinfo")
            else None
        )
        device = f"CPU: {cpu[1] if cpu else platform.processor() or platform.machine()}"
    return {"device": device, "vllm": vllm_version, "torch": torch.__version__, "date": time.strftime("%Y-%m-%d")}


def _run_group(cmd: list[str], log: Path, env: Mapping[str, str], timeout: float) -> int | None:
    """Runs `cmd` in a process group of its own and ends the whole group afterwards, however this ends (engine
    processes can outlive the process that started them). The exit code, or None after `timeout` seconds."""
    with open(log, "w") as f:
        process = subprocess.Popen(cmd, stdout=f, stderr=subprocess.STDOUT, env=dict(env), start_new_session=True)
        try:
            return process.wait(timeout)
        except subprocess.TimeoutExpired:
            return None
        finally:
            try:
                os.killpg(process.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            process.wait()


def _json_lines(path: Path) -> list[dict]:
    """The records of a JSON-lines file; a line cut short by a killed writer is left out."""
    records = []
    for line in path.read_text().splitlines() if path.exists() else []:
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:
            pass
    return records


class _NotStarted(SamoyedsError):
    """The variant's engine did not start (a model too large for the GPU, typically)."""


def watched_jit_caches(variant: Variant, env: Mapping[str, str]) -> list[Path]:
    """The JIT caches whose new files count as kernels `variant`'s engine compiled: DeepGEMM's for the variants with
    FP8 block projections (DeepGEMM logs nothing when it compiles), none for the others. The cache is shared by every
    engine of the user, so watching it for a variant that never runs DeepGEMM would count another engine's compiles
    (a dense FP8 variant on the machine's other GPU) against it, and time its batches again for nothing."""
    return [deep_gemm_cache(env)] if variant.model.fp8_projections else []


def run_offline(
    model: Path,
    mix: tuple[int, int],
    batch_sizes: list[int],
    engine_args: list[str],
    env: Mapping[str, str],
    jit_caches: list[Path],
    out: Path,
    timeout: float,
    record: Callable[[dict | None, list[dict], str], None],
) -> None:
    """One engine (bench/offline.py) generating `mix` = (input, output) tokens at each of `batch_sizes`, each timed
    run after an untimed one of its shape (and again while it compiles kernels: vLLM's JIT monitor, new files in
    `jit_caches`). `record(engine, results, log)` gets what it measured, also when it
    failed or this process is interrupted; a run that did not finish then raises (_NotStarted when the engine
    never started)."""
    tag = f"{model.name}-{mix[0]}x{mix[1]}"
    spec_path, results_path, log = (out / f"offline-{tag}{ext}" for ext in (".spec.json", ".jsonl", ".log"))
    results_path.unlink(missing_ok=True)
    spec = {
        "model": str(model),
        "engine_args": engine_args,
        "input_len": mix[0],
        "output_len": mix[1],
        "batch_sizes": batch_sizes,
        "seed": 0,
        "results": str(results_path),
        "log": str(log),
        "jit_caches": [str(cache) for cache in jit_caches],
    }
    spec_path.write_text(json.dumps(spec, indent=2) + "\n")
    code = "interrupted"
    try:
        code = _run_group([sys.executable, "-m", "samoyeds_vllm.bench.offline", str(spec_path)], log, env, timeout)
    finally:
        lines = _json_lines(results_path)
        engine = next((line["engine"] for line in lines if "engine" in line), None)
        record(engine, [line for line in lines if "engine" not in line], log.read_text(errors="replace"))
    if code != 0:
        why = f"timed out after {timeout:.0f} s" if code is None else f"exit {code}"
        error = _NotStarted if engine is None else SamoyedsError
        raise error(failure_text(f"offline run of {tag} failed ({why})", log))


def _random_requests(mix: tuple[int, int], num_prompts: int, seed: int) -> list[str]:
    """`vllm bench` arguments for `num_prompts` random-token requests of mix = (input, output) tokens."""
    return [
        "--dataset-name",
        "random",
        "--random-input-len",
        str(mix[0]),
        "--random-output-len",
        str(mix[1]),
        "--num-prompts",
        str(num_prompts),
        "--seed",
        str(seed),
    ]


def bench_serve(
    client: BenchServeClient,
    model: Path,
    mix: tuple[int, int],
    concurrency: int,
    num_prompts: int,
    out: Path,
    tag: str,
    seed: int,
    extra: Sequence[str] = (),
) -> dict:
    """One `vllm bench serve` load against the client's server, through its long-lived client; `extra`: more of
    its arguments (`--profile`, `--save-detailed`)."""
    name = f"serve-{tag}.json"
    client.run(
        [
            "--backend",
            "vllm",
            "--base-url",
            client.url,
            "--model",
            str(model),
            *_random_requests(mix, num_prompts, seed),
            "--max-concurrency",
            str(concurrency),
            "--ignore-eos",
            "--save-result",
            "--result-dir",
            str(out),
            "--result-filename",
            name,
            "--disable-tqdm",
            "--request-id-prefix",  # its default is drawn once per process: the same ids in every load
            f"bench-{tag}-{seed}-",
            *extra,
        ],
        out / f"serve-{tag}.log",
    )
    r = json.loads((out / name).read_text())
    return {
        "concurrency": concurrency,
        "num_prompts": num_prompts,
        "output_tokens_per_s": r.get("output_throughput"),
        **{
            f"{stat}_{metric}_ms": r.get(f"{stat}_{metric}_ms")
            for metric in ("ttft", "tpot")
            for stat in ("mean", "median", "p99")
        },
        "completed": r.get("completed"),
        "date": time.strftime("%Y-%m-%d"),
    }


def _metrics(url: str, timeout: float = 120) -> str:
    """The server's Prometheus text (with several API servers, theirs and the engine's together)."""
    return urllib.request.urlopen(f"{url}/metrics", timeout=timeout).read().decode()


def _metric_total(text: str, metric: str) -> float:
    """A metric summed over its label sets (engines, API server processes)."""
    return sum(float(m[1]) for m in re.finditer(rf"^{metric}(?:{{[^}}]*}})? ([\d.e+-]+)$", text, re.M))


#: Where a served request's time goes, from the server's histograms (vLLM's names, without `vllm:`): TTFT as the
#: API server sees it (arrival to first token out), and the engine's own intervals, waiting in its queue, from its
#: first scheduling to its first token, and from there to its last. TTFT less queue and prefill is what lies
#: outside the engine's step loop: the API servers (tokenizing, handing the request over) and the hops between.
#: Decode is recorded beside them (the report shows the TTFT split only).
SERVER_TIMES = {
    "ttft": "time_to_first_token_seconds",
    "queue": "request_queue_time_seconds",
    "prefill": "request_prefill_time_seconds",
    "decode": "request_decode_time_seconds",
}


def _server_times(text: str) -> dict[str, tuple[float, float]]:
    """Each SERVER_TIMES histogram's (sum of seconds, count) so far."""
    return {
        key: (_metric_total(text, f"vllm:{name}_sum"), _metric_total(text, f"vllm:{name}_count"))
        for key, name in SERVER_TIMES.items()
    }


def server_split(url: str, measure: Callable[[], dict]) -> dict:
    """measure()'s record of a served load with `server_mean_ms`: the mean ms per request of each SERVER_TIMES
    interval over the requests that finished during it, read from the server's /metrics before and after."""
    before = _server_times(_metrics(url))
    level = measure()
    after = _server_times(_metrics(url))
    level["server_mean_ms"] = {
        key: 1000 * (after[key][0] - before[key][0]) / count
        for key in SERVER_TIMES
        if (count := after[key][1] - before[key][1]) > 0
    }
    return level


class _MetricsPoller:
    """Polls /metrics while a load runs: peak running requests and the preemption counter."""

    def __init__(self, url: str):
        self.url, self.peak_running, self._stop = url, 0.0, threading.Event()

    def read(self, timeout: float = 120) -> tuple[float, float]:
        text = _metrics(self.url, timeout)
        return _metric_total(text, "vllm:num_requests_running"), _metric_total(text, "vllm:num_preemptions_total")

    def __enter__(self):
        self.start_preemptions = self.read()[1]
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            try:
                self.peak_running = max(self.peak_running, self.read(timeout=10)[0])
            except OSError:  # a busy server (a long prefill) may not answer in time: poll again
                pass
            time.sleep(0.01)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.preemptions = self.read()[1] - self.start_preemptions


def measure_max_seqs(
    client: BenchServeClient,
    model: Path,
    seq_len: int,
    estimate: float,
    out: Path,
    tag: str,
    factors,
    measured: dict,
    save,
) -> None:
    """The most `seq_len`-token sequences (an eighth of each generated, so they stay resident long enough to be
    seen) running at once without preemption, into `measured`. Offered more than fit, vLLM queues the rest, so
    the peak of `num_requests_running` at a load above capacity is the capacity. The loads are `factors` times the
    engine's estimate (which ignores block granularity and scheduler limits), taken from the estimate outwards:
    upwards while loads run clean until a peak seen below its load repeats, downwards while one preempts, so a
    lower load than a clean one, which can only show a lower peak, is not run (each probe of 4096-token sequences
    took ~60 s on an H200, the client's start included). Each probe is saved as it finishes (a run cut short
    resumes). `saturated` says a clean probe hit the limit (a peak seen below its load)."""
    output_len = max(16, seq_len // 8)
    measured["seq_len"] = seq_len
    probes = measured.setdefault("probes", [])

    def probe(c: int) -> dict:
        done = next((p for p in probes if p["concurrency"] == c), None)
        if done is None:
            with _MetricsPoller(client.url) as poll:
                mix = (seq_len - output_len, output_len)
                bench_serve(client, model, mix, c, c, out, f"{tag}-maxseqs-{c}", seed=1_000_000 + c)
            done = {"concurrency": c, "peak_running": poll.peak_running, "preemptions": poll.preemptions}
            probes.append(done)
            probes.sort(key=lambda p: p["concurrency"])
            save()
        return done

    def clean(p: dict) -> bool:
        return p["preemptions"] == 0

    def limited(p: dict) -> bool:  # a clean load whose peak was seen below it: the capacity
        return clean(p) and 0 < p["peak_running"] < p["concurrency"]

    if estimate < 1:
        raise SamoyedsError(f"no capacity estimate to probe around ({estimate:.2f} sequences of {seq_len} tokens)")
    loads = sorted({max(1, int(estimate * f)) for f in factors})
    start = next((k for k, c in enumerate(loads) if c >= int(estimate)), len(loads) - 1)
    # upwards from the estimate while loads run clean, until one's peak, seen below it, is no higher than a peak
    # seen before: the capacity found twice. One sampled peak does not end the search (the poller can see a load
    # of short sequences on a busy CPU late, below its capacity, or not running at all).
    i, found = start, probe(loads[start])
    best = found["peak_running"]  # the highest peak of the clean loads so far (a preempted load ends the loop)
    while clean(found) and i + 1 < len(loads):
        i += 1
        found = probe(loads[i])
        if limited(found) and found["peak_running"] <= best:
            break
        best = max(best, found["peak_running"])
    # downwards from below the estimate until a clean load has been seen running
    i = start
    while not any(clean(p) and p["peak_running"] > 0 for p in probes) and i > 0:
        i -= 1
        probe(loads[i])
    measured["max_seqs_without_preemption"] = max((int(p["peak_running"]) for p in probes if clean(p)), default=0)
    measured["saturated"] = any(limited(p) for p in probes)
    save()


def engine_tensor_parallel_size(engine_args) -> int | None:
    """The tensor parallelism vLLM engine flags ask for (`--tensor-parallel-size N`, `-tp N`, or with `=`), None
    when they do not."""
    args = list(engine_args)
    for i, arg in enumerate(args):
        name, eq, value = arg.partition("=")
        if name in ("--tensor-parallel-size", "-tp"):
            value = value if eq else (args[i + 1] if i + 1 < len(args) else "")
            try:
                return int(value)
            except ValueError:
                raise SamoyedsError(f"engine flag {name} wants a number of GPUs, not {value!r}") from None
    return None


@dataclass(frozen=True)
class Workload:
    """What each variant runs: `stages` (of STAGES); offline mixes of (input, output) tokens at `batch_sizes`
    prompts each; serving concurrencies (`prompts_per_client` requests per client, on the first mix); the
    sequence length of the capacity probe (probes at `probe_factors` times vLLM's estimate); extra engine flags
    for every variant; the longest one offline engine may run, in seconds."""

    mixes: tuple[tuple[int, int], ...] = ((128, 128), (1024, 256), (4096, 64))
    batch_sizes: tuple[int, ...] = BATCH_SIZES
    concurrencies: tuple[int, ...] = (1, 4, 16, 64, 256)
    prompts_per_client: int = 4
    seq_len: int = 4096
    probe_factors: tuple[float, ...] = PROBE_FACTORS
    engine_args: tuple[str, ...] = ()
    stages: tuple[str, ...] = STAGES
    engine_timeout: float = 3600.0
    dense_tensor_parallel_size: int = 1
    api_servers: int = API_SERVERS

    def server_args(self, variant: Variant) -> list[str]:
        """The engine's flags and the serving ones (_SERVER_FLAGS, the API server processes)."""
        return [*self.variant_engine_args(variant), *_SERVER_FLAGS, "--api-server-count", str(self.api_servers)]

    def _dense_spread(self, variant: Variant) -> bool:
        return variant.model.dense and self.dense_tensor_parallel_size > 1

    def gpus(self, variant: Variant) -> int:
        """How many GPUs `variant` runs on: the dense ones over `dense_tensor_parallel_size` where it is above 1 (a
        big model that fits one GPU sparse, against dense spread over several), otherwise the tensor parallelism
        `engine_args` give every variant."""
        if self._dense_spread(variant):
            return self.dense_tensor_parallel_size
        return engine_tensor_parallel_size(self.engine_args) or 1

    def variant_engine_args(self, variant: Variant) -> list[str]:
        """Dummy weights, vLLM's JIT monitor and `engine_args`, and for a dense variant spread over several GPUs
        the tensor parallelism that spreads it."""
        spread = ["--tensor-parallel-size", str(self.dense_tensor_parallel_size)] if self._dense_spread(variant) else []
        return ["--load-format", "dummy", *JIT_MONITOR_FLAGS, *cpu_engine_flags(), *self.engine_args, *spread]

    def steps(self) -> int:
        """Progress steps per variant: an offline engine per mix, a serving level per concurrency, the probe."""
        offline = len(self.mixes) if "offline" in self.stages else 0
        serving = len(self.concurrencies) if "serving" in self.stages else 0
        return offline + serving + ("capacity" in self.stages)


def run_variant(
    variant: Variant, model: Path, work: Workload, out: Path, progress, result: dict, save, baseline
) -> None:
    """Measures one variant into `result`, skipping what it already holds (a run cut short resumes) and calling
    `save` after each step."""
    mixes = [tuple(m) for m in work.mixes]
    engine_args = work.variant_engine_args(variant)
    env = variant_env(variant)
    result["env"] = recorded_env(env)
    result["engine_args"] = engine_args
    throughput = result.setdefault("throughput", [])
    engines = result.setdefault("offline_engines", {})
    for mix in mixes if "offline" in work.stages else []:
        done = {r["batch_size"] for r in throughput if (r["input_len"], r["output_len"]) == mix}
        todo = [b for b in work.batch_sizes if b not in done]
        if todo:
            key = f"{mix[0]}x{mix[1]}"

            def record(engine, measured, log, key=key):
                if engine is not None:
                    engines[key] = {**engine, **parse_engine_log(log)}
                note_shared_host(result, measured)
                throughput.extend(measured)
                throughput.sort(key=lambda row: (row["input_len"], row["output_len"], row["batch_size"]))
                save()

            wait_for_gpu_memory(baseline)
            try:
                run_offline(
                    model,
                    mix,
                    todo,
                    engine_args,
                    env,
                    watched_jit_caches(variant, env),
                    out,
                    work.engine_timeout,
                    record,
                )
            except _NotStarted as e:
                if throughput:  # it ran before: not a model that does not fit
                    raise SamoyedsError(str(e)) from None
                result["failed"] = _kept_failure(str(e))  # what the engine said before it died
                save()
                raise
        progress.update()
    if "serving" not in work.stages and "capacity" not in work.stages:
        return
    serving = result.setdefault("serving", {"input_len": mixes[0][0], "output_len": mixes[0][1], "levels": []})
    memory = result.setdefault("memory", {})
    measured = memory.setdefault("measured", {})
    todo = [c for c in work.concurrencies if c not in {lv["concurrency"] for lv in serving["levels"]}]
    todo = todo if "serving" in work.stages else []
    probe = "capacity" in work.stages and "max_seqs_without_preemption" not in measured
    if not todo and not probe:
        return
    log = out / f"server-{model.name}.log"
    result["server_args"] = work.server_args(variant)
    wait_for_gpu_memory(baseline)
    server = VllmServer(model, result["server_args"], log_path=log, env=dict(variant.env))
    caches = watched_jit_caches(variant, env)
    try:
        server.__enter__()  # not `with`: a server that does not start is told apart from one that fails later
    except SamoyedsError as e:
        if not throughput and not serving["levels"]:
            result["failed"] = _kept_failure(str(e))
            save()
            raise _NotStarted(str(e)) from None
        raise
    try:
        memory.update(parse_engine_log(log.read_text(errors="replace")))
        with BenchServeClient(server.url, out / f"client-{model.name}.log") as client:
            for c in todo:
                mix = (serving["input_len"], serving["output_len"])
                before = other_gpus_in_use()
                level = serve_level(client, model, mix, c, work.prompts_per_client * c, out, log, caches)
                note_shared_host(result, [level], before)
                serving["levels"].append(level)
                serving["levels"].sort(key=lambda lv: lv["concurrency"])
                save()
                progress.update()
            if probe:
                estimate = memory.get("kv_cache_tokens", 0) / work.seq_len
                measure_max_seqs(
                    client, model, work.seq_len, estimate, out, model.name, work.probe_factors, measured, save
                )
                progress.update()
    finally:
        server.stop()


#: Untimed rounds of a served level at most, while each compiles a kernel. DeepGEMM (vLLM's dense FP8 linears; the
#: dense engines skip its warm-up: the module docstring) JIT-compiles kernels as new token counts come: at 256
#: clients three timed rounds after one untimed round each still compiled some (8 in all, docs/benchmarks.md,
#: 2026-11-27), so no round of that level stood for the steady state.
WARMUP_ROUNDS = 6


def serve_level(
    client: BenchServeClient,
    model: Path,
    mix: tuple[int, int],
    concurrency: int,
    requests: int,
    out: Path,
    log: Path,
    jit_caches: list[Path],
) -> dict:
    """One served level's record: untimed rounds of `requests` requests at `concurrency` clients, again (other
    prompts) while a round compiled a kernel, at most WARMUP_ROUNDS; then timed rounds (timed_rounds).
    Untimed, as many requests as the timed run: after the first round each client's next request arrives while the
    others decode, so most steps mix prefills into decodes, and those batch shapes must be compiled and captured
    before the timed run too. Seeds: 2C timed, 2C + 1 untimed, each + _RERUN_SEEDS k for its k-th run."""
    c, name = concurrency, model.name
    serve = partial(bench_serve, client, model, mix, c, requests, out)
    untimed, warmup = without_jit(
        lambda run: serve(f"{name}-c{c}-warmup" + (f"-{run}" if run else ""), seed=2 * c + 1 + _RERUN_SEEDS * run),
        log,
        attempts=WARMUP_ROUNDS,
        caches=jit_caches,
    )
    level = timed_rounds(
        # every run with seeds and a file of its own: other prompts than the runs before
        lambda run: server_split(
            client.url, partial(serve, f"{name}-c{c}" + (f"-{run}" if run else ""), seed=2 * c + _RERUN_SEEDS * run)
        ),
        untimed["output_tokens_per_s"],
        rerun_if_compiled=partial(without_jit, log=log, caches=jit_caches),
    )
    return level | {
        "warmup_runs": warmup["timed_runs"],
        "warmup_jit_compiles": warmup["jit_compiles"],
        "warmup_jit_free": warmup["jit_free"],
    }


STEADY_TOLERANCE = 0.10  # timed rounds of a level further apart than this (max / min - 1) are named in the report
TIMED_ROUNDS = 3  # timed rounds of every served level; the median stands for it


def timed_rounds(measure, untimed_tok_s: float | None, rerun_if_compiled, rounds: int = TIMED_ROUNDS) -> dict:
    """A served level's record: `rounds` timed rounds, each `measure(run)` (run = 0, 1, ...: each its own prompts)
    through `rerun_if_compiled` (tools.vllm_server.without_jit: a run that compiled a kernel is made again); the
    round of median output tok/s stands for the level, with its own `jit_free` (`rounds_jit_free`: every round's).
    With `rounds_output_tokens_per_s` (every timed round, the untimed one first), `spread` (the timed rounds' max /
    min - 1; None where a round made no tokens) and `steady` (spread within STEADY_TOLERANCE). One round does not
    stand for a level: at 256 clients a timed round came out 21-47% slower than the untimed round just before it on
    the same server (docs/benchmarks.md, 2026-11-27), and rounds of one server that agreed within 10% still differed
    by up to 9% (2026-11-29), enough to move a ratio across a target."""
    measured, runs, compiles = [], 0, 0
    for _ in range(rounds):
        level, jit = rerun_if_compiled(lambda run, base=runs: measure(base + run))
        runs, compiles = runs + jit["timed_runs"], compiles + jit["jit_compiles"]
        measured.append((level, jit["jit_free"]))
    tok_s = [level["output_tokens_per_s"] for level, _ in measured]
    median, jit_free = sorted(measured, key=lambda m: m[0]["output_tokens_per_s"] or 0.0)[len(measured) // 2]
    spread = max(tok_s) / min(tok_s) - 1 if all(tok_s) else None
    return {
        **median,
        "timed_runs": runs,
        "jit_compiles": compiles,
        "jit_free": jit_free,
        "rounds_jit_free": [free for _, free in measured],
        "rounds_output_tokens_per_s": [untimed_tok_s, *tok_s],
        "spread": spread,
        "steady": spread is not None and spread <= STEADY_TOLERANCE,
    }


# What every variant of one comparison must share (the variant's own model and environment may differ).
COMMON_SETTINGS = (
    "harness",
    "preset",
    "segment",
    "engine_args",
    "api_servers",
    "prompts_per_client",
    "device",
    "vllm",
    "torch",
)


def bench_e2e(
    preset: str,
    out: Path,
    work: Workload = Workload(),
    variants=DEFAULT_VARIANTS,
    segment: int | None = None,
) -> dict | None:
    """Runs `variants` (names of VARIANTS) and writes the comparison of every variant OUT holds. Each variant's
    results go to OUT/variant-NAME.json after every step; a later call with the same settings on the same kind
    of device resumes there (so a few variants per call fit a time-limited machine), and one with other settings
    moves them to OUT/replaced/ first. A dense variant that
    cannot start (a model too large for the GPU) is recorded as such, with the reason."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    measured_on = environment()
    common = {
        "harness": HARNESS,
        "preset": preset,
        "segment": segment,
        "engine_args": list(work.engine_args),
        "api_servers": work.api_servers,
        # only where not the default: results saved before this key existed still resume
        **({"prompts_per_client": n} if (n := work.prompts_per_client) != Workload.prompts_per_client else {}),
        **{k: measured_on[k] for k in ("device", "vllm", "torch")},
    }
    baseline = gpu_memory_used()
    if baseline and any(used > 1.0 for used in baseline):
        print(f"warning: GPU memory in use before the first engine ({gpu_processes()}); engines get less")
    if busy := other_gpus_in_use():
        print(f"warning: other GPUs of this machine are in use ({_gpus_text(busy)}): their jobs share its CPUs")
    with tqdm(total=len(variants) * work.steps(), desc="bench e2e") as progress:
        for name in variants:
            variant = VARIANTS[name]
            start = progress.n
            progress.set_postfix_str(name)
            path = out / f"variant-{name}.json"
            gpus = work.gpus(variant)
            settings = {
                **common,
                "variant": name,
                "model": variant.model.describe(segment),
                "env": dict(variant.env),
                # only where several: one-GPU results saved before this key existed still resume
                **({"gpus": gpus} if gpus > 1 else {}),
            }
            saved = _read_variant(path) if path.exists() else {}
            if saved and "failed" not in saved and saved.get("settings") != settings:
                changed = settings_changed(saved.get("settings", {}), settings)
                progress.write(
                    f"{name}: {path.name} was measured with other settings ({changed}): moved to {set_aside(path)}"
                )
                saved = {}
            result = saved if saved and "failed" not in saved else {"settings": settings}
            model = variant.model(preset, segment, out / "models" / name)

            def save(result=result, path=path):
                result["date"] = time.strftime("%Y-%m-%d")
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(result, indent=2) + "\n")
                tmp.replace(path)

            try:
                run_variant(variant, model, work, out, progress, result, save, baseline)
            except _NotStarted:
                if not variant.model.dense:
                    raise
                progress.write(f"{name} did not start: recorded with vLLM's reason")
            save()
            progress.update(start + work.steps() - progress.n)
    return report(out)


def note_shared_host(result: dict, measured: list[dict], before: Mapping[str, float] | None = None) -> None:
    """Marks the points just `measured` (offline rows, a served level) with the other GPUs of the machine that held
    memory (another job's) while they ran, and adds them to result["other_gpus_in_use"] (index: the most GiB seen),
    so the report can say that the measured engines may have shared the host's CPUs. An offline row carries what
    the engine's process saw just before and after its timed runs (bench/offline.py), which it keeps (an empty
    look is dropped): a neighbour that came or went mid-mix marks only the rows it ran beside. A point without its
    own look (a served level) gets what was seen `before` it and now; when nothing was measured (an engine that
    failed), the look now still counts for the variant."""
    now = other_gpus_in_use()
    for point in measured:
        busy = point.pop("other_gpus_in_use") if "other_gpus_in_use" in point else busiest(before or {}, now)
        if busy:
            point["other_gpus_in_use"] = busy
    looks = [p.get("other_gpus_in_use", {}) for p in measured] if measured else [now]
    if seen := busiest(result.get("other_gpus_in_use", {}), *looks):
        result["other_gpus_in_use"] = seen


def _gpus_text(gpus: Mapping[str, float]) -> str:
    return ", ".join(f"GPU {gpu}: {gib} GiB" for gpu, gib in gpus.items())


def settings_changed(old: dict, new: dict) -> str:
    """The settings that differ between two runs of a variant, as `key: old -> new`."""
    keys = [k for k in {**old, **new} if old.get(k) != new.get(k)]
    return ", ".join(f"{k}: {old.get(k)!r} -> {new.get(k)!r}" for k in keys)


def set_aside(path: Path) -> Path:
    """Moves a variant's results measured with other settings to OUT/replaced/ (the report reads only OUT's own
    variant files), named by when they were last written, so a run with new settings loses nothing."""
    stamp = time.strftime("%Y%m%d-%H%M%S", time.localtime(path.stat().st_mtime))
    folder = path.parent / "replaced"
    folder.mkdir(exist_ok=True)
    target, n = folder / f"{path.stem}-{stamp}.json", 1
    while target.exists():
        target, n = folder / f"{path.stem}-{stamp}-{n}.json", n + 1
    path.replace(target)
    return target


def report(out: Path) -> dict | None:
    """results.json, results.md and plots from every variant file in OUT; None where OUT holds none."""
    out = Path(out)
    paths = {name: out / f"variant-{name}.json" for name in VARIANTS}
    variants = {name: _read_variant(p) for name, p in paths.items() if p.exists()}
    if not variants:
        return None
    on_cpu = all(str(v["settings"].get("device")).startswith("CPU") for v in variants.values())
    runnable = [name for name in DEFAULT_VARIANTS if not (on_cpu and VARIANTS[name].model.needs_cuda)]
    if missing := [name for name in runnable if name not in variants]:
        print(f"{', '.join(missing)} not measured in {out}: `bench e2e --variants {','.join(missing)}` adds them")
    common = {name: {k: v["settings"].get(k) for k in COMMON_SETTINGS} for name, v in variants.items()}
    if len({json.dumps(c, sort_keys=True) for c in common.values()}) > 1:
        raise SamoyedsError(f"the variants in {out} were measured with different settings or devices: {common}")
    results = {
        **next(iter(common.values())),
        "date": max(v.get("date", "") for v in variants.values()),
        "variants": variants,
    }
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    text = markdown(results)
    (out / "results.md").write_text(text)
    plot(results, out)
    print(text)
    return results


def _read_variant(path: Path) -> dict:
    """A variant's results as bench e2e wrote them, or an error naming the file (a copy cut short, another tool's)."""
    try:
        variant = json.loads(path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise SamoyedsError(
            f"{path}: not readable as bench e2e's results ({e}); remove it or run the variant again"
        ) from None
    if not isinstance(variant, dict) or not isinstance(variant.get("settings"), dict):
        raise SamoyedsError(f"{path}: not bench e2e's results (no settings); remove it or run the variant again")
    return variant


def _kept_failure(text: str, chars: int = 2000) -> str:
    """What a variant's file keeps of why its engine did not start: the first line (the cause, failure_text) and
    the log's end."""
    if len(text) <= chars:
        return text
    first = text.split("\n", 1)[0][:500]
    return f"{first}\n...\n{text[-(chars - len(first)) :]}"


def _failure_reason(text: str) -> str:
    """The line of a failed start that says why (an out-of-memory error, typically; or that it timed out)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    if lines and "timed out after" in lines[0]:
        return lines[0][:300]
    if cause := engine_failure_cause(text):
        return cause[:300]
    for line in reversed(lines):
        if "memory" in line.lower() or "Error" in line:
            return line[-300:]
    return lines[-1][-300:] if lines else "unknown"


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def _is_dense(name: str) -> bool:
    return VARIANTS[name].model.dense


def _memory(result: dict) -> dict:
    """The served engine's memory, or the first offline engine's when the variant was not served."""
    engines = list(result.get("offline_engines", {}).values())
    return {**(engines[0] if engines else {}), **result.get("memory", {})}


def _cells(values: Mapping[str, float | None], names: list[str], spec: str, higher: bool) -> tuple[list[str], str]:
    """One cell per variant; each sparse one with its ratio against the best dense variant (`higher`: larger
    values are better; otherwise the ratio is dense / ours, so above 1 is better either way), and that variant."""
    dense = {n: x for n, x in values.items() if _is_dense(n) and x is not None}
    best = (max if higher else min)(dense, key=dense.get) if dense else None
    cells = []
    for n in names:
        x = values.get(n)
        cell = _fmt(x, spec)
        if x is not None and best is not None and not _is_dense(n) and x > 0 and dense[best] > 0:
            cell += f" ({(x / dense[best] if higher else dense[best] / x):.2f}×)"
        cells.append(cell)
    return cells, best or "-"


def _table(
    title: str, key_names: list[str], rows: Mapping[tuple, Mapping[str, float | None]], names, spec, higher: bool
) -> list[str]:
    """A markdown table: one row per key (a tuple, whose tuple parts print as a/b), one column per variant, and
    which dense variant was the best."""
    lines = [f"**{title}**", "", "| " + " | ".join([*key_names, *names, "best dense"]) + " |"]
    lines.append("|" + "---|" * (len(key_names) + len(names) + 1))
    for key in sorted(rows):
        cells, best = _cells(rows[key], names, spec, higher)
        labels = ["/".join(map(str, k)) if isinstance(k, tuple) else str(k) for k in key]
        lines.append("| " + " | ".join([*labels, *cells, best]) + " |")
    return [*lines, ""]


def _compiled_in_timed_runs(v: dict, names: list[str]) -> str:
    """The points whose last timed run still compiled a kernel (tools.vllm_server.without_jit), as text."""
    points = [
        f"{n} {r['input_len']}/{r['output_len']} batch {r['batch_size']}"
        for n in names
        for r in v[n].get("throughput", [])
        if r.get("jit_free") is False
    ]
    points += [
        f"{n} serving {lv['concurrency']} clients"
        for n in names
        for lv in v[n].get("serving", {}).get("levels", [])
        if lv.get("jit_free") is False
    ]
    return ", ".join(points)


def _unsteady_levels(v: dict, names: list[str]) -> str:
    """The served levels whose timed rounds differed by more than STEADY_TOLERANCE (timed_rounds; harness 4: whose
    last two rounds did)."""
    return ", ".join(
        f"{n} {lv['concurrency']} clients ({' / '.join(f'{x:,.0f}' for x in lv['rounds_output_tokens_per_s'])})"
        for n in names
        for lv in v[n].get("serving", {}).get("levels", [])
        if lv.get("steady") is False
    )


def _ttft_split(mix: dict, levels: dict[str, dict[int, dict]], names: list[str], concurrencies: list[int]) -> list[str]:
    """Where the served TTFT went (the levels' `server_mean_ms`, server_split), as a table; none without it."""

    def cell(level: dict) -> str:
        t = level.get("server_mean_ms", {})
        if not all(k in t for k in ("ttft", "queue", "prefill")):
            return "-"
        return f"{t['ttft']:.1f} = {t['queue']:.1f} + {t['prefill']:.1f} + {t['ttft'] - t['queue'] - t['prefill']:.1f}"

    rows = [[cell(levels[n].get(c, {})) for n in names] for c in concurrencies]
    if all(x == "-" for row in rows for x in row):
        return []
    return [
        f"**serving {mix['input_len']}/{mix['output_len']}, mean TTFT by the server, ms = waiting in the engine's "
        "queue + its first scheduling to the first token + outside the engine's steps (API servers, hand-over)**",
        "",
        "| clients | " + " | ".join(names) + " |",
        "|---|" + "---|" * len(names),
        *(f"| {c} | " + " | ".join(row) + " |" for c, row in zip(concurrencies, rows, strict=True)),
        "",
    ]


def markdown(results: dict) -> str:
    v = results["variants"]
    names = [n for n in VARIANTS if n in v]
    lines = [
        f"# {results['preset']} end to end: {', '.join(names)} ({results['date']})",
        "",
        f"{results['device']}, vLLM {results['vllm']}, torch {results['torch']}, dummy weights, engine flags "
        f"`{' '.join(['--load-format dummy', *results['engine_args']])}`. Every timed batch ran after an untimed "
        "one of the same shape in the same engine, and again if it compiled a kernel. Ratios: against the best "
        "dense variant at that point (for TTFT and TPOT dense / ours: above 1 is faster).",
        "",
    ]
    if (servers := results.get("api_servers")) and any("serving" in v[n] for n in names):  # none before harness 3
        per_client = results.get("prompts_per_client") or Workload.prompts_per_client
        lines[-1:-1] = [
            "",
            f"Served through {servers} API server processes (`--api-server-count {servers}`), prefix caching off "
            f"(`{' '.join(_SERVER_FLAGS)}`); each client level's timed requests ({per_client} per client) after an "
            "untimed round of as many"
            + (
                "; each level the median of three timed rounds (harness 5)."
                if results.get("harness", HARNESS) >= 5
                else "."
            ),
        ]
    spread = {n: _gpus(v[n]) for n in names if _gpus(v[n]) > 1}
    if spread and len(spread) < len(names):  # dense over several GPUs (--dense-tp), sparse on one
        lines += [
            f"**Not one GPU each**: {', '.join(f'{n} ran on {g} GPUs (tensor parallel)' for n, g in spread.items())}, "
            "the others on one; the ratios compare them as they ran.",
            "",
        ]
    for name in names:
        if "failed" in v[name]:
            lines += [f"**{name} did not run**: {_failure_reason(v[name]['failed'])}", ""]
    if shared := {n: v[n]["other_gpus_in_use"] for n in names if v[n].get("other_gpus_in_use")}:
        busy = "; ".join(f"{n}: {_gpus_text(gpus)}" for n, gpus in shared.items())
        lines += [
            f"**Other GPUs of the host were in use** while these ran ({busy}): another job may have shared the "
            "CPUs with the measured engines and slowed them (the points it touched carry `other_gpus_in_use`).",
            "",
        ]
    offline: dict[tuple, dict] = {}
    for name in names:
        for r in v[name].get("throughput", []):
            point = ((r["input_len"], r["output_len"]), r["batch_size"])  # sorts 128/128 before 1024/256
            offline.setdefault(point, {})[name] = r["output_tokens_per_s"]
    if offline:
        lines += _table("offline, output tokens/s", ["in/out", "batch"], offline, names, ",.0f", higher=True)
    levels = {n: {lv["concurrency"]: lv for lv in v[n].get("serving", {}).get("levels", [])} for n in names}
    if concurrencies := sorted({c for n in names for c in levels[n]}):
        mix = next(v[n]["serving"] for n in names if levels[n])
        for metric, label, spec, higher in (
            ("output_tokens_per_s", "output tokens/s", ",.0f", True),
            ("median_ttft_ms", "TTFT p50 ms", ".1f", False),
            ("p99_ttft_ms", "TTFT p99 ms", ".1f", False),
            ("median_tpot_ms", "TPOT p50 ms", ".2f", False),
            ("p99_tpot_ms", "TPOT p99 ms", ".2f", False),
        ):
            rows = {(c,): {n: levels[n].get(c, {}).get(metric) for n in names} for c in concurrencies}
            if any(x is not None for row in rows.values() for x in row.values()):
                title = f"serving {mix['input_len']}/{mix['output_len']}, {label}"
                lines += _table(title, ["clients"], rows, names, spec, higher)
        lines += _ttft_split(mix, levels, names, concurrencies)
    if jit := _compiled_in_timed_runs(v, names):
        lines += [f"**A kernel was still compiled in every timed run** (so these include it): {jit}", ""]
    if unsteady := _unsteady_levels(v, names):
        lines += [
            f"**Served levels whose timed rounds disagreed by more than {STEADY_TOLERANCE:.0%}** (output tok/s, "
            f"untimed round first): {unsteady}",
            "",
        ]
    memory = {n: _memory(v[n]) for n in names}
    measured = {n: memory[n].get("measured", {}) for n in names}
    estimated = {n: memory[n].get("estimated_max_seqs") for n in names}
    rows = [
        ("model weights GiB per GPU", {n: memory[n].get("weights_gib") for n in names}, "", None),
        ("KV cache GiB per GPU", {n: memory[n].get("kv_cache_gib") for n in names}, "", None),
        ("KV-cache tokens", {n: memory[n].get("kv_cache_tokens") for n in names}, ",", True),
        (
            f"concurrent {next((e['tokens'] for e in estimated.values() if e), '-')}-token sequences (vLLM's estimate)",
            {n: (estimated[n] or {}).get("sequences") for n in names},
            ",.1f",
            True,
        ),
        (
            f"concurrent {next((m['seq_len'] for m in measured.values() if 'seq_len' in m), '-')}-token sequences "
            "without preemption (measured)",
            {n: measured[n].get("max_seqs_without_preemption") for n in names},
            ",",
            True,
        ),
    ]
    lines += ["**memory**", "", "| | " + " | ".join([*names, "best dense"]) + " |", "|---|" + "---|" * (len(names) + 1)]
    for label, values, spec, higher in rows:
        if all(x is None for x in values.values()):
            continue
        cells, best = _cells(values, names, spec, higher) if higher else ([_fmt(values[n], spec) for n in names], "")
        lines.append(f"| {label} | " + " | ".join([*cells, best]) + " |")
    kernels = [memory[n].get("moe_backend", "-" if _is_dense(n) or "failed" in v[n] else "samoyeds") for n in names]
    lines += [f"| MoE kernels | {' | '.join(kernels)} | |", ""]
    lines += [
        "**how each variant ran**",
        "",
        "| variant | GPUs | model | environment | offline engine |",
        "|---|---|---|---|---|",
    ]
    for name in names:
        engine = next(iter(v[name].get("offline_engines", {}).values()), {})
        shown = ("max_num_seqs", "max_num_batched_tokens", "max_model_len", "gpu_memory_utilization", "cudagraph_mode")
        engine_text = ", ".join(f"{k} {engine[k]}" for k in shown if k in engine) or "-"
        env = " ".join(f"{k}={x}" for k, x in v[name].get("env", {}).items()) or "-"
        model = v[name]["settings"].get("model", "-")
        lines.append(f"| {name} | {_gpus(v[name])} | {model} | {env} | {engine_text} |")
    return "\n".join(lines) + "\n"


def _color(variant: str) -> str:
    """One colour per variant in every plot, whichever variants a run holds."""
    return f"C{list(VARIANTS).index(variant) % 10}"


def _gpus(result: dict) -> int:
    """How many GPUs a variant's result ran on (recorded only where several)."""
    return result.get("settings", {}).get("gpus", 1)


def _label(variants: dict, name: str) -> str:
    """A variant's name in a plot, with its GPUs where it ran on several."""
    gpus = _gpus(variants[name])
    return f"{name} ({gpus} GPUs)" if gpus > 1 else name


def plot(results: dict, out: Path) -> None:
    """offline-throughput.png, throughput-vs-concurrency.png and latency-vs-load.png where there is something to
    draw (a plot of an earlier run without it is removed), memory.png (nothing without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots")
        return
    v = results["variants"]
    names = [n for n in VARIANTS if n in v]
    gpu = results["device"].split(",")[0]  # the name; memory and driver would not fit a plot's width
    title = f"{results['preset']}, {gpu} ({results['date']})"
    mixes = sorted({(r["input_len"], r["output_len"]) for n in names for r in v[n].get("throughput", [])})
    if not mixes:
        (out / "offline-throughput.png").unlink(missing_ok=True)
    else:
        fig, axes = plt.subplots(1, len(mixes), figsize=(5 * len(mixes), 4), squeeze=False)
        for ax, mix in zip(axes[0], mixes, strict=True):
            for name in names:
                rows = [r for r in v[name].get("throughput", []) if (r["input_len"], r["output_len"]) == mix]
                if rows:
                    ax.plot(
                        [r["batch_size"] for r in rows],
                        [r["output_tokens_per_s"] for r in rows],
                        marker="o",
                        label=_label(v, name),
                        color=_color(name),
                    )
            ax.set_xscale("log", base=2)
            ax.set_xlabel("sequences per batch")
            ax.set_ylabel("output tokens/s")
            ax.set_title(f"offline {mix[0]}/{mix[1]}")
            ax.legend()
        fig.suptitle(title, fontsize=10)
        fig.tight_layout()
        fig.savefig(out / "offline-throughput.png", dpi=120)
        plt.close(fig)
    for name, key, ylabel in (
        ("throughput-vs-concurrency", "output_tokens_per_s", "output tokens/s"),
        ("latency-vs-load", "median_tpot_ms", "median TPOT (ms)"),
    ):
        if not any(v[n].get("serving", {}).get("levels") for n in names):
            (out / f"{name}.png").unlink(missing_ok=True)
            continue
        fig, ax = plt.subplots(figsize=(6, 4))
        for variant in names:
            levels = v[variant].get("serving", {}).get("levels", [])
            if levels:
                x, y = [lv["concurrency"] for lv in levels], [lv[key] for lv in levels]
                ax.plot(x, y, marker="o", label=_label(v, variant), color=_color(variant))
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(ylabel)
        ax.set_title(title, fontsize=9)
        if ax.get_legend_handles_labels()[0]:
            ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=120)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(1.5 * len(names) + 3, 4))
    memory = [_memory(v[n]) for n in names]
    weights = [m.get("weights_gib", 0) for m in memory]
    labels = [_label(v, n) for n in names]
    ax.bar(labels, weights, label="weights")
    ax.bar(labels, [m.get("kv_cache_gib", 0) for m in memory], bottom=weights, label="KV cache")
    ax.set_ylabel("GiB")
    ax.set_title("memory per GPU" + "".join(f" ({n} did not fit)" for n in names if "failed" in v[n]), fontsize=9)
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=120)
    plt.close(fig)
