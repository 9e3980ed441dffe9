"""Merges runs of tune_kernels.py into the tuned tables: per (shape, pattern, value type, token count), the fastest
config of any run where it beat the table's current entry (or the heuristics, without one) by a margin.

    python benchmarks/merge_tables.py RUN.json [RUN.json ...] --out DIR [--margin 0.03] [--tables configs/kernels]

Runs are compared through their own "default" (the heuristics' plan, which every run times): each config's two
rounds are taken relative to the faster round of its run's default. The current entry is the "tuned table"
candidate of an activations search (the table's entry, nearest token count); without a table entry it is the
heuristics. A token count takes the fastest config where even its slower round beats the current entry's faster
round by the margin; else it keeps the current entry. Token counts whose table entry no run timed are left as they
are. Each table read from --tables (the shipped ones, or none) is written to DIR with the measured token counts'
entries set, and "1": {} added to a new table so that T = 1 keeps the one-token kernels; every change is printed.
Point $SAMOYEDS_KERNEL_CONFIG_DIR at DIR to run with the result, copy it to configs/kernels/ to ship it.
"""

import argparse
import json
import re
from collections import defaultdict
from pathlib import Path

import torch

from samoyeds_vllm.format import Pattern
from samoyeds_vllm.kernels import LayerShape
from samoyeds_vllm.kernels.plan import Device, nearest_token_count, table_name
from samoyeds_vllm.tools.presets import preset_shape

SHIPPED = Path(__file__).parents[1] / "configs" / "kernels"


def parse_pattern(text: str) -> Pattern:
    """A pattern as the runs print it: "2:4" or "samoyeds(V=128)"."""
    m = re.fullmatch(r"(\w+)\(V=(\d+)\)", text)
    return Pattern.parse(m[1], int(m[2])) if m else Pattern.parse(text)


def relative_rounds(rows: list[dict]) -> dict[str, list[float]]:
    """name -> its rounds over the faster round of its run's default, for the rows of one cell across runs (a name
    timed by two runs keeps the better)."""
    out: dict[str, list[float]] = {}
    for row in rows:
        default = min(row["us"]["default"])
        for name, rounds in row["us"].items():
            rel = sorted(t / default for t in rounds)
            if name not in out or rel[-1] < out[name][-1]:
                out[name] = rel
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("runs", nargs="+", type=Path, help="JSON files of tune_kernels.py --json")
    parser.add_argument("--out", type=Path, required=True, help="write the merged tables here")
    parser.add_argument("--margin", type=float, default=0.03, help="how much faster a config must be (0.03: 3%%)")
    parser.add_argument("--tables", type=Path, default=SHIPPED, help="the tables to start from")
    args = parser.parse_args()

    cells: dict[tuple[str, str, str, str], dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for run in args.runs:
        data = json.loads(run.read_text())
        for row in data["rows"]:
            if "configs" not in row:
                raise SystemExit(f"{run}: rows without their configs (a run of an older tune_kernels.py)")
            cells[data["device"], row["shape"], row["pattern"], row["values"]][row["tokens"]].append(row)

    args.out.mkdir(parents=True, exist_ok=True)
    for (device_name, shape_name, pattern_name, values), by_tokens in cells.items():
        shape = preset_shape(shape_name)
        layer = LayerShape(1, shape.top_k, shape.num_experts, shape.hidden, shape.intermediate)
        device = Device(device_name, (0, 0), 0, "")  # only the name goes into a table's file name
        name = table_name(layer, parse_pattern(pattern_name), torch.bfloat16, device, values == "fp8")
        path = args.tables / name
        table = json.loads(path.read_text()) if path.is_file() else {"1": {}}
        for tokens, rows in sorted(by_tokens.items()):
            rel = relative_rounds(rows)
            configs = {k: v for row in rows for k, v in row["configs"].items()}
            nearest = nearest_token_count(map(int, table), tokens)  # the entry the kernels take now
            entry = {} if nearest is None else table[str(nearest)]
            current = "tuned table" if entry else "default"
            if current not in rel:
                print(f"{shape_name} {pattern_name} {values} T={tokens}: its table entry {entry} was not timed, kept")
                continue
            best = min(rel, key=lambda k: rel[k][-1])
            if rel[best][-1] <= (1 - args.margin) * rel[current][0]:
                chosen, why = configs[best], f"{best} {rel[best][-1]:.3f} against {current} {rel[current][0]:.3f}"
            else:
                chosen, why = entry, f"kept ({current}; best {best} {rel[best][-1]:.3f} against {rel[current][0]:.3f})"
            if table.get(str(tokens)) != chosen:
                print(f"{shape_name} {pattern_name} {values} T={tokens}: {table.get(str(tokens))} -> {chosen}: {why}")
            table[str(tokens)] = chosen
        ordered = dict(sorted(table.items(), key=lambda kv: int(kv[0])))
        (args.out / name).write_text(json.dumps(ordered, indent=2) + "\n")
        print(f"wrote {args.out / name}")


if __name__ == "__main__":
    main()
