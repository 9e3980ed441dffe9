"""Reading and writing Hugging Face safetensors checkpoints a tensor at a time, and committing output atomically.

Checkpoints can be larger than RAM: the reader memory-maps each shard and hands out one tensor at a time; the
writer holds at most one output shard before saving it. Outputs are built in a hidden sibling directory and
renamed into place at the end, so a failed or interrupted run leaves no half-written model behind.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import torch
from safetensors.torch import save_file

from ..errors import CheckpointError, SamoyedsError
from ..format.shards import INDEX_NAME, open_shard, shard_files

SINGLE_NAME = "model.safetensors"
DEFAULT_MAX_SHARD_BYTES = 2 * 1024**3


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


# what open() and mkdir() would give: tempfile's private 0600 files and 0700 directories would keep the model from
# other users, or from a server running under another uid
_UMASK = _umask()
_FILE_MODE, _DIR_MODE = 0o666 & ~_UMASK, 0o777 & ~_UMASK


def read_config(model_dir: Path) -> dict:
    """config.json of a model directory, with errors that say what is wrong."""
    if not model_dir.exists():
        hint = ""
        if re.fullmatch(r"[\w.-]+/[\w.-]+", str(model_dir)) and not str(model_dir).startswith("."):
            # what vLLM would download: these tools read local checkpoints only
            hint = f" (a Hugging Face model? download it first: hf download {model_dir} --local-dir DIR)"
        raise CheckpointError(f"{model_dir}: no such directory{hint}")
    if not model_dir.is_dir():
        raise CheckpointError(f"{model_dir}: not a directory")
    path = model_dir / "config.json"
    try:
        config = json.loads(path.read_text())
    except FileNotFoundError:
        raise CheckpointError(f"{model_dir}: no config.json, so not a Hugging Face model directory") from None
    except (OSError, UnicodeDecodeError) as e:
        raise CheckpointError(f"{path}: cannot read: {e}") from None
    except json.JSONDecodeError as e:
        raise CheckpointError(f"{path}: not valid JSON ({e})") from None
    if not isinstance(config, dict):
        raise CheckpointError(f"{path}: expected a JSON object")
    return config


#: Model dtypes by their config.json names.
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def dtype_of(config: dict) -> torch.dtype:
    """The model's dtype as config.json names it (`torch_dtype`, or transformers 5's `dtype`); bfloat16 if absent."""
    name = config.get("torch_dtype") or config.get("dtype") or "bfloat16"
    if name not in DTYPES:
        raise CheckpointError(f"config.json: dtype {name!r} is not one of {', '.join(DTYPES)}")
    return DTYPES[name]


class CheckpointReader:
    """The safetensors weights of a model directory. Opening checks every shard's header and size, so a
    truncated or corrupted file is reported before any work starts."""

    def __init__(self, model_dir: Path):
        self.model_dir = model_dir
        files = shard_files(model_dir)
        if not files:
            raise CheckpointError(f"{model_dir}: no *.safetensors weights (other weight formats are not supported)")
        self._handles = {}
        self._file_of: dict[str, str] = {}
        for path in files:
            handle = self._handles[path.name] = open_shard(path)
            for key in handle.keys():
                if key in self._file_of:
                    raise CheckpointError(f"{path}: tensor {key} also appears in {self._file_of[key]}")
                self._file_of[key] = path.name

    def names(self) -> list[str]:
        """Every tensor name, shard by shard, in file order."""
        return list(self._file_of)

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self._handles[self._file_of[name]].get_slice(name).get_shape())

    def itemsize(self, name: str) -> int:
        """Bytes of one stored value of `name`, from its header (safetensors' dtype names: BF16, F8_E4M3, ...)."""
        dtype = self._handles[self._file_of[name]].get_slice(name).get_dtype()
        return 1 if dtype == "BOOL" else int(re.search(r"\d+", dtype)[0]) // 8

    def get(self, name: str) -> torch.Tensor:
        try:
            return self._handles[self._file_of[name]].get_tensor(name)
        except KeyError:
            raise CheckpointError(f"{self.model_dir}: no tensor named {name}") from None
        except Exception as e:
            raise CheckpointError(f"{self.model_dir / self._file_of[name]}: cannot read {name} ({e})") from None


class ShardedWriter:
    """Writes tensors into `model-0000i-of-0000N.safetensors` shards of at most `max_shard_bytes` (one
    `model.safetensors` when a single shard), plus the index, holding one shard in memory at a time."""

    def __init__(self, out_dir: Path, max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES):
        self.out_dir = out_dir
        self.max_shard_bytes = max_shard_bytes
        self._pending: dict[str, torch.Tensor] = {}
        self._pending_bytes = 0
        self._shards: list[list[str]] = []
        self.total_bytes = 0

    def add(self, name: str, tensor: torch.Tensor) -> None:
        size = tensor.numel() * tensor.element_size()
        if self._pending and self._pending_bytes + size > self.max_shard_bytes:
            self._flush()
        self._pending[name] = tensor.contiguous()
        self._pending_bytes += size
        self.total_bytes += size

    def _flush(self) -> None:
        path = self.out_dir / f"shard-{len(self._shards)}.tmp"
        save_file(self._pending, str(path), metadata={"format": "pt"})
        path.chmod(_FILE_MODE)  # safetensors writes through a private (0600) temporary file
        self._shards.append(list(self._pending))
        self._pending, self._pending_bytes = {}, 0

    def close(self) -> None:
        """Save the last shard, give the shards their final names and write the index."""
        if self._pending or not self._shards:
            self._flush()
        n = len(self._shards)
        if n == 1:
            os.replace(self.out_dir / "shard-0.tmp", self.out_dir / SINGLE_NAME)
            return
        weight_map = {}
        for i, names in enumerate(self._shards):
            final = f"model-{i + 1:05d}-of-{n:05d}.safetensors"
            os.replace(self.out_dir / f"shard-{i}.tmp", self.out_dir / final)
            weight_map.update(dict.fromkeys(names, final))
        index = {"metadata": {"total_size": self.total_bytes}, "weight_map": weight_map}
        (self.out_dir / INDEX_NAME).write_text(json.dumps(index, indent=2) + "\n")


def check_output_dir(out_dir: Path, force: bool, what: str = "output directory", inputs: tuple[Path, ...] = ()) -> None:
    """Refuse to replace an existing directory unless forced, and even then anything but a model directory
    (or an empty one), so a mistyped path loses nothing; and refuse an output that is one of `inputs`, lies inside
    one or holds one (replacing it would delete the input)."""
    out = Path(out_dir).resolve()
    for source in inputs:
        source = Path(source).resolve()
        if out == source:
            raise SamoyedsError(f"{what} {out_dir} is the input directory {source}; write the output elsewhere")
        if out.is_relative_to(source):
            raise SamoyedsError(f"{what} {out_dir} is inside the input directory {source}; write the output elsewhere")
        if source.is_relative_to(out):
            raise SamoyedsError(f"{what} {out_dir} holds the input directory {source}; write the output elsewhere")
    check_writable_place(out_dir, what)
    if out.parent.is_dir() and any(out.parent.glob(_REPLACED.format(name=out.name))):
        with _output_lock(out):  # a previous output a stopped run had moved aside: back first, then judged as one
            _remove_stale_partials(out)
    if out_dir.exists() and not _empty_folder(out_dir):  # an empty one (made beforehand) holds nothing to lose
        if not force:
            raise SamoyedsError(f"{what} {out_dir} already exists; choose another path or pass --force to replace it")
        if not out_dir.is_dir():
            raise SamoyedsError(f"{what} {out_dir} exists and is not a directory; not replacing it")
        if any(out_dir.iterdir()) and not (out_dir / "config.json").is_file():
            raise SamoyedsError(
                f"{what} {out_dir} is not empty and holds no config.json, so it does not look "
                "like a model; not replacing it"
            )


def nearest_existing(path: Path) -> Path:
    """What exists nearest above `path` (made absolute): where writing it starts."""
    place = Path(os.path.abspath(path)).parent
    while not place.exists():
        place = place.parent
    return place


def check_writable_place(path: Path, what: str) -> None:
    """Refuse, before any work, a `path` to write whose nearest existing parent is a file or a folder this user
    cannot write in: it failed only at the end, with a traceback."""
    place = nearest_existing(path)
    if not place.is_dir():
        raise SamoyedsError(f"{what} {path}: {place} is a file, not a folder")
    if not os.access(place, os.W_OK | os.X_OK):
        raise SamoyedsError(f"{what} {path}: cannot write in {place}")


def _empty_folder(path: Path) -> bool:
    return path.is_dir() and not path.is_symlink() and not any(path.iterdir())


def _tree_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file() and not f.is_symlink())


