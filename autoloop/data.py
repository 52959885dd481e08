"""Corpus sources, the pinned train/validation/audit split, and byte-level batching.

A prepared dataset is a directory holding ``train.bin``, ``val.bin``, ``audit.bin``
(raw bytes: the tokens *are* the bytes, vocabulary 256, so bits per byte is exact)
and ``meta.json`` (sources, sizes, fingerprint). It is built once by
``autoloop prepare`` (or on first use by ``load_data``) and only read afterwards.

Why the split is keyed on a hash of each unit's relative path and never on its
position: adding or removing one file then moves only that file, and the same corpus
gives the same split on every machine. The validation slice has a fixed size so that
every trial is scored on exactly the same bytes. The fingerprint covers those bytes
and the training manifest, so results measured on different data are never compared.

Building streams: units are read one at a time and appended to the split files, so a
corpus of gigabytes (a named public one, ``autoloop.corpora``) is prepared in bounded
memory. A path's units are still ordered by a hash of their key (only the keys are held,
never the bytes); a named corpus's documents keep the order of its shards.
"""

from __future__ import annotations

import glob as globlib
import hashlib
import json
import os
import shutil
import sys
import sysconfig
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np

from autoloop.core.errors import AutoloopError
from autoloop.corpora import MISSING_EXTRA, HubCorpus, fetch, named

if TYPE_CHECKING:   # torch is imported when batches are made: train.py's process has it, prepare does not need it
    import torch

FORMAT_VERSION = 1
DEFAULT_VAL_BYTES = 512 * 1024
DEFAULT_AUDIT_BYTES = 128 * 1024
# Files are cut into units of at most this size before splitting, so that a corpus of
# one large text file can still be split; nearly every stdlib module fits in one unit.
UNIT_BYTES = 64 * 1024
SPLITS = ("train", "val", "audit")
VAL_FRACTION = 0.10
AUDIT_FRACTION = 0.05
# Written between units so the model can tell where one document ends.
SEPARATOR = b"\x00"
_SPLIT_SALT = b"autoloop-split-v1:"
# Directory names in the standard library that hold test suites and fixtures: noisy
# data (encoded blobs, deliberately broken files) that is not representative code.
_STDLIB_SKIP_DIRS = {"site-packages", "dist-packages", "test", "tests", "idle_test", "__pycache__"}


class DataError(AutoloopError):
    """A corpus or prepared dataset that cannot be used; the message is one line for the user."""


@dataclass(frozen=True)
class CorpusSpec:
    """Where the text comes from: ``stdlib``, a named public corpus (``autoloop.corpora``)
    or a user path (directory, file or glob)."""

    source: str = "stdlib"
    val_bytes: int = DEFAULT_VAL_BYTES
    audit_bytes: int = DEFAULT_AUDIT_BYTES
    shards: int | None = None   # a named corpus: how many of its shards (None: its default)

    @property
    def is_stdlib(self) -> bool:
        return self.source == "stdlib"

    @property
    def hub(self) -> HubCorpus | None:
        return named(self.source)

    @property
    def shard_count(self) -> int:
        hub = self.hub
        return self.shards or (hub.default_shards if hub else 0)

    def source_id(self) -> str:
        """What meta.json's ``source`` holds for this spec."""
        if self.is_stdlib or self.hub:
            return self.source
        return os.path.abspath(os.path.expanduser(self.source))

    def cache_name(self) -> str:
        """A directory name that differs whenever the prepared bytes would differ."""
        if self.is_stdlib:
            base = f"stdlib-py{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
        elif self.hub:
            base = f"hub-{self.source}"   # the shard count is in meta.json: --shards N rebuilds it there
        else:
            resolved = os.path.abspath(os.path.expanduser(self.source))
            tag = hashlib.sha256(resolved.encode()).hexdigest()[:10]
            stem = Path(resolved.rstrip("*/")).name or "corpus"
            stem = "".join(c if c.isalnum() or c in "-_." else "_" for c in stem)[:40]
            base = f"text-{stem}-{tag}"
        if (self.val_bytes, self.audit_bytes) != (DEFAULT_VAL_BYTES, DEFAULT_AUDIT_BYTES):
            base += f"-v{self.val_bytes}-a{self.audit_bytes}"
        return base


def cache_root() -> Path:
    """The per-user cache directory for prepared datasets."""
    xdg = os.environ.get("XDG_CACHE_HOME")
    return Path(xdg) / "autoloop" if xdg else Path.home() / ".cache" / "autoloop"


