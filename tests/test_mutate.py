"""MutateProposer: one literal rewritten in place, memory from the ledger, a winning
direction followed, exhaustion. Pure Python on source bytes; no training."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from helpers.git import TRAIN_PY

from autoloop.proposers.base import FixContext, ProposalRequest
from autoloop.proposers.mutate import (
    SKIP,
    MutateProposer,
    apply_move,
    constant_moves,
    find_constants,
    parse_description,
    profile_bounds,
)
from autoloop.store.ledger import Ledger, LedgerRecord

BEST = "b" * 40

# Awkward on purpose: comments, odd spacing, an annotation, scientific notation, a
# negative number, a tuple over two lines, non-ASCII text before a literal on its line.
AWKWARD = """\
import os
# Größe: the comment before must stay
LR   =   0.04    # learning rate (keep this comment)
NAME: float = 3e-4  # annotated
SHIFT = -0.5
STEPS = 100
WIDTH = 128
USE_X = True
BETAS = (0.8,
         0.95)  # two lines
LABEL = "größe"; SCALE = 2.5
MODE = "fast"
DERIVED = WIDTH // 2
FROM_ENV = float(os.environ.get("X", "1"))
lower = 0.3
LOG_EVERY_S = 5.0
def f():
    INNER = 1.0
    return INNER
