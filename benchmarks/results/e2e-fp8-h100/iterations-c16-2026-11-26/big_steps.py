"""How many of the timed run's 256 requests were prefilled in steps of more than 512 tokens (past vLLM's default
CUDA-graph sizes), from it-VARIANT.txt: vLLM's per-iteration log lines (--enable-logging-iteration-details) as
`index context_requests context_tokens generation_requests generation_tokens elapsed_ms`, extracted by
sed -E 's/.*Iteration\(([0-9]+)\): ([0-9]+) context requests, ([0-9]+) context tokens, ([0-9]+) generation requests,
([0-9]+) generation tokens, iteration elapsed time: ([0-9.]+) ms.*/\1 \2 \3 \4 \5 \6/' from the server log."""

import sys

for variant in sys.argv[1:] or ["samoyeds-fp8", "dense-fp8"]:
    rows = [list(map(float, line.split())) for line in open(f"it-{variant}.txt")]
    prefills, requests = [], 0
    for row in reversed([r for r in rows if r[1] > 0]):  # the last steps with prefills: the timed run's
        if requests >= 256:
            break
        prefills.append(row)
        requests += row[1]
    big = sum(r[1] for r in prefills if r[2] + r[4] > 512)
    print(f"{variant}: {int(big)} of {int(requests)} requests prefilled in steps over 512 tokens, {len(prefills)} steps")
