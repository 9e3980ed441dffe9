"""What the engine log says about memory, as `bench e2e` reads it."""

from samoyeds_vllm.tools.vllm_server import parse_engine_log


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
