"""What the engine log says about memory, as `bench e2e` reads it."""

from samoyeds_vllm.tools.vllm_server import engine_failure_cause, failure_text, parse_engine_log


def test_parse_engine_log():
    log = (
        "Model loading took 56.94 GiB memory and 20.1 seconds\nAvailable KV cache memory: 10.25 GiB\n"
        "GPU KV cache size: 112,384 tokens\nMaximum concurrency for 4,096 tokens per request: 27.44x\n"
    )
    assert parse_engine_log(log) == {
        "weights_gib": 56.94,
        "kv_cache_gib": 10.25,
        "kv_cache_tokens": 112384,
        "estimated_max_seqs": {"tokens": 4096, "sequences": 27.44},
    }
    assert parse_engine_log("no memory lines") == {}


def test_the_moe_kernels_vllm_picked():
    log = "INFO [fp8.py:325] Using TRITON Fp8 MoE backend out of potential backends: ['DEEPGEMM', 'TRITON'].\n"
    assert parse_engine_log(log) == {"moe_backend": "TRITON Fp8"}


# The shape of a CPU engine that could not allocate its KV cache (vLLM 0.26.0), shortened: the worker's error a page
# above the parent's "See root cause above".
WORKER = "(Worker pid=25429) ERROR 12-07 08:36:17 [multiproc_executor.py:1007] "
CORE = "(EngineCore pid=25415) "
FAILED_START = "\n".join(
    [
        "INFO 12-07 08:35:18 [importing.py:53] Triton is installed but 0 active driver(s) found. Disabling Triton",
        WORKER + "Traceback (most recent call last):",
        WORKER + "    raise ValueError(",
        WORKER + "ValueError: Available memory on node 0 (21.54/23.54 GiB) on kv cache allocation is less than "
        "requested memory for kv (100000.0 GiB).",
        CORE + "ERROR 12-07 08:36:17 [core.py:1330] EngineCore failed to start.",
        CORE + "RuntimeError: Worker failed with error 'Available memory on node 0', please check the stack trace "
        "above for the root cause",
        "Traceback (most recent call last):",
        "    raise RuntimeError(",
        "RuntimeError: Engine core initialization failed. See root cause above. Failed core proc(s): {}\n",
    ]
)


def test_the_root_cause_of_a_failed_start(tmp_path):
    """The log's end says only "Engine core initialization failed"; the cause is the first exception it names."""
    assert engine_failure_cause(FAILED_START) == (
        "ValueError: Available memory on node 0 (21.54/23.54 GiB) on kv cache allocation is less than requested "
        "memory for kv (100000.0 GiB)."
    )
    assert engine_failure_cause("INFO all well\nKeyboardInterrupt\n") == "KeyboardInterrupt"
    assert engine_failure_cause("INFO ValueError: in a message, not raised\n") is None
    refused = "ValidationError: 1 validation error for ModelConfig\n  Value error, User-specified max_model_len\n"
    assert engine_failure_cause(refused) == (
        "ValidationError: 1 validation error for ModelConfig: Value error, User-specified max_model_len"
    )
    log = tmp_path / "engine.log"
    log.write_text(FAILED_START)
    text = failure_text("offline run failed (exit 1)", log)
    assert text.startswith("offline run failed (exit 1): ValueError: Available memory on node 0")
    assert f"log {log}, its end:" in text and text.endswith("Failed core proc(s): {}\n")
    assert failure_text("vllm serve exited", tmp_path / "none.log").startswith("vllm serve exited\nlog ")
