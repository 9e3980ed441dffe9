"""Text for evaluation and calibration: one loader for every data source, and token windows cut from it.

A SOURCE is, in this order of checks:
- a local file: `.jsonl` / `.json` / `.parquet` (one document per record, read by Hugging Face `datasets`, the text
  in `text_field`), or any other file, read as one UTF-8 text document;
- a local directory: every file in it (recursively, sorted by path) read as above;
- otherwise a Hugging Face `datasets` name, `NAME` or `NAME:CONFIG` (needs network, or the datasets cache).

Documents stay apart (evaluation scores each from its start; calibration draws windows across their
concatenation, documents joined by the tokenizer's end-of-text token).
"""

from __future__ import annotations

import random
import re
from dataclasses import dataclass
from pathlib import Path

from ..errors import SamoyedsError

RECORD_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet"}


class DataError(SamoyedsError):
    """A data source that is missing, unreadable, empty or too short for what was asked."""


def _records(path: Path, text_field: str) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{path}: reading {path.suffix} files needs the `datasets` package") from None
    datasets.disable_progress_bars()
    try:
        table = datasets.load_dataset(RECORD_SUFFIXES[path.suffix], data_files=str(path), split="train")
    except Exception as e:  # datasets raises many kinds for malformed files
        raise DataError(f"{path}: cannot read as {path.suffix[1:]}: {e}") from None
    if text_field not in table.column_names:
        raise DataError(f"{path}: no field {text_field!r} (fields: {', '.join(table.column_names)}); see --text-field")
    return [t for t in table[text_field] if isinstance(t, str)]


def _file_documents(path: Path, text_field: str) -> list[str]:
    if path.suffix in RECORD_SUFFIXES:
        return _records(path, text_field)
    try:
        return [path.read_text(encoding="utf-8")]
    except UnicodeDecodeError:
        raise DataError(f"{path}: not UTF-8 text") from None
    except OSError as e:
        raise DataError(f"{path}: cannot read: {e}") from None


def _hub_documents(name: str, split: str, text_field: str) -> list[str]:
    try:
        import datasets
    except ImportError:
        raise DataError(f"{name!r} is not a local file or directory, and `datasets` is not installed") from None
    repo, _, config = name.partition(":")
    try:
        table = datasets.load_dataset(repo, config or None, split=split)
    except Exception as e:
        raise DataError(
            f"{name!r} is not a local file or directory, and the Hugging Face dataset of that name cannot be "
            f"loaded: {e}"
        ) from None
    if text_field not in table.column_names:
        raise DataError(f"{name}: no field {text_field!r} (fields: {', '.join(table.column_names)})")
    return [t for t in table[text_field] if isinstance(t, str)]


def load_documents(source: str | Path, *, split: str = "test", text_field: str = "text") -> list[str]:
    """The non-empty documents of SOURCE (module docstring), in a stable order. `split` applies to hub
    datasets only. Raises DataError when there is nothing to read."""
    path = Path(source)
    if path.is_dir():
        files = sorted(p for p in path.rglob("*") if p.is_file() and not p.name.startswith("."))
        docs = [d for f in files for d in _file_documents(f, text_field)]
    elif path.is_file():
        docs = _file_documents(path, text_field)
    elif str(source).startswith((".", "/", "~")) or re.fullmatch(r"\.[A-Za-z]\w{0,5}", path.suffix):
        # a file name (a letter-led extension: a hub dataset's name may end in a version such as "-1.0")
        raise DataError(f"{source}: no such file or directory")
    else:
        docs = _hub_documents(str(source), split, text_field)
    docs = [d for d in docs if d.strip()]
    if not docs:
        raise DataError(f"{source}: no text in it")
    return docs


@dataclass(frozen=True)
class TokenizedDocuments:
    """Each document's token ids, and its length in UTF-8 bytes (for bits per byte)."""

    ids: list[list[int]]
    num_bytes: list[int]

    @property
    def num_tokens(self) -> int:
        return sum(len(i) for i in self.ids)


def tokenize_documents(tokenizer, docs: list[str]) -> TokenizedDocuments:
    """Token ids of each document without special tokens (the caller decides what goes in front)."""
    ids = tokenizer(docs, add_special_tokens=False)["input_ids"]
    return TokenizedDocuments(ids=list(ids), num_bytes=[len(d.encode("utf-8")) for d in docs])


def separator_id(tokenizer) -> int:
    """The token that starts every scored document and joins documents in calibration streams: BOS when the
    tokenizer has one, else its end-of-text token (what a model trained on packed documents saw there)."""
    for token_id in (tokenizer.bos_token_id, tokenizer.eos_token_id):
        if token_id is not None:
            return int(token_id)
    raise DataError("the tokenizer has neither a BOS nor an EOS token to separate documents")


def _token_stream(tokenizer, docs: list[str]) -> list[int]:
    """The documents' tokens, each document after the separator token."""
    sep = separator_id(tokenizer)
    stream: list[int] = []
    for ids in tokenize_documents(tokenizer, docs).ids:
        stream += [sep, *ids]
    return stream


def token_windows(tokenizer, docs: list[str], seq_len: int) -> list[list[int]]:
    """Every non-overlapping window of `seq_len` tokens of the documents joined by the separator token, in order."""
    if seq_len < 2:
        raise DataError(f"windows need at least 2 tokens, not {seq_len}")
    stream = _token_stream(tokenizer, docs)
    return [stream[s : s + seq_len] for s in range(0, len(stream) - seq_len + 1, seq_len)]


def calibration_windows(tokenizer, docs: list[str], samples: int, seq_len: int, seed: int) -> list[list[int]]:
    """`samples` windows of `seq_len` tokens, distinct and non-overlapping, drawn at random (seeded) from the
    documents joined by the separator token. Raises DataError saying how many tokens were given and needed."""
    if samples < 1 or seq_len < 2:
        raise DataError(f"calibration needs at least 1 sample of at least 2 tokens, not {samples} x {seq_len}")
    stream = _token_stream(tokenizer, docs)
    needed = samples * seq_len
    if len(stream) < needed:
        raise DataError(
            f"calibration data gives {len(stream)} tokens, but {samples} samples of {seq_len} tokens need {needed}; "
            "give more text or ask for fewer or shorter samples"
        )
    starts = random.Random(seed).sample(range(len(stream) // seq_len), samples)
    return [stream[s * seq_len : (s + 1) * seq_len] for s in sorted(starts)]
