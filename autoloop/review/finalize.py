"""`autoloop finalize`: the night's kept changes as a short branch that is easy to review.

The loop's branch ``autoloop/<tag>`` holds the kept commits, each with the message the
proposer gave it and nothing about what it measured. ``finalize`` writes a NEW branch
(default ``autoloop/<tag>-final``) that starts at the baseline commit and has one
commit per kept change, in ledger order, each message carrying the description and
the metric before and after::

    MATRIX_LR 0.04 -> 0.06

    val_bpb 1.0275 -> 1.0234 (trial 17)

    autoloop-trial: 17
    autoloop-commit: <the original kept commit>

With ``--squash-overlapping``, consecutive kept changes that touch overlapping line
ranges (the second rewrote what the first had just changed) become one commit.

With ``--drop-unproven``, the kept changes that ``autoloop verify`` did not confirm
(their contribution within noise, or harmful) are left out: the branch holds only what was
shown to matter. It needs a finished verification of the current best
(``verify_plan.unproven``); a later change that does not apply without a dropped one stops
it with a message naming both. A kept change whose finished ``autoloop ladder`` said
SCALE-BOUND, NOISE or not predictive is left out too (``ladder_plan.unproven``).

The branch ends with one more commit (``--no-results`` leaves it out) that adds
``results/results.tsv`` (rebuilt from the ledger), ``results/report.md`` and
``results/progress.png`` (without matplotlib: no picture, and the report says why), forced
past ``.gitignore`` on that branch only, so a pull request of the final branch shows the
night's rows as a diff beside the kept changes. Each kept-change commit gets the git note
(``refs/notes/autoloop``, observe/git_notes.py) of the trial commit(s) it replays.

How: git plumbing only, on a temporary index file (``repo/plumbing.py``): for each kept
change, the diff from its parent (the best commit it was built on) to its commit is
applied to the new branch's tree (each changed path's blob is taken from the kept
commit when the path there still equals the parent's, which is always the case when
the kept changes form the usual chain; otherwise the change is replayed onto the path's
text there by ``core.revert.merge3``, the merge verify takes changes out with, without
context lines: a change next to one --drop-unproven left out still applies), a
tree is written, ``git commit-tree`` makes the commit, and ``git update-ref`` creates
the branch only if it does not exist yet. HEAD, the index, the work tree and the
original branch are never touched, so it is safe to run while a loop runs (it
finalizes what the ledger holds so far).
"""

from __future__ import annotations

import contextlib
import difflib
import re
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

from autoloop.core.errors import AutoloopError
from autoloop.core.layout import Layout, final_branch_name, tag_of_branch
from autoloop.core.revert import merge3
from autoloop.observe.console import metric_digits
from autoloop.repo.plumbing import PlumbingError, PrivateIndex
from autoloop.store import queries
from autoloop.store.ledger import Ledger, LedgerRecord
from autoloop.store.queries import best_before, is_kept_change
from autoloop.store.state import load_state
from autoloop.verification.ladder_plan import unproven as ladder_unproven
from autoloop.verification.verify_plan import load_plan, unproven


class FinalizeError(AutoloopError):
    """Nothing (or nothing safe) to finalize; the message is one line for the user."""


@dataclass
class KeptChange:
    record: LedgerRecord
    before: float | None          # the best metric it was judged against
    commit: str                   # the record's commit and parent: a kept change has both
    parent: str


@dataclass
class FinalCommit:
    sha: str
    changes: list[KeptChange]
    message: str

    @property
    def subject(self) -> str:
        return self.message.splitlines()[0]


@dataclass
class FinalizeResult:
    branch: str
    base: str                      # the baseline commit the branch starts from
    commits: list[FinalCommit]
    best: str | None               # the best commit of the ledger
    differs: list[str] = field(default_factory=list)   # paths where the final tree differs from best's
    tag: str | None = None
    results: FinalCommit | None = None    # the last commit, adding results.tsv, report.md, progress.png
    results_paths: list[str] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)   # what did not stop finalize (no picture, a note)
    dropped: list[tuple[KeptChange, str]] = field(default_factory=list)   # left out, with verify's verdict


