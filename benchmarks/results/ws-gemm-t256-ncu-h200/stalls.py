"""Warp-state samples of the two ws GEMMs by role and by SASS instruction, from Nsight Compute's source page.

    python stalls.py [source-fp8.csv.gz]

The page (`ncu --import R --page source --csv --print-source cuda,sass`) lists each csrc line and under it the SASS
instructions compiled from it (an inlined helper's instruction once under each line it came through). Its source
text is not CSV-escaped (quotes inside asm strings), so rows are split from the right on the column separator.
Each SASS instruction is taken once, by address, under the role of the kernel code around it: gemm_ws.cuh lines
before the MMA branch are the copier's, that branch and fold.cuh / epilogue.cuh the MMA warpgroups'; inlined helpers
(ptx.cuh, tiles.cuh) take the role of the last instruction before them. Shares are of all samples of the kernel.
"""

import collections
import gzip
import sys

MMA_BRANCH_LINE = 238  # gemm_ws.cuh: `} else {  // ---- an MMA warpgroup` (csrc at 4e16755)


def rows(path: str):
    columns = None
    with gzip.open(path, "rt") as f:
        for line in f:
            text = line.rstrip("\n")
            if not text.startswith('"'):
                continue
            body = text[1:-1]
            if columns is None or body.startswith(("File Path", "Function Name", "Line No")):
                fields = body.split('","')
                if fields[0] == "Line No":
                    columns = fields
                yield [fields[0], '","'.join(fields[1:])] if fields[0] != "Line No" else fields
                continue
            tail = body.rsplit('","', len(columns) - 2)
            yield tail[0].split('","', 1) + tail[1:]


def main(path: str) -> None:
    kernel = source_file = header = None
    line_no = 0
    seen = set()
    instructions = collections.defaultdict(list)  # kernel -> [(address, file, line, samples, stalls, sass)]
    for row in rows(path):
        if row[0] == "File Path":
            source_file = row[1].rsplit("/", 1)[-1]
        elif row[0] == "Function Name":
            kernel = "GEMM 1 (gate/up)" if "(bool)1, (bool)1>" in row[1] else "GEMM 2 (down)"
        elif row[0] == "Line No":
            header = row
        elif row[0]:
            line_no = int(row[0])
        elif header and row[2].startswith("0x") and (kernel, row[2]) not in seen:
            seen.add((kernel, row[2]))
            cells = dict(zip(header, row))
            stalls = {
                name[len("stall_") :]: int(value)
                for name, value in cells.items()
                if name.startswith("stall_") and "Not Issued" not in name and value not in ("", "-") and int(value)
            }
            samples = int(cells["Warp Stall Sampling (All Samples)"] or 0)
            instructions[kernel].append((int(row[2], 16), source_file, line_no, samples, stalls, row[3].split()[0]))
    for kernel, found in sorted(instructions.items()):
        found.sort()
        total = sum(i[3] for i in found)
        by_role = collections.defaultdict(collections.Counter)
        by_place = collections.defaultdict(collections.Counter)
        role = "set-up"
        for _, source, line, samples, stalls, opcode in found:
            if source == "gemm_ws.cuh":
                role = "copier" if line < MMA_BRANCH_LINE else "MMA"
            elif source in ("fold.cuh", "epilogue.cuh"):
                role = "MMA"
            for counter in (by_role[role], by_place[(role, source, line, opcode)]):
                counter.update(stalls)
                counter["samples"] += samples
        print(f"{kernel}: {total} samples")
        for name, c in sorted(by_role.items(), key=lambda kv: -kv[1]["samples"]):
            reasons = ", ".join(f"{r} {100 * v / total:.1f}%" for r, v in c.most_common(7) if r != "samples")
            print(f"  {name}: {100 * c['samples'] / total:.1f}% ({reasons})")
        print("  the 12 instructions with most samples:")
        for (name, source, line, opcode), c in sorted(by_place.items(), key=lambda kv: -kv[1]["samples"])[:12]:
            reasons = ", ".join(f"{r} {v}" for r, v in c.most_common(4) if r != "samples")
            print(f"    {100 * c['samples'] / total:4.1f}%  {name:6s} {source}:{line} {opcode} ({reasons})")


if __name__ == "__main__":
    main(sys.argv[1] if len(sys.argv) > 1 else "source-fp8.csv.gz")
