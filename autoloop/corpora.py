"""Named public corpora of GPU size, fetched from the Hugging Face hub and pinned.

The embedded default (this Python's standard library, about 10 MB of training bytes) is
read many times over in one GPU budget: an H100 at 30-40 % MFU reads 130-210 MB in 300 s,
so val_bpb would rank memorisation. A named corpus is the way out:
``autoloop prepare --corpus climbmix`` downloads the first ``--shards`` parquet shards of
the dataset karpathy/autoresearch trains on, and ``autoloop.data`` builds the usual
train/validation/audit split from their ``text`` column, streaming.

How a download is kept honest and cheap to repeat:

* resumable: each shard is downloaded by ``huggingface_hub`` (an optional extra: its HTTP
  session, retries and redirects, ``http_get``) into ``<shard>.part``, which a kill leaves
  behind and the next fetch continues with an HTTP range request. Not ``hf_hub_download``:
  since huggingface_hub 1.x (PR 4228) it downloads into a temporary file unique to the process
  and deletes it on failure, so a killed download starts again from zero. A shard already
  there and matching its recorded hash is not fetched again;
* checksummed: the hub names each large file by its sha256 (the ETag of a file kept in
  LFS); every shard's own sha256 is computed after the download and must match it;
* pinned: the first download records the repository's commit in ``pinned.json`` beside the
  shards, and every later one asks for that commit, so a shard added or changed upstream
  never slips into a dataset; the prepared data's fingerprint pins the bytes themselves.

``HF_ENDPOINT`` (huggingface_hub's own setting) points it at a mirror, or, in the tests, at
a local stand-in of the hub: nothing is downloaded from the internet at test time.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoloop.core.errors import AutoloopError

PINNED_FILE = "pinned.json"
PART_SUFFIX = ".part"   # a shard being downloaded: kept across a kill, continued by the next fetch
MISSING_EXTRA = "a named corpus needs huggingface_hub and pyarrow: pip install 'autoloop[hub]'"
_SHA256 = re.compile(r"^[0-9a-f]{64}$")


class HubError(AutoloopError):
    """A named corpus that cannot be fetched; the message is one line for the user."""


@dataclass(frozen=True)
class HubCorpus:
    """A public dataset on the hub whose text is spread over numbered parquet shards."""

    name: str              # what --corpus takes
    repo_id: str           # the hub's dataset repository
    filename: str          # a shard's path in the repository, formatted with its index
    default_shards: int    # how many shards --corpus NAME fetches without --shards
    column: str            # the parquet column holding the documents' text
    about: str             # one line for --help and the docs


# climbmix-400b-shuffle is what karpathy/autoresearch's prepare.py downloads (its shards
# shard_00000.parquet .. shard_06542.parquet, a "text" column). 400B tokens over 6,543 shards
# is about 61M tokens a shard, about 250 MB of text at 4 bytes a token (an estimate from the
# dataset's name and shard count: no shard was downloaded here), so 4 shards give a gigabyte.
CORPORA = {c.name: c for c in (
    HubCorpus("climbmix", "karpathy/climbmix-400b-shuffle", "shard_{:05d}.parquet", 4, "text",
              "the web text karpathy/autoresearch trains on (karpathy/climbmix-400b-shuffle)"),
)}


def named(source: str) -> HubCorpus | None:
    """The named corpus ``source`` names, or None for stdlib and paths."""
    return CORPORA.get(source)


def shard_names(corpus: HubCorpus, shards: int) -> list[str]:
    return [corpus.filename.format(i) for i in range(shards)]


def read_pinned(folder: Path) -> dict[str, Any]:
    """The commit and the shards' hashes recorded so far ({} before the first download)."""
    try:
        pinned: dict[str, Any] = json.loads((folder / PINNED_FILE).read_text())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as e:
        raise HubError(f"{folder / PINNED_FILE} is unreadable ({e}); delete {folder} to download anew") from e
    return pinned