def hub_dir(corpus: HubCorpus) -> Path:
    """Where a named corpus's shards are downloaded to (and kept: a rebuild reads them again)."""
    return cache_root() / "hub" / corpus.name


def default_data_dir(spec: CorpusSpec | None = None) -> Path:
    """``$AUTOLOOP_DATA_DIR`` when set, else the per-user cache directory for ``spec``."""
    env = os.environ.get("AUTOLOOP_DATA_DIR")
    if env:
        return Path(env)
    return cache_root() / (spec or CorpusSpec()).cache_name()


# --------------------------------------------------------------------------- sources


def stdlib_root() -> Path:
    return Path(sysconfig.get_paths()["stdlib"])


def _stdlib_files() -> tuple[Path, list[Path]]:
    root = stdlib_root()
    files: list[Path] = []
    for dirpath, dirnames, filenames in os.walk(root):
        # Sorted in place so the walk order never depends on the file system.
        dirnames[:] = sorted(d for d in dirnames if d not in _STDLIB_SKIP_DIRS)
        files.extend(Path(dirpath) / f for f in sorted(filenames) if f.endswith(".py"))
    return root, files


def _looks_like_text(path: Path) -> bool:
    with open(path, "rb") as f:
        head = f.read(8192)
    return b"\x00" not in head


def _user_files(source: str) -> tuple[Path, list[Path]]:
    expanded = os.path.expanduser(source)
    if globlib.has_magic(expanded):
        matches = sorted(Path(p) for p in globlib.glob(expanded, recursive=True))
        files = [p for p in matches if p.is_file()]
        if not files:
            raise DataError(f"corpus glob '{source}' matches no files")
        root = Path(os.path.commonpath([str(p.parent.resolve()) for p in files]))
        files = [p.resolve() for p in files]
    else:
        path = Path(expanded)
        if not path.exists():
            raise DataError(f"corpus path '{source}' does not exist")
        if path.is_file():
            root, files = path.resolve().parent, [path.resolve()]
        else:
            root = path.resolve()
            files = []
            for dirpath, dirnames, filenames in os.walk(root):
                dirnames[:] = sorted(d for d in dirnames if not d.startswith("."))
                files.extend(Path(dirpath) / f for f in sorted(filenames) if not f.startswith("."))
    texts = [p for p in files if p.stat().st_size > 0 and _looks_like_text(p)]
    if not texts:
        raise DataError(f"corpus '{source}' has no non-empty text files")
    return root, texts


# --------------------------------------------------------------------------- split


def split_of(key: str) -> str:
    """``train``, ``val`` or ``audit`` for a unit key, from a salted hash of the key alone."""
    digest = hashlib.sha256(_SPLIT_SALT + key.encode("utf-8", "surrogateescape")).digest()
    bucket = int.from_bytes(digest[:8], "big") / 2**64
    if bucket < VAL_FRACTION:
        return "val"
    if bucket < VAL_FRACTION + AUDIT_FRACTION:
        return "audit"
    return "train"


def _order_key(key: str) -> bytes:
    return hashlib.sha256(b"autoloop-order-v1:" + key.encode("utf-8", "surrogateescape")).digest()


Unit = tuple[str, str, bytes]   # (split, key, bytes)


def _path_units(root: Path, files: list[Path]) -> Iterator[Unit]:
    """Every unit of every file, each split's in the order of its hashed keys; the key is the
    relative path (+ part). Only the keys and offsets are held: each unit's bytes are read
    when it is written, so a corpus larger than memory is split in bounded memory."""
    refs: dict[str, list[tuple[bytes, str, Path, int, int]]] = {split: [] for split in SPLITS}
    for path in files:
        rel = path.relative_to(root).as_posix()
        size = path.stat().st_size
        parts = [(rel, 0, size)] if size <= UNIT_BYTES else [
            (f"{rel}#{i // UNIT_BYTES}", i, min(UNIT_BYTES, size - i)) for i in range(0, size, UNIT_BYTES)]
        for key, offset, length in parts:
            refs[split_of(key)].append((_order_key(key), key, path, offset, length))
    for split in SPLITS:
        refs[split].sort()
        for _, key, path, offset, length in refs[split]:
            with open(path, "rb") as f:
                f.seek(offset)
                yield split, key, f.read(length)


