"""Integrity of the measurement: the inputs that decide a trial's number stay as they were.

A trial (and a proposer) runs as the user and can write anywhere the user can. Three
inputs decide what a trial's number means, and none of them is the target file:

* the harness: the ``*.py`` files of the autoloop package that trials import (its
  ``evaluate.py`` scores every trial), recursively, and the bytecode that existed
  beside them when the snapshot was taken (a ``.pyc`` rewritten with the source's
  mtime and size in its header would be loaded instead of the source). Trials import a
  private copy, ``results/.harness/autoloop`` (put first on their PYTHONPATH), made from
  the package this process imported when the session starts: restoring it can never undo
  an edit of the user's own autoloop source (a developer's checkout, while a night or the
  test suite runs), and an edit of that source cannot reach a running night's trials;
* ``program.md`` in the workspace, present or absent (a trial that writes one would
  speak to the next agent);
* every file of the prepared data directory, and no new ones;
* git's own configuration of the workspace (``.git/config``, ``config.worktree``,
  ``info/attributes`` and every file under ``hooks/``, :func:`git_files`): what it names
  would run in the person's own git after the night. autoloop's git runs with all of
  it off (``gitsafe.py``); a change is put back and recorded like any other tampering.

:class:`InputsSnapshot` snapshots them once per session, after the data is prepared, and keeps
pristine copies in ``results/.pristine/``: content-addressed ``blobs/<sha256>`` and
``manifest.json`` (written blobs first, manifest last and atomically), so a kill at any
moment leaves recovery what it needs. Data over ``DATA_BACKUP_CAP`` in total is hashed
only; when it changes it cannot be restored and the loop must stop.

Every check re-hashes every byte. Skipping files whose (size, mtime_ns, inode) did not
change would not be safe: a trial can rewrite a file in place and put the mtime back with
``os.utime``, and a ctime check would depend on the filesystem. The cost is small: one
pass over the default stdlib data (11.2 MiB) plus the harness (53 files in all) took 9 ms
on an idle core and 21 ms (median) on a 2-core machine at load 6.8; it runs twice per attempt.

Restoring is idempotent: the changed file is kept as evidence (a hard link where possible,
else a copy) under the given evidence folder, then the pristine bytes are written to a
temporary file beside it and moved over it with ``os.replace``.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import autoloop
from autoloop.core.errors import AutoloopError
from autoloop.core.keep import tampered_reason
from autoloop.core.layout import PRISTINE, RESULTS, Layout
from autoloop.store.atomic import atomic_write

MANIFEST = "manifest.json"
DATA_BACKUP_CAP = 512 * 2**20
# Tests (and a user with a huge corpus who wants hash-only) may lower the cap.
CAP_ENV = "AUTOLOOP_PRISTINE_MAX_BYTES"
PROGRAM_FILE = "program.md"
DATA_LABEL = "$AUTOLOOP_DATA_DIR"
GIT_LABEL = ".git/"
# What, in a git directory, makes git run a program or changes what it does to the work
# tree: the configuration (hooks path, fsmonitor, filter drivers...), the attributes that
# name filters, and the hooks themselves.
GIT_FILES = ("config", "config.worktree", "info/attributes")
_CHUNK = 1 << 20


class IntegrityError(AutoloopError):
    """A protected input changed and cannot be restored; the message is one line for the user."""


def harness_dir() -> Path:
    """The autoloop package this process imported: the source of the trials' private copy."""
    return Path(autoloop.__file__).resolve().parent


def harness_path(results_dir: Path) -> Path:
    """The folder trials get first on their PYTHONPATH: it holds the private ``autoloop`` copy."""
    return Layout(Path(results_dir)).harness


def _not_python(folder: str, names: list[str]) -> set[str]:
    """copytree's ignore: only the Python sources (the templates are symlinks into a checkout)."""
    return {n for n in names if n == "__pycache__" or not (n.endswith(".py") or os.path.isdir(os.path.join(folder, n)))
            or os.path.islink(os.path.join(folder, n))}


