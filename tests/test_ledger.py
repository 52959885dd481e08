"""Ledger: append under a lock from many processes, torn-tail repair, results.tsv derivation."""

from __future__ import annotations

import csv
import json
import math
import multiprocessing
import os
from pathlib import Path

import pytest
from pydantic import ValidationError

from autoloop.store import ledger as ledger_mod
from autoloop.store import queries
from autoloop.store.ledger import TSV_COLUMNS, Draft, Ledger, LedgerError, LedgerRecord, format_tsv


def rec(trial: int = 0, attempt: int = 1, **kw) -> LedgerRecord:
    base = dict(trial=trial, attempt=attempt, started_at=1000.0 + trial, ended_at=1300.0 + trial,
                proposer="mutate", description=f"trial {trial}", status="keep",
                commit="0123456789abcdef0123456789abcdef01234567", metric=1.25, memory_gb=3.14,
                training_seconds=300.04, wall_seconds=320.0)
    base.update(kw)
    return LedgerRecord(**base)


def tsv_rows(path: Path) -> list[list[str]]:
    return [line.split("\t") for line in path.read_text().splitlines()]


# ---------------------------------------------------------------------------------------------
# concurrency


WORKERS = 8


def _append_many(results_dir: str, worker: int, count: int, fsync: bool, start) -> None:
    start.wait()   # all processes begin together, to maximise contention
    ledger = Ledger(Path(results_dir), fsync=fsync)
    for seq in range(count):
        ledger.append(rec(trial=worker, attempt=seq + 1, extra={"worker": worker, "seq": seq},
                          description="x" * (seq % 300)),   # varied lengths: torn writes would show
                      write_tsv=(seq == count - 1))


# 8 x 1000 without fsync: what keeps lines whole is the lock plus one O_APPEND write, not
# fsync, and fsync on a shared CI disk costs ~1-5 ms each (8000 of them: up to a minute).
# The smaller run goes through the real, fsync'ed path. benchmarks/ledger_concurrency.py
# runs the full size with fsync.
@pytest.mark.parametrize("count, fsync", [(1000, False), (40, True)], ids=["8x1000", "8x40-fsync"])
def test_concurrent_appends_from_many_processes_lose_and_tear_nothing(tmp_path, count, fsync):
    methods = multiprocessing.get_all_start_methods()
    ctx = multiprocessing.get_context("fork" if "fork" in methods else "spawn")
    start = ctx.Event()
    procs = [ctx.Process(target=_append_many, args=(str(tmp_path), w, count, fsync, start))
             for w in range(WORKERS)]
    for p in procs:
        p.start()
    start.set()
    for p in procs:
        p.join(timeout=120)
        assert p.exitcode == 0

    raw = (tmp_path / "ledger.jsonl").read_bytes()
    assert raw.endswith(b"\n")
    lines = raw.decode().splitlines()
    assert len(lines) == WORKERS * count
    seen: dict[int, list[int]] = {w: [] for w in range(WORKERS)}
    for line in lines:
        obj = json.loads(line)     # every line is complete JSON: nothing interleaved
        seen[obj["extra"]["worker"]].append(obj["extra"]["seq"])
    for w, seqs in seen.items():
        # every (worker, seq) exactly once, and each process's records in its own order
        assert seqs == list(range(count)), f"worker {w}"

    ledger = Ledger(tmp_path)
    assert len(ledger.records()) == WORKERS * count
    assert ledger.repair() is None
    # Whichever worker finished last rewrote the TSV from the complete ledger.
    assert len(tsv_rows(tmp_path / "results.tsv")) == 1 + WORKERS * count
    assert not list(tmp_path.glob("*.tmp"))


# ---------------------------------------------------------------------------------------------
# torn tail and corruption