def _hub_units(corpus: HubCorpus, paths: list[Path]) -> Iterator[Unit]:
    """Every document of the shards, in their order, cut into units; a document's key is its
    shard and row. pyarrow reads 64 rows at a time: memory stays bounded by a batch and a page."""
    # pyarrow's default allocator (mimalloc) keeps freed batches: reading four 27 MiB shards
    # 64 rows at a time peaked 91 MB over the imports with it, 50 MB with the system's
    # allocator. Read when pyarrow is first imported, which is here in a prepare.
    os.environ.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    try:
        import pyarrow.parquet as pq
    except ImportError:
        raise DataError(MISSING_EXTRA) from None
    for path in paths:
        try:
            # Page by page through a 1 MiB buffer, not a row group's column at once (pre_buffer):
            # a shard's row groups may be larger than the memory a prepare should take.
            shard = pq.ParquetFile(path, pre_buffer=False, buffer_size=1 << 20)
            if corpus.column not in shard.schema_arrow.names:
                raise DataError(f"{path} has no '{corpus.column}' column")
            row = 0
            for batch in shard.iter_batches(batch_size=64, columns=[corpus.column]):
                for text in batch.column(0).to_pylist():
                    key = f"{path.name}#{row}"
                    row += 1
                    data = (text or "").encode("utf-8", "replace")
                    if len(data) <= UNIT_BYTES:
                        if data:
                            yield split_of(key), key, data
                        continue
                    for i in range(0, len(data), UNIT_BYTES):
                        part = f"{key}#{i // UNIT_BYTES}"
                        yield split_of(part), part, data[i : i + UNIT_BYTES]
        except (OSError, ValueError) as e:   # pyarrow's ArrowInvalid is a ValueError
            raise DataError(f"{path} is not a readable parquet shard ({e}); delete it and prepare again") from e


@dataclass
class PreparedInfo:
    data_dir: Path
    meta: dict[str, Any]
    built: bool  # False when an identical dataset was already there

    def summary_lines(self) -> list[str]:
        m = self.meta
        verb = "built" if self.built else "already prepared"
        lines = [f"{verb}: {self.data_dir}", f"source:      {m['source']}"]
        for split in ("train", "val", "audit"):
            s = m["splits"][split]
            lines.append(f"{split + ':':<12} {s['files']:>5} units  {s['bytes']:>11,} bytes")
        lines.append(f"fingerprint: {m['fingerprint']}")
        return lines


class _SplitWriter:
    """The three split files, written as units arrive in any order of splits: each split's
    units joined by SEPARATOR and cut at its size (validation and audit), with the hashes,
    unit counts and manifest lines meta.json and manifest.tsv need. Memory: one unit."""

    def __init__(self, folder: Path, spec: CorpusSpec):
        self.folder = folder
        self.limits: dict[str, int | None] = {"train": None, "val": spec.val_bytes, "audit": spec.audit_bytes}
        self.bins = {split: open(folder / f"{split}.bin", "wb") for split in SPLITS}
        self.lists = {split: open(folder / f".manifest-{split}", "w", encoding="utf-8", errors="surrogateescape")
                      for split in SPLITS}
        self.sizes = dict.fromkeys(SPLITS, 0)
        self.units = dict.fromkeys(SPLITS, 0)
        self.hashes = {split: hashlib.sha256() for split in SPLITS}
        self.train_manifest = hashlib.sha256()

    def add(self, split: str, key: str, data: bytes) -> None:
        self.units[split] += 1
        self.lists[split].write(f"{split}\t{len(data)}\t{key}\n")
        if split == "train":
            self.train_manifest.update(f"{key}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}\n"
                                       .encode("utf-8", "surrogateescape"))
        chunk = SEPARATOR + data if self.sizes[split] else data
        limit = self.limits[split]
        if limit is not None:
            chunk = chunk[: max(0, limit - self.sizes[split])]
        if chunk:
            self.bins[split].write(chunk)
            self.hashes[split].update(chunk)
            self.sizes[split] += len(chunk)

    def close(self) -> None:
        """Closes the files and joins the manifest's parts into manifest.tsv (train, val, audit)."""
        for f in (*self.bins.values(), *self.lists.values()):
            f.close()
        with open(self.folder / "manifest.tsv", "wb") as out:
            out.write(b"split\tbytes\tunit\n")
            for split in SPLITS:
                part = self.folder / f".manifest-{split}"
                with open(part, "rb") as f:
                    shutil.copyfileobj(f, out)
                part.unlink()