def copy_harness(results_dir: Path) -> Path:
    """(Re)make the private copy of the imported package that trials import; returns its root.

    Written beside and swapped in whole, so a kill mid-copy leaves either the old copy or
    the new one."""
    dest = harness_path(results_dir) / "autoloop"
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=".autoloop-", dir=dest.parent))
    shutil.copytree(harness_dir(), staging / "autoloop", ignore=_not_python)
    if dest.exists():
        old = dest.parent / f".old-{os.getpid()}-{time.time_ns()}"
        os.replace(dest, old)
        shutil.rmtree(old, ignore_errors=True)
    os.replace(staging / "autoloop", dest)
    shutil.rmtree(staging, ignore_errors=True)
    return dest




def data_backup_cap() -> int:
    try:
        return int(os.environ[CAP_ENV])
    except (KeyError, ValueError):
        return DATA_BACKUP_CAP


# ------------------------------------------------------------------------------ files


@dataclass(frozen=True)
class Entry:
    path: str              # absolute
    sha256: str
    size: int
    mode: int
    mtime_ns: int = 0
    link: str | None = None    # a symlink's target (then sha256 hashes that text)
    blob: bool = True          # a pristine copy is kept under blobs/<sha256>
    strict: bool = True        # False: bytecode; only a change counts, not absence or addition
    # Harness sources: a new mtime counts as a change too. Python trusts a .pyc whose header
    # holds the source's mtime and size, so sources and bytecode must go back together.
    check_mtime: bool = False


def _digest(path: Path) -> tuple[str, int, int, int, str | None]:
    """(sha256, size, mode, mtime_ns, symlink target) of one file, read in full every time."""
    st = os.lstat(path)
    if stat.S_ISLNK(st.st_mode):
        target = os.readlink(path)
        return hashlib.sha256(b"symlink\0" + os.fsencode(target)).hexdigest(), 0, 0, 0, target
    if not stat.S_ISREG(st.st_mode):   # a folder, FIFO, socket: never opened (a FIFO would block)
        return hashlib.sha256(b"special\0%o" % stat.S_IFMT(st.st_mode)).hexdigest(), 0, 0, 0, None
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_CHUNK):
            h.update(chunk)
    return h.hexdigest(), st.st_size, stat.S_IMODE(st.st_mode), st.st_mtime_ns, None


def _files(root: Path, suffix: str | None) -> list[Path]:
    """Files (and symlinks) under root, __pycache__ skipped; only *suffix when given."""
    out = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__")
        here = Path(dirpath)
        # A symlink to a folder is listed as a name, not walked into: count it as a file.
        names = filenames + [d for d in dirnames if (here / d).is_symlink()]
        out += [here / n for n in sorted(names) if suffix is None or n.endswith(suffix)]
    return out


@dataclass(frozen=True)
class Area:
    """One group of protected files: where they are and how they are named."""
    name: str              # harness | program | data | git
    root: Path
    label: str             # display prefix: "autoloop/", "", "$AUTOLOOP_DATA_DIR/"
    backup: bool = True

    def scan(self) -> dict[str, Path]:
        """The area's files now, by display name (the strict part: no bytecode)."""
        if self.name == "program":
            path = self.root / PROGRAM_FILE
            return {PROGRAM_FILE: path} if os.path.lexists(path) else {}
        if self.name == "git":
            return git_files(self.root, self.label)
        if not self.root.is_dir():
            return {}
        suffix = ".py" if self.name == "harness" else None
        return {self.label + p.relative_to(self.root).as_posix(): p for p in _files(self.root, suffix)}

    def bytecode(self) -> dict[str, Path]:
        if self.name != "harness":
            return {}
        return {self.label + p.relative_to(self.root).as_posix(): p
                for p in sorted(self.root.rglob("__pycache__/*.pyc")) if p.is_file()}