def test_repair_moves_an_unterminated_fragment_aside(tmp_path):
    ledger = Ledger(tmp_path)
    for t in range(3):
        ledger.append(rec(t))
    fragment = b'{"trial": 3, "attempt": 1, "started_at": 12.5, "desc'
    with open(ledger.path, "ab") as f:
        f.write(fragment)

    assert [r.trial for r in ledger.records()] == [0, 1, 2]   # readable before repair
    report = ledger.repair()
    assert report is not None and "\n" not in report
    assert "torn" in report and f"{len(fragment)} bytes" in report and "3 good records kept" in report
    torn = list(tmp_path.glob("ledger.torn-*"))
    assert len(torn) == 1 and torn[0].name in report
    assert torn[0].read_bytes() == fragment                   # preserved byte for byte
    assert ledger.path.read_bytes().endswith(b"}\n")
    assert [r.trial for r in ledger.records()] == [0, 1, 2]
    assert ledger.repair() is None                            # idempotent


def test_repair_treats_trailing_non_json_lines_as_torn(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append(rec(0))
    tail = b'{"trial": 1, "att\n\x00\x00\x00'
    with open(ledger.path, "ab") as f:
        f.write(tail)
    report = ledger.repair()
    assert report and "not valid JSON" in report
    assert next(tmp_path.glob("ledger.torn-*")).read_bytes() == tail
    assert len(ledger.records()) == 1


def test_append_after_a_torn_tail_repairs_first_instead_of_gluing(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append(rec(0))
    with open(ledger.path, "ab") as f:
        f.write(b'{"trial": 1, "sta')
    ledger.append(rec(1))
    assert [r.trial for r in ledger.records()] == [0, 1]
    assert len(ledger.repairs) == 1 and "torn" in ledger.repairs[0]
    assert next(tmp_path.glob("ledger.torn-*")).read_bytes() == b'{"trial": 1, "sta'


def test_repair_completes_a_valid_record_missing_its_newline(tmp_path):
    ledger = Ledger(tmp_path)
    # A ledger from before the hash chain (a hand-written record after a chained one is
    # foreign: tests/test_tamper.py), its last line cut before the newline.
    with open(ledger.path, "ab") as f:
        f.write(rec(0).model_dump_json().encode() + b"\n" + rec(1).model_dump_json().encode())
    assert [r.trial for r in ledger.records()] == [0, 1]
    report = ledger.repair()
    assert report and "newline" in report
    assert ledger.path.read_bytes().endswith(b"\n")
    assert not list(tmp_path.glob("ledger.torn-*"))
    assert [r.trial for r in ledger.records()] == [0, 1]


def test_corruption_in_the_middle_is_an_error_naming_the_line(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append(rec(0))
    with open(ledger.path, "ab") as f:
        f.write(b'{"trial": 1, "broken\n' + rec(2).model_dump_json().encode() + b"\n")
    before = ledger.path.read_bytes()
    for call in (ledger.records, ledger.repair, ledger.write_tsv):
        with pytest.raises(LedgerError) as e:
            call()
        msg = str(e.value)
        assert "line 2" in msg and "\n" not in msg
    assert ledger.path.read_bytes() == before                # nothing dropped
    assert not list(tmp_path.glob("ledger.torn-*"))


def test_json_that_is_not_a_record_is_an_error_even_at_the_end(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append(rec(0))
    with open(ledger.path, "ab") as f:
        f.write(b'{"trial": 1, "status": "exploded"}\n')
    with pytest.raises(LedgerError, match="line 2: not a valid ledger record"):
        ledger.records()
    with pytest.raises(LedgerError):
        ledger.repair()


def test_blank_lines_are_tolerated(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append(rec(0))
    with open(ledger.path, "ab") as f:
        f.write(b"\n  \n")
    ledger.append(rec(1))
    assert [r.trial for r in ledger.records()] == [0, 1]
    assert ledger.repair() is None


# ---------------------------------------------------------------------------------------------
# results.tsv


def test_tsv_layout(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append(rec(0, kind="baseline", description="baseline", metric=1.2345678))
    ledger.append(rec(1, description="tabs\there\nand newline\r\nand \"quotes\"", status="discard",
                      metric=1.3, memory_gb=12.345, training_seconds=None, wall_seconds=45.06))
    ledger.append(rec(2, description="typo", status="crash", crash="trivial", metric=None,
                      memory_gb=2.0, training_seconds=3.0, exit_code=1))
    ledger.append(rec(2, attempt=2, kind="fix", description="fix typo", status="keep", metric=1.2))
    ledger.append(rec(3, description="agent gave up", status="skip", commit=None, metric=None))
    ledger.append(rec(4, description="", status="crash", crash="timeout", commit=None, metric=None))
    ledger.append(rec(2, attempt=10, kind="confirm", description="confirm", status="discard"))

    rows = tsv_rows(ledger.tsv_path)
    assert rows[0] == TSV_COLUMNS
    assert rows[0][:5] == ["commit", "val_bpb", "memory_gb", "status", "description"]
    assert all(len(r) == len(TSV_COLUMNS) for r in rows)
    assert rows[1] == ["0123456", "1.234568", "3.1", "keep", "baseline", "-", "0", "300.0", "-", "-", "-"]
    # discard with no training_seconds: wall seconds; description on one line, no tabs/quotes
    assert rows[2] == ["0123456", "1.300000", "12.3", "discard",
                       "tabs here and newline  and 'quotes'", "-", "1", "45.1", "-", "-", "-"]
    # crashes carry zeros and their class
    assert rows[3] == ["0123456", "0.000000", "0.0", "crash", "typo", "trivial", "2", "0.0", "-", "-", "-"]
    assert rows[4][3:] == ["keep", "fix typo", "-", "2.2", "300.0", "-", "-", "-"]
    # the skip record is in the ledger but not in the TSV
    assert [r.status for r in ledger.records()].count("skip") == 1
    assert "skip" not in [r[3] for r in rows]
    assert rows[5] == ["-", "0.000000", "0.0", "crash", "-", "timeout", "4", "0.0", "-", "-", "-"]
    assert rows[6][6] == "2.10"
    assert len(rows) == 7


def test_tsv_reads_as_autoresearch_expects(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append(rec(0, description='a "quoted" start'))
    ledger.append(rec(1, description='"leading quote', status="discard"))
    with open(ledger.tsv_path, newline="") as f:
        rows = list(csv.DictReader(f, delimiter="\t"))
    assert [r["status"] for r in rows] == ["keep", "discard"]
    assert float(rows[0]["val_bpb"]) == 1.25 and float(rows[0]["memory_gb"]) == 3.1
    assert rows[1]["description"] == "'leading quote"


def test_tsv_is_replaced_atomically_and_leaves_no_temp_files(tmp_path, monkeypatch):
    ledger = Ledger(tmp_path)
    replaced = []
    real_replace = os.replace

    def spy(src, dst):
        replaced.append((Path(src).parent, Path(dst)))
        return real_replace(src, dst)

    monkeypatch.setattr(ledger_mod.os, "replace", spy)
    for t in range(5):
        ledger.append(rec(t))
    assert len(replaced) == 5 and all(d == ledger.tsv_path and s == tmp_path for s, d in replaced)
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ledger.lock", "ledger.jsonl", "results.tsv"]

    # A failure mid-rewrite leaves the previous TSV whole and no temp file behind.
    before = ledger.tsv_path.read_bytes()

    def boom(src, dst):
        raise OSError("disk full")

    monkeypatch.setattr(ledger_mod.os, "replace", boom)
    with pytest.raises(OSError):
        ledger.append(rec(5))
    assert ledger.tsv_path.read_bytes() == before
    assert sorted(p.name for p in tmp_path.iterdir()) == [".ledger.lock", "ledger.jsonl", "results.tsv"]
    assert len(ledger.records()) == 6          # the record itself was appended before the TSV step


def test_format_tsv_is_pure():
    text = format_tsv([rec(0), rec(1, status="skip")])
    assert text.count("\n") == 2 and text.endswith("\n")


# ---------------------------------------------------------------------------------------------
# the queries the orchestrator asks (autoloop.store.queries), on a real ledger


def test_queries(tmp_path):
    ledger = Ledger(tmp_path / "results")         # created on demand
    assert queries.next_trial(ledger.records()) == 0
    assert queries.best(ledger.records()) == (None, None)
    assert ledger.last(3) == []
    ledger.append(rec(0, kind="baseline", best="aaa", best_metric=1.3))
    ledger.append(rec(1, status="crash", crash="trivial", metric=None))
    ledger.append(rec(1, attempt=2, kind="fix", status="keep", metric=1.2, best="bbb", best_metric=1.2))
    ledger.append(rec(2, status="skip", metric=None))   # no best field: best() looks further back
    records = ledger.records()
    assert queries.next_trial(records) == 3
    assert queries.best(records) == ("bbb", 1.2)
    assert queries.next_attempt(records, 1) == 3 and queries.next_attempt(records, 7) == 1
    assert queries.best_before(records) == [None, 1.3, 1.3, 1.2]
    tail = ledger.last(2)
    assert [d["trial"] for d in tail] == [1, 2] and isinstance(tail[0], dict)
    json.dumps(tail)                               # JSON-ready


def test_non_finite_numbers_round_trip_as_strict_json(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append(rec(0, status="discard", metric=float("nan"), noise=float("inf")))
    line = ledger.path.read_text().strip()
    json.loads(line, parse_constant=lambda c: pytest.fail(f"non-standard JSON constant {c}"))
    r = ledger.records()[0]
    assert math.isnan(r.metric) and r.noise == math.inf


def test_append_accepts_a_dict_and_rejects_bad_records(tmp_path):
    ledger = Ledger(tmp_path)
    ledger.append(rec(0).model_dump())
    with pytest.raises(ValidationError):
        ledger.append({"trial": 1})
    assert len(ledger.records()) == 1


def test_durations_read_the_monotonic_seconds_not_the_stepped_stamps():
    """A wall clock stepped forward 3 h mid-attempt puts ended_at - started_at hours off; the
    attempt's elapsed_s (monotonic) is what the next attempt's estimate, against --hours, reads."""
    stepped = [rec(trial=t, started_at=1000.0 * t, ended_at=1000.0 * t + 10800 + 5.0, elapsed_s=5.0,
                   wall_seconds=4.0) for t in range(1, 4)]
    assert queries.typical_attempt_seconds(stepped, 330.0) == 5.0
    assert [queries.attempt_seconds(r) for r in stepped] == [5.0] * 3
    # Written before the field (or cut off by a kill): the stamps' span, never below the run's own seconds.
    old = [rec(trial=1, started_at=2000.0, ended_at=2010.0), rec(trial=2, started_at=3000.0, ended_at=2000.0)]
    assert [queries.attempt_seconds(r) for r in old] == [320.0, 320.0]
    assert queries.typical_attempt_seconds([rec(trial=1, wall_seconds=0.0, started_at=5.0, ended_at=1.0)], 9.0) == 0.0


def test_a_draft_is_the_records_measured_fields_with_the_records_defaults():
    # The arbiter makes a LedgerRecord of a Draft's fields (Arbiter.record): a field the record
    # lacks, or a default that differs, would change what a night writes.
    for name, field in Draft.model_fields.items():
        mine = LedgerRecord.model_fields[name]
        assert field.annotation == mine.annotation or name == "extra", name
        assert field.get_default(call_default_factory=True) == mine.get_default(call_default_factory=True), name
    decided = {"status", "crash", "reason", "noise", "confidence", "best", "best_metric", "worker", "next", "chain"}
    assert set(LedgerRecord.model_fields) - set(Draft.model_fields) == decided