def _build(spec: CorpusSpec, folder: Path, hub: dict[str, Any] | None = None) -> dict[str, Any]:
    """Writes the dataset of ``spec`` into ``folder`` (split files and manifest.tsv) and
    returns its meta.json. ``hub``: the fetched shards of a named corpus (corpora.fetch)."""
    if spec.val_bytes < 2:
        raise DataError(f"val_bytes must be at least 2, got {spec.val_bytes}")
    if spec.audit_bytes < 0:
        raise DataError(f"audit_bytes must not be negative, got {spec.audit_bytes}")
    corpus = spec.hub
    if corpus is not None and hub is not None:
        root = hub_dir(corpus)
        units = _hub_units(corpus, [root / name for name in hub["files"]])
    else:
        root, files = _stdlib_files() if spec.is_stdlib else _user_files(spec.source)
        units = _path_units(root, files)
    writer = _SplitWriter(folder, spec)
    try:
        for split, key, data in units:
            writer.add(split, key, data)
    finally:
        writer.close()
    _check_sizes(spec, writer.sizes)
    return _meta(spec, root, writer, hub)


def _check_sizes(spec: CorpusSpec, sizes: dict[str, int]) -> None:
    for split, need in (("val", spec.val_bytes), ("audit", spec.audit_bytes)):
        if sizes[split] < need:
            raise DataError(
                f"corpus '{spec.source}' is too small: its {split} split has {sizes[split]:,} bytes, "
                f"{need:,} needed (add text, or lower --{split}-bytes)"
            )
    if sizes["train"] < 4 * 1024:
        raise DataError(f"corpus '{spec.source}' is too small: {sizes['train']:,} training bytes")


def _meta(spec: CorpusSpec, root: Path, writer: _SplitWriter, hub: dict[str, Any] | None) -> dict[str, Any]:
    """meta.json: where the data came from, each split's size and hash, and the fingerprint
    (the validation bytes and the training manifest: what a metric depends on)."""
    fp = hashlib.sha256()
    fp.update(b"autoloop-fingerprint-v1\n")
    fp.update(writer.hashes["val"].digest())
    fp.update(writer.train_manifest.digest())
    meta: dict[str, Any] = {
        "format": FORMAT_VERSION,
        "source": spec.source_id(),
        "source_root": str(root),
        "python": sys.version.split()[0],
        "val_bytes": spec.val_bytes,
        "audit_bytes": spec.audit_bytes,
        "splits": {
            split: {"files": writer.units[split], "bytes": writer.sizes[split],
                    "sha256": writer.hashes[split].hexdigest()}
            for split in SPLITS
        },
        "train_manifest_sha256": writer.train_manifest.hexdigest(),
        "fingerprint": fp.hexdigest()[:16],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    if hub is not None:
        meta["hub"] = hub   # repository, commit, and every shard's sha256 and size
    return meta


def read_meta(data_dir: Path) -> dict[str, Any] | None:
    try:
        meta: dict[str, Any] = json.loads((Path(data_dir) / "meta.json").read_text())
    except (FileNotFoundError, NotADirectoryError):
        return None
    except (OSError, ValueError) as e:
        raise DataError(f"prepared data in {data_dir} is unreadable ({e}); delete it and run autoloop prepare") from e
    if meta.get("format") != FORMAT_VERSION:
        raise DataError(f"prepared data in {data_dir} has format {meta.get('format')}, expected {FORMAT_VERSION}; "
                        "delete it and run autoloop prepare")
    return meta


def prepare(spec: CorpusSpec | None = None, data_dir: str | Path | None = None) -> PreparedInfo:
    """Build the dataset for ``spec`` into ``data_dir`` unless identical data is already there.

    Idempotent and safe against concurrent callers: the build happens in a temporary
    directory next to the target and is moved into place under a file lock.
    """
    from filelock import FileLock

    spec = spec or CorpusSpec()
    data_dir = Path(data_dir) if data_dir else default_data_dir(spec)
    data_dir.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(data_dir) + ".lock"):
        existing = read_meta(data_dir) if data_dir.exists() else None
        if data_dir.exists() and existing is None and any(data_dir.iterdir()):
            # Never delete a folder we did not build: it may be the user's own files.
            raise DataError(f"{data_dir} exists and is not a prepared dataset; choose an empty or new --data-dir")
        corpus = spec.hub
        hub = fetch(corpus, spec.shard_count, hub_dir(corpus),
                    say=lambda line: print(line, file=sys.stderr)) if corpus else None
        if hub is not None and existing and existing.get("hub") == hub and (
                existing.get("val_bytes"), existing.get("audit_bytes")) == (spec.val_bytes, spec.audit_bytes):
            # The same shards, checked by their hashes: the same bytes, not read again (gigabytes).
            return PreparedInfo(data_dir, existing, built=False)
        # Built next to the target and moved into place: a reader never sees half a dataset,
        # and a kill leaves only a temporary folder behind.
        tmp = Path(tempfile.mkdtemp(prefix=".prepare-", dir=data_dir.parent))
        try:
            meta = _build(spec, tmp, hub)
            if existing and existing.get("fingerprint") == meta["fingerprint"] and existing.get(
                "splits", {}).get("audit", {}).get("sha256") == meta["splits"]["audit"]["sha256"]:
                return PreparedInfo(data_dir, existing, built=False)
            # manifest.tsv says which unit went where, for people: the split is auditable without rerunning it.
            (tmp / "meta.json").write_text(json.dumps(meta, indent=2) + "\n")
            if data_dir.exists():
                shutil.rmtree(data_dir)
            os.replace(tmp, data_dir)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return PreparedInfo(data_dir, meta, built=True)