# ------------------------------------------------------------------------------ pure parts


def kept_changes(records: list[LedgerRecord]) -> list[KeptChange]:
    """Kept, non-baseline records that changed something, in ledger order."""
    return [KeptChange(record, before, record.commit, record.parent)
            for record, before in zip(records, best_before(records), strict=True)
            if is_kept_change(record) and record.commit and record.parent]   # the last two: for the type checker


def changed_ranges(old: str, new: str) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """Line ranges [start, end) that differ: (in the old text, in the new text)."""
    matcher = difflib.SequenceMatcher(None, old.splitlines(), new.splitlines(), autojunk=False)
    olds, news = [], []
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag != "equal":
            olds.append((i1, i2))
            news.append((j1, j2))
    return olds, news


def _hit(a: tuple[int, int], b: tuple[int, int]) -> bool:
    (a0, a1), (b0, b1) = a, b
    if a0 == a1 or b0 == b1:   # a pure insertion or deletion point touches the lines around it
        return a0 <= b1 and b0 <= a1
    return a0 < b1 and b0 < a1


def ranges_overlap(first: list[tuple[int, int]], second: list[tuple[int, int]]) -> bool:
    return any(_hit(a, b) for a in first for b in second)


def _num(value: float | None, digits: int) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _label(record: LedgerRecord) -> str:
    return str(record.trial) if record.attempt <= 1 else f"{record.trial}.{record.attempt}"


def _measure(changes: list[KeptChange]) -> str:
    first, last = changes[0], changes[-1]
    metric = last.record.metric_name
    delta = None if first.before is None or last.record.metric is None else last.record.metric - first.before
    digits = metric_digits(delta)
    trials = ", ".join(_label(c.record) for c in changes)
    word = "trial" if len(changes) == 1 else "trials"
    return f"{metric} {_num(first.before, digits)} -> {_num(last.record.metric, digits)} ({word} {trials})"


def commit_message(changes: list[KeptChange]) -> str:
    """The message of one final commit (one kept change, or a squashed run of them)."""
    descriptions = [c.record.description.strip() or "kept change" for c in changes]
    if len(changes) == 1:
        subject, *rest = descriptions[0].splitlines()
        body = [_measure(changes)]
        if any(line.strip() for line in rest):
            body += ["", *rest]
    else:
        firsts = [d.splitlines()[0] for d in descriptions]
        subject = "; ".join(firsts)
        if len(subject) > 72:
            subject = f"{firsts[0]} (and {len(firsts) - 1} more)"
        body = [_measure(changes), ""]
        body += [f"- {d.splitlines()[0]}: {_measure([c])}" for d, c in zip(descriptions, changes, strict=True)]
    trailers = [f"autoloop-trial: {_label(c.record)}\nautoloop-commit: {c.record.commit}" for c in changes]
    return "\n".join([subject.strip(), "", *body, "", *trailers]) + "\n"


# ------------------------------------------------------------------------------ finalize


@contextlib.contextmanager
def _git_failure_is_finalize_error() -> Iterator[None]:
    """A git command of the private index that fails stops finalize with its one line."""
    try:
        yield
    except PlumbingError as e:
        raise FinalizeError(str(e)) from None


def _ledger_dir(results: Layout, tag: str, current_tag: str | None) -> Path:
    """The results folder holding tag's ledger: results/ itself, or its newest archive."""
    if current_tag in (None, tag) and results.ledger.exists():
        return results.root
    pattern = re.compile(rf"^{re.escape(tag)}-\d{{8}}-\d{{6}}(-\d+)?$")
    archives = sorted(p for p in results.archive.glob(f"{tag}-*") if pattern.match(p.name)
                      and Layout(p).ledger.exists())
    if archives:
        return archives[-1]
    if results.ledger.exists():
        raise FinalizeError(f"no ledger of tag '{tag}': results/ledger.jsonl belongs to tag '{current_tag}' "
                            f"(pass --tag {current_tag})")
    raise FinalizeError(f"no ledger at {results.ledger}: nothing to finalize (run autoloop run first)")


