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
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from ..errors import SamoyedsError
from ..format import Pattern
from ..tools.model_maker import preset_model
from ..tools.vllm_server import VllmServer, parse_engine_log, vllm_command

VARIANTS = ("dense", "samoyeds")
PROBE_FACTORS = (0.5, 0.75, 0.9, 1.0, 1.1, 1.25)


def _run(cmd: list[str], log: Path, timeout: float) -> str:
    with open(log, "w") as f:
        result = subprocess.run(cmd, stdout=f, stderr=subprocess.STDOUT, timeout=timeout)
    text = log.read_text(errors="replace")
    if result.returncode != 0:
        raise SamoyedsError(f"{' '.join(cmd[:3])} failed (exit {result.returncode}); log {log}:\n{text[-3000:]}")
    return text


def _random_requests(mix: tuple[int, int], num_prompts: int) -> list[str]:
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
    ]


def run_throughput(model: Path, mix: tuple[int, int], num_prompts: int, engine_args: list[str], out: Path) -> dict:
    """`vllm bench throughput` on `num_prompts` random requests of mix = (input, output) tokens."""
    tag = f"{model.name}-{mix[0]}x{mix[1]}"
    result_json = out / f"throughput-{tag}.json"
    text = _run(
        [
            *vllm_command(),
            "bench",
            "throughput",
            "--model",
            str(model),
            "--load-format",
            "dummy",
            *_random_requests(mix, num_prompts),
            "--output-json",
            str(result_json),
            *engine_args,
        ],
        out / f"throughput-{tag}.log",
        timeout=3600,
    )
    result = json.loads(result_json.read_text())
    output_tps = re.search(r"Throughput: .*?([\d.]+) output tokens/s", text)
    return {
        "input_len": mix[0],
        "output_len": mix[1],
        "num_prompts": num_prompts,
        "requests_per_s": result["requests_per_second"],
        "total_tokens_per_s": result["tokens_per_second"],
        "output_tokens_per_s": float(output_tps[1]) if output_tps else None,
        **parse_engine_log(text),
    }


def _bench_serve(
    server: VllmServer, model: Path, mix: tuple[int, int], concurrency: int, num_prompts: int, out: Path, tag: str
) -> dict:
    name = f"serve-{tag}.json"
    _run(
        [
            *vllm_command(),
            "bench",
            "serve",
            "--backend",
            "vllm",
            "--base-url",
            server.url,
            "--model",
            str(model),
            *_random_requests(mix, num_prompts),
            "--max-concurrency",
            str(concurrency),
            "--ignore-eos",
            "--save-result",
            "--result-dir",
            str(out),
            "--result-filename",
            name,
            "--disable-tqdm",
        ],
        out / f"serve-{tag}.log",
        timeout=3600,
    )
    r = json.loads((out / name).read_text())
    return {
        "concurrency": concurrency,
        "output_tokens_per_s": r.get("output_throughput"),
        "mean_ttft_ms": r.get("mean_ttft_ms"),
        "p99_ttft_ms": r.get("p99_ttft_ms"),
        "mean_tpot_ms": r.get("mean_tpot_ms"),
        "p99_tpot_ms": r.get("p99_tpot_ms"),
        "completed": r.get("completed"),
    }


