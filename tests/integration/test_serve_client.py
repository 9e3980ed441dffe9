"""The long-lived `vllm bench serve` client (tools.serve_client) without a server: a load the command refuses is
reported with its log, one whose requests fail is logged as the command logs it, and the worker goes on to the
next. Loads against a server are in test_bench_e2e (every served level and capacity probe goes through the
client)."""

import socket
import time

import pytest

from samoyeds_vllm.errors import SamoyedsError
from samoyeds_vllm.tools.serve_client import BenchServeClient
from samoyeds_vllm.tools.vllm_server import free_port

pytestmark = pytest.mark.vllm


def test_a_refused_load_is_reported_and_the_worker_takes_the_next(tmp_path, tiny_models):
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    model = tiny_models["qwen3_moe"]
    with BenchServeClient(url, tmp_path / "client.log") as client:
        with pytest.raises(SamoyedsError, match="SystemExit") as bad_flag:
            client.run(["--no-such-flag"], tmp_path / "bad-flag.log")
        assert "unrecognized arguments: --no-such-flag" in (tmp_path / "bad-flag.log").read_text()
        assert "bad-flag.log" in str(bad_flag.value)
        load = ["--backend", "vllm", "--base-url", url, "--model", str(model), "--dataset-name", "random"]
        load += ["--random-input-len", "8", "--random-output-len", "4", "--num-prompts", "2", "--disable-tqdm"]
        text = client.run(load, tmp_path / "no-server.log")  # as the command does: its requests count as failed
        assert text == (tmp_path / "no-server.log").read_text()
        assert "Sampling input_len" in text  # vLLM's logger, not only print(), went to the load's log
        assert [line.split()[-1] for line in text.splitlines() if line.startswith("Failed requests:")] == ["2"]
        assert "Sampling input_len" not in (tmp_path / "client.log").read_text()
        assert client.process.poll() is None  # still there for the next load
    assert client.process.poll() is not None


def test_a_load_past_its_time_ends_the_worker_at_once(tmp_path, tiny_models):
    with socket.socket() as silent:  # accepts connections and never answers
        silent.bind(("127.0.0.1", 0))
        silent.listen()
        url = f"http://127.0.0.1:{silent.getsockname()[1]}"
        load = ["--backend", "vllm", "--base-url", url, "--model", str(tiny_models["qwen3_moe"]), "--num-prompts", "1"]
        with BenchServeClient(url, tmp_path / "client.log") as client:
            began = time.monotonic()
            with pytest.raises(SamoyedsError, match="did not answer in 3 s"):
                client.run(load + ["--dataset-name", "random", "--disable-tqdm"], tmp_path / "hung.log", timeout=3)
            assert time.monotonic() - began < 15  # killed, not waited for
            assert client.process.poll() is not None
            with pytest.raises(SamoyedsError, match="not running"):
                client.run(load, tmp_path / "after.log")
