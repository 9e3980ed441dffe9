"""As run on the H200 (2026-11-26, `python3 probe.py samoyeds-fp8 1,16 240`, then `dense-fp8 1,16 300`): wall time
of LLM.generate with max_tokens=1 (the prefill step and the engine's bookkeeping) for N prompts of 128 random
tokens, the bench e2e variants' models and environments, prefix caching off, 8192 batched tokens as `vllm serve`
has; 8 calls per N, the last 5 kept (ms)."""
import json, os, subprocess, sys, time
from pathlib import Path

def child(model, args, batches):
    import numpy as np
    from vllm import LLM, SamplingParams
    from vllm.engine.arg_utils import EngineArgs
    from vllm.inputs import TokensPrompt
    from vllm.utils.argparse_utils import FlexibleArgumentParser
    parser = EngineArgs.add_cli_args(FlexibleArgumentParser())
    ea = EngineArgs.from_cli_args(parser.parse_args(["--model", model, *args]))
    llm = LLM.from_engine_args(ea)
    rng = np.random.default_rng(0)
    p1 = SamplingParams(max_tokens=1, ignore_eos=True)
    res = {}
    for b in batches:
        times = []
        for i in range(8):
            ids = rng.integers(10, 990, size=(b, 128))
            prompts = [TokensPrompt(prompt_token_ids=r.tolist()) for r in ids]
            t = time.perf_counter(); llm.generate(prompts, p1, use_tqdm=False); times.append(time.perf_counter() - t)
        res[b] = [round(x * 1000, 2) for x in times[3:]]
        print("RESULT", b, sorted(res[b]), flush=True)
    os._exit(0)

if __name__ == "__main__" and sys.argv[1] == "child":
    child(sys.argv[2], json.loads(sys.argv[3]), json.loads(sys.argv[4]))

if __name__ == "__main__" and sys.argv[1] != "child":
    from samoyeds_vllm.bench.e2e import VARIANTS, variant_env, Workload, wait_for_gpu_memory, gpu_memory_used
    out = Path(os.environ.get("OUT", "/tmp/pilot")); models = out / "models"
    batches = [int(b) for b in sys.argv[2].split(",")]
    baseline = gpu_memory_used()
    for name in sys.argv[1].split(","):
        v = VARIANTS[name]
        model = v.model("qwen3-30b-a3b", None, models / name)
        args = Workload().variant_engine_args(v) + ["--no-enable-prefix-caching", "--max-num-batched-tokens", "8192"]
        wait_for_gpu_memory(baseline)
        t = time.time()
        log = out / f"prefill-{name}.log"
        with open(log, "w") as f:
            try:
                p = subprocess.run([sys.executable, __file__, "child", str(model), json.dumps(args), json.dumps(batches)],
                                   env=variant_env(v), stdout=f, stderr=subprocess.STDOUT, timeout=int(sys.argv[3]))
            except subprocess.TimeoutExpired:
                print(name, "timed out", flush=True)
        for line in log.read_text().splitlines():
            if line.startswith("RESULT"): print(name, line, flush=True)
        print(name, "took", round(time.time() - t), "s", flush=True)
