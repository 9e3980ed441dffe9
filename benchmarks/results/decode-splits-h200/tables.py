"""Tables of the tuned splits that clearly win: a T keeps its tuned config only if both of its rounds beat both of the
heuristics' rounds and its best is at least 3% under the heuristics' best; otherwise {} (the heuristics). A {} entry at
twice the largest tuned T ends the tuned range; the shipped table's entries past it are kept."""
import json, sys
from pathlib import Path

repo, written, tables, *tunes = sys.argv[1:]
rows = [r for f in tunes for r in json.load(open(f))["rows"]]
for path in sorted(Path(written).iterdir()):
    table = json.loads(path.read_text())
    shape = "qwen3-30b-a3b" if "E=128" in path.name else "mixtral-8x7b"
    out = {}
    for row in rows:
        if row["shape"] != shape:
            continue
        t, us, best = row["tokens"], row["us"], row["best"]
        default = us["default"]
        clear = best != "default" and max(us[best]) < min(default) and min(us[best]) < 0.97 * min(default)
        out[t] = table[str(t)] if clear else {}
        print(f"{shape} T={t}: default {default} best {best} {us[best]} -> {out[t] or 'heuristics'}")
    end = 2 * max(out)
    out[end] = {}
    shipped = Path(repo) / "configs" / "kernels" / path.name
    if shipped.is_file():
        for t, config in json.loads(shipped.read_text()).items():
            if int(t) > end:
                out[int(t)] = config
    text = json.dumps({str(t): out[t] for t in sorted(out)}, indent=2) + "\n"
    (Path(tables) / path.name).write_text(text)
    print(path.name, text)
