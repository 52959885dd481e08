"""Notes from the person (autoloop/person_notes.py, `autoloop note`): written from other
processes while the loop runs, carried by every later prompt until cleared, in the report.
The end-to-end test runs a real fake agent that has `autoloop note` run in a process of
its own mid-night (the person's shell)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from helpers.git import init_repo
from helpers.loop import BUDGET, LR_ARGS, assert_invariants, autoloop, read_tsv

from autoloop.store.person_notes import PersonNotesError, active_notes, add_note, clear_notes, history, notes_path

FAKE = Path(__file__).resolve().parent / "fake_agents"
NOTE = "try SwiGLU; leave the LRs alone"


def test_notes_in_force_until_cleared_and_history_kept(tmp_path):
    add_note(tmp_path, "first", now=10.0)
    add_note(tmp_path, "  second\n  line  ", now=20.0)
    assert [(n.at, n.text) for n in active_notes(tmp_path)] == [(10.0, "first"), (20.0, "second line")]
    assert clear_notes(tmp_path, now=30.0) == 2 and active_notes(tmp_path) == []
    assert clear_notes(tmp_path, now=31.0) == 0          # nothing in force: nothing recorded
    add_note(tmp_path, "third", now=40.0)
    assert [n.text for n in active_notes(tmp_path)] == ["third"]
    assert history(tmp_path) == [{"at": 10.0, "note": "first"}, {"at": 20.0, "note": "second line"},
                                 {"at": 30.0, "clear": True}, {"at": 40.0, "note": "third"}]


@pytest.mark.parametrize("text,message", [("   ", "an empty note"), ("x" * 1001, "at most 1000 characters")])
def test_bad_notes_are_refused(tmp_path, text, message):
    with pytest.raises(PersonNotesError, match=message):
        add_note(tmp_path, text)
    assert not notes_path(tmp_path).exists()


def test_a_damaged_notes_file_is_one_line_and_never_overwritten(tmp_path):
    notes_path(tmp_path).write_text('{"events": [{"at": "noon"}]}')
    with pytest.raises(PersonNotesError, match="not a notes file written by autoloop note"):
        add_note(tmp_path, "lost?")
    assert notes_path(tmp_path).read_text() == '{"events": [{"at": "noon"}]}'


def test_writers_in_parallel_processes_lose_nothing(tmp_path):
    """Eight processes adding five notes each at once: all forty are there, the file whole."""
    code = ("import sys; from autoloop.store.person_notes import add_note\n"
            "for i in range(5): add_note(sys.argv[1], f'{sys.argv[2]}-{i}')\n")
    procs = [subprocess.Popen([sys.executable, "-c", code, str(tmp_path), f"p{k}"]) for k in range(8)]
    assert [p.wait(timeout=120) for p in procs] == [0] * 8
    texts = sorted(n.text for n in active_notes(tmp_path))
    assert texts == sorted(f"p{k}-{i}" for k in range(8) for i in range(5))
    json.loads(notes_path(tmp_path).read_text())


def test_the_note_command_lists_adds_and_clears(tmp_path, tiny_data_dir):
    repo = init_repo(tmp_path / "repo", {"train.py": "LR = 0.1\n"})
    listed = autoloop(repo, "note", data_dir=tiny_data_dir, check=True).stdout
    assert listed.startswith("no notes in force")
    assert "every later prompt carries it" in autoloop(repo, "note", NOTE, data_dir=tiny_data_dir, check=True).stdout
    assert autoloop(repo, "note", data_dir=tiny_data_dir, check=True).stdout.split("  ", 1)[1].strip() == NOTE
    both = autoloop(repo, "note", "--clear", "x", data_dir=tiny_data_dir)
    assert (both.returncode, both.stderr.strip()) == (1, "autoloop: give a note or --clear, not both")
    assert autoloop(repo, "note", "--clear", data_dir=tiny_data_dir, check=True).stdout.startswith("cleared 1 note")


def test_a_note_from_another_process_reaches_the_next_prompt_and_the_report(baselined_repo, tiny_data_dir, tmp_path):
    repo, prompts = baselined_repo, tmp_path / "prompts"
    agent = f"{FAKE / 'steered.py'} {prompts} {json.dumps(NOTE)} {LR_ARGS}"
    proc = autoloop(repo, "run", "--budget", BUDGET, "--timeout", "60", "--tag", "t", "--device", "cpu", "--resume",
                    # Serial: this agent's two edits touch one line, so a look-ahead's second
                    # proposal would conflict with the first's keep and be skipped (test_lookahead).
                    "--agent-cmd", agent, "--max-trials", "2", "--lookahead", "0", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    assert NOTE not in (prompts / "1.md").read_text()           # written during trial 1's call
    second = (prompts / "2.md").read_text()
    assert "## Notes from the person running the night" in second and f"«{NOTE}»" in second
    # The hypothesis: its first line, in the ledger, results.tsv's last column and the report.
    hypothesis = "larger steps learn faster in a short budget"
    assert [r["extra"].get("hypothesis") for r in ledger[1:]] == [hypothesis, hypothesis]
    assert [row["hypothesis"] for row in read_tsv(repo)][-2:] == [hypothesis, hypothesis]
    status = autoloop(repo, "status", data_dir=tiny_data_dir, check=True).stdout
    assert "notes: 1 in force" in status and NOTE in status
    autoloop(repo, "report", data_dir=tiny_data_dir, check=True)
    report = (repo / "results" / "report.md").read_text()
    assert "## Notes from the person" in report and f": {NOTE}" in report
    assert hypothesis in report
