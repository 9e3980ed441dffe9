"""Running vLLM as a user does: `vllm serve` as a child process on a free local port (waited for until it answers,
always reaped), the `vllm` command of this environment, what the engine log says about memory, and waiting for
an ended engine's GPU memory to come back.

Used by the serving example, the server tests and the end-to-end benchmarks.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterable, Mapping
from pathlib import Path

from ..errors import SamoyedsError

#: --gpu-memory-utilization of engines on a machine without a GPU: vLLM's CPU build takes that share of the node's
#: RAM for its KV cache (0.92 by default) and refuses to start when less is free
CPU_MEMORY_UTILIZATION = 0.3


def cpu_engine_flags() -> list[str]:
    """Engine flags for this machine that go before the user's (the last of a repeated flag wins): without a GPU, a
    KV cache of CPU_MEMORY_UTILIZATION of the RAM."""
    import torch

    return [] if torch.cuda.is_available() else ["--gpu-memory-utilization", str(CPU_MEMORY_UTILIZATION)]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vllm_command() -> list[str]:
    """The `vllm` CLI of this interpreter's environment (falls back to running its module)."""
    exe = Path(sys.executable).with_name("vllm")
    if exe.exists():
        return [str(exe)]
    if shutil.which("vllm"):
        return ["vllm"]
    return [sys.executable, "-m", "vllm.entrypoints.cli.main"]