def git_common_dir(workspace: Path) -> Path | None:
    """The git directory shared by every work tree of the repository at ``workspace``
    (``.git``, or what a ``.git`` file and its ``commondir`` point at); None when there is none."""
    dot = Path(workspace) / ".git"
    if dot.is_file():
        try:
            text = dot.read_text().strip()
        except OSError:
            return None
        if not text.startswith("gitdir:"):
            return None
        gitdir = (dot.parent / text[len("gitdir:"):].strip()).resolve()
        try:
            common = (gitdir / "commondir").read_text().strip()
        except OSError:
            return gitdir
        return (gitdir / common).resolve()
    return dot.resolve() if dot.is_dir() else None


def git_files(git_dir: Path, label: str) -> dict[str, Path]:
    """The protected files of a git directory now: GIT_FILES that exist, and all of hooks/."""
    found = {label + name: git_dir / name for name in GIT_FILES if os.path.lexists(git_dir / name)}
    hooks = git_dir / "hooks"
    if hooks.is_dir() and not hooks.is_symlink():
        found.update({label + p.relative_to(git_dir).as_posix(): p for p in _files(hooks, None)})
    elif os.path.lexists(hooks):
        found[label + "hooks"] = hooks    # a symlink (or a file) put where the folder was
    return found


# ------------------------------------------------------------------------------ the snapshot


@dataclass
class Tampering:
    """What one check found: paths changed (all restored unless listed in unrestorable).

    ``git``: files of the git area changed, restored too, but apart: they cannot change a
    number (autoloop's git runs with them off, trials do not run git), so, like an edit
    outside the target, they are put back and recorded without invalidating the run; and a
    look-ahead agent, proposing while another trial trains, would otherwise spoil that run."""
    paths: list[str] = field(default_factory=list)
    unrestorable: list[str] = field(default_factory=list)
    message: str = ""      # one line for the user when something could not be restored
    git: list[str] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.paths)