def ensure_prepared(spec: CorpusSpec | None = None, data_dir: str | Path | None = None) -> PreparedInfo:
    """Use the dataset already prepared in ``data_dir`` as it is, or build ``spec`` there.

    An existing dataset is never rebuilt behind the user's back (its sizes may have been
    chosen with ``autoloop prepare``); one built from another source is an error.
    """
    spec = spec or CorpusSpec()
    target = Path(data_dir) if data_dir else default_data_dir(spec)
    meta = read_meta(target)
    if meta is None:
        return prepare(spec, target)
    if meta.get("source") != spec.source_id():
        raise DataError(f"{target} holds the corpus '{meta.get('source')}', not '{spec.source}'; "
                        f"run autoloop prepare --corpus {spec.source} with another --data-dir")
    return PreparedInfo(target, meta, built=False)


# --------------------------------------------------------------------------- reading


class Dataset:
    """A prepared dataset opened read-only: memory-mapped splits and random-window batches."""

    def __init__(self, data_dir: str | Path):
        self.data_dir = Path(data_dir)
        meta = read_meta(self.data_dir)
        if meta is None:
            raise DataError(f"no prepared data in {self.data_dir}; run autoloop prepare")
        self.meta = meta
        self.fingerprint: str = meta["fingerprint"]
        self._maps: dict[str, np.ndarray] = {}

    def split(self, name: str) -> np.ndarray:
        """The bytes of one split as a read-only uint8 array (memory-mapped, so free to open)."""
        if name not in self._maps:
            path = self.data_dir / f"{name}.bin"
            expected = self.meta["splits"][name]["bytes"]
            if not path.exists() or path.stat().st_size != expected:
                raise DataError(f"{path} is missing or has the wrong size; delete {self.data_dir} and run "
                                "autoloop prepare")
            self._maps[name] = np.memmap(path, dtype=np.uint8, mode="r") if expected else np.zeros(0, np.uint8)
        return self._maps[name]

    def batches(self, batch_size: int, seq_len: int, device: str | torch.device = "cpu", seed: int = 42,
                split: str = "train") -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Endless (x, y) int64 batches of random windows; y is x shifted by one byte.

        Windows are drawn uniformly from the memory map with one vectorised gather,
        so a batch costs a few microseconds and nothing is loaded up front.
        """
        import torch

        data = self.split(split)
        if len(data) < seq_len + 2:
            raise DataError(f"{split} split has {len(data)} bytes, too few for windows of {seq_len}")
        rng = np.random.default_rng(seed)
        offsets = np.arange(seq_len + 1)
        pin = torch.device(device).type == "cuda"
        while True:
            starts = rng.integers(0, len(data) - seq_len - 1, size=batch_size)
            window = torch.from_numpy(data[starts[:, None] + offsets].astype(np.int64))
            if pin:
                window = window.pin_memory().to(device, non_blocking=True)
            else:
                window = window.to(device)
            yield window[:, :-1], window[:, 1:]


def load_data(data_dir: str | Path | None = None) -> Dataset:
    """Open the prepared dataset, preparing the default corpus there on first use.

    With ``data_dir`` and ``$AUTOLOOP_DATA_DIR`` unset this is the stdlib corpus in the
    per-user cache, so ``python train.py`` works on a fresh machine with nothing set.
    """
    target = Path(data_dir) if data_dir else default_data_dir()
    if read_meta(target) is None:
        info = prepare(CorpusSpec(), target)
        if info.built:
            print(f"prepared the default corpus in {target} (fingerprint {info.meta['fingerprint']})", file=sys.stderr)
    return Dataset(target)  # whatever corpus is prepared there: the harness chose it
