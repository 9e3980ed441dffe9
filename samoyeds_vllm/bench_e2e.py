"""`samoyeds-vllm bench e2e`: dense vLLM against the samoyeds method, same GPU, same engine settings.

Both variants are config-only models of a real shape with dummy weights (no download): the dense one as vLLM
serves it, the sparse one marked as a packed samoyeds checkpoint so vLLM allocates only packed expert weights.
Each variant runs in its own processes (`vllm bench throughput`, and `vllm serve` under `vllm bench serve`):
- throughput: offline generation of random-token workloads (input/output length mixes);
- serving: TTFT, TPOT and output tokens/s at increasing client concurrency;
- memory: model weight memory and KV-cache capacity from the engine log, and the largest number of concurrent
  sequences of a given length served without preemption, measured by probing concurrencies around vLLM's own
  estimate while polling the server's /metrics.
Results go to OUT as JSON, a markdown table and PNG plots.
"""

from __future__ import annotations

import json
import re
import subprocess
import threading
import time
import urllib.request
from pathlib import Path

from tqdm import tqdm

from .errors import SamoyedsError
from .formats import Pattern
from .model_maker import make_model, preset_family
from .server import VllmServer, vllm_command

VARIANTS = ("dense", "samoyeds")
PROBE_FACTORS = (0.5, 0.75, 0.9, 1.0, 1.1, 1.25)


def parse_engine_log(text: str) -> dict:
    """What vLLM logs about memory: weight memory, KV-cache tokens, its own concurrency estimate."""
    info: dict = {}
    if m := re.search(r"Model loading took ([\d.]+) GiB", text):
        info["weights_gib"] = float(m[1])
    if m := re.search(r"Available KV cache memory: ([\d.]+) GiB", text):
        info["kv_cache_gib"] = float(m[1])
    if m := re.search(r"KV cache size: ([\d,]+) tokens", text):
        info["kv_cache_tokens"] = int(m[1].replace(",", ""))
    if m := re.search(r"Maximum concurrency for ([\d,]+) tokens per request: ([\d.]+)x", text):
        info["estimated_max_seqs"] = {"tokens": int(m[1].replace(",", "")), "sequences": float(m[2])}
    return info


def _run(cmd: list[str], log: Path, timeout: float) -> str:
    with open(log, "w") as f:
        result = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    text = log.read_text(errors="replace")
    if result.returncode != 0:
        raise SamoyedsError(f"{' '.join(cmd[:3])} failed (exit {result.returncode}); log {log}:\n{text[-3000:]}")
    return text


def run_throughput(model: Path, mix: tuple[int, int], num_prompts: int, engine_args: list[str], out: Path) -> dict:
    """`vllm bench throughput` on `num_prompts` random requests of mix = (input, output) tokens."""
    tag = f"{model.name}-{mix[0]}x{mix[1]}"
    result_json = out / f"throughput-{tag}.json"
    text = _run([*vllm_command(), "bench", "throughput", "--model", str(model), "--load-format", "dummy",
                 "--dataset-name", "random", "--random-input-len", str(mix[0]), "--random-output-len", str(mix[1]),
                 "--num-prompts", str(num_prompts), "--output-json", str(result_json), *engine_args],
                out / f"throughput-{tag}.log", timeout=3600)
    result = json.loads(result_json.read_text())
    output_tps = re.search(r"Throughput: .*?([\d.]+) output tokens/s", text)
    return {"input_len": mix[0], "output_len": mix[1], "num_prompts": num_prompts,
            "requests_per_s": result["requests_per_second"], "total_tokens_per_s": result["tokens_per_second"],
            "output_tokens_per_s": float(output_tps[1]) if output_tps else None, **parse_engine_log(text)}


def _bench_serve(server: VllmServer, model: Path, mix: tuple[int, int], concurrency: int, num_prompts: int,
                 out: Path, tag: str) -> dict:
    name = f"serve-{tag}.json"
    _run([*vllm_command(), "bench", "serve", "--backend", "vllm", "--base-url", server.url, "--model", str(model),
          "--dataset-name", "random", "--random-input-len", str(mix[0]), "--random-output-len", str(mix[1]),
          "--num-prompts", str(num_prompts), "--max-concurrency", str(concurrency), "--ignore-eos",
          "--save-result", "--result-dir", str(out), "--result-filename", name, "--disable-tqdm"],
         out / f"serve-{tag}.log", timeout=3600)
    r = json.loads((out / name).read_text())
    return {"concurrency": concurrency, "output_tokens_per_s": r.get("output_throughput"),
            "mean_ttft_ms": r.get("mean_ttft_ms"), "p99_ttft_ms": r.get("p99_ttft_ms"),
            "mean_tpot_ms": r.get("mean_tpot_ms"), "p99_tpot_ms": r.get("p99_tpot_ms"),
            "completed": r.get("completed")}