def finalize(root: Path, tag: str | None = None, branch: str | None = None,
             squash_overlapping: bool = False, results_commit: bool = True,
             drop_unproven: bool = False) -> FinalizeResult:
    root = Path(root).resolve()
    results = Layout.of(root)
    current_tag = load_state(results.root).tag
    with tempfile.TemporaryDirectory(prefix="autoloop-finalize-") as tmp, _git_failure_is_finalize_error():
        g = PrivateIndex(root, Path(tmp) / "index")
        tag = _which_tag(g, results, tag, current_tag)
        ledger_dir = _ledger_dir(results, tag, current_tag)
        records = Ledger(ledger_dir).records()
        baseline, changes, dropped = _select(records, ledger_dir, tag, drop_unproven)
        branch = branch or final_branch_name(tag)
        ref = _new_branch_ref(g, branch, baseline, changes)
        parent, made = _build(g, baseline, _groups(g, changes, squash_overlapping), Path(tmp))
        best = next((r.best for r in reversed(records) if r.best), None)
        differs = g.changed_paths(parent, best) if best and g.resolve(best) else []
        result = FinalizeResult(branch, baseline, made, best, differs, tag, dropped=dropped)
        if results_commit:
            parent = _results_commit(g, result, records, ledger_dir, parent, Path(tmp))
        # Create the branch only if it still does not exist (old value: none).
        g.create_ref(ref, parent, f"autoloop finalize {tag}")
        _note_final_commits(root, result, records)
        return result


def _which_tag(g: PrivateIndex, results: Layout, tag: str | None, current_tag: str | None) -> str:
    """The tag asked for, else that of results/, else that of the checked-out autoloop/TAG branch."""
    if tag is None:
        tag = current_tag
    if tag is None:
        tag = tag_of_branch(g.head_branch())
    if tag is None and not results.ledger.exists():
        raise FinalizeError(f"no ledger at {results.ledger}: nothing to finalize "
                            "(run autoloop run first)")
    if tag is None:
        raise FinalizeError("cannot tell which tag to finalize: pass --tag TAG")
    return tag


def _select(records: list[LedgerRecord], ledger_dir: Path, tag: str,
            drop_unproven: bool) -> tuple[str, list[KeptChange], list[tuple[KeptChange, str]]]:
    """The baseline commit, the kept changes to replay, and those --drop-unproven leaves out."""
    baseline = next((r.commit for r in records if r.kind == "baseline" and r.status == "keep" and r.commit), None)
    if baseline is None:
        raise FinalizeError(f"the ledger of tag '{tag}' has no baseline record: nothing to start from")
    changes = kept_changes(records)
    if not changes:
        raise FinalizeError(f"no kept changes in the ledger of tag '{tag}': nothing to finalize")
    dropped: list[tuple[KeptChange, str]] = []
    if drop_unproven:
        best_now = next((r.best for r in reversed(records) if r.best), None)
        plan = load_plan(Layout(ledger_dir))
        scaled = ladder_unproven(Layout(ledger_dir), tag)   # SCALE-BOUND, NOISE, not predictive
        verdicts = {**(unproven(plan, records, tag, best_now) if plan or not scaled else {}), **scaled}
        dropped = [(c, verdicts[c.record.trial]) for c in changes if c.record.trial in verdicts]
        changes = [c for c in changes if c.record.trial not in verdicts]
        if not changes:
            raise FinalizeError("autoloop verify confirmed none of the kept changes: nothing to finalize "
                                "(drop --drop-unproven to finalize them all)")
    return baseline, changes, dropped