"""


# A frozen hyperparameter block in train.py's style, so that the expectations below do
# not move when train.py is retuned (the real file is covered by value-free checks).
TRAINLIKE = """\
import os
DEPTH = 4               # transformer blocks
WIDTH = 128             # model dimension
SEQ_LEN = 256           # training context in bytes
BATCH_SIZE = 16         # sequences per step
MATRIX_LR = 0.04        # Muon learning rate
MUON_MOMENTUM = 0.95    # Muon (Nesterov) momentum
EMBED_LR = 0.3          # AdamW learning rate for the byte embedding
ADAM_BETAS = (0.8, 0.95)
WEIGHT_DECAY = 0.0      # decoupled weight decay
WARMDOWN_FRAC = 0.4     # final fraction of the budget
COMPILE_ON_CPU = False  # skipped
EVAL_BATCH = 32         # skipped
LOG_EVERY_S = 5.0       # skipped
BUDGET_S = float(os.environ.get("AUTOLOOP_BUDGET_S", "300"))
SEED = int(os.environ.get("AUTOLOOP_SEED", "42"))
"""


def moves_of(source: bytes):
    return [m for c in find_constants(source) for m in constant_moves(c)]


def changed_bytes(old: bytes, new: bytes) -> tuple[int, bytes, bytes]:
    """(line number, old line, new line) of the single line that differs."""
    old_lines, new_lines = old.split(b"\n"), new.split(b"\n")
    assert len(old_lines) == len(new_lines)
    diff = [(i + 1, a, b) for i, (a, b) in enumerate(zip(old_lines, new_lines, strict=True)) if a != b]
    assert len(diff) == 1, diff
    return diff[0]


# ------------------------------------------------------------------------------ finding and rewriting


def test_finds_literal_constants_and_skips_the_rest():
    found = {c.name: c.value for c in find_constants(AWKWARD.encode())}
    assert found == {"LR": 0.04, "NAME": 3e-4, "SHIFT": -0.5, "STEPS": 100, "WIDTH": 128, "USE_X": True,
                     "BETAS": (0.8, 0.95), "LABEL": "größe", "SCALE": 2.5, "MODE": "fast"}
    # Derived values, lower-case names, names in SKIP and function locals are never touched;
    # strings are found but have no moves.
    assert not [m for c in find_constants(AWKWARD.encode()) if isinstance(c.value, str) for m in constant_moves(c)]
    assert "LOG_EVERY_S" in SKIP


@pytest.mark.parametrize("source", [AWKWARD.encode(), TRAIN_PY.read_bytes()], ids=["awkward", "train.py"])
def test_every_move_rewrites_exactly_one_literal(source):
    moves = moves_of(source)
    assert len(moves) > 10
    for move in moves:
        new = apply_move(source, move)
        line_no, old_line, new_line = changed_bytes(source, new)
        lit = move.literal
        assert line_no == lit.line
        # Everything before and after the literal's bytes on that line is untouched.
        assert new_line[:lit.start] == old_line[:lit.start]
        assert new_line.endswith(old_line[lit.end:])
        after = {c.name: c.value for c in find_constants(new)}
        assert after[move.name] == move.new, move.description


def test_rewrite_of_the_awkward_lines_byte_for_byte():
    source = AWKWARD.encode()
    by_desc = {m.description: m for m in moves_of(source)}
    assert apply_move(source, by_desc["LR 0.04 -> 0.056"]).decode() == AWKWARD.replace(
        "LR   =   0.04    #", "LR   =   0.056    #")
    assert apply_move(source, by_desc["NAME 3e-4 -> 4.2e-4"]).decode() == AWKWARD.replace("3e-4", "4.2e-4")
    assert apply_move(source, by_desc["SHIFT -0.5 -> -0.7"]).decode() == AWKWARD.replace("-0.5", "-0.7")
    assert apply_move(source, by_desc["BETAS (0.8, 0.95) -> (0.8, 0.965)"]).decode() == AWKWARD.replace(
        "         0.95)", "         0.965)")
    assert apply_move(source, by_desc["USE_X True -> False"]).decode() == AWKWARD.replace("= True", "= False")
    # ast reports UTF-8 byte offsets: the non-ASCII string before SCALE must not shift them.
    assert apply_move(source, by_desc["SCALE 2.5 -> 3.5"]).decode() == AWKWARD.replace("SCALE = 2.5", "SCALE = 3.5")


@pytest.mark.parametrize("source", [TRAINLIKE.encode(), TRAIN_PY.read_bytes()], ids=["trainlike", "train.py"])
def test_moves_never_produce_nonsense(source):
    moves = moves_of(source)
    names = {m.name for m in moves}
    assert {"MATRIX_LR", "DEPTH", "ADAM_BETAS", "MUON_MOMENTUM"} <= names
    assert names.isdisjoint({"LOG_EVERY_S", "EVAL_BATCH", "COMPILE_ON_CPU", "CUDA_FULL_BATCH_GIB", "BUDGET_S", "SEED"})
    for m in moves:
        for old, new in zip(m.old if isinstance(m.old, tuple) else (m.old,),
                            m.new if isinstance(m.new, tuple) else (m.new,), strict=True):
            if isinstance(old, bool):
                continue
            assert (old > 0) == (new > 0) or old == 0, m.description
            if isinstance(old, int) and old >= 1:
                assert isinstance(new, int) and new >= 1, m.description
                if old & (old - 1) == 0:
                    assert new & (new - 1) == 0, m.description   # powers of two stay so
            if any(k in m.name for k in ("FRAC", "MOMENTUM", "BETA")):
                assert 0 <= new <= 1, m.description
        if m.name == "SEQ_LEN":
            assert m.new <= 512


def test_moves_per_type():
    descriptions = [m.description for m in moves_of(TRAINLIKE.encode())]
    assert "MATRIX_LR 0.04 -> 0.056" in descriptions
    assert "MUON_MOMENTUM 0.95 -> 0.975" in descriptions   # the distance to 1 halves
    assert "DEPTH 4 -> 8" in descriptions and "DEPTH 4 -> 2" in descriptions
    assert "WEIGHT_DECAY 0.0 -> 0.1" in descriptions
    assert "STEPS 100 -> 125" in [m.description for m in moves_of(AWKWARD.encode())]


def test_descriptions_parse_back():
    assert parse_description("MATRIX_LR 0.04 -> 0.056") == ("MATRIX_LR", 0.04, 0.056)
    assert parse_description("ADAM_BETAS (0.8, 0.95) -> (0.8, 0.975)") == ("ADAM_BETAS", (0.8, 0.95), (0.8, 0.975))
    assert parse_description("restore learning rates") is None


# ------------------------------------------------------------------------------ choosing


def record(description: str, status: str = "discard", parent: str = BEST, commit: str | None = None,
           trial: int = 1) -> dict:
    return {"trial": trial, "attempt": 1, "kind": "candidate", "parent": parent, "commit": commit or "c" * 40,
            "description": description, "status": status}


def choose(records: list[dict], seed: int = 42, trial: int = 1, source: bytes | None = None):
    constants = find_constants(source or TRAINLIKE.encode())
    return MutateProposer.choose(constants, records, BEST, seed, trial)


def test_deterministic_for_a_seed_and_varied_across_seeds():
    first = [choose([], seed=7, trial=t).description for t in range(1, 30)]
    assert first == [choose([], seed=7, trial=t).description for t in range(1, 30)]
    other = [choose([], seed=8, trial=t).description for t in range(1, 30)]
    assert first != other
    assert len({d.split()[0] for d in first}) > 4   # the draws spread over many constants


def test_no_repeats_at_the_same_base_then_exhausted():
    total = len(moves_of(TRAINLIKE.encode()))
    records: list[dict] = []
    seen = set()
    for trial in range(1, total + 5):
        move = choose(records, trial=trial)
        if move is None:
            break
        assert move.description not in seen
        seen.add(move.description)
        records.append(record(move.description, status="crash" if trial % 5 == 0 else "discard", trial=trial))
    assert len(seen) == total
    assert choose(records, trial=total + 10) is None
    # Moves made on top of another commit do not count here.
    elsewhere = [dict(r, parent="a" * 40) for r in records]
    assert choose(elsewhere) is not None


def test_a_win_is_followed_further_and_not_reversed():
    source = TRAINLIKE.replace("MATRIX_LR = 0.04 ", "MATRIX_LR = 0.056 ").encode()
    won = record("MATRIX_LR 0.04 -> 0.056", status="keep", parent="a" * 40, commit=BEST)
    move = choose([won], source=source)
    assert move.description == "MATRIX_LR 0.056 -> 0.0784"
    # Once that was tried, no MATRIX_LR move goes back down at this best.
    records = [won, record(move.description)]
    for trial in range(2, 200):
        move = choose(records, trial=trial, source=source)
        if move is None:
            break
        if move.name == "MATRIX_LR":
            assert move.new > 0.056, move.description
        records.append(record(move.description, trial=trial))
    # A power-of-two win keeps doubling; a tuple win moves the same element further.
    source = TRAINLIKE.replace("BATCH_SIZE = 16 ", "BATCH_SIZE = 32 ").encode()
    won = record("BATCH_SIZE 16 -> 32", status="keep", parent="a" * 40, commit=BEST)
    assert choose([won], source=source).description == "BATCH_SIZE 32 -> 64"
    source = TRAINLIKE.replace("(0.8, 0.95)", "(0.8, 0.975)").encode()
    won = record("ADAM_BETAS (0.8, 0.95) -> (0.8, 0.975)", status="keep", parent="a" * 40, commit=BEST)
    assert choose([won], source=source).description == "ADAM_BETAS (0.8, 0.975) -> (0.8, 0.988)"


# ------------------------------------------------------------------------------ the proposer on files


def request(workspace: Path, results_dir: Path | None, trial: int = 1, fix: FixContext | None = None,
            tail: list[dict] | None = None, device: str = "cpu") -> ProposalRequest:
    return ProposalRequest(
        workspace=workspace, target="train.py", program_text="", metric_name="val_bpb", direction="min",
        parent_metric=2.0, parent=BEST, trial=trial, attempt=1, seed=42, ledger_tail=tail or [], fix=fix,
        results_dir=results_dir, device=device,
    )


def test_memory_survives_a_restart_through_the_ledger(tmp_path):
    """Every move already in the ledger at this best is skipped, even ones far beyond
    the short tail the loop passes."""
    (tmp_path / "train.py").write_bytes(AWKWARD.encode())
    results = tmp_path / "results"
    ledger = Ledger(results, fsync=False)
    all_moves = [m.description for m in moves_of(AWKWARD.encode())]
    now = time.time()
    for trial, description in enumerate(all_moves[:-1], start=1):
        ledger.append(LedgerRecord(trial=trial, started_at=now, ended_at=now, proposer="mutate", parent=BEST,
                                   description=description, status="discard", best=BEST), write_tsv=False)
    proposal = MutateProposer().propose(request(tmp_path, results, trial=len(all_moves)))
    assert proposal.description == all_moves[-1]
    assert proposal.description.split()[0] in (tmp_path / "train.py").read_text()
    # Recorded too, then nothing is left: the loop stops with "no more ideas".
    (tmp_path / "train.py").write_bytes(AWKWARD.encode())
    ledger.append(LedgerRecord(trial=99, started_at=now, ended_at=now, proposer="mutate", parent=BEST,
                               description=proposal.description, status="discard", best=BEST))
    assert MutateProposer().propose(request(tmp_path, results, trial=100)) is None
    assert (tmp_path / "train.py").read_bytes() == AWKWARD.encode()


def test_fix_requests_are_declined(tmp_path):
    (tmp_path / "train.py").write_bytes(AWKWARD.encode())
    fix = FixContext(crash="trivial", reason="NameError", log_tail="", description="LR 0.04 -> 0.056")
    assert MutateProposer().propose(request(tmp_path, None, fix=fix)) is None
    assert MutateProposer.can_fix is False
    assert (tmp_path / "train.py").read_bytes() == AWKWARD.encode()


# train.py's shape: a profile multiplies SEQ_LEN and the product is capped at 512.
PROFILED = """\
SEQ_LEN = 128           # training context in bytes
PROFILES = {
    "cpu": dict(width=1, seq=1, bf16=False),
    "cuda": dict(width=6, seq=4, bf16=True),
}
"""


def test_seq_len_is_bounded_on_the_value_the_devices_profile_trains(tmp_path, monkeypatch):
    """On the cuda profile SEQ_LEN 128 already trains 512 bytes: 128 -> 256 would train the
    same model, so it is never proposed there; on the CPU it is the first move."""
    monkeypatch.delenv("AUTOLOOP_PROFILE", raising=False)
    (tmp_path / "train.py").write_text(PROFILED)
    results = tmp_path / "results"
    on_cpu = MutateProposer().propose(request(tmp_path, results, device="cpu"))
    assert on_cpu.description == "SEQ_LEN 128 -> 256"
    (tmp_path / "train.py").write_text(PROFILED)
    on_gpu = MutateProposer().propose(request(tmp_path, results, device="cuda"))
    assert on_gpu.description == "SEQ_LEN 128 -> 64"
    ledger = Ledger(results, fsync=False)
    now = time.time()
    ledger.append(LedgerRecord(trial=1, started_at=now, ended_at=now, proposer="mutate", parent=BEST,
                               description=on_gpu.description, status="discard", best=BEST), write_tsv=False)
    (tmp_path / "train.py").write_text(PROFILED)
    assert MutateProposer().propose(request(tmp_path, results, trial=2, device="cuda")) is None   # nothing left
    # AUTOLOOP_PROFILE names the profile over the device's own, as in train.py.
    monkeypatch.setenv("AUTOLOOP_PROFILE", "cpu")
    assert MutateProposer().propose(request(tmp_path, results, trial=2, device="cuda")).description == \
        "SEQ_LEN 128 -> 256"


def test_the_real_train_pys_seq_len_moves_change_what_a_gpu_trains():
    source = TRAIN_PY.read_bytes()
    factor = 4   # train.py's cuda profile
    assert profile_bounds(source, "cuda") == {"SEQ_LEN": 512 // factor}
    assert profile_bounds(source, "cpu") == {"SEQ_LEN": 512}
    assert profile_bounds(b"SEQ_LEN = 128\n", "cuda") == {"SEQ_LEN": 512}   # no profiles: what is written
    for const in find_constants(source):
        if const.name == "SEQ_LEN":
            moves = constant_moves(const, profile_bounds(source, "cuda"))
            assert moves and all(min(m.new * factor, 512) != min(const.value * factor, 512) for m in moves)