def check_free_space(needs: dict[Path, int], what: str) -> None:
    """Refuse writes of about `needs[target]` bytes beside each target (where staged_dirs writes; targets on one
    file system added) when its file system has less free: said now, not as a raw OSError after minutes of work.
    Partial outputs of killed runs count as free: staged_dirs removes them before it writes."""
    by_device: dict[int, tuple[Path, int, int]] = {}
    for target, size in needs.items():
        target = Path(os.path.abspath(target))
        place = nearest_existing(target)
        stale = sum(_tree_bytes(p) for pattern in _STALE for p in place.glob(pattern.format(name=target.name)))
        device = place.stat().st_dev
        first, total, freed = by_device.get(device, (place, 0, 0))
        by_device[device] = (first, total + size, freed + stale)
    for place, size, stale in by_device.values():
        free = shutil.disk_usage(place).free + stale
        if size > free:
            raise SamoyedsError(
                f"{what} needs about {size / 2**30:.1f} GiB in {place}, which has {free / 2**30:.1f} GiB free; "
                "free some space or write elsewhere"
            )


@contextlib.contextmanager
def _output_lock(target: Path) -> Iterator[None]:
    """Hold `.NAME.lock` beside `target` for the whole write, so two runs never write one output at once. The lock
    file is removed when done; a run that locked a file already removed (its inode no longer at the path) retries
    on the new one, so a removed lock never lets two runs in."""
    lock = target.parent / f".{target.name}.lock"
    while True:
        fd = os.open(lock, os.O_CREAT | os.O_RDWR, _FILE_MODE)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            os.close(fd)
            raise SamoyedsError(
                f"another process is writing {target} (it holds {lock}); wait for it or choose another output"
            ) from None
        try:
            if os.fstat(fd).st_ino == os.stat(lock).st_ino:
                break
        except FileNotFoundError:
            pass
        os.close(fd)
    try:
        yield
    finally:
        os.unlink(lock)
        os.close(fd)