class _MetricsPoller:
    """Polls /metrics while a load runs: peak running requests and the preemption counter."""

    def __init__(self, url: str):
        self.url, self.peak_running, self._stop = f"{url}/metrics", 0.0, threading.Event()

    def read(self) -> tuple[float, float]:
        text = urllib.request.urlopen(self.url, timeout=10).read().decode()
        def total(metric):
            return sum(float(m[1]) for m in re.finditer(rf"^{metric}(?:{{[^}}]*}})? ([\d.e+-]+)$", text, re.M))
        return total("vllm:num_requests_running"), total("vllm:num_preemptions_total")

    def __enter__(self):
        self.start_preemptions = self.read()[1]
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()
        return self

    def _poll(self):
        while not self._stop.is_set():
            self.peak_running = max(self.peak_running, self.read()[0])
            time.sleep(0.01)

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()
        self.preemptions = self.read()[1] - self.start_preemptions


def measure_max_seqs(server: VllmServer, model: Path, seq_len: int, estimate: float, out: Path, tag: str) -> dict:
    """The most `seq_len`-token sequences (a quarter of each generated, so they stay resident long enough to be
    seen) running at once without preemption. Offered more than fit, vLLM queues the rest, so the peak of
    `num_requests_running` at a load above capacity is the capacity; probes go from half to 1.25x the engine's
    estimate (which ignores block granularity and scheduler limits). `saturated` says a probe hit the limit."""
    output_len = max(16, seq_len // 4)
    probes = sorted({max(1, int(estimate * f)) for f in PROBE_FACTORS})
    results = []
    for c in probes:
        with _MetricsPoller(server.url) as poll:
            _bench_serve(server, model, (seq_len - output_len, output_len), c, c, out, f"{tag}-maxseqs-{c}")
        results.append({"concurrency": c, "peak_running": poll.peak_running, "preemptions": poll.preemptions})
    clean = [r for r in results if r["preemptions"] == 0]
    held = max((int(r["peak_running"]) for r in clean), default=0)
    return {"seq_len": seq_len, "max_seqs_without_preemption": held,
            "saturated": any(r["peak_running"] < r["concurrency"] for r in clean), "probes": results}


def run_variant(model: Path, mixes, num_prompts, concurrencies, seq_len, engine_args, out: Path, progress) -> dict:
    result = {"throughput": []}
    for mix in mixes:
        result["throughput"].append(run_throughput(model, mix, num_prompts, engine_args, out))
        progress.update()
    log = out / f"server-{model.name}.log"
    with VllmServer(model, ["--load-format", "dummy", *engine_args], log_path=log) as server:
        result["memory"] = parse_engine_log(log.read_text(errors="replace"))
        serve_mix = mixes[0]
        result["serving"] = {"input_len": serve_mix[0], "output_len": serve_mix[1], "levels": []}
        for c in concurrencies:
            result["serving"]["levels"].append(
                _bench_serve(server, model, serve_mix, c, max(num_prompts, 2 * c), out, f"{model.name}-c{c}"))
            progress.update()
        estimate = result["memory"].get("kv_cache_tokens", 0) / seq_len
        result["memory"]["measured"] = measure_max_seqs(server, model, seq_len, estimate, out, model.name)
        progress.update()
    return result


def bench_e2e(preset: str, pattern: Pattern, out: Path, mixes=((128, 128), (1024, 256), (4096, 64)),
              num_prompts: int = 200, concurrencies=(1, 4, 16, 64, 256), seq_len: int = 4096,
              engine_args: list[str] = ()) -> dict:
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    family = preset_family(preset)
    models = {"dense": make_model(family, preset, out / "models" / "dense", config_only=True, force=True),
              "samoyeds": make_model(family, preset, out / "models" / "samoyeds", config_only=True, force=True,
                                     sparse=pattern)}
    steps = len(VARIANTS) * (len(mixes) + len(concurrencies) + 1)
    results = {"preset": preset, "pattern": str(pattern), "date": time.strftime("%Y-%m-%d"),
               "engine_args": list(engine_args), "variants": {}}
    with tqdm(total=steps, desc="bench e2e") as progress:
        for variant in VARIANTS:
            progress.set_postfix_str(variant)
            results["variants"][variant] = run_variant(models[variant], list(mixes), num_prompts, concurrencies,
                                                       seq_len, list(engine_args), out, progress)
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    plot(results, out)
    print(markdown(results))
    return results


def markdown(results: dict) -> str:
    v = results["variants"]
    lines = [f"# {results['preset']}: dense vLLM vs samoyeds {results['pattern']} ({results['date']})", "",
             "| throughput (in/out) | dense req/s | samoyeds req/s | dense out tok/s | samoyeds out tok/s | speedup |",
             "|---|---|---|---|---|---|"]
    for d, s in zip(v["dense"]["throughput"], v["samoyeds"]["throughput"]):
        speedup = s["output_tokens_per_s"] / d["output_tokens_per_s"] if d["output_tokens_per_s"] else float("nan")
        lines.append(f"| {d['input_len']}/{d['output_len']} | {d['requests_per_s']:.2f} | {s['requests_per_s']:.2f} "
                     f"| {d['output_tokens_per_s']:.1f} | {s['output_tokens_per_s']:.1f} | {speedup:.2f}x |")
    lines += ["", "| concurrency | dense out tok/s | samoyeds out tok/s | dense TTFT ms | samoyeds TTFT ms "
              "| dense TPOT ms | samoyeds TPOT ms |", "|---|---|---|---|---|---|---|"]
    for d, s in zip(v["dense"]["serving"]["levels"], v["samoyeds"]["serving"]["levels"]):
        lines.append(f"| {d['concurrency']} | {d['output_tokens_per_s']:.1f} | {s['output_tokens_per_s']:.1f} | "
                     f"{d['mean_ttft_ms']:.1f} | {s['mean_ttft_ms']:.1f} | {d['mean_tpot_ms']:.2f} | "
                     f"{s['mean_tpot_ms']:.2f} |")
    lines += ["", "| memory | dense | samoyeds |", "|---|---|---|"]
    for key in ("weights_gib", "kv_cache_gib", "kv_cache_tokens"):
        lines.append(f"| {key} | {v['dense']['memory'].get(key, '-')} | {v['samoyeds']['memory'].get(key, '-')} |")
    seq_len = v["dense"]["memory"]["measured"]["seq_len"]
    lines.append(f"| concurrent {seq_len}-token sequences without preemption (measured) | "
                 f"{v['dense']['memory']['measured']['max_seqs_without_preemption']} | "
                 f"{v['samoyeds']['memory']['measured']['max_seqs_without_preemption']} |")
    return "\n".join(lines) + "\n"


def plot(results: dict, out: Path) -> None:
    """throughput-vs-concurrency.png, latency-vs-load.png, memory.png (skipped without matplotlib)."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: no plots")
        return
    v = results["variants"]
    for name, key, ylabel in (("throughput-vs-concurrency", "output_tokens_per_s", "output tokens/s"),
                              ("latency-vs-load", "mean_tpot_ms", "mean TPOT (ms)")):
        fig, ax = plt.subplots(figsize=(6, 4))
        for variant in VARIANTS:
            levels = v[variant]["serving"]["levels"]
            ax.plot([lv["concurrency"] for lv in levels], [lv[key] for lv in levels], marker="o", label=variant)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel(ylabel)
        ax.set_title(f"{results['preset']} ({results['pattern']})")
        ax.legend()
        fig.tight_layout()
        fig.savefig(out / f"{name}.png", dpi=120)
        plt.close(fig)
    fig, ax = plt.subplots(figsize=(6, 4))
    weights = [v[x]["memory"].get("weights_gib", 0) for x in VARIANTS]
    kv = [v[x]["memory"].get("kv_cache_gib", 0) for x in VARIANTS]
    ax.bar(VARIANTS, weights, label="weights")
    ax.bar(VARIANTS, kv, bottom=weights, label="KV cache")
    ax.set_ylabel("GiB")
    ax.set_title("memory per GPU")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=120)
    plt.close(fig)
