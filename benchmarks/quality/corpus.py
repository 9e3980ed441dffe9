"""Real English prose for the reference model, from Debian packages (no data set can be downloaded here).

    python benchmarks/quality/corpus.py OUT [--allow-newer]

Downloads the pinned packages with `apt-get download` (root, network to a Debian mirror), checks their sha256,
unpacks them with `dpkg-deb -x` (nothing is installed) and keeps their reStructuredText sources: Python 3.11's
documentation and the Linux kernel's. Documents (files) are split into train / validation / test by a hash of
their path, so the split never depends on the order of files and test text is never trained on. Writes
OUT/{train,validation,test}.jsonl ({"text", "source"} per document) and OUT/manifest.json (versions, hashes,
counts). Only the newest python3.11-doc may stay in the archive: when the pinned version is gone the script says
so, and takes the archive's version only with --allow-newer (recording its hash).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
import tempfile
from pathlib import Path

PACKAGES = [
    # (package, version, sha256 of the .deb, glob of the documents inside it)
    (
        "python3.11-doc",
        "3.11.2-6+deb12u9",
        "5b3594189d6ef9a6963ce0347fd307a1cc67620ad697e144db366070e2e146be",
        "usr/share/doc/python3.11/html/_sources/**/*.rst.txt",
    ),
    (
        "linux-doc-6.1",
        "6.1.192-2",
        "d1d1b5a602f0d439ecc39e713e044bf2df30d839fb4bf8a7b859ba3273c47993",
        "usr/share/doc/linux-doc-6.1/html/_sources/**/*.rst.txt",
    ),
]
#: Percent of documents in validation and test (by path hash); the rest is train.
VALIDATION_PERCENT, TEST_PERCENT = 2, 2


def split_of(path: str) -> str:
    bucket = int(hashlib.sha256(path.encode()).hexdigest(), 16) % 100
    if bucket < TEST_PERCENT:
        return "test"
    if bucket < TEST_PERCENT + VALIDATION_PERCENT:
        return "validation"
    return "train"


def sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with path.open("rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def download(package: str, version: str, expected: str, work: Path, allow_newer: bool) -> tuple[Path, str, str]:
    run = subprocess.run(["apt-get", "download", f"{package}={version}"], cwd=work, capture_output=True, text=True)
    if run.returncode != 0:
        if not allow_newer:
            sys.exit(
                f"{package}={version} cannot be downloaded ({run.stderr.strip()}); the archive may have replaced it. "
                "Run `apt-get update` first, or pass --allow-newer to take the archive's version (the manifest "
                "records it, and results are then not comparable with the pinned corpus)."
            )
        run = subprocess.run(["apt-get", "download", package], cwd=work, capture_output=True, text=True)
        if run.returncode != 0:
            sys.exit(f"{package} cannot be downloaded: {run.stderr.strip()}")
    deb = next(work.glob(f"{package}_*.deb"))
    got = sha256(deb)
    actual_version = deb.name.split("_")[1].replace("%2b", "+")
    if actual_version == version and got != expected:
        sys.exit(f"{deb.name}: sha256 {got} differs from the pinned {expected}")
    return deb, actual_version, got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("out", type=Path)
    parser.add_argument("--allow-newer", action="store_true", help="take the archive's version if the pin is gone")
    args = parser.parse_args()
    if args.out.exists():
        sys.exit(f"{args.out} exists; remove it or choose another directory")
    manifest = {"packages": [], "splits": {}, "validation_percent": VALIDATION_PERCENT, "test_percent": TEST_PERCENT}
    splits: dict[str, list[dict]] = {"train": [], "validation": [], "test": []}
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        for package, version, expected, glob in PACKAGES:
            deb, actual, digest = download(package, version, expected, work, args.allow_newer)
            root = work / package
            subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
            files = sorted(root.glob(glob))
            for f in files:
                text = f.read_text(encoding="utf-8", errors="replace")
                if text.strip():
                    source = f"{package}/{f.relative_to(root)}"
                    splits[split_of(source)].append({"text": text, "source": source})
            manifest["packages"].append(
                {
                    "package": package,
                    "version": actual,
                    "sha256": digest,
                    "pinned": actual == version,
                    "files": len(files),
                }
            )
    args.out.mkdir(parents=True)
    for name, docs in splits.items():
        with (args.out / f"{name}.jsonl").open("w") as f:
            for doc in docs:
                f.write(json.dumps(doc) + "\n")
        manifest["splits"][name] = {"documents": len(docs), "bytes": sum(len(d["text"].encode()) for d in docs)}
    (args.out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    print(json.dumps(manifest, indent=2))


if __name__ == "__main__":
    main()