def _write_pinned(folder: Path, pinned: dict[str, Any]) -> None:
    tmp = folder / (PINNED_FILE + ".tmp")
    tmp.write_text(json.dumps(pinned, indent=2, sort_keys=True) + "\n")
    os.replace(tmp, folder / PINNED_FILE)   # never half a record: a kill keeps the previous one


def file_sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(1 << 22):
            digest.update(chunk)
    return digest.hexdigest()


def _hub() -> Any:
    try:
        import huggingface_hub
    except ImportError:
        raise HubError(MISSING_EXTRA) from None
    return huggingface_hub


def fetch(corpus: HubCorpus, shards: int, folder: Path, say: Callable[[str], None] = print) -> dict[str, Any]:
    """The first ``shards`` shards of ``corpus`` in ``folder``, downloaded where missing and
    each checked against the hub's sha256; returns (and keeps in pinned.json) the repository,
    its commit and every shard's sha256 and size."""
    if shards < 1:
        raise HubError(f"--shards must be at least 1, got {shards}")
    hub = _hub()
    from huggingface_hub.file_download import http_get
    folder.mkdir(parents=True, exist_ok=True)
    pinned = read_pinned(folder)
    if pinned and pinned.get("repo") != corpus.repo_id:
        raise HubError(f"{folder} holds shards of {pinned.get('repo')}, not {corpus.repo_id}; delete it")
    pinned.setdefault("repo", corpus.repo_id)
    files: dict[str, dict[str, Any]] = pinned.setdefault("files", {})
    for index, name in enumerate(shard_names(corpus, shards)):
        path = folder / name
        known = files.get(name)
        if known and path.is_file() and path.stat().st_size == known["bytes"] and file_sha256(path) == known["sha256"]:
            continue
        revision = pinned.get("commit") or "main"
        part = folder / (name + PART_SUFFIX)
        done = part.stat().st_size if part.exists() else 0
        say(f"downloading {corpus.repo_id} {name} ({index + 1}/{shards})"
            + (f", resuming at {done:,} bytes" if done else ""))
        try:
            url = hub.hf_hub_url(corpus.repo_id, name, repo_type="dataset", revision=revision)
            meta = hub.get_hf_file_metadata(url)
            expected = (meta.etag or "").removeprefix("W/").strip('"')
            commit = meta.commit_hash or revision
            if meta.size is not None and done > meta.size:   # not a part of this file
                part.unlink()
                done = 0
            if meta.size is None or done < meta.size:
                with open(part, "r+b" if done else "wb") as f:
                    f.seek(done)   # (not "ab": http_get seeks back to 0 when a server ignores the range)
                    # huggingface_hub's own transfer (its session, retries and redirects), asked
                    # for the bytes after those already in the .part file: an HTTP range request.
                    http_get(meta.location or url, f, resume_size=done, headers=hub.utils.build_hf_headers(),
                             expected_size=meta.size)
        except Exception as e:   # the hub client's errors are many (HTTP, network, OS); all end the same way
            detail = " ".join(str(e).split())[:200]
            raise HubError(f"downloading {name} of {corpus.repo_id} failed ({type(e).__name__}: {detail}); "
                           "run the same command again to resume") from None
        if not _SHA256.match(expected):
            raise HubError(f"the hub gave no sha256 for {name} of {corpus.repo_id} (ETag {expected[:20]!r}): "
                           "cannot check the download")
        digest = file_sha256(part)
        if digest != expected:
            part.unlink(missing_ok=True)
            raise HubError(f"{name} of {corpus.repo_id} has sha256 {digest[:12]}..., the hub says "
                           f"{expected[:12]}...: deleted; run the same command again to download it anew")
        os.replace(part, path)   # a shard under its own name is a whole, checked one
        pinned["commit"] = commit
        files[name] = {"sha256": digest, "bytes": path.stat().st_size}
        _write_pinned(folder, pinned)   # after every shard: an interrupted fetch keeps what it finished
    return {"repo": corpus.repo_id, "commit": pinned.get("commit"),
            "files": {name: files[name] for name in shard_names(corpus, shards)}}
