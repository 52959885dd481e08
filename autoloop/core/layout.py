"""Where everything autoloop writes is named: the files under ``results/`` and its git refs.

Every path under the workspace's ``results/`` folder comes from one :class:`Layout`, and
every branch or ref name from the functions below, so that a reader (``autoloop status``,
``report``, ``finalize``, recovery after ``kill -9``) and the writer can never disagree
about where something is. Nothing here touches the disk except ``ensure``.

::

    results/
      ledger.jsonl             the truth: one validated record per attempt (ledger.py)
      results.tsv              derived from it after every append
      .ledger.lock             serialises ledger appends and TSV rewrites
      ledger.torn-<stamp>      a torn tail moved aside by the repair on start
      .autoloop.lock           held by the one orchestrator of this workspace
      state.json               the attempt in flight and its phase (state.py)
      night.json               the night's facts for the study: budget, data, metric, machine (study.py)
      state-w<k>.json          the same for parallel worker k
      state-ahead.json         the look-ahead proposal in flight (state-w<k>-ahead.json: worker k's)
      prepared/<t>.json        a look-ahead candidate prepared and not yet run (lookahead.py)
      runs/<t>-<a>.log         a trial's output; runs/<t>-<a>.result.json its result file
      agents/<t>-<a>.*         an agent call: prompt, description, hypothesis, log
      agents/<t>-<a>.refs.json the branches, tags and trial refs before a proposal (while it runs)
      quarantine/<t>-<a>/      what the scope check took away (run/: what the run wrote)
      quarantine/<t>-<a>-tampered/   changed versions of protected inputs (integrity.py)
      quarantine/prepared-data/      data restored before the session's snapshot
      .pristine/               pristine copies of the protected inputs
      .harness/autoloop/       the private copy of the harness that trials import
      queue/, queue/done/      the queue proposer's patches (default --queue-dir)
      slurm/                   submitit's job files (default --slurm-folder)
      optuna.db                the Optuna proposer's study (SQLite; -wal, -shm beside it)
      archive/<tag>-<stamp>/   a previous tag's results, moved aside when a new tag starts
      report.md, progress.png  `autoloop report`
      study.png                `autoloop report`: the running best across nights (history.py); not archived
      person-notes.json        `autoloop note`: the person's notes and clears (person_notes.py)
      .person-notes.lock       serialises the writers of person-notes.json
      stop-request.json        "stop after the running trial", for the orchestrator of one pid (stop_request.py)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

RESULTS = "results"               # the folder, relative to the workspace root (git-ignored)
QUEUE = "queue"
SLURM = "slurm"
DEFAULT_QUEUE_DIR = f"{RESULTS}/{QUEUE}"     # settings.queue_dir's default, relative to the workspace
DEFAULT_SLURM_DIR = f"{RESULTS}/{SLURM}"     # settings.slurm_folder's default
WORKTREES = "worktrees"           # parallel workers' git worktrees, beside results/ in the workspace
STATE = "state.json"
PRISTINE = ".pristine"
HARNESS = ".harness"
TORN_PREFIX = "ledger.torn-"
OPTUNA_STUDY = "optuna.db"        # one night's Optuna study, relearnt from the ledger when moved aside
# What a new tag moves into archive/ (the rest: queue, locks, pristine copies, stay).
VERIFY = "verify"                 # autoloop verify's plan and its contributions picture
PREPARED = "prepared"             # look-ahead candidates (--lookahead) waiting to run
LADDER = "ladder"                 # autoloop ladder's plan and verdicts; its picture is ladder.png
NIGHT_INFO = "night.json"         # the night's facts (budget, data, metric, machine) for the study across nights
TAG_FILES = (NIGHT_INFO, "ledger.jsonl", "results.tsv", STATE, "runs", "agents", "quarantine", "progress.png",
             "report.md", VERIFY, OPTUNA_STUDY, f"{OPTUNA_STUDY}-wal", f"{OPTUNA_STUDY}-shm", PREPARED, LADDER,
             f"{LADDER}.png")


def branch_name(tag: str) -> str:
    """The loop's branch: it always points at the best commit of the night."""
    return f"autoloop/{tag}"


def tag_of_branch(branch: str | None) -> str | None:
    """'autoloop/nov29' -> 'nov29'; None for any other branch (or a detached HEAD)."""
    prefix = branch_name("")
    return branch[len(prefix):] if branch and branch.startswith(prefix) and len(branch) > len(prefix) else None


