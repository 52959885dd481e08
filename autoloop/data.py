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

if TYPE_CHECKING:   # torch is imported when batches are made: train.py's process has it, prepare does not need it
    import torch

FORMAT_VERSION = 1
DEFAULT_VAL_BYTES = 512 * 1024
DEFAULT_AUDIT_BYTES = 128 * 1024
# Files are cut into units of at most this size before splitting, so that a corpus of
# one large text file can still be split; nearly every stdlib module fits in one unit.
UNIT_BYTES = 64 * 1024
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
    """Where the text comes from: ``stdlib`` or a user path (directory, file or glob)."""

    source: str = "stdlib"
    val_bytes: int = DEFAULT_VAL_BYTES
    audit_bytes: int = DEFAULT_AUDIT_BYTES

    @property
    def is_stdlib(self) -> bool:
        return self.source == "stdlib"

    def cache_name(self) -> str:
        """A directory name that differs whenever the prepared bytes would differ."""
        if self.is_stdlib:
            base = f"stdlib-py{sys.version_info.major}.{sys.version_info.minor}.{sys.version_info.micro}"
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


def _units(root: Path, files: list[Path]) -> Iterator[tuple[str, bytes]]:
    """Yield (key, bytes) for every unit of every file; the key is the relative path (+ part)."""
    for path in files:
        rel = path.relative_to(root).as_posix()
        data = path.read_bytes()
        if len(data) <= UNIT_BYTES:
            yield rel, data
            continue
        for i in range(0, len(data), UNIT_BYTES):
            yield f"{rel}#{i // UNIT_BYTES}", data[i : i + UNIT_BYTES]


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


Buckets = dict[str, list[tuple[bytes, str, bytes]]]   # split -> (order key, unit key, bytes), in order


def _build(spec: CorpusSpec) -> tuple[dict[str, Any], dict[str, bytes], str]:
    """The dataset of ``spec``: its meta.json, the bytes of each split, and manifest.tsv's text."""
    if spec.val_bytes < 2:
        raise DataError(f"val_bytes must be at least 2, got {spec.val_bytes}")
    if spec.audit_bytes < 0:
        raise DataError(f"audit_bytes must not be negative, got {spec.audit_bytes}")
    root, files = _stdlib_files() if spec.is_stdlib else _user_files(spec.source)
    buckets: Buckets = {"train": [], "val": [], "audit": []}
    for key, data in _units(root, files):
        buckets[split_of(key)].append((_order_key(key), key, data))
    for units in buckets.values():
        units.sort()
    blobs = {
        "train": _joined(buckets["train"]),
        "val": _joined(buckets["val"], spec.val_bytes),
        "audit": _joined(buckets["audit"], spec.audit_bytes),
    }
    _check_sizes(spec, blobs)
    manifest_lines = [f"{split}\t{len(data)}\t{key}" for split in ("train", "val", "audit")
                      for _, key, data in buckets[split]]
    manifest = "\n".join(["split\tbytes\tunit", *manifest_lines]) + "\n"
    return _meta(spec, root, buckets, blobs), blobs, manifest


def _joined(units: list[tuple[bytes, str, bytes]], limit: int | None = None) -> bytes:
    """The units' bytes, separated; cut at ``limit`` bytes when given."""
    out = bytearray()
    for _, _, data in units:
        if out:
            out += SEPARATOR
        out += data
        if limit is not None and len(out) >= limit:
            break
    return bytes(out if limit is None else out[:limit])


def _check_sizes(spec: CorpusSpec, blobs: dict[str, bytes]) -> None:
    for split, need in (("val", spec.val_bytes), ("audit", spec.audit_bytes)):
        if len(blobs[split]) < need:
            raise DataError(
                f"corpus '{spec.source}' is too small: its {split} split has {len(blobs[split]):,} bytes, "
                f"{need:,} needed (add text, or lower --{split}-bytes)"
            )
    if len(blobs["train"]) < 4 * 1024:
        raise DataError(f"corpus '{spec.source}' is too small: {len(blobs['train']):,} training bytes")


def _meta(spec: CorpusSpec, root: Path, buckets: Buckets, blobs: dict[str, bytes]) -> dict[str, Any]:
    """meta.json: where the data came from, each split's size and hash, and the fingerprint
    (the validation bytes and the training manifest: what a metric depends on)."""
    manifest = hashlib.sha256()
    for _, key, data in buckets["train"]:
        manifest.update(f"{key}\t{len(data)}\t{hashlib.sha256(data).hexdigest()}\n"
                        .encode("utf-8", "surrogateescape"))
    fp = hashlib.sha256()
    fp.update(b"autoloop-fingerprint-v1\n")
    fp.update(hashlib.sha256(blobs["val"]).digest())
    fp.update(manifest.digest())
    return {
        "format": FORMAT_VERSION,
        "source": "stdlib" if spec.is_stdlib else os.path.abspath(os.path.expanduser(spec.source)),
        "source_root": str(root),
        "python": sys.version.split()[0],
        "val_bytes": spec.val_bytes,
        "audit_bytes": spec.audit_bytes,
        "splits": {
            split: {"files": len(buckets[split]), "bytes": len(blobs[split]),
                    "sha256": hashlib.sha256(blobs[split]).hexdigest()}
            for split in blobs
        },
        "train_manifest_sha256": manifest.hexdigest(),
        "fingerprint": fp.hexdigest()[:16],
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }


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
        meta, blobs, manifest = _build(spec)
        existing = read_meta(data_dir) if data_dir.exists() else None
        if data_dir.exists() and existing is None and any(data_dir.iterdir()):
            # Never delete a folder we did not build: it may be the user's own files.
            raise DataError(f"{data_dir} exists and is not a prepared dataset; choose an empty or new --data-dir")
        if existing and existing.get("fingerprint") == meta["fingerprint"] and existing.get(
            "splits", {}).get("audit", {}).get("sha256") == meta["splits"]["audit"]["sha256"]:
            return PreparedInfo(data_dir, existing, built=False)
        tmp = Path(tempfile.mkdtemp(prefix=".prepare-", dir=data_dir.parent))
        try:
            for split, blob in blobs.items():
                (tmp / f"{split}.bin").write_bytes(blob)
            # Which unit went where, for people: the split is auditable without rerunning it.
            (tmp / "manifest.tsv").write_text(manifest, encoding="utf-8", errors="surrogateescape")
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
    wanted = "stdlib" if spec.is_stdlib else os.path.abspath(os.path.expanduser(spec.source))
    if meta.get("source") != wanted:
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
