"""The docs' links and the results folders they cite exist: a folder removed or a heading renamed fails here, not in
a reader's browser."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = sorted([ROOT / "README.md", ROOT / "benchmarks" / "README.md", *(ROOT / "docs").glob("*.md")])
DOCS += sorted((ROOT / "configs").rglob("README.md"))
LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")
# A results folder cited by path; one read through `git show REV:benchmarks/results/...` is history, not a folder.
RESULTS_PATH = re.compile(r"(?<![:\w/])benchmarks/results/([a-z0-9][a-z0-9_.-]*)")


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of a file: lower case, punctuation dropped, spaces as hyphens, a
    repeated heading numbered from -1 (code blocks hold no headings)."""
    anchors: set[str] = set()
    seen: dict[str, int] = {}
    in_code = False
    for line in markdown.splitlines():
        if line.startswith("```"):
            in_code = not in_code
        if in_code or not re.match(r"#{1,6} ", line):
            continue
        slug = re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def test_anchor_rule_matches_github():
    anchors = github_anchors("## Qwen3-235B-A22B: one H200 (`benchmarks/results/x-h200x2/`)\n## Results\n## Results\n")
    assert anchors == {"qwen3-235b-a22b-one-h200-benchmarksresultsx-h200x2", "results", "results-1"}


@pytest.mark.parametrize("doc", DOCS, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve(doc: Path):
    broken = []
    for target in LINK.findall(doc.read_text()):
        if re.match(r"[a-z]+:", target):  # https:, mailto:
            continue
        path, _, anchor = target.partition("#")
        file = (doc.parent / path).resolve() if path else doc
        if not file.exists():
            broken.append(f"{target}: no such file")
        elif anchor and file.suffix == ".md" and anchor not in github_anchors(file.read_text()):
            broken.append(f"{target}: no heading with that anchor in {file.relative_to(ROOT)}")
    assert not broken, f"{doc.relative_to(ROOT)}: " + "; ".join(broken)


def cited_results(files) -> dict[str, list[str]]:
    cited: dict[str, list[str]] = {}
    for file in files:
        for name in RESULTS_PATH.findall(file.read_text(errors="replace")):
            cited.setdefault(name.rstrip("."), []).append(str(file.relative_to(ROOT)))
    return cited


def test_cited_results_folders_exist():
    files = [*DOCS, *(ROOT / "samoyeds_vllm").rglob("*.py"), *(ROOT / "benchmarks").glob("*.py")]
    files += [f for f in (ROOT / "tests").rglob("*.py") if f != Path(__file__)] + [*(ROOT / "scripts").glob("*.sh")]
    missing = {
        name: sorted(set(where))
        for name, where in cited_results(files).items()
        if not (ROOT / "benchmarks" / "results" / name).exists()
    }
    assert not missing, f"results folders cited but not in benchmarks/results/: {missing}"


def test_every_option_says_its_default():
    """`samoyeds-vllm COMMAND --help` gives each option's default where it has one (a value other than none / off)."""
    import argparse

    from samoyeds_vllm.cli import build_parser

    def parsers(parser):
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    yield name, sub
                    yield from ((f"{name} {n}", s) for n, s in parsers(sub))

    silent = []
    for name, sub in parsers(build_parser()):
        text = sub.format_help()
        for action in sub._actions:
            if action.option_strings and action.default not in (None, False, argparse.SUPPRESS):
                if not action.help:
                    silent.append(f"{name} {action.option_strings[-1]}: no help")
                elif "default" not in sub._get_formatter()._expand_help(action):
                    silent.append(f"{name} {action.option_strings[-1]}")
        assert text
    assert silent == []