#: What runs that were killed leave beside a target: its partial output, and a previous output it was replacing.
_PARTIAL, _REPLACED = ".{name}.partial-*", ".{name}.replaced-*"
_STALE = (_PARTIAL, _REPLACED)


def _remove_stale_partials(target: Path) -> None:
    """Partial outputs of earlier runs that were killed: no live run owns them while we hold the lock. A run killed
    between moving the previous output aside and its own into place left the target missing: the previous output
    goes back."""
    for stale in target.parent.glob(_PARTIAL.format(name=target.name)):
        shutil.rmtree(stale, ignore_errors=True)
        print(f"removed {stale}, left by an earlier run that did not finish", file=sys.stderr)
    for stale in target.parent.glob(_REPLACED.format(name=target.name)):
        if target.exists():
            shutil.rmtree(stale, ignore_errors=True)
        else:
            os.replace(stale, target)
            print(f"restored {target}, which an earlier run was replacing when it was stopped", file=sys.stderr)


@contextlib.contextmanager
def staged_dirs(*targets: Path, replace: bool = False) -> Iterator[list[Path]]:
    """Temporary sibling directories that become `targets` only if the block finishes; removed otherwise. Each
    target is locked for the duration (a second run into it is refused), stale partial outputs of killed runs are
    removed first, and a target that appears meanwhile is replaced only with `replace`."""
    targets = tuple(Path(os.path.abspath(t)) for t in targets)
    for target in targets:
        target.parent.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as locks:
        for target in targets:
            locks.enter_context(_output_lock(target))
            _remove_stale_partials(target)
        staged: list[Path] = []
        try:
            for target in targets:
                staged.append(Path(tempfile.mkdtemp(prefix=f".{target.name}.partial-", dir=target.parent)))
                staged[-1].chmod(_DIR_MODE)
            yield staged
            for target in targets:
                if target.exists() and not replace and not _empty_folder(target):
                    raise SamoyedsError(f"{target} appeared while this run was writing it; not replacing it")
        except BaseException:
            for tmp in staged:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
        for tmp, target in zip(staged, targets, strict=True):
            if target.exists():
                old = tmp.with_name(tmp.name.replace(".partial-", ".replaced-"))
                os.replace(target, old)
                os.replace(tmp, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(tmp, target)
