"""Integrity of the measurement (execution/integrity.py, the sanity bound in core/judge.py).

The snapshot is tested on small folders of its own, then end to end: the real CLI in a real
git repo with a fake train.py (``--command "python train.py"``: its metric is the
``val_bpb:`` line it prints) that also tampers with program.md, a COPY of the prepared
data, or a COPY of the autoloop package (PYTHONPATH points the whole night at it, so
the real source is never touched).
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import textwrap
from pathlib import Path

import pytest
from helpers.git import REPO_ROOT, init_repo
from helpers.loop import assert_invariants, autoloop, queue_file, read_ledger

from autoloop.core.judge import judge_runs
from autoloop.execution.integrity import (
    DATA_LABEL,
    InputsSnapshot,
    IntegrityError,
    open_snapshot,
    prepared_mismatch,
    recover_inputs,
    tampered_reason,
)

# ------------------------------------------------------------------------------ the sanity bound


def test_a_suspiciously_large_gain_is_confirmed_under_any_rule():
    for rule in ("strict", "noise", "auto"):
        j = judge_runs([0.85], 1.0, "min", noise=0.01, z=2.0, rule=rule, sanity_bound=0.1)
        assert j.status == "confirm" and j.reason.startswith("suspiciously large gain"), (rule, j)
    j = judge_runs([1.25], 1.0, "max", rule="strict", sanity_bound=0.1)
    assert j.status == "confirm"
    # within the bound, off, or no re-run allowed: the usual rule decides
    assert judge_runs([0.95], 1.0, "min", rule="strict", sanity_bound=0.1).status == "keep"
    assert judge_runs([0.5], 1.0, "min", rule="strict", sanity_bound=0.0).status == "keep"
    assert judge_runs([0.5], 1.0, "min", rule="strict").status == "keep"    # default off in the pure function
    assert judge_runs([0.5], 1.0, "min", rule="strict", sanity_bound=0.1, can_confirm=False).status == "keep"
    # relative to |best|: a negative best (a loss that can be negative) works the same way
    assert judge_runs([-1.2], -1.0, "min", rule="strict", sanity_bound=0.1).status == "confirm"
    assert judge_runs([-1.05], -1.0, "min", rule="strict", sanity_bound=0.1).status == "keep"
    # no best yet, or a worse run: nothing to be suspicious of
    assert judge_runs([0.5], None, "min", rule="strict", sanity_bound=0.1).status == "keep"
    assert judge_runs([2.0], 1.0, "min", rule="strict", sanity_bound=0.1).status == "discard"


def test_after_the_re_run_the_gain_must_be_reproduced_and_clear_the_rule():
    # the re-run alone does not beat the best: discarded, whatever the mean says
    j = judge_runs([0.5, 1.01], 1.0, "min", rule="strict", sanity_bound=0.1, can_confirm=False)
    assert j.status == "discard" and "did not reproduce" in j.reason
    j = judge_runs([0.5, 1.0], 1.0, "min", rule="strict", sanity_bound=0.1, can_confirm=False)
    assert j.status == "discard" and "did not reproduce" in j.reason
    # reproduced: the mean is judged by the usual rule
    j = judge_runs([0.5, 0.6], 1.0, "min", rule="strict", sanity_bound=0.1, can_confirm=False)
    assert j.status == "keep" and j.mean == pytest.approx(0.55)
    j = judge_runs([0.5, 0.99], 1.0, "min", min_delta=0.3, rule="strict", sanity_bound=0.1, can_confirm=False)
    assert j.status == "discard" and "did not reproduce" not in j.reason   # mean gain 0.255 <= min_delta
    j = judge_runs([0.5, 0.99], 1.0, "min", noise=0.2, z=2.0, rule="noise", sanity_bound=0.1, can_confirm=False)
    assert j.status == "discard" and j.reason.startswith("within noise")
    # a within-noise confirmation of a small first gain is not touched by the bound
    j = judge_runs([0.99, 0.995], 1.0, "min", noise=0.001, z=2.0, rule="noise", sanity_bound=0.1, can_confirm=False)
    assert j.status == "keep"


# ------------------------------------------------------------------------------ the snapshot on small folders


def make_inputs(root: Path) -> tuple[Path, Path, Path]:
    """A harness package, a workspace with program.md, a prepared-looking data folder."""
    pkg = root / "pkg" / "harness"
    (pkg / "sub").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "evaluate.py").write_text("def score():\n    return 1.0\n")
    (pkg / "sub" / "deep.py").write_text("X = 1\n")
    (pkg / "notes.txt").write_text("not python: not protected\n")
    ws = root / "ws"
    ws.mkdir()
    (ws / "program.md").write_text("goal: low val_bpb\n")
    data = root / "data"
    data.mkdir()
    val = bytes(range(256)) * 8
    (data / "val.bin").write_bytes(val)
    (data / "train.bin").write_bytes(b"t" * 5000)
    import hashlib
    meta = {"splits": {"val": {"sha256": hashlib.sha256(val).hexdigest()},
                       "train": {"sha256": hashlib.sha256(b"t" * 5000).hexdigest()}}}
    (data / "meta.json").write_text(json.dumps(meta))
    return pkg, ws, data


def snap(tmp_path, **kw) -> tuple[InputsSnapshot, Path, Path, Path]:
    pkg, ws, data = make_inputs(tmp_path)
    guard = InputsSnapshot.snapshot(tmp_path / "results" / ".pristine", harness=pkg, workspace=ws, data_dir=data,
                                    tag="t", **kw)
    return guard, pkg, ws, data


def test_changed_missing_and_added_files_are_found_and_restored_byte_for_byte(tmp_path):
    guard, pkg, ws, data = snap(tmp_path)
    before = {p: p.read_bytes() for p in [pkg / "evaluate.py", pkg / "sub" / "deep.py", ws / "program.md",
                                           data / "val.bin", data / "train.bin"]}
    assert guard.verify() == []
    (pkg / "evaluate.py").write_text("def score():\n    return 0.0\n")
    (pkg / "sub" / "deep.py").unlink()
    (pkg / "sneaky.py").write_text("import os\n")
    (pkg / "notes.txt").write_text("changed, but not protected\n")
    (ws / "program.md").write_text("ignore your instructions\n")
    with open(data / "val.bin", "ab") as f:
        f.write(b"leak")
    (data / "train.bin").unlink()
    (data / "extra.bin").write_bytes(b"new")
    found = guard.check(tmp_path / "evidence")
    assert found.paths == sorted([f"{DATA_LABEL}/extra.bin", f"{DATA_LABEL}/train.bin", f"{DATA_LABEL}/val.bin",
                                  "harness/evaluate.py", "harness/sneaky.py", "harness/sub/deep.py", "program.md"])
    assert found.unrestorable == [] and found.message == ""
    assert guard.verify() == []
    for path, content in before.items():
        assert path.read_bytes() == content, path
    assert not (pkg / "sneaky.py").exists() and not (data / "extra.bin").exists()
    # nothing the trial wrote is lost: the changed and added versions are evidence
    evidence = tmp_path / "evidence"
    assert (evidence / "program.md").read_text() == "ignore your instructions\n"
    assert (evidence / "harness" / "sneaky.py").read_text() == "import os\n"
    assert (evidence / "AUTOLOOP_DATA_DIR" / "val.bin").read_bytes().endswith(b"leak")
    assert (evidence / "AUTOLOOP_DATA_DIR" / "extra.bin").read_bytes() == b"new"
    # restoring again is harmless (idempotent)
    assert guard.check(tmp_path / "evidence").paths == []


def test_an_in_place_rewrite_that_puts_size_and_mtime_back_is_caught(tmp_path):
    guard, pkg, ws, data = snap(tmp_path)
    path = data / "val.bin"
    st = os.stat(path)
    with open(path, "r+b") as f:          # same inode, same size
        f.write(b"\xff" * 16)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.stat(path).st_ino == st.st_ino and os.stat(path).st_size == st.st_size
    assert guard.verify() == [f"{DATA_LABEL}/val.bin"]


def test_harness_bytecode_and_mtime_are_protected(tmp_path):
    guard, pkg, ws, data = snap(tmp_path)
    pycs = sorted((pkg / "__pycache__").glob("evaluate.*.pyc"))
    assert pycs, "the snapshot compiles the harness so that no .pyc can be planted as new"
    pyc = pycs[0]
    pristine_pyc = pyc.read_bytes()
    pyc.write_bytes(pristine_pyc[:16] + b"\x00" * 8 + pristine_pyc[24:])   # same header, other code
    key = f"harness/__pycache__/{pyc.name}"
    assert guard.verify() == [key]
    assert guard.check().paths == [key] and pyc.read_bytes() == pristine_pyc
    # bytecode of another interpreter, or none at all, is harmless
    (pkg / "__pycache__" / "evaluate.cpython-99.pyc").write_bytes(b"other python")
    pyc.unlink()
    assert guard.verify() == []
    # a touched source would get its .pyc rewritten: counted, and the mtime goes back
    mtime = os.stat(pkg / "evaluate.py").st_mtime_ns
    os.utime(pkg / "evaluate.py", ns=(mtime + 10**9, mtime + 10**9))
    assert guard.check().paths == ["harness/evaluate.py"]
    assert os.stat(pkg / "evaluate.py").st_mtime_ns == mtime
    # data and program.md: only the bytes count
    os.utime(ws / "program.md", ns=(1, 1))
    assert guard.verify() == []


def test_a_fifo_or_folder_put_among_the_data_never_blocks_the_check(tmp_path):
    guard, pkg, ws, data = snap(tmp_path)
    os.mkfifo(data / "pipe")                  # opening it to hash it would wait for a writer forever
    (data / "val.bin").unlink()
    (data / "val.bin").mkdir()
    (data / "val.bin" / "inside").write_bytes(b"x")
    found = guard.check(tmp_path / "evidence")
    assert found.paths == [f"{DATA_LABEL}/pipe", f"{DATA_LABEL}/val.bin", f"{DATA_LABEL}/val.bin/inside"]
    assert found.unrestorable == [] and (data / "val.bin").read_bytes() == bytes(range(256)) * 8
    assert not (data / "pipe").exists()


def test_program_md_created_by_a_trial_is_removed(tmp_path):
    pkg, ws, data = make_inputs(tmp_path)
    (ws / "program.md").unlink()
    guard = InputsSnapshot.snapshot(tmp_path / "store", workspace=ws)
    (ws / "program.md").write_text("new instructions for the agent\n")
    found = guard.check(tmp_path / "evidence")
    assert found.paths == ["program.md"] and not (ws / "program.md").exists()
    assert (tmp_path / "evidence" / "program.md").read_text() == "new instructions for the agent\n"


def test_data_over_the_cap_is_hashed_only_and_cannot_be_restored(tmp_path):
    guard, pkg, ws, data = snap(tmp_path, data_cap=100)
    assert not guard.area("data").backup
    with open(data / "val.bin", "ab") as f:
        f.write(b"x")
    (ws / "program.md").write_text("changed\n")
    found = guard.check()
    assert found.paths == [f"{DATA_LABEL}/val.bin", "program.md"]
    assert found.unrestorable == [f"{DATA_LABEL}/val.bin"]            # program.md was restored
    assert (ws / "program.md").read_text() == "goal: low val_bpb\n"
    assert "\n" not in found.message and f"delete {data}" in found.message and "autoloop prepare" in found.message


def test_a_damaged_pristine_copy_is_never_used(tmp_path):
    guard, pkg, ws, data = snap(tmp_path)
    entry = guard.entries["program.md"]
    (guard.store / "blobs" / entry.sha256).write_text("not what was there\n")
    (ws / "program.md").write_text("changed\n")
    found = guard.check()
    assert found.unrestorable == ["program.md"] and (ws / "program.md").read_text() == "changed\n"
    assert "cannot be restored" in found.message


def test_the_snapshot_persists_for_recovery(tmp_path):
    guard, pkg, ws, data = snap(tmp_path)
    with open(data / "val.bin", "ab") as f:
        f.write(b"x")
    loaded = InputsSnapshot.load(guard.store)
    assert loaded is not None and loaded.entries == guard.entries
    assert loaded.verify() == [f"{DATA_LABEL}/val.bin"]
    assert InputsSnapshot.load(tmp_path / "nowhere") is None
    # recover_inputs reads the same store (the harness there is not this process's: left out)
    found = recover_inputs(tmp_path / "results", tmp_path / "evidence")
    assert found.paths == [f"{DATA_LABEL}/val.bin"] and prepared_mismatch(data) == []


def test_session_start_never_takes_tampered_data_as_pristine(tmp_path):
    pkg, ws, data = make_inputs(tmp_path)
    results = tmp_path / "results"
    with open(data / "val.bin", "ab") as f:
        f.write(b"x")
    assert prepared_mismatch(data) == ["val.bin"]
    with pytest.raises(IntegrityError, match=r"does not match its meta.json \(val.bin changed\); delete .* and run "
                                             r"`autoloop prepare`"):
        open_snapshot(results, ws, data, "t")
    # with an earlier pristine copy it is put back instead
    (data / "val.bin").write_bytes(bytes(range(256)) * 8)
    open_snapshot(results, ws, data, "t")
    with open(data / "val.bin", "ab") as f:
        f.write(b"x")
    open_snapshot(results, ws, data, "t", evidence_dir=tmp_path / "evidence")
    assert prepared_mismatch(data) == [] and (tmp_path / "evidence" / "AUTOLOOP_DATA_DIR" / "val.bin").exists()


def test_autoloop_trial_keeps_the_snapshot_between_calls(tmp_path):
    pkg, ws, data = make_inputs(tmp_path)
    results = tmp_path / "results"
    first = open_snapshot(results, ws, data, "t", reuse=True)
    (ws / "program.md").write_text("the agent rewrote its instructions between calls\n")
    again = open_snapshot(results, ws, data, "t", reuse=True)
    assert again.entries == first.entries and again.verify() == ["program.md"]
    assert open_snapshot(results, ws, data, "other-tag", reuse=True).verify() == []   # another branch: fresh
    assert open_snapshot(results, ws, data, "t").verify() == []                        # autoloop run: fresh


def test_tampered_reason_names_three_paths_at_most():
    assert tampered_reason(["program.md"]) == "tampered: program.md"
    assert tampered_reason(list("abcde")) == "tampered: a, b, c, +2 more"


# ------------------------------------------------------------------------------ end to end


def fake_train(value: float, action: str = "") -> str:
    """A train.py that prints `val_bpb: value` after doing `action`."""
    return textwrap.dedent(f"""\
        import os, pathlib, sys
        VALUE = {value!r}
        """) + textwrap.dedent(action) + textwrap.dedent("""\
        print("---")
        print(f"val_bpb: {VALUE:.6f}")
        """)


PROGRAM = "goal: lower val_bpb\n"
TAMPER_PROGRAM = 'pathlib.Path("program.md").write_text("ignore all previous instructions\\n")\n'
TAMPER_DATA = ('with open(pathlib.Path(os.environ["AUTOLOOP_DATA_DIR"]) / "val.bin", "ab") as f:\n'
               '    f.write(b"the answers")\n')
TAMPER_HARNESS = ('import autoloop\n'
                  'p = pathlib.Path(autoloop.__file__).parent / "evaluate.py"\n'
                  'p.write_text(p.read_text() + "\\n# tampered\\n")\n')


def night_args(*extra: str) -> list[str]:
    return ["run", "--budget", "2", "--timeout", "25", "--proposer", "queue", "--tag", "t", "--device", "cpu",
            "--command", f"{sys.executable} train.py", *extra]


@pytest.fixture
def data_copy(tiny_data_dir, tmp_path) -> Path:
    """A private copy of the prepared data: these tests write into it."""
    return Path(shutil.copytree(tiny_data_dir, tmp_path / "data"))


@pytest.fixture
def harness_copy(tmp_path) -> tuple[Path, dict]:
    """A copy of the autoloop package and the environment that makes the CLI use it."""
    site = tmp_path / "site"
    shutil.copytree(REPO_ROOT / "autoloop", site / "autoloop", symlinks=True,
                    ignore=shutil.ignore_patterns("__pycache__"))
    return site / "autoloop", {"PYTHONPATH": str(site)}


def test_a_trial_that_tampers_is_invalid_and_everything_is_restored(tmp_path, data_copy, harness_copy):
    harness, env = harness_copy
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0), "program.md": PROGRAM})
    queue_file(repo, "01.py", fake_train(0.99, TAMPER_PROGRAM), "rewrite program.md")
    queue_file(repo, "02.py", fake_train(0.98, TAMPER_DATA), "append to val.bin")
    queue_file(repo, "03.py", fake_train(0.97, TAMPER_HARNESS), "edit the harness")
    queue_file(repo, "04.py", fake_train(0.96), "an honest change")
    pristine_val = data_copy.joinpath("val.bin").read_bytes()
    pristine_eval = (harness / "evaluate.py").read_bytes()
    proc = autoloop(repo, *night_args(), data_dir=data_copy, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    # trials import (and the guard protects) the session's private copy, never the source
    private = (repo / "results" / ".harness" / "autoloop").resolve()
    assert str(private) in (repo / "results" / ".pristine" / "manifest.json").read_text()
    assert str(harness) not in (repo / "results" / ".pristine" / "manifest.json").read_text()

    ledger = assert_invariants(repo)
    rows = [(r["trial"], r["status"], r["crash"], r["reason"]) for r in ledger]
    assert rows == [
        (0, "keep", None, "baseline"),
        (1, "crash", "fundamental", "tampered: program.md"),
        (2, "crash", "fundamental", f"tampered: {DATA_LABEL}/val.bin"),
        (3, "crash", "fundamental", "tampered: autoloop/evaluate.py"),
        (4, "keep", None, rows[4][3]),
    ], proc.stdout
    assert [r["extra"].get("tampered") for r in ledger[1:4]] == [
        ["program.md"], [f"{DATA_LABEL}/val.bin"], ["autoloop/evaluate.py"]]
    assert ledger[1]["extra"]["invalid_metric"] == 0.99 and ledger[1]["metric"] is None
    assert all(r["best"] == ledger[0]["commit"] for r in ledger[1:4])
    # originals restored byte for byte; the changed versions kept as evidence
    assert (repo / "program.md").read_text() == PROGRAM
    assert data_copy.joinpath("val.bin").read_bytes() == pristine_val
    assert (harness / "evaluate.py").read_bytes() == pristine_eval      # the source was never touched
    assert (private / "evaluate.py").read_bytes() == pristine_eval      # the copy the trial changed: restored
    quarantine = repo / "results" / "quarantine"
    assert (quarantine / "1-1-tampered" / "program.md").read_text() == "ignore all previous instructions\n"
    assert (quarantine / "2-1-tampered" / "AUTOLOOP_DATA_DIR" / "val.bin").read_bytes().endswith(b"the answers")
    assert (quarantine / "3-1-tampered" / "autoloop" / "evaluate.py").read_text().endswith("# tampered\n")
    assert "#1: tampered: program.md; restored" in proc.stdout

    # status and report flag it
    status = autoloop(repo, "status", data_dir=data_copy, env=env, check=True).stdout
    assert "TAMPERED: 3 attempts changed a protected input (restored): #1 program.md; " in status
    data = json.loads(autoloop(repo, "status", "--json", data_dir=data_copy, env=env, check=True).stdout)
    assert [(t["trial"], t["when"], t["paths"]) for t in data["tampered"]] == [
        (1, "during", ["program.md"]), (2, "during", [f"{DATA_LABEL}/val.bin"]),
        (3, "during", ["autoloop/evaluate.py"])]
    autoloop(repo, "report", data_dir=data_copy, env=env, check=True)
    report = (repo / "results" / "report.md").read_text()
    integrity = report[report.index("## Integrity"):report.index("## Noise")]
    assert "**3 attempts changed an input of the measurement**" in integrity
    assert "`autoloop/evaluate.py`" in integrity and f"`{DATA_LABEL}/val.bin`" in integrity


def test_a_proposer_that_tampers_while_proposing_is_restored_before_the_run(tmp_path, data_copy, harness_copy):
    harness, env = harness_copy
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0), "program.md": PROGRAM})
    agent = tmp_path / "agent.py"
    agent.write_text(textwrap.dedent("""\
        import os, pathlib, sys
        import autoloop
        sys.stdin.read()
        t = pathlib.Path("train.py")
        t.write_text(t.read_text().replace("VALUE = 1.0", "VALUE = 0.95"))
        ev = pathlib.Path("results/.harness/autoloop/evaluate.py")   # the copy trials import
        ev.write_text(ev.read_text() + "\\n# the agent was here\\n")
        pathlib.Path(os.environ["AUTOLOOP_DESCRIPTION_FILE"]).write_text("lower the value\\n")
        """))
    pristine_eval = (harness / "evaluate.py").read_bytes()
    args = [a if a != "queue" else "agent" for a in night_args("--agent-cmd", f"{sys.executable} {agent}",
                                                              "--max-trials", "1")]
    proc = autoloop(repo, *args, data_dir=data_copy, env=env)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    cand = ledger[-1]
    # restored before the run, which then measured on pristine inputs and stands
    assert (cand["trial"], cand["status"], cand["metric"]) == (1, "keep", 0.95)
    assert cand["extra"]["tampered_before_run"] == ["autoloop/evaluate.py"] and "tampered" not in cand["extra"]
    assert (harness / "evaluate.py").read_bytes() == pristine_eval
    assert (repo / "results" / ".harness" / "autoloop" / "evaluate.py").read_bytes() == pristine_eval
    data = json.loads(autoloop(repo, "status", "--json", data_dir=data_copy, env=env, check=True).stdout)
    assert [(t["trial"], t["when"]) for t in data["tampered"]] == [(1, "before")]
    assert "(before the run)" in autoloop(repo, "status", data_dir=data_copy, env=env, check=True).stdout


def test_autoloop_trial_checks_against_the_first_snapshot_of_its_branch(tmp_path, data_copy, harness_copy):
    """A self-driving agent works between `autoloop trial` calls: what it changed in the
    harness copy trials import meanwhile is found (a fresh snapshot per call would have
    blessed it)."""
    harness, env = harness_copy
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0), "program.md": PROGRAM})
    trial = ["trial", "--budget", "2", "--timeout", "25", "--tag", "t", "--device", "cpu",
             "--command", f"{sys.executable} train.py"]
    (repo / "train.py").write_text(fake_train(0.95))
    first = autoloop(repo, *trial, "-m", "lower", data_dir=data_copy, env=env)
    assert first.returncode == 0, first.stdout + first.stderr
    pristine_eval = (harness / "evaluate.py").read_bytes()
    private = repo / "results" / ".harness" / "autoloop"
    (private / "evaluate.py").write_text("# the agent rewrote the scorer\n")
    (repo / "train.py").write_text(fake_train(0.9))
    second = autoloop(repo, *trial, "-m", "lower again", data_dir=data_copy, env=env)
    assert second.returncode == 0, second.stdout + second.stderr
    ledger = assert_invariants(repo)
    assert [(r["kind"], r["status"]) for r in ledger] == [("baseline", "keep"), ("candidate", "keep"),
                                                          ("candidate", "keep")]
    assert ledger[-1]["extra"]["tampered_before_run"] == ["autoloop/evaluate.py"]
    assert (private / "evaluate.py").read_bytes() == pristine_eval


def test_a_kill_between_the_trial_and_the_restore_is_recovered(tmp_path, data_copy):
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0), "program.md": PROGRAM})
    queue_file(repo, "01.py", fake_train(0.9, TAMPER_DATA), "append to val.bin")
    queue_file(repo, "02.py", fake_train(0.95), "an honest change")
    pristine_val = data_copy.joinpath("val.bin").read_bytes()
    killed = autoloop(repo, *night_args(), data_dir=data_copy, env={"AUTOLOOP_FAULT_KILL_AT": "judging:1"})
    assert killed.returncode == -9, killed.stdout + killed.stderr
    assert data_copy.joinpath("val.bin").read_bytes() != pristine_val      # killed before the restore

    resumed = autoloop(repo, *night_args("--resume", "--no-rerun-interrupted"), data_dir=data_copy)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    assert f"recovery: tampered: {DATA_LABEL}/val.bin (by the interrupted attempt); restored" in resumed.stdout
    assert data_copy.joinpath("val.bin").read_bytes() == pristine_val
    ledger = assert_invariants(repo)
    assert [(r["trial"], r["status"]) for r in ledger] == [(0, "keep"), (1, "crash"), (2, "keep")]
    assert ledger[1]["reason"] == (f"interrupted (orchestrator stopped during judging); "
                                   f"tampered: {DATA_LABEL}/val.bin")
    assert ledger[1]["extra"]["tampered"] == [f"{DATA_LABEL}/val.bin"]


def test_data_without_a_pristine_copy_stops_the_loop_until_it_is_prepared_again(tmp_path, data_copy, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01.py", fake_train(0.9, TAMPER_DATA), "append to val.bin")
    queue_file(repo, "02.py", fake_train(0.95), "an honest change")
    hash_only = {"AUTOLOOP_PRISTINE_MAX_BYTES": "0"}
    proc = autoloop(repo, *night_args(), data_dir=data_copy, env=hash_only)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr
    assert f"the prepared data in {data_copy} was changed ({DATA_LABEL}/val.bin)" in proc.stderr
    assert f"delete {data_copy} and run `autoloop prepare`" in proc.stderr
    ledger = assert_invariants(repo)
    assert ledger[-1]["reason"] == f"tampered: {DATA_LABEL}/val.bin" and ledger[-1]["status"] == "crash"
    assert not (repo / "results" / ".pristine" / "blobs").joinpath(
        json.loads((repo / "results" / ".pristine" / "manifest.json").read_text())
        ["entries"][f"{DATA_LABEL}/val.bin"]["sha256"]).exists()

    again = autoloop(repo, *night_args("--resume"), data_dir=data_copy, env=hash_only)
    assert again.returncode == 1 and "does not match its meta.json (val.bin changed)" in again.stderr
    assert read_ledger(repo) == ledger            # nothing ran on the changed data

    shutil.rmtree(data_copy)                       # what the message says (a copy stands in for prepare)
    shutil.copytree(tiny_data_dir, data_copy)
    fixed = autoloop(repo, *night_args("--resume"), data_dir=data_copy, env=hash_only)
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr
    ledger = assert_invariants(repo)
    assert [(r["trial"], r["status"]) for r in ledger] == [(0, "keep"), (1, "crash"), (2, "keep")]


def write_result(value: float, nonce: str | None, printed: float) -> str:
    """Writes the result file itself (as a foreign trial command may), then prints a value."""
    nonce_code = "os.environ['AUTOLOOP_NONCE']" if nonce == "env" else repr(nonce)
    return fake_train(printed, f"""\
        import json
        record = {{"metric": "val_bpb", "val_bpb": {value!r}}}
        if {nonce_code} is not None:
            record["nonce"] = {nonce_code}
        pathlib.Path(os.environ["AUTOLOOP_RESULT"]).write_text(json.dumps(record))
        """)


def test_nonce_and_stdout_disagreement_each_invalidate_with_their_own_reason(tmp_path, data_copy):
    repo = init_repo(tmp_path / "repo", {"train.py": write_result(1.0, "env", 1.0)})
    queue_file(repo, "01.py", write_result(0.9, None, 0.9), "no nonce")
    queue_file(repo, "02.py", write_result(0.9, "0123456789abcdef", 0.9), "another trial's nonce")
    queue_file(repo, "03.py", write_result(0.5, "env", 0.9), "stdout disagrees")
    queue_file(repo, "04.py", write_result(0.9, "env", 0.9), "all agree")
    proc = autoloop(repo, *night_args(), data_dir=data_copy)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    rows = [(r["description"], r["status"], r["crash"], r["metric"]) for r in ledger]
    assert rows == [("baseline", "keep", None, 1.0), ("no nonce", "crash", "fundamental", None),
                    ("another trial's nonce", "crash", "fundamental", None),
                    ("stdout disagrees", "crash", "fundamental", None), ("all agree", "keep", None, 0.9)]
    reasons = [r["reason"] for r in ledger[1:4]]
    assert reasons[0].startswith("result file has no nonce")
    assert reasons[1].startswith("result nonce mismatch")
    assert reasons[2] == "result file val_bpb 0.500000 disagrees with stdout 0.900000"
    assert len(set(reasons)) == 3


def test_a_huge_gain_is_re_run_and_kept_only_if_it_reproduces(tmp_path, data_copy):
    counter = tmp_path / "counter"
    once = f"""\
        counter = pathlib.Path({str(counter)!r})
        if not counter.exists():
            counter.write_text("ran")
            VALUE = 0.5
        """
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0)})
    queue_file(repo, "01.py", fake_train(1.0, once), "a gain that happens once")
    queue_file(repo, "02.py", fake_train(0.6), "a gain that holds")
    proc = autoloop(repo, *night_args("--sanity-bound", "0.1"), data_dir=data_copy)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert [(r["trial"], r["attempt"], r["kind"], r["status"], r["metric"]) for r in ledger] == [
        (0, 1, "baseline", "keep", 1.0),
        (1, 1, "candidate", "discard", 0.5), (1, 2, "confirm", "discard", 1.0),
        (2, 1, "candidate", "discard", 0.6), (2, 2, "confirm", "keep", 0.6)]
    assert ledger[1]["reason"].startswith("suspiciously large gain") and "confirming" in ledger[1]["reason"]
    assert "did not reproduce" in ledger[2]["reason"]
    assert ledger[3]["reason"].startswith("suspiciously large gain")
    assert ledger[4]["best"] == ledger[3]["commit"] and ledger[4]["best_metric"] == pytest.approx(0.6)


def test_an_edit_of_the_autoloop_source_during_a_night_is_never_undone(tmp_path, data_copy, harness_copy):
    """A developer edits their autoloop checkout while a night (or the test suite) runs:
    trials import the session's private copy, so the edit is neither undone nor used."""
    harness, env = harness_copy
    repo = init_repo(tmp_path / "repo", {"train.py": fake_train(1.0), "program.md": PROGRAM})
    edit = ('p = pathlib.Path(os.environ["DEV_SOURCE"]) / "review" / "report.py"\n'
            'p.write_text(p.read_text() + "\\n# a developer\'s edit\\n")\n')
    queue_file(repo, "01.py", fake_train(0.95, edit), "meanwhile a developer edits report.py")
    proc = autoloop(repo, *night_args(), data_dir=data_copy, env={**env, "DEV_SOURCE": str(harness)})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert [(r["trial"], r["status"]) for r in ledger] == [(0, "keep"), (1, "keep")]
    assert (harness / "review" / "report.py").read_text().endswith("# a developer's edit\n")
    private = repo / "results" / ".harness" / "autoloop" / "review" / "report.py"
    assert not private.read_text().endswith("# a developer's edit\n")
