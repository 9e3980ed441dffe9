"""As run on the H200 (2026-11-26, `python3 probe.py 16,64,256 all,values`, OUT set by the device tool): samoyeds FP8
experts with bf16 other projections (the bench e2e samoyeds-fp8 model, "values") against FP8 128x128-block other
projections ("all": the dense FP8 config with the samoyeds keys added, sparsified on load), offline 128/128, the
engine flags of bench e2e, bench/offline.py's method (an untimed run of each batch shape first)."""
import json, os, sys, time
from pathlib import Path
from samoyeds_vllm.bench.e2e import run_offline, VARIANTS, variant_env, Workload, wait_for_gpu_memory, gpu_memory_used
from samoyeds_vllm.tools.model_maker import FORMS

out = Path(os.environ.get("OUT", "/tmp/pilot")); out.mkdir(parents=True, exist_ok=True)
bs = [int(b) for b in sys.argv[1].split(",")]
work = Workload()
models = out / "models"
a = FORMS["samoyeds-fp8"]("qwen3-30b-a3b", None, models / "samoyeds-fp8")
b = FORMS["dense-fp8"]("qwen3-30b-a3b", None, models / "samoyeds-fp8-all")
cfg = json.loads((b / "config.json").read_text())
cfg["quantization_config"].update(pattern="samoyeds", values="float8_e4m3fn")
(b / "config.json").write_text(json.dumps(cfg, indent=2))
env = variant_env(VARIANTS["samoyeds-fp8"])
base = work.variant_engine_args(VARIANTS["samoyeds-fp8"])
baseline = gpu_memory_used()
order = sys.argv[2].split(",") if len(sys.argv) > 2 else ["all", "values"]
for which in order:
    model, args = (b, base + ["--quantization", "samoyeds"]) if which == "all" else (a, base)
    wait_for_gpu_memory(baseline)
    t = time.time()
    def record(engine, results, log, which=which):
        for r in results:
            print(which, r["batch_size"], round(r["output_tokens_per_s"]), r.get("compiled", ""), flush=True)
    run_offline(model, (128, 128), bs, args, env, out, 900, record)
    print(which, "took", round(time.time() - t), "s", flush=True)