class InputsSnapshot:
    """Snapshot, verify and restore the protected inputs of the measurement."""

    def __init__(self, store: Path, areas: list[Area], entries: dict[str, Entry], meta: dict[str, Any] | None = None):
        self.store = Path(store)
        self.areas = areas
        self.entries = entries
        self.meta = meta or {}

    # -- taking and loading --------------------------------------------------------------

    @classmethod
    def snapshot(cls, store: Path, *, harness: Path | None = None, workspace: Path | None = None,
                 data_dir: Path | None = None, tag: str | None = None, data_cap: int | None = None,
                 git_dir: Path | None = None) -> InputsSnapshot:
        """Hash every protected file now, keep pristine copies, persist the manifest."""
        store = Path(store)
        cap = data_backup_cap() if data_cap is None else data_cap
        areas = []
        if harness is not None:
            # Bytecode for every module, so that none can be planted later as "new" by a
            # trial run under this interpreter (only an existing .pyc is compared).
            import compileall
            compileall.compile_dir(str(harness), quiet=2, force=False)
            areas.append(Area("harness", Path(harness), Path(harness).name + "/"))
        if workspace is not None:
            areas.append(Area("program", Path(workspace), ""))
        if data_dir is not None:
            data_dir = Path(data_dir)
            total = sum(p.stat().st_size for p in _files(data_dir, None) if p.is_file() and not p.is_symlink())
            areas.append(Area("data", data_dir, DATA_LABEL + "/", backup=total <= cap))
        if git_dir is not None:
            areas.append(Area("git", Path(git_dir), GIT_LABEL))
        blobs = store / "blobs"
        blobs.mkdir(parents=True, exist_ok=True)
        entries: dict[str, Entry] = {}
        for area in areas:
            for strict, files in ((True, area.scan()), (False, area.bytecode())):
                for key, path in files.items():
                    entry = cls._take(path, blobs, area.backup, strict, strict and area.name == "harness")
                    if entry is not None:
                        entries[key] = entry
        meta = {"version": 1, "tag": tag, "autoloop": autoloop.__version__, "created": time.time(),
                "areas": [{"name": a.name, "root": str(a.root), "label": a.label, "backup": a.backup} for a in areas]}
        snapshot = cls(store, areas, entries, meta)
        snapshot._save()
        return snapshot

    @staticmethod
    def _take(path: Path, blobs: Path, backup: bool, strict: bool, check_mtime: bool) -> Entry | None:
        try:
            sha, size, mode, mtime, link = _digest(path)
            keep = backup and link is None and stat.S_ISREG(os.lstat(path).st_mode)
            if keep and not (blobs / sha).exists():
                tmp = blobs / f".{sha}.{os.getpid()}.tmp"
                shutil.copyfile(path, tmp)
                if _digest(tmp)[0] != sha:     # changed while we copied: not a pristine copy
                    tmp.unlink()
                    raise IntegrityError(f"{path} changed while autoloop was taking its snapshot; start again")
                os.replace(tmp, blobs / sha)
        except FileNotFoundError:
            return None                        # vanished between listing and reading
        return Entry(str(path), sha, size, mode, mtime, link, keep, strict, check_mtime and link is None)

    def _save(self) -> None:
        doc = {**self.meta, "entries": {k: vars(e) for k, e in self.entries.items()}}
        atomic_write(self.store / MANIFEST, json.dumps(doc, indent=1))
        # Blobs no longer referenced (an older session's) go; the manifest is already safe.
        wanted = {e.sha256 for e in self.entries.values() if e.blob}
        for blob in (self.store / "blobs").iterdir():
            if blob.name not in wanted and not blob.name.startswith("."):
                blob.unlink(missing_ok=True)

    @classmethod
    def load(cls, store: Path) -> InputsSnapshot | None:
        """The persisted snapshot of an earlier session, or None (none, or unreadable)."""
        store = Path(store)
        try:
            doc = json.loads((store / MANIFEST).read_text())
            areas = [Area(a["name"], Path(a["root"]), a["label"], a["backup"]) for a in doc["areas"]]
            entries = {k: Entry(**v) for k, v in doc["entries"].items()}
        except (OSError, ValueError, KeyError, TypeError):
            return None
        meta = {k: v for k, v in doc.items() if k != "entries"}
        return cls(store, areas, entries, meta)

    def area(self, name: str) -> Area | None:
        return next((a for a in self.areas if a.name == name), None)

    def without(self, name: str) -> InputsSnapshot:
        """The same snapshot minus one area (e.g. a harness that was upgraded since)."""
        area = self.area(name)
        if area is None:
            return self
        return InputsSnapshot(self.store, [a for a in self.areas if a.name != name],
                     {k: e for k, e in self.entries.items() if self._area_of(k) is not area}, self.meta)

    def only(self, name: str) -> InputsSnapshot:
        """The same snapshot, one area alone (the git area, checked after each proposal)."""
        area = self.area(name)
        return InputsSnapshot(self.store, [area] if area else [],
                              {k: e for k, e in self.entries.items() if area and self._area_of(k) is area}, self.meta)

    def _area_of(self, key: str) -> Area | None:
        if key == PROGRAM_FILE:
            return self.area("program")
        # Longest label first: no label is a prefix of another today, but be exact.
        for area in sorted(self.areas, key=lambda a: -len(a.label)):
            if area.label and key.startswith(area.label):
                return area
        return None

    # -- checking and restoring ------------------------------------------------------------

    def verify(self) -> list[str]:
        """Display names of protected files changed, missing or added since the snapshot."""
        current: dict[str, Path] = {}
        for area in self.areas:
            current.update(area.scan())
        changed = []
        for key, entry in self.entries.items():
            path = Path(entry.path)
            if not entry.strict:
                if os.path.lexists(path) and self._hash(path) != entry.sha256:
                    changed.append(key)
                continue
            if key not in current or self._hash(path) != entry.sha256:
                changed.append(key)
            elif entry.check_mtime and _mtime_ns(path) != entry.mtime_ns:
                changed.append(key)
        changed += [k for k in current if k not in self.entries]
        return sorted(changed)

    @staticmethod
    def _hash(path: Path) -> str | None:
        try:
            return _digest(path)[0]
        except OSError:
            return None

    def restore(self, keys: list[str], evidence_dir: Path | None = None) -> list[str]:
        """Put the snapshot back for these names; returns those that could not be restored
        (no pristine copy, or a damaged one). The changed versions go to evidence_dir."""
        failed = []
        for key in keys:
            entry = self.entries.get(key)
            path = Path(entry.path) if entry else self._path_of_added(key)
            if path is None:
                continue
            if entry is not None and not entry.blob and entry.link is None:
                failed.append(key)          # hash only: nothing to restore from
                continue
            if entry is not None and entry.link is None and self._blob_sha(entry) != entry.sha256:
                failed.append(key)          # the pristine copy itself is gone or damaged
                continue
            if os.path.lexists(path) and evidence_dir is not None:
                _keep_evidence(path, Path(evidence_dir) / key.lstrip("$/"), move=entry is None)
            if entry is None:
                _remove(path)               # added: restoring means it is not there
            else:
                self._write(entry, path)
        return failed

    def _path_of_added(self, key: str) -> Path | None:
        area = self._area_of(key)
        if area is None:
            return None
        return area.root / (key if area.name == "program" else key[len(area.label):])

    def _blob_sha(self, entry: Entry) -> str | None:
        return self._hash(self.store / "blobs" / entry.sha256)

    def _write(self, entry: Entry, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".restore", dir=path.parent)
        os.close(fd)
        try:
            if entry.link is not None:
                os.unlink(tmp)
                os.symlink(entry.link, tmp)
            else:
                shutil.copyfile(self.store / "blobs" / entry.sha256, tmp)
                os.chmod(tmp, entry.mode)
                os.utime(tmp, ns=(entry.mtime_ns, entry.mtime_ns))   # keeps its .pyc valid
            if os.path.isdir(path) and not os.path.islink(path):
                shutil.rmtree(path)          # a folder put where a file was
            os.replace(tmp, path)
        finally:
            if os.path.lexists(tmp):
                os.unlink(tmp)

    def check(self, evidence_dir: Path | None = None) -> Tampering:
        """verify, restore what changed, verify again: what was found and what is still wrong."""
        paths = self.verify()
        if not paths:
            return Tampering()
        self.restore(paths, evidence_dir)
        left = self.verify()
        git = [p for p in paths if p.startswith(GIT_LABEL)]
        return Tampering([p for p in paths if p not in git], left, self.explain(left) if left else "", git)

    def explain(self, left: list[str]) -> str:
        """One line: what could not be restored and what the user should do."""
        data = self.area("data")
        shown = tampered_reason(left).removeprefix("tampered: ")
        if data is not None and all(self._area_of(k) is data for k in left):
            why = ("no pristine copy is kept (it is over "
                   f"{data_backup_cap() // 2**20} MiB)" if not data.backup else "its pristine copy is damaged")
            return (f"the prepared data in {data.root} was changed ({shown}) and {why}: delete {data.root} "
                    "and run `autoloop prepare`, then `autoloop run --resume`")
        return (f"{shown} changed and cannot be restored from {RESULTS}/{PRISTINE} (missing or damaged): "
                "put them back by hand (git checkout, reinstall autoloop), then `autoloop run --resume`")