class VllmServer:
    """`with VllmServer(model, ["--max-model-len", "1024"]) as server: ...server.url...`

    The server's output goes to `log_path` (a file, so a chatty server never blocks on a full pipe). `env` adds to
    this process's environment; a value None removes the variable.
    """

    def __init__(
        self,
        model: str | Path,
        args: list[str] = (),
        port: int | None = None,
        log_path: str | Path | None = None,
        startup_timeout: float = 900.0,
        env: dict | None = None,
    ):
        self.port = port or free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.command = [*vllm_command(), "serve", str(model), "--host", "127.0.0.1", "--port", str(self.port), *args]
        self.log_path = Path(log_path) if log_path else Path(f"vllm-serve-{self.port}.log")
        self.startup_timeout = startup_timeout
        self.env = {k: v for k, v in {**os.environ, **(env or {})}.items() if v is not None}
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> VllmServer:
        self._log = open(self.log_path, "w")
        # A new session, so stopping the server also stops the engine processes it spawned.
        self.process = subprocess.Popen(
            self.command, stdout=self._log, stderr=subprocess.STDOUT, env=self.env, start_new_session=True
        )
        try:
            self._wait_healthy()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def _wait_healthy(self) -> None:
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                why = f"vllm serve exited with code {self.process.returncode}"
                raise SamoyedsError(failure_text(why, self.log_path))
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(2)
        raise SamoyedsError(
            failure_text(f"vllm serve did not become healthy in {self.startup_timeout:.0f} s", self.log_path)
        )

    def stop(self, grace: float = 30.0) -> None:
        """Interrupt the server's process group, wait for it, kill it if it lingers."""
        if self.process is not None and self.process.poll() is None:
            pgid = os.getpgid(self.process.pid)
            os.killpg(pgid, signal.SIGINT)
            try:
                self.process.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(pgid, signal.SIGKILL)
                self.process.wait()
            try:  # engine processes left in the group
                os.killpg(pgid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        if getattr(self, "_log", None):
            self._log.close()


# A log line's prefixes: the process vLLM's multiprocessing names ("(EngineCore pid=12) "), then a logger's
# "ERROR 12-07 08:36:17 [core.py:1330] " where the exception was logged rather than printed.
_LOG_PREFIX = re.compile(r"^(\([^)]*pid=\d+\)\s*)?([A-Z]+ \d\d-\d\d [\d:]+ \[[^\]]*\]\s*)?")
_EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b(: .*)?$")


def engine_failure_cause(text: str) -> str | None:
    """The first exception a vLLM log names, prefixes stripped: the root cause of an engine that did not start.
    The log's end says only "Engine core initialization failed. See root cause above." (the parent process's
    traceback), and the worker's error is a page above it."""
    lines = [_LOG_PREFIX.sub("", line.rstrip()) for line in text.splitlines()]
    for i, line in enumerate(lines):
        if _EXCEPTION_LINE.match(line):
            # pydantic's errors (an engine argument vLLM refused) give the reason on the indented line below
            after = lines[i + 1] if i + 1 < len(lines) else ""
            if after.startswith("  ") and not after.lstrip().startswith(("File ", "Traceback")):
                line = f"{line}: {after.strip()}"
            return line[:500]
    return None


def failure_text(what: str, log: Path, chars: int = 3000) -> str:
    """`what` failed: the root cause the log names, then the log's tail, and where the whole log is."""
    text = log.read_text(errors="replace") if log.exists() else ""
    cause = engine_failure_cause(text)
    return f"{what}{f': {cause}' if cause else ''}\nlog {log}, its end:\n{text[-chars:]}"


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
    if m := re.search(r"Using (.+?) MoE backend", text):  # which kernels vLLM picked for its own MoE
        info["moe_backend"] = m[1]
    return info


#: Engine flag: vLLM's JIT monitor logs every kernel it compiles or autotunes after its warm-up (not only the first
#: of each kernel), each line saying "... during inference: KERNEL".
JIT_MONITOR_FLAGS = ("--jit-monitor-verbose",)
_JIT_EVENT = "during inference: "


def jit_events_since(log: Path, offset: int) -> tuple[int, int]:
    """(kernels compiled or autotuned after warm-up that `log` names after byte `offset`, its size now)."""
    if not log.exists():
        return 0, offset
    with open(log, "rb") as f:
        f.seek(offset)
        text = f.read()
    return text.count(_JIT_EVENT.encode()), offset + len(text)


def deep_gemm_cache(env: Mapping[str, str]) -> Path:
    """Where DeepGEMM (vLLM's FP8 GEMMs on Hopper) writes the kernels it compiles at run time, in an engine with
    environment `env`: $DG_JIT_CACHE_DIR, which vLLM sets to $VLLM_CACHE_ROOT/deep_gemm unless it is given."""
    if env.get("DG_JIT_CACHE_DIR"):
        return Path(env["DG_JIT_CACHE_DIR"]).expanduser()
    cache_home = Path(env.get("XDG_CACHE_HOME") or Path.home() / ".cache").expanduser()
    return Path(env.get("VLLM_CACHE_ROOT") or cache_home / "vllm").expanduser() / "deep_gemm"


def _cached_files(folders: Iterable[Path]) -> set[Path]:
    return {f for folder in folders if folder.is_dir() for f in folder.rglob("*") if f.is_file()}


def without_jit(measure, log: Path, attempts: int = 3, caches: Iterable[Path] = ()):
    """`measure(run)` for run = 0, 1, ... (at most `attempts` runs) until a run compiles no kernel, as the engine
    writing `log` reports and as the JIT caches `caches` show (a folder that gains files in a run: one kernel per
    new folder of files; DeepGEMM logs nothing when it compiles); returns its last result and a record: the runs
    made, the kernels compiled during them, and whether the last run compiled none (`jit_free`). A kernel compiled
    inside a timed run costs about a second (DeepGEMM's nvcc more) and says nothing about the steady state; the
    untimed run of the same batch shape before it compiles most of them, but the scheduler may batch the timed
    requests differently (another mix of prefill and decode tokens per step, which Triton and DeepGEMM specialise
    kernels on). A rerun must draw other prompts than the run before it, or it finds them in the prefix cache:
    `run` tells them apart."""
    caches = list(caches)
    offset = log.stat().st_size if log.exists() else 0
    cached = _cached_files(caches)
    compiled = runs = 0
    while True:
        result = measure(runs)
        events, offset = jit_events_since(log, offset)
        now = _cached_files(caches)
        events += len({f.parent for f in now - cached})
        cached = now
        compiled, runs = compiled + events, runs + 1
        if events == 0 or runs == attempts:
            return result, {"timed_runs": runs, "jit_compiles": compiled, "jit_free": events == 0}


def nvidia_smi(query: str, *formats: str, gpus: list[str] | None = None) -> str | None:
    """nvidia-smi's CSV answer to `--query-...=` (e.g. "gpu=memory.used") about `gpus` (indices or UUIDs; all
    when None), None without nvidia-smi or on an error."""
    if not shutil.which("nvidia-smi"):
        return None
    try:
        done = subprocess.run(
            [
                "nvidia-smi",
                f"--query-{query}",
                "--format=" + ",".join(("csv", "noheader", *formats)),
                *([f"--id={','.join(gpus)}"] if gpus else []),
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=True,
        )
        return done.stdout
    except (subprocess.SubprocessError, OSError):
        return None


def visible_gpus() -> list[str] | None:
    """The GPUs CUDA_VISIBLE_DEVICES names (indices or UUIDs), None when it is unset: what nvidia-smi, which sees
    every GPU of the machine, should look at (engines here use only those, and another job may use the others).
    nvidia-smi numbers GPUs in PCI order, CUDA fastest first unless CUDA_DEVICE_ORDER=PCI_BUS_ID: the same on a
    host of one GPU model; on a mixed host name the GPUs by UUID."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    return None if visible is None else [gpu.strip() for gpu in visible.split(",") if gpu.strip()]


def gpu_memory_used() -> list[float] | None:
    """GiB in use on each visible GPU, by nvidia-smi (or torch in a fresh process, so this process never holds a
    CUDA context); None on a machine without a GPU."""
    visible = visible_gpus()
    if visible == []:
        return None
    answer = nvidia_smi("gpu=memory.used", "nounits", gpus=visible)
    if answer is not None:
        try:
            return [float(mib) / 1024 for mib in answer.split()]
        except ValueError:
            pass
    probe = (
        "import torch\n"
        "if torch.cuda.is_available():\n"
        "    print(*((t - f) / 2**30 for f, t in map(torch.cuda.mem_get_info, range(torch.cuda.device_count()))))"
    )
    try:
        done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120)
        return [float(gib) for gib in done.stdout.split()] or None
    except (subprocess.SubprocessError, OSError, ValueError):
        return None


def other_gpus_in_use(slack_gib: float = 1.0) -> dict[str, float]:
    """The GPUs of this machine outside CUDA_VISIBLE_DEVICES holding more than `slack_gib` of memory, index: GiB.
    Another job there shares this machine's CPUs with the engines measured here (its engine's host loop, its
    kernels' compiles), which can slow them. Empty when CUDA_VISIBLE_DEVICES is unset (every GPU may be this run's)
    or names MIG instances (not matched to GPUs here), and without nvidia-smi."""
    visible = visible_gpus()
    if visible is None or any(gpu.startswith("MIG-") for gpu in visible):
        return {}
    busy = {}
    for line in (nvidia_smi("gpu=index,uuid,memory.used", "nounits") or "").strip().splitlines():
        try:
            index, uuid, mib = (field.strip() for field in line.split(","))
            gib = float(mib) / 1024
        except ValueError:
            continue
        # CUDA takes a GPU's index, its UUID or a unique prefix of the UUID
        ours = index in visible or any(gpu.startswith("GPU-") and uuid.startswith(gpu) for gpu in visible)
        if not ours and gib > slack_gib:
            busy[index] = round(gib, 1)
    return busy


def busiest(*seen: Mapping[str, float]) -> dict[str, float]:
    """Several looks of other_gpus_in_use as one: every GPU seen in use, with the most GiB it held."""
    most: dict[str, float] = {}
    for busy in seen:
        for gpu, gib in busy.items():
            most[gpu] = max(gib, most.get(gpu, 0.0))
    return most


def gpu_processes() -> str:
    """The processes holding memory of the visible GPUs, as nvidia-smi lists them (for error messages)."""
    answer = nvidia_smi("compute-apps=pid,process_name,used_memory", gpus=visible_gpus())
    return "unknown (no nvidia-smi)" if answer is None else answer.strip() or "none listed"


def wait_for_gpu_memory(baseline: list[float] | None, timeout: float = 300.0, slack_gib: float = 1.0) -> None:
    """Wait until every GPU uses at most `slack_gib` more than `baseline` (what it used before the first engine).
    An engine's processes release their memory some time after they are told to end, and the next engine sizes
    its KV cache by the memory free when it starts: started too early, it fails or measures a smaller cache."""
    if baseline is None:
        return
    deadline = time.monotonic() + timeout
    while True:
        used = gpu_memory_used()
        if used is None or all(u <= b + slack_gib for u, b in zip(used, baseline, strict=False)):
            return
        if time.monotonic() > deadline:
            raise SamoyedsError(
                f"GPU memory still in use {timeout:.0f} s after the last engine ended: "
                f"{', '.join(f'{u:.1f}' for u in used)} GiB against {', '.join(f'{b:.1f}' for b in baseline)} "
                f"GiB before the first; holders: {gpu_processes()}"
            )
        time.sleep(2)