def _new_branch_ref(g: PrivateIndex, branch: str, baseline: str, changes: list[KeptChange]) -> str:
    """refs/heads/<branch>, once the name is valid and free and every commit it needs is here."""
    if not g.valid_branch_name(branch):
        raise FinalizeError(f"invalid branch name {branch!r}")
    ref = f"refs/heads/{branch}"
    if g.resolve(ref):
        raise FinalizeError(f"branch {branch} already exists; pass --branch NAME or delete it "
                            f"(git branch -D {branch})")
    for rev in [baseline] + [c.commit for c in changes] + [c.parent for c in changes]:
        if not g.resolve(rev):
            raise FinalizeError(f"commit {rev[:12]} named in the ledger is not in this repository")
    return ref


Ranges = dict[str, tuple[list[tuple[int, int]], list[tuple[int, int]]]]   # path -> (old, new) changed lines


def _groups(g: PrivateIndex, changes: list[KeptChange], squash_overlapping: bool) -> list[list[KeptChange]]:
    """The changes, grouped: each alone, or runs of overlapping ones squashed."""
    groups: list[list[KeptChange]] = []
    ranges: dict[int, Ranges] = {}
    for change in changes:
        ranges[id(change)] = {path: changed_ranges(g.text(change.parent, path), g.text(change.commit, path))
                              for *_, path in g.changes(change.parent, change.commit)} if squash_overlapping else {}
        if squash_overlapping and groups:
            prev = ranges[id(groups[-1][-1])]
            mine = ranges[id(change)]
            if any(ranges_overlap(prev[p][1], mine[p][0]) for p in set(prev) & set(mine)):
                groups[-1].append(change)
                continue
        groups.append([change])
    return groups


def _build(g: PrivateIndex, baseline: str, groups: list[list[KeptChange]], tmp: Path) -> tuple[str, list[FinalCommit]]:
    """The commits, one per group, on a private index starting from the baseline's tree; the last one's sha."""
    g.read_tree(baseline)
    parent = g.resolve(baseline)
    if parent is None:   # _new_branch_ref resolved it already; a commit does not vanish in between
        raise FinalizeError(f"commit {baseline[:12]} named in the ledger is not in this repository")
    made: list[FinalCommit] = []
    for group in groups:
        for change in group:
            _apply(g, change, tmp)
        tree = g.write_tree()
        message = commit_message(group)
        sha = g.commit_tree(tree, parent, message.rstrip("\n"), g.ident_env(group[-1].commit))
        made.append(FinalCommit(sha, group, message))
        parent = sha
    return parent, made


RESULTS_PREFIX = "results"


def _results_commit(g: PrivateIndex, result: FinalizeResult, records: list[LedgerRecord], ledger_dir: Path,
                    parent: str, tmp: Path) -> str:
    """One commit on top of ``parent`` adding the night's results.tsv, report.md and
    progress.png (blobs written straight into the private index: .gitignore does not apply)."""
    from autoloop.review import plot
    from autoloop.review.report import eval_seconds, report_markdown, verification_lines
    from autoloop.store.ledger import format_tsv
    from autoloop.store.queries import of_night

    # The night's attempts in the counts and pictures; autoloop verify's in their section.
    verification = verification_lines(Layout(ledger_dir), Layout(tmp), records, result.tag)
    contributions = Layout(tmp).contributions_picture
    records = of_night(records)
    picture: bytes | None = None
    try:
        picture = plot.write_progress_png(records, tmp / "progress.png", tag=result.tag).read_bytes()
    except plot.PlotUnavailable as e:
        result.warnings.append(f"no progress.png in the results commit: {e}")
    report = report_markdown(records, eval_seconds(ledger_dir, records), tag=result.tag,
                             picture="progress.png" if picture else None,
                             picture_note=None if picture else "_No picture: matplotlib is not installed._",
                             verification=verification)
    files = {"results.tsv": format_tsv(records).encode("utf-8"), "report.md": (report + "\n").encode("utf-8")}
    if picture:
        files["progress.png"] = picture
    if verification and contributions.exists():
        files[f"{contributions.parent.name}/{contributions.name}"] = contributions.read_bytes()
    for name, data in files.items():
        path = tmp / f"blob-{name.replace('/', '-')}"
        path.write_bytes(data)
        g.set_entry("100644", g.write_blob(path), f"{RESULTS_PREFIX}/{name}")
        result.results_paths.append(f"{RESULTS_PREFIX}/{name}")
    tree = g.write_tree()
    judged = [r for r in records if r.status != "skip"]
    kept = len(result.commits)
    metric = records[-1].metric_name
    baseline = queries.baseline_estimate(records)   # the mean of the baseline's runs, as status shows it
    best_metric = next((r.best_metric for r in reversed(records) if r.best), None)
    subject = f"autoloop results: {len(judged)} attempts of autoloop/{result.tag}"
    body = [f"{metric} {baseline.metric:.6f} -> {best_metric:.6f}" if baseline and best_metric is not None
            else f"{metric}: no best recorded",
            f"{len({r.trial for r in judged})} trials, {kept} kept change commit{'s' if kept != 1 else ''} above",
            "", "Adds " + ", ".join(result.results_paths) + ", rebuilt from results/ledger.jsonl."]
    message = "\n".join([subject, "", *body])
    sha = g.commit_tree(tree, parent, message, g.ident_env(None))
    result.results = FinalCommit(sha, [], message + "\n")
    return sha