def _mtime_ns(path: Path) -> int | None:
    try:
        return os.lstat(path).st_mtime_ns
    except OSError:
        return None


def _keep_evidence(path: Path, dest: Path, move: bool) -> None:
    """The changed version, for the user to look at: nothing a trial wrote is silently lost."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists() or dest.is_symlink():
        dest = dest.with_name(f"{dest.name}.{time.time_ns()}")
    try:
        if move:
            shutil.move(str(path), str(dest))
        elif path.is_symlink() or path.is_dir():
            shutil.move(str(path), str(dest))
        else:
            try:
                os.link(path, dest)          # free; the restore replaces the name, not the inode
            except OSError:
                shutil.copy2(path, dest)
    except OSError:
        pass   # evidence is best effort; restoring is what matters


def _remove(path: Path) -> None:
    if os.path.isdir(path) and not os.path.islink(path):
        shutil.rmtree(path, ignore_errors=True)
    elif os.path.lexists(path):
        os.unlink(path)


# ------------------------------------------------------------------------------ session helpers


def prepared_mismatch(data_dir: Path) -> list[str]:
    """Split files of a prepared dataset whose bytes differ from the sha256 in its meta.json
    (written by `autoloop prepare`): data that must not be taken as pristine."""
    try:
        meta = json.loads((Path(data_dir) / "meta.json").read_text())
        splits = meta.get("splits", {})
    except (OSError, ValueError, AttributeError):
        return []
    bad = []
    for name, info in splits.items():
        want = info.get("sha256") if isinstance(info, dict) else None
        if not want:
            continue
        path = Path(data_dir) / f"{name}.bin"
        if InputsSnapshot._hash(path) != want:
            bad.append(f"{name}.bin")
    return bad


def open_snapshot(results_dir: Path, workspace: Path, data_dir: Path | None, tag: str | None,
               reuse: bool = False, evidence_dir: Path | None = None) -> InputsSnapshot:
    """The session's snapshot, taken after the data is prepared.

    reuse: keep an earlier snapshot of the same tag, harness and data (``autoloop trial``:
    an agent that drives itself works between calls, so a fresh snapshot would bless what
    it changed meanwhile). Otherwise a fresh snapshot, but never of data that differs from
    its own meta.json: that is restored from an earlier pristine copy, or refused.
    """
    store = Layout(Path(results_dir)).pristine
    old = InputsSnapshot.load(store)
    harness = harness_path(results_dir) / "autoloop"
    if reuse and old is not None and harness.is_dir() and _compatible(old, harness, Path(workspace), data_dir, tag):
        return old
    if data_dir is not None:
        bad = prepared_mismatch(data_dir)
        old_data = old.area("data") if old is not None else None
        if bad and old is not None and old_data and old_data.root == Path(data_dir):
            old.restore([DATA_LABEL + "/" + name for name in bad], evidence_dir)
            bad = prepared_mismatch(data_dir)
        if bad:
            raise IntegrityError(f"the prepared data in {data_dir} does not match its meta.json ({', '.join(bad)} "
                                 f"changed); delete {data_dir} and run `autoloop prepare`")
    copy_harness(results_dir)
    return InputsSnapshot.snapshot(store, harness=harness, workspace=workspace, data_dir=data_dir, tag=tag,
                                   git_dir=git_common_dir(Path(workspace)))


def _compatible(old: InputsSnapshot, harness: Path, workspace: Path, data_dir: Path | None, tag: str | None) -> bool:
    roots = {a.name: a.root for a in old.areas}
    return (old.meta.get("tag") == tag and old.meta.get("autoloop") == autoloop.__version__
            and roots.get("harness") == harness and roots.get("program") == workspace
            and roots.get("data") == (Path(data_dir) if data_dir else None)
            and roots.get("git") == git_common_dir(workspace))


def recover_inputs(results_dir: Path, evidence_dir: Path | None) -> Tampering:
    """After an interrupted attempt: restore what it changed, from the last snapshot.

    The harness area is the session's private copy (``copy_harness``), ours to restore; a
    snapshot of some other harness (an older layout, another version) is left out: the next
    session makes a fresh copy anyway.
    """
    snapshot = InputsSnapshot.load(Layout(Path(results_dir)).pristine)
    if snapshot is None:
        return Tampering()
    area = snapshot.area("harness")
    if area is not None and (area.root != harness_path(results_dir) / "autoloop"
                             or snapshot.meta.get("autoloop") != autoloop.__version__):
        snapshot = snapshot.without("harness")
    return snapshot.check(evidence_dir)
