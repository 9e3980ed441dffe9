"""`vllm bench serve` loads against one server from one long-lived client process.

Each `vllm bench serve` command is a new interpreter that imports vLLM before it sends a request: on an H200 host
whose CPUs also ran the API servers that start took 20-25 s against 3-8 s of load at 16-256 clients (128/128), and ~25
s against 17-36 s at a capacity probe (benchmarks/results/e2e-h4-h200/; the probes: `git show
411eb8f:benchmarks/results/capacity-4096-h200/`). Here one worker imports vLLM's benchmark once and runs each load it
is sent with the command's own arguments and code (vLLM's `vllm.benchmarks.serve.main`, which seeds its random state
from `--seed` each time), its output going to that load's log. The worker is its own process, as the command was, so
nothing in the caller (a /metrics poller thread) shares the client's interpreter.

    with BenchServeClient(server.url, log_path) as client:
        client.run(["--backend", "vllm", "--base-url", client.url, ...], Path("serve.log"))
"""

from __future__ import annotations

import gc
import json
import os
import select
import subprocess
import sys
import traceback
from pathlib import Path

from ..errors import SamoyedsError

READY_TIMEOUT = 600.0  # seconds for the worker to import vLLM


class BenchServeClient:
    """A worker that runs `vllm bench serve` loads (their arguments as the command takes them) one at a time."""

    def __init__(self, url: str, log_path: str | Path, env: dict | None = None):
        self.url = url
        self.log_path = Path(log_path)  # the worker's own output: what vLLM prints outside a load
        self.env = {**os.environ, **(env or {})}
        self.process: subprocess.Popen | None = None

    def __enter__(self) -> BenchServeClient:
        self._log = open(self.log_path, "w")
        try:
            self.process = subprocess.Popen(
                [sys.executable, "-m", __name__],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=self._log,
                text=True,
                env=self.env,
            )
            self._reply(READY_TIMEOUT, "start")
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def run(self, args: list[str], log: Path, timeout: float = 3600.0) -> str:
        """One load: `vllm bench serve ARGS`, its output in `log` (returned). A load that fails raises with the
        log's end; one past `timeout` seconds ends the worker."""
        if self.process is None or self.process.poll() is not None:
            raise SamoyedsError(f"the vllm bench serve worker is not running; its log {self.log_path}")
        self.process.stdin.write(json.dumps({"args": args, "log": str(log)}) + "\n")
        self.process.stdin.flush()
        reply = self._reply(timeout, f"the load logged in {log}")
        text = Path(log).read_text(errors="replace")
        if not reply["ok"]:
            raise SamoyedsError(f"vllm bench serve failed ({reply['error']}); log {log}:\n{text[-3000:]}")
        return text

    def _reply(self, timeout: float, what: str) -> dict:
        ready, _, _ = select.select([self.process.stdout], [], [], timeout)
        line = self.process.stdout.readline() if ready else ""
        if not line:
            self.stop(grace=0.0)  # a load still running reads no stdin: it would not end on its own
            why = "ended" if ready else f"did not answer in {timeout:.0f} s"
            raise SamoyedsError(f"the vllm bench serve worker {why} ({what}); its log {self.log_path}")
        return json.loads(line)

    def stop(self, grace: float = 30.0) -> None:
        """End of input for the worker (it ends after the load it runs), killed after `grace` seconds."""
        if self.process is not None:
            if self.process.poll() is None:
                try:
                    self.process.stdin.close()
                    self.process.wait(grace)
                except (OSError, subprocess.TimeoutExpired):
                    self.process.kill()
                    self.process.wait()
            for pipe in (self.process.stdin, self.process.stdout):
                try:
                    pipe.close()
                except OSError:  # a broken pipe whose buffered request could not be flushed
                    pass
        if getattr(self, "_log", None):
            self._log.close()


def _worker() -> None:
    """Reads one JSON request a line ({"args": [...], "log": path}), runs it with stdout and stderr (file
    descriptors 1 and 2, so vLLM's loggers too) in the request's log, and answers on the original stdout."""
    replies = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # outside a load, what is printed goes to the worker's log, not into the replies
    from vllm.benchmarks.serve import add_cli_args, main
    from vllm.utils.argparse_utils import FlexibleArgumentParser

    parser = FlexibleArgumentParser()
    add_cli_args(parser)
    replies.write(json.dumps({"ok": True}) + "\n")
    while line := sys.stdin.readline():
        request = json.loads(line)
        ok, error = True, ""
        with open(request["log"], "w") as log:
            sys.stdout.flush(), sys.stderr.flush()
            saved = os.dup(1), os.dup(2)
            os.dup2(log.fileno(), 1), os.dup2(log.fileno(), 2)
            try:
                main(parser.parse_args(request["args"]))
            except BaseException as e:  # argparse's SystemExit too: the worker goes on with the next load
                traceback.print_exc()
                ok, error = False, f"{type(e).__name__}: {e}"
            finally:
                sys.stdout.flush(), sys.stderr.flush()
                os.dup2(saved[0], 1), os.dup2(saved[1], 2)
                os.close(saved[0]), os.close(saved[1])
                # main() freezes the heap (gc.freeze) before its requests: what a load left in reference cycles,
                # its tokenizer among them, would stay for good (~40 MB a load with a 150k-token vocabulary)
                gc.unfreeze()
                gc.collect()
        replies.write(json.dumps({"ok": ok, "error": error}) + "\n")


if __name__ == "__main__":
    _worker()