def worker_branch_name(tag: str, worker: int) -> str:
    """Parallel worker k's own branch, checked out in its worktree."""
    return f"{branch_name(tag)}-w{worker}"


def ahead_branch_name(tag: str, worker: int | None) -> str:
    """The branch of a slot's look-ahead worktree (the single loop's, or worker k's)."""
    return f"{branch_name(tag)}{'' if worker is None else f'-w{worker}'}-ahead"


def prepared_ref(tag: str, trial: int) -> str:
    """Where a look-ahead candidate is kept from the moment it is prepared, whatever becomes of it."""
    return f"refs/autoloop/{tag}/prepared/{trial}"


def final_branch_name(tag: str) -> str:
    """`autoloop finalize`'s default branch of the kept changes."""
    return f"{branch_name(tag)}-final"


def trial_ref_prefix(tag: str) -> str:
    return f"refs/autoloop/{tag}/trials/"


def trial_ref(tag: str, trial: int, attempt: int) -> str:
    """Where an attempt's commit is kept after a reset. `<trial>-<attempt>`: git cannot hold
    both trials/5 and trials/5/2."""
    return f"{trial_ref_prefix(tag)}{trial}-{attempt}"


def agent_ref_prefix(tag: str, trial: int, attempt: int) -> str:
    """Where the agent's own commits and index are kept (reconcile)."""
    return f"refs/autoloop/{tag}/agent/{trial}-{attempt}/"


def attempt_stem(trial: int, attempt: int) -> str:
    return f"{trial}-{attempt}"


