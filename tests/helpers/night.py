"""A night built by hand: a real git repo on autoloop/<tag> and a ledger written with
LedgerRecord, as the loop would have left them, without training anything.

Each step edits constants of a small train.py: a kept step stays on the branch, any
other step is committed, saved under its trial ref and reset away (as the loop does).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from autoloop.store.ledger import Ledger, LedgerRecord
from helpers.git import git, init_repo

CONSTANTS = {
    "DEPTH": "4", "WIDTH": "128", "HEADS": "4", "SEQ_LEN": "256",
    "MATRIX_LR": "0.04", "EMBED_LR": "0.6", "HEAD_LR": "0.004", "WEIGHT_DECAY": "0.0",
    "WARMUP": "0.0", "WARMDOWN": "0.5", "BATCH": "32", "DROPOUT": "0.0",
}


def train_source(values: dict[str, str]) -> str:
    """A train.py whose constants sit 3 lines apart, so edits of different constants
    touch different line ranges."""
    lines = ['"""A tiny training script for the tests."""', ""]
    for name, value in values.items():
        lines += [f"# {name.lower()}: what it does", f"{name} = {value}", ""]
    lines += ["def main():", "    print('val_bpb: 1.0')", ""]
    return "\n".join(lines)


def set_values(source: str, **values: str) -> str:
    for name, value in values.items():
        source, n = re.subn(rf"^{name} = .*$", f"{name} = {value}", source, count=1, flags=re.M)
        assert n == 1, name
    return source


@dataclass
class Step:
    description: str
    status: str                       # keep | discard | crash | skip
    metric: float | None = None
    crash: str | None = None
    reason: str = ""
    edit: dict[str, str] = field(default_factory=dict)   # constant -> new value
    attempt: int = 1
    noise: float | None = None
    training_seconds: float | None = 300.0
    wall_seconds: float = 330.0


@dataclass
class Night:
    repo: Path
    tag: str
    records: list[LedgerRecord]
    baseline: str
    best: str

    @property
    def results(self) -> Path:
        return self.repo / "results"


def build_night(tmp: Path, steps: list[Step], *, tag: str = "t", baseline_metric: float = 1.0275,
                start: float = 1_700_000_000.0, gap: float = 20.0, results_extra: bool = True) -> Night:
    repo = init_repo(tmp / "repo", {"train.py": train_source(CONSTANTS), "program.md": "goal\n"})
    git(repo, "checkout", "-q", "-b", f"autoloop/{tag}")
    baseline = git(repo, "rev-parse", "HEAD")
    ledger = Ledger(repo / "results", fsync=False)
    t = start
    best, best_metric = baseline, baseline_metric
    records = []

    def add(**kw) -> LedgerRecord:
        record = LedgerRecord(metric_name="val_bpb", seed=42, **kw)
        ledger.append(record, write_tsv=False)
        records.append(record)
        return record

    add(trial=0, attempt=1, kind="baseline", started_at=t, ended_at=t + 340, proposer="-", parent=baseline,
        commit=baseline, description="baseline", status="keep", metric=baseline_metric, training_seconds=300.0,
        wall_seconds=330.0, best=baseline, best_metric=baseline_metric, log_path="runs/0-1.log")
    t += 340
    trial = 0
    for step in steps:
        if step.attempt == 1:
            trial += 1
        t += gap
        started = t
        if step.status == "skip":
            add(trial=trial, attempt=step.attempt, started_at=t, ended_at=t, proposer="queue", parent=best,
                description=step.description, status="skip", reason=step.reason or "patch does not apply",
                best=best, best_metric=best_metric)
            continue
        path = repo / "train.py"
        path.write_text(set_values(path.read_text(), **step.edit))
        git(repo, "commit", "-q", "-am", f"{step.description}\n\nautoloop trial {trial}.{step.attempt} (queue)")
        commit = git(repo, "rev-parse", "HEAD")
        git(repo, "update-ref", f"refs/autoloop/{tag}/trials/{trial}-{step.attempt}", commit)
        crashed = step.status == "crash"
        wall = 4.0 if crashed and step.crash == "trivial" else step.wall_seconds
        t += wall + 6
        kw = dict(trial=trial, attempt=step.attempt, kind="fix" if step.attempt > 1 else "candidate",
                  started_at=started, ended_at=t, proposer="queue", parent=best, commit=commit,
                  description=step.description, status=step.status, crash=step.crash, reason=step.reason,
                  metric=None if crashed else step.metric, noise=step.noise, wall_seconds=wall,
                  training_seconds=None if crashed else step.training_seconds,
                  log_path=f"runs/{trial}-{step.attempt}.log")
        if step.status == "keep":
            best, best_metric = commit, step.metric
        else:
            git(repo, "reset", "-q", "--hard", best)
        add(**kw, best=best, best_metric=best_metric)
    ledger.write_tsv()
    if results_extra:
        runs = repo / "results" / "runs"
        runs.mkdir(parents=True, exist_ok=True)
        for r in records:
            if r.status in ("keep", "discard"):
                (runs / f"{r.trial}-{r.attempt}.result.json").write_text(json.dumps({"metric": r.metric,
                                                                                    "eval_seconds": 12.5}))
    (repo / "results" / "state.json").write_text(json.dumps({"tag": tag, "phase": "stopped",
                                                             "stop_reason": "time is up"}))
    return Night(repo, tag, records, baseline, best)


# A realistic night: ~30 attempts mixing keeps, discards, all crash classes, a fix, a skip.
def realistic_steps() -> list[Step]:
    S = Step
    return [
        S("MATRIX_LR 0.04 -> 0.06", "keep", 1.0234, edit={"MATRIX_LR": "0.06"}),
        S("EMBED_LR 0.6 -> 0.9", "discard", 1.0251, edit={"EMBED_LR": "0.9"}),
        S("depth 4 -> 6", "crash", crash="fundamental", reason="CUDA out of memory (tried to allocate 2.1 GiB)",
          edit={"DEPTH": "6"}),
        S("warmup 0 -> 0.05", "discard", 1.0240, edit={"WARMUP": "0.05"}),
        S("swap GELU for ReLU^2", "crash", crash="trivial",
          reason="NameError: name 'relu2' is not defined (train.py:88)", edit={"DROPOUT": "0.0 + relu2"}),
        S("swap GELU for ReLU^2 (fixed)", "discard", 1.0249, edit={"DROPOUT": "0.00"}, attempt=2),
        S("weight decay 0 -> 0.1", "keep", 1.0212, edit={"WEIGHT_DECAY": "0.1"}),
        S("HEAD_LR 0.004 -> 0.008", "discard", 1.0230, edit={"HEAD_LR": "0.008"}),
        S("batch 32 -> 64", "discard", 1.0262, edit={"BATCH": "64"}),
        S("lr 10x", "crash", crash="fundamental", reason="loss is nan at step 41", edit={"MATRIX_LR": "0.6"}),
        S("bad patch", "skip", reason="patch does not apply: train.py:12"),
        S("warmdown 0.5 -> 0.7", "keep", 1.0196, edit={"WARMDOWN": "0.7"}),
        S("seq len 256 -> 512", "crash", crash="timeout", reason="ran past the hard limit of 12m",
          edit={"SEQ_LEN": "512"}),
        S("MATRIX_LR 0.06 -> 0.08", "discard", 1.0201, edit={"MATRIX_LR": "0.08"}),
        S("dropout 0.1", "discard", 1.0455, edit={"DROPOUT": "0.1"}),
        S("heads 4 -> 8", "discard", 1.0215, edit={"HEADS": "8"}),
        S("width 128 -> 160", "keep", 1.0181, edit={"WIDTH": "160"}),
        S("freeze every weight", "discard", 8.0, edit={"MATRIX_LR": "0.0"}),
        S("EMBED_LR 0.6 -> 0.4", "discard", 1.0190, edit={"EMBED_LR": "0.4"}),
        S("typo in schedule", "crash", crash="trivial", reason="SyntaxError: invalid syntax (train.py:140)",
          edit={"WARMDOWN": "0.7)"}),
        S("weight decay 0.1 -> 0.2", "discard", 1.0185, edit={"WEIGHT_DECAY": "0.2"}, noise=0.0011),
        S("HEAD_LR 0.004 -> 0.006", "keep", 1.0168, edit={"HEAD_LR": "0.006"}, noise=0.0011),
        S("batch 32 -> 48", "discard", 1.0177, edit={"BATCH": "48"}, noise=0.0012),
        S("warmup 0 -> 0.02", "discard", 1.0172, edit={"WARMUP": "0.02"}, noise=0.0012),
        S("depth 4 -> 5", "crash", crash="fundamental", reason="killed by SIGSEGV", edit={"DEPTH": "5"}),
        S("MATRIX_LR 0.06 -> 0.07", "keep", 1.0159, edit={"MATRIX_LR": "0.07"}, noise=0.0012),
        S("width 160 -> 192", "discard", 1.0163, edit={"WIDTH": "192"}, noise=0.0012),
        S("heads 4 -> 2", "discard", 1.0207, edit={"HEADS": "2"}, noise=0.0012),
        S("EMBED_LR 0.6 -> 0.7", "discard", 1.0161, edit={"EMBED_LR": "0.7"}, noise=0.0012),
    ]