def _note_final_commits(root: Path, result: FinalizeResult, records: list[LedgerRecord]) -> None:
    """Each final commit gets the notes of the trial commit(s) it replays (never fatal)."""
    from autoloop.observe.git_notes import Notes, NotesError, notes_by_commit

    texts = notes_by_commit(records)
    notes = Notes(root)
    try:
        for commit in result.commits:
            parts = [texts[c.record.commit].rstrip("\n") for c in commit.changes if c.record.commit in texts]
            if parts:
                notes.write(commit.sha, "\n\n".join(parts) + "\n")
    except NotesError as e:
        result.warnings.append(f"git notes of the final commits not written: {e}")


def _apply(g: PrivateIndex, change: KeptChange, tmp: Path) -> None:
    """Apply one kept change (parent -> commit) to the private index."""
    rec = change.record
    for old_mode, new_mode, old_blob, new_blob, status, path in g.changes(change.parent, change.commit):
        now = g.entry(path)
        was = None if status == "A" else (old_mode, old_blob)
        if now == was or (now is not None and now[1] == old_blob):
            if status == "D":
                g.remove_entry(path)
            else:
                g.set_entry(new_mode, new_blob, path)
        elif now is not None and status != "D" and now[1] == new_blob:
            continue   # already there
        elif now is not None and status == "M" and _replay(g, change, path, now, tmp):
            continue
        else:
            # The path moved on since this change's parent: apply the change as a patch.
            patch = tmp / "change.patch"
            patch.write_text(g.patch(change.parent, change.commit, path))
            try:
                g.apply_cached(patch)
            except PlumbingError as e:
                raise FinalizeError(f"the kept change of trial {_label(rec)} ({rec.description.splitlines()[0]}) "
                                    f"does not apply on top of the earlier kept changes: {e}") from None


def _replay(g: PrivateIndex, change: KeptChange, path: str, now: tuple[str, str], tmp: Path) -> bool:
    """A text file's change replayed onto the index's version (``core.revert.merge3``: no
    context lines, by constant where it can, as verify takes changes out), written to the
    index; False when the texts are not text, and a conflict stops finalize."""
    parent, commit = g.blob_text(f"{change.parent}:{path}"), g.blob_text(f"{change.commit}:{path}")
    current = g.blob_text(now[1])
    if parent is None or commit is None or current is None:
        return False   # not text: git apply decides
    merged = merge3(parent, current, commit)
    if merged is None:
        rec = change.record
        raise FinalizeError(f"the kept change of trial {_label(rec)} ({rec.description.splitlines()[0]}) does not "
                            f"apply on top of the earlier kept changes: it rewrites lines of {path} they changed")
    blob_file = tmp / "replayed"
    blob_file.write_bytes(merged.encode("utf-8"))
    g.set_entry(now[0], g.write_blob(blob_file), path)
    return True
