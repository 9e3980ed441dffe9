"""What a torch-profiler trace of vLLM holds for the profiling scripts (benchmarks/profile_decode.py,
benchmarks/profile_serving.py): the GPU kernels (name, start, duration, on the GPU's clock), vLLM's engine steps,
the kernels' time with overlaps counted once, and windows of the trace cut out by time."""

from __future__ import annotations

import bisect
import gzip
import heapq
import json
import re
from collections import defaultdict
from pathlib import Path
from typing import NamedTuple

CATEGORIES = (  # first match wins; vLLM's dense MoE runs its SiLU-and-mul (act_and_mul) as a separate kernel
    ("moe", re.compile(r"samoyeds|moe|topk|expert|act_and_mul", re.I)),
    ("attention", re.compile(r"flash|attn|attention|reshape_and_cache|rotary|rope", re.I)),
    ("gemm", re.compile(r"gemm|gemv|cutlass|xmma|nvjet|cublas|matmul", re.I)),
)
# vLLM's GPU worker names each engine step after its "context" (prefill) and "generation" (decode) requests and
# tokens (`annotate_profile` in vllm/v1/worker/gpu_worker.py), with the step's token count and per-phase sums when
# its detailed_trace_annotation is on: `execute_context_0(0)_generation_256(256)`,
# `execute_256_context_0(sq0sk0sqsq0sqsk0)_generation_256(sq256sk270592sqsq256sqsk270592)`.
STEP = re.compile(r"execute_(?:\d+_)?context_(\d+)\([^)]*\)_generation_(\d+)\([^)]*\)")


def category(kernel: str) -> str:
    return next((name for name, pattern in CATEGORIES if pattern.search(kernel)), "other")


class Trace(NamedTuple):
    """What a profiled run's torch-profiler traces hold, read once: `kernels` (name, start µs, duration µs) of every
    GPU kernel; `steps` (start µs, prefill requests, decode requests) of each engine step (STEP), in time order. A
    step starts on the GPU's clock, where its first kernel starts (the profiler's GPU-side copy of the host's
    annotation), so a window between two starts holds that step's kernels and no other's. A CPU run has no steps."""

    kernels: list[tuple[str, float, float]]
    steps: list[tuple[float, int, int]]


def read_trace(trace_dir: Path) -> Trace:
    """The kernels and engine steps of the torch-profiler traces in `trace_dir`."""
    kernels, steps = [], []
    for path in sorted(trace_dir.glob("*.json*")):
        with gzip.open(path, "rt") if path.suffix == ".gz" else open(path) as f:
            events = json.load(f).get("traceEvents", [])
        for e in events:
            if e.get("cat") == "kernel":
                kernels.append((e.get("name", ""), float(e.get("ts", 0)), float(e.get("dur", 0))))
            elif e.get("cat") == "gpu_user_annotation" and (match := STEP.fullmatch(e.get("name", ""))):
                steps.append((float(e.get("ts", 0)), int(match[1]), int(match[2])))
    return Trace(kernels, sorted(steps))


def kernel_spans(kernels: list[tuple[str, float, float]]) -> dict[str, float]:
    """µs from start to end per kernel name, summed. A kernel launched as a programmatic dependent launch (ours,
    DeepGEMM's) starts before the kernel before it ends and waits inside, so its span includes that wait."""
    totals: dict[str, float] = defaultdict(float)
    for name, _, dur in kernels:
        totals[name] += dur
    return dict(totals)


def kernel_times(kernels: list[tuple[str, float, float]]) -> dict[str, float]:
    """µs of GPU time per kernel name, each instant given to the earliest-started kernel running then: of kernels
    that overlap through dependent launches the later ones wait for it, so it is the one on the step's path. The
    times add up to busy_time (summing spans would count the waits too)."""
    totals: dict[str, float] = defaultdict(float)
    running: list[tuple[float, int, float, str]] = []  # heap of (start, launch order, end, name)
    now = float("-inf")

    def advance(until: float) -> None:
        nonlocal now
        while running and now < until:
            _, _, end, name = running[0]
            if end > now:
                stop = min(end, until)
                totals[name] += stop - now
                now = stop
            if end <= now:
                heapq.heappop(running)
        now = max(now, until)

    for order, (name, start, dur) in enumerate(sorted(kernels, key=lambda k: k[1])):
        advance(start)
        heapq.heappush(running, (start, order, start + dur, name))
    advance(float("inf"))
    return dict(totals)


def gap_spans(kernels: list[tuple[str, float, float]]) -> list[tuple[float, float, str, str]]:
    """(start, end, the kernel before, the kernel after) of every stretch with no kernel running between the first
    kernel's start and the last one's end, in time order (kernels of several streams may overlap)."""
    gaps, end, last = [], float("-inf"), None
    for name, start, dur in sorted(kernels, key=lambda k: k[1]):
        if last is not None and start > end:
            gaps.append((end, start, last, name))
        if start + dur >= end:
            end, last = start + dur, name
    return gaps


def gpu_gaps(kernels: list[tuple[str, float, float]]) -> list[dict]:
    """gap_spans as records: each stretch's µs and the kernels on either side."""
    return [
        {"us": end - start, "after": after[:100], "before": before[:100]}
        for start, end, after, before in gap_spans(kernels)
    ]


def busy_time(kernels: list[tuple[str, float, float]]) -> float:
    """µs during which at least one kernel ran (overlapping kernels of several streams count once)."""
    if not kernels:
        return 0.0
    span = max(start + dur for _, start, dur in kernels) - min(start for _, start, _ in kernels)
    return span - sum(end - start for start, end, _, _ in gap_spans(kernels))


def largest_gaps(kernels: list[tuple[str, float, float]], count: int = 5) -> list[dict]:
    """The `count` longest stretches with no kernel running, each with the kernels on either side: a one-off
    stall (a kernel compiled on first use) shows as one gap far longer than the rest."""
    return sorted(gpu_gaps(kernels), key=lambda g: -g["us"])[:count]


def by_category(times: dict[str, float]) -> dict[str, float]:
    totals: dict[str, float] = defaultdict(float)
    for name, us in times.items():
        totals[category(name)] += us
    return dict(totals)


class Kernels:
    """A trace's kernels sorted by start, to cut windows out of: `window(start, end)` gives the kernels running in
    [start, end), each clipped to it, in launch order (kernel_times gives an instant to the earliest-started
    kernel); a window looks only as far back as the longest kernel."""

    def __init__(self, kernels: list[tuple[str, float, float]]):
        self.kernels = sorted(kernels, key=lambda k: k[1])
        self.starts = [k[1] for k in self.kernels]
        self.longest = max((k[2] for k in self.kernels), default=0.0)

    def window(self, start: float, end: float) -> list[tuple[str, float, float]]:
        near = self.kernels[
            bisect.bisect_left(self.starts, start - self.longest) : bisect.bisect_left(self.starts, end)
        ]
        return [(n, max(s, start), min(s + d, end) - max(s, start)) for n, s, d in near if s + d > start]