class _MetricsPoller:
    """Polls /metrics while a load runs: peak running requests and the preemption counter."""

    def __init__(self, url: str):
        self.url, self.peak_running, self._stop = f"{url}/metrics", 0.0, threading.Event()

    def read(self, timeout: float = 120) -> tuple[float, float]:
        text = urllib.request.urlopen(self.url, timeout=timeout).read().decode()

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
    server: VllmServer, model: Path, seq_len: int, estimate: float, out: Path, tag: str, factors, measured: dict, save
) -> None:
    """The most `seq_len`-token sequences (an eighth of each generated, so they stay resident long enough to be
    seen) running at once without preemption, into `measured`. Offered more than fit, vLLM queues the rest, so
    the peak of `num_requests_running` at a load above capacity is the capacity; probes go from half to 1.25x
    the engine's estimate (which ignores block granularity and scheduler limits). Each probe is saved as it
    finishes (a run cut short resumes). `saturated` says a probe hit the limit."""
    output_len = max(16, seq_len // 8)
    measured["seq_len"] = seq_len
    probes = measured.setdefault("probes", [])
    for c in sorted({max(1, int(estimate * f)) for f in factors}):
        if any(p["concurrency"] == c for p in probes):
            continue
        with _MetricsPoller(server.url) as poll:
            _bench_serve(server, model, (seq_len - output_len, output_len), c, c, out, f"{tag}-maxseqs-{c}")
        probes.append({"concurrency": c, "peak_running": poll.peak_running, "preemptions": poll.preemptions})
        save()
    clean = [p for p in probes if p["preemptions"] == 0]
    measured["max_seqs_without_preemption"] = max((int(p["peak_running"]) for p in clean), default=0)
    measured["saturated"] = any(p["peak_running"] < p["concurrency"] for p in clean)
    save()


@dataclass(frozen=True)
class Workload:
    """What each variant runs: offline mixes of (input, output) tokens, serving concurrencies (with
    `prompts_per_client` requests per client, on the first mix), the sequence length of the concurrency probe
    (probes at `probe_factors` times vLLM's estimate) and extra engine flags for both variants."""

    mixes: tuple[tuple[int, int], ...] = ((128, 128), (1024, 256), (4096, 64))
    num_prompts: int = 200
    concurrencies: tuple[int, ...] = (1, 4, 16, 64, 256)
    prompts_per_client: int = 4
    seq_len: int = 4096
    probe_factors: tuple[float, ...] = PROBE_FACTORS
    engine_args: tuple[str, ...] = ()


def run_variant(model: Path, work: Workload, out: Path, progress, result: dict, save) -> None:
    """Measures one variant into `result`, skipping what it already holds (a run cut short resumes) and calling
    `save` after each step."""
    mixes, engine_args = [tuple(m) for m in work.mixes], list(work.engine_args)
    throughput = result.setdefault("throughput", [])
    for mix in mixes:
        if not any((r["input_len"], r["output_len"]) == mix for r in throughput):
            throughput.append(run_throughput(model, mix, work.num_prompts, engine_args, out))
            save()
        progress.update()
    serving = result.setdefault("serving", {"input_len": mixes[0][0], "output_len": mixes[0][1], "levels": []})
    memory = result.setdefault("memory", {})
    measured = memory.setdefault("measured", {})
    todo = [c for c in work.concurrencies if c not in {lv["concurrency"] for lv in serving["levels"]}]
    if not todo and "max_seqs_without_preemption" in measured:
        progress.update(len(work.concurrencies) + 1)
        return
    log = out / f"server-{model.name}.log"
    with VllmServer(model, ["--load-format", "dummy", *engine_args], log_path=log) as server:
        memory.update(parse_engine_log(log.read_text(errors="replace")))
        progress.update(len(work.concurrencies) - len(todo))
        for c in todo:
            serving["levels"].append(
                _bench_serve(
                    server,
                    model,
                    (serving["input_len"], serving["output_len"]),
                    c,
                    work.prompts_per_client * c,
                    out,
                    f"{model.name}-c{c}",
                )
            )
            serving["levels"].sort(key=lambda lv: lv["concurrency"])
            save()
            progress.update()
        if "max_seqs_without_preemption" not in measured:
            estimate = memory.get("kv_cache_tokens", 0) / work.seq_len
            measure_max_seqs(server, model, work.seq_len, estimate, out, model.name, work.probe_factors, measured, save)
        progress.update()


def variant_model(preset: str, pattern: Pattern, variant: str, out: Path) -> Path:
    """The model of `variant` under OUT/models (dummy weights): dense, or marked as a packed `pattern` checkpoint."""
    return preset_model(preset, out / "models" / variant, pattern if variant == "samoyeds" else None)


def bench_e2e(preset: str, pattern: Pattern, out: Path, work: Workload = Workload(), variants=VARIANTS) -> dict | None:
    """Runs `variants` (both by default) and, once OUT holds both, writes the comparison. Each variant's results
    go to OUT/variant-NAME.json after every step; a later call with the same settings and OUT resumes there
    (so one variant per call fits a time-limited machine). A variant that cannot start (a dense model too
    large for the GPU) is recorded as such, with the reason."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    settings = {"preset": preset, "pattern": str(pattern), "engine_args": list(work.engine_args)}
    steps = len(variants) * (len(work.mixes) + len(work.concurrencies) + 1)
    with tqdm(total=steps, desc="bench e2e") as progress:
        for variant in variants:
            progress.set_postfix_str(variant)
            path = out / f"variant-{variant}.json"
            saved = json.loads(path.read_text()) if path.exists() else {}
            result = saved if saved.get("settings") == settings and "failed" not in saved else {"settings": settings}
            model = variant_model(preset, pattern, variant, out)

            def save(result=result, path=path):
                result["date"] = time.strftime("%Y-%m-%d")
                tmp = path.with_suffix(".tmp")
                tmp.write_text(json.dumps(result, indent=2) + "\n")
                tmp.replace(path)

            try:
                run_variant(model, work, out, progress, result, save)
            except SamoyedsError as e:
                if result.get("throughput") or variant != "dense":
                    raise
                result["failed"] = str(e)[-2000:]  # the dense model did not start: record why
                save()
    return report(out)


def report(out: Path) -> dict | None:
    """results.json, results.md and plots from OUT's variant files, when both variants are there."""
    paths = {v: out / f"variant-{v}.json" for v in VARIANTS}
    missing = [v for v, p in paths.items() if not p.exists()]
    if missing:
        print(
            f"{', '.join(missing)} not measured yet in {out}: run `bench e2e --variants "
            f"{','.join(missing)}` with the same --out for the comparison"
        )
        return None
    variants = {v: json.loads(p.read_text()) for v, p in paths.items()}
    settings = [v["settings"] for v in variants.values()]
    if settings[0] != settings[1]:
        raise SamoyedsError(f"the variants in {out} were measured with different settings: {settings}")
    results = {**settings[0], "date": variants["samoyeds"]["date"], "variants": variants}
    (out / "results.json").write_text(json.dumps(results, indent=2) + "\n")
    (out / "results.md").write_text(markdown(results))
    plot(results, out)
    print(markdown(results))
    return results


def _failure_reason(text: str) -> str:
    """The line of a failed start that says why (an out-of-memory error, typically)."""
    lines = [ln.strip() for ln in text.splitlines() if ln.strip()]
    for line in reversed(lines):
        if "memory" in line.lower() or "Error" in line:
            return line[-300:]
    return lines[-1][-300:] if lines else "unknown"


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def markdown(results: dict) -> str:
    v = results["variants"]
    s_ok = "failed" not in v["samoyeds"]
    lines = [f"# {results['preset']}: dense vLLM vs samoyeds {results['pattern']} ({results['date']})", ""]
    for name in VARIANTS:
        if "failed" in v[name]:
            lines += [f"**{name} did not run**: {_failure_reason(v[name]['failed'])}", ""]
    dense_tp = {(r["input_len"], r["output_len"]): r for r in v["dense"].get("throughput", [])}
    lines += [
        "| throughput (in/out) | dense req/s | samoyeds req/s | dense out tok/s | samoyeds out tok/s | speedup |",
        "|---|---|---|---|---|---|",
    ]
    for s in v["samoyeds"].get("throughput", []) if s_ok else []:
        d = dense_tp.get((s["input_len"], s["output_len"]), {})
        speedup = s["output_tokens_per_s"] / d["output_tokens_per_s"] if d.get("output_tokens_per_s") else None
        lines.append(
            f"| {s['input_len']}/{s['output_len']} | {_fmt(d.get('requests_per_s'), '.2f')} | "
            f"{s['requests_per_s']:.2f} | {_fmt(d.get('output_tokens_per_s'), '.1f')} | "
            f"{s['output_tokens_per_s']:.1f} | {_fmt(speedup, '.2f')}x |"
        )
    lines += [
        "",
        "| concurrency | dense out tok/s | samoyeds out tok/s | dense TTFT ms | samoyeds TTFT ms "
        "| dense TPOT ms | samoyeds TPOT ms |",
        "|---|---|---|---|---|---|---|",
    ]
    dense_lv = {lv["concurrency"]: lv for lv in v["dense"].get("serving", {}).get("levels", [])}
    for s in v["samoyeds"].get("serving", {}).get("levels", []) if s_ok else []:
        d = dense_lv.get(s["concurrency"], {})
        lines.append(
            f"| {s['concurrency']} | {_fmt(d.get('output_tokens_per_s'), '.1f')} | "
            f"{s['output_tokens_per_s']:.1f} | {_fmt(d.get('mean_ttft_ms'), '.1f')} | "
            f"{s['mean_ttft_ms']:.1f} | {_fmt(d.get('mean_tpot_ms'), '.2f')} | {s['mean_tpot_ms']:.2f} |"
        )
    lines += ["", "| memory | dense | samoyeds |", "|---|---|---|"]
    mem = {x: v[x].get("memory", {}) for x in VARIANTS}
    for key in ("weights_gib", "kv_cache_gib", "kv_cache_tokens"):
        lines.append(f"| {key} | {mem['dense'].get(key, '-')} | {mem['samoyeds'].get(key, '-')} |")
    measured = {x: mem[x].get("measured", {}) for x in VARIANTS}
    seq_len = measured["samoyeds"].get("seq_len") or measured["dense"].get("seq_len")
    lines.append(
        f"| concurrent {seq_len}-token sequences without preemption (measured) | "
        f"{measured['dense'].get('max_seqs_without_preemption', '-')} | "
        f"{measured['samoyeds'].get('max_seqs_without_preemption', '-')} |"
    )
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
    for name, key, ylabel in (
        ("throughput-vs-concurrency", "output_tokens_per_s", "output tokens/s"),
        ("latency-vs-load", "mean_tpot_ms", "mean TPOT (ms)"),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for variant in VARIANTS:
            levels = v[variant].get("serving", {}).get("levels", [])
            if levels:
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
    weights = [v[x].get("memory", {}).get("weights_gib", 0) for x in VARIANTS]
    kv = [v[x].get("memory", {}).get("kv_cache_gib", 0) for x in VARIANTS]
    ax.bar(VARIANTS, weights, label="weights")
    ax.bar(VARIANTS, kv, bottom=weights, label="KV cache")
    ax.set_ylabel("GiB")
    ax.set_title("memory per GPU" + "".join(f" ({x} did not fit)" for x in VARIANTS if "failed" in v[x]))
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "memory.png", dpi=120)
    plt.close(fig)
