"""The `samoyeds-vllm` command: make-model, convert."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from .errors import SamoyedsError


def _make_model(args: argparse.Namespace) -> None:
    from .model_maker import make_model

    make_model(args.arch, args.preset, Path(args.out), dtype=args.dtype, seed=args.seed,
               config_only=args.config_only, force=args.force)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="samoyeds-vllm", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("make-model", help="write a Hugging Face MoE model with random weights and a local tokenizer")
    p.add_argument("--arch", required=True, help="model family: mixtral, qwen2_moe, qwen3_moe, olmoe, ...")
    p.add_argument("--preset", default="tiny", help="'tiny' (a few MB, for tests) or a real shape from configs/models")
    p.add_argument("--out", required=True, help="output directory (must not exist, unless --force)")
    p.add_argument("--dtype", default=None, help="float32, bfloat16 or float16 (default: the preset's)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--config-only", action="store_true",
                   help="write config.json and the tokenizer only (for load_format=dummy benchmarks)")
    p.add_argument("--force", action="store_true", help="replace an existing output directory")
    p.set_defaults(func=_make_model)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        args.func(args)
    except SamoyedsError as e:
        print(f"samoyeds-vllm {args.command}: error: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