@dataclass(frozen=True)
class Layout:
    """The paths under one workspace's results/ folder."""

    root: Path          # results/ itself (absolute)

    @classmethod
    def of(cls, workspace: Path) -> Layout:
        return cls(Path(workspace) / RESULTS)

    def ensure(self) -> Layout:
        self.root.mkdir(parents=True, exist_ok=True)
        return self

    # -- the ledger -----------------------------------------------------------------------
    @property
    def ledger(self) -> Path:
        return self.root / "ledger.jsonl"

    @property
    def tsv(self) -> Path:
        return self.root / "results.tsv"

    @property
    def ledger_lock(self) -> Path:
        return self.root / ".ledger.lock"

    def torn(self, stamp: str) -> Path:
        return self.root / f"{TORN_PREFIX}{stamp}"

    # -- the orchestrator -----------------------------------------------------------------
    @property
    def workspace_lock(self) -> Path:
        return self.root / ".autoloop.lock"

    def state(self, name: str = STATE) -> Path:
        return self.root / name

    @staticmethod
    def worker_state_name(worker: int) -> str:
        return f"state-w{worker}.json"

    @staticmethod
    def ahead_state_name(worker: int | None) -> str:
        """The state file of a slot's look-ahead proposal."""
        return "state-ahead.json" if worker is None else f"state-w{worker}-ahead.json"

    def ahead_states(self) -> list[tuple[int | None, Path]]:
        """(worker or None, path) of every look-ahead state file there is."""
        found: list[tuple[int | None, Path]] = []
        if self.state(self.ahead_state_name(None)).exists():
            found.append((None, self.state(self.ahead_state_name(None))))
        for path in sorted(self.root.glob("state-w*-ahead.json")):
            number = path.name.removeprefix("state-w").removesuffix("-ahead.json")
            if number.isdigit():
                found.append((int(number), path))
        return found

    @property
    def prepared_dir(self) -> Path:
        return self.root / PREPARED

    def prepared(self, trial: int) -> Path:
        """A look-ahead candidate of ``trial``, prepared and not yet run."""
        return self.prepared_dir / f"{trial}.json"

    def worker_states(self) -> list[tuple[int, Path]]:
        """(worker, path) of every worker state file there is, by worker number."""
        found = []
        for path in self.root.glob("state-w*.json"):
            number = path.stem.removeprefix("state-w")
            if number.isdigit():
                found.append((int(number), path))
        return sorted(found)

    # -- one attempt ----------------------------------------------------------------------
    @property
    def runs(self) -> Path:
        return self.root / "runs"

    def log(self, trial: int, attempt: int) -> Path:
        return self.runs / f"{attempt_stem(trial, attempt)}.log"

    def log_rel(self, trial: int, attempt: int) -> str:
        """The log as the ledger names it: relative to results/."""
        return f"runs/{attempt_stem(trial, attempt)}.log"

    def result(self, trial: int, attempt: int) -> Path:
        return self.runs / f"{attempt_stem(trial, attempt)}.result.json"

    @property
    def agents(self) -> Path:
        return self.root / "agents"

    def agent_files(self, trial: int, attempt: int) -> tuple[Path, Path, Path]:
        """(prompt, description, log) of one agent call."""
        stem = self.agents / attempt_stem(trial, attempt)
        return (stem.with_name(stem.name + ".prompt.md"), stem.with_name(stem.name + ".description.txt"),
                stem.with_name(stem.name + ".log"))

    def hypothesis_file(self, trial: int, attempt: int) -> Path:
        """Where an agent call may write its one-line hypothesis (why the change should help)."""
        return self.agents / f"{attempt_stem(trial, attempt)}.hypothesis.txt"

    @property
    def night_info(self) -> Path:
        """The night's facts for the study (store/study.py); archived with its ledger."""
        return self.root / NIGHT_INFO

    @property
    def person_notes(self) -> Path:
        """The person's notes to the agent (`autoloop note`); kept across tags until cleared."""
        return self.root / "person-notes.json"

    @property
    def person_notes_lock(self) -> Path:
        return self.root / ".person-notes.lock"

    @property
    def stop_request(self) -> Path:
        """A request that the night stop once its running trials are recorded (store/stop_request.py)."""
        return self.root / "stop-request.json"

    def ref_snapshot(self, trial: int, attempt: int) -> Path:
        """The refs before one proposal, persisted so that a recovery after kill -9 puts back
        what the proposer moved (reconcile); removed once the proposal is reconciled."""
        return self.agents / f"{attempt_stem(trial, attempt)}.refs.json"

    @property
    def quarantine_root(self) -> Path:
        return self.root / "quarantine"

    def quarantine(self, trial: int, attempt: int) -> Path:
        """What the scope check moved or copied away from the proposal of one attempt."""
        return self.quarantine_root / attempt_stem(trial, attempt)

    def run_writes(self, trial: int, attempt: int) -> Path:
        """What the run itself wrote into the repository, put back after it."""
        return self.quarantine(trial, attempt) / "run"

    def tampered(self, trial: int, attempt: int) -> Path:
        """The changed versions of protected inputs, when they are restored."""
        return self.quarantine_root / f"{attempt_stem(trial, attempt)}-tampered"

    @property
    def prepared_data_evidence(self) -> Path:
        return self.quarantine_root / "prepared-data"

    # -- integrity ------------------------------------------------------------------------
    @property
    def pristine(self) -> Path:
        return self.root / PRISTINE

    @property
    def harness(self) -> Path:
        """The folder trials get first on their PYTHONPATH; it holds the harness copy."""
        return self.root.resolve() / HARNESS

    # -- proposers, executors, reports ----------------------------------------------------
    @property
    def queue(self) -> Path:
        return self.root / QUEUE

    @property
    def optuna_study(self) -> Path:
        return self.root / OPTUNA_STUDY

    @property
    def slurm(self) -> Path:
        return self.root / SLURM

    @property
    def archive(self) -> Path:
        return self.root / "archive"

    @property
    def report(self) -> Path:
        return self.root / "report.md"

    @property
    def picture(self) -> Path:
        return self.root / "progress.png"

    @property
    def study_picture(self) -> Path:
        return self.root / "study.png"

    @property
    def verify_plan(self) -> Path:
        """The verification's plan (variants, seeds, trials), what --resume continues."""
        return self.root / VERIFY / "plan.json"

    @property
    def contributions_picture(self) -> Path:
        return self.root / VERIFY / "contributions.png"

    @property
    def ladder_plan(self) -> Path:
        """The scaling ladder's plan (rungs, sides, seeds, trials), what --resume continues."""
        return self.root / LADDER / "plan.json"

    @property
    def ladder_verdicts(self) -> Path:
        """Each finished ladder's verdict by kept change, what finalize --drop-unproven reads."""
        return self.root / LADDER / "verdicts.json"

    @property
    def ladder_picture(self) -> Path:
        return self.root / f"{LADDER}.png"
