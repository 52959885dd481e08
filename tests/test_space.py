"""The search space over a target's constants: ranges keep the mutator's rules, values round
trip, several literals are rewritten at once and every other byte stays. Pure Python."""

from __future__ import annotations

import itertools
import math

import pytest
from helpers.git import TRAIN_PY

from autoloop.proposers.mutate import find_constants
from autoloop.proposers.space import Space, build_space

AWKWARD = b"""\
import os
LR   =   0.04    # learning rate (keep this comment)
NAME: float = 3e-4  # annotated
SHIFT = -0.5
STEPS = 100
WIDTH = 96
N_HEADS = 4
USE_X = True
BETAS = (0.8, 0.95)  # one line, two literals
DROPOUT = 0.0
WARMDOWN_FRAC = 0.4
SEQ_LEN = 256
MODE = "fast"
DERIVED = WIDTH // 2
LOG_EVERY_S = 5.0
"""


def corners(space: Space):
    """Every dimension at its low and its high end, and the current values in between."""
    for d in space.dimensions:
        for p in (d.low, d.high):
            yield d, d.value(int(p) if d.kind in ("pow2", "int") else (bool(p) if d.kind == "bool" else p))


def test_train_py_space_keeps_the_mutators_rules():
    source = TRAIN_PY.read_bytes()
    space = build_space(source)
    current = {c.name: c.value for c in find_constants(source)}
    names = {d.constant for d in space.dimensions}
    assert {"MATRIX_LR", "WIDTH", "HEAD_DIM", "SEQ_LEN", "ADAM_BETAS", "WARMDOWN_FRAC"} <= names
    assert "\nDATA_SEED = " in source.decode()
    assert not names & {"LOG_EVERY_S", "EVAL_BATCH", "COMPILE_ON_CPU", "DATA_SEED"}   # mutate.SKIP
    for d, value in corners(space):
        old = current[d.constant]
        old = old[d.index] if d.index is not None else old
        assert type(value) is type(old) or (isinstance(old, float) and isinstance(value, float)), d
        if isinstance(old, (int, float)) and not isinstance(old, bool) and old != 0:
            assert (value > 0) == (old > 0), d                     # the sign is kept
        if d.kind == "pow2":
            assert value >= 1 and value & (value - 1) == 0, d      # powers of two stay powers of two
        if "FRAC" in d.constant or "MOMENTUM" in d.constant or "BETA" in d.constant:
            assert 0 <= value <= 1, d                              # fractions stay fractions
        if d.kind == "log1m":
            assert 0.5 <= value < 1, d                             # a momentum never reaches 1
    seq = next(d for d in space.dimensions if d.constant == "SEQ_LEN")
    assert seq.value(seq.high) == 512                              # SEQ_LEN <= 512
    assert ("WIDTH", "HEAD_DIM") in space.divisible   # heads = WIDTH // HEAD_DIM


def test_every_width_and_head_count_in_the_space_divide():
    space = build_space(TRAIN_PY.read_bytes())
    width = next(d for d in space.dimensions if d.name == "WIDTH")
    heads = next(d for d in space.dimensions if d.name == "HEAD_DIM")   # the default's divisor of WIDTH
    assert heads.value(heads.high) >= 64 and width.value(width.low) >= heads.value(heads.high)
    widths, heads_range = range(int(width.low), int(width.high) + 1), range(int(heads.low), int(heads.high) + 1)
    for w, h in itertools.product(widths, heads_range):
        values = {"WIDTH": width.value(w), "HEAD_DIM": heads.value(h)}
        assert space.infeasible(values) is None, values


def test_a_width_that_is_not_a_power_of_two_is_checked_not_capped():
    space = build_space(AWKWARD)
    assert ("WIDTH", "N_HEADS") in space.divisible
    assert space.infeasible({"WIDTH": 100, "N_HEADS": 8}) == "WIDTH 100 is not divisible by N_HEADS 8"
    assert space.infeasible({"WIDTH": 96, "N_HEADS": 8}) is None


def test_float_ranges_are_centred_on_the_current_value():
    space = build_space(AWKWARD)
    for name, current in (("LR", 0.04), ("NAME", 3e-4)):
        d = next(d for d in space.dimensions if d.name == name)
        assert math.isclose(math.sqrt(d.low * d.high), current)
        assert math.isclose(d.high / d.low, 16)
    frac = next(d for d in space.dimensions if d.name == "WARMDOWN_FRAC")
    assert math.isclose(frac.high, 1.0) and math.isclose(math.sqrt(frac.low * frac.high), 0.4)
    shift = next(d for d in space.dimensions if d.name == "SHIFT")
    assert shift.negative and shift.value(shift.high) == -2.0
    zero = next(d for d in space.dimensions if d.name == "DROPOUT")
    assert zero.kind == "linear" and (zero.low, zero.high) == (0.0, 0.2)
    assert {d.name for d in space.dimensions} >= {"BETAS[0]", "BETAS[1]", "USE_X", "STEPS", "SEQ_LEN"}
    assert "MODE" not in {d.name for d in space.dimensions} and "DERIVED" not in {d.name for d in space.dimensions}


def test_values_and_params_round_trip():
    space = build_space(AWKWARD)
    current = space.read(AWKWARD)
    params = space.params(current)
    assert params is not None
    assert space.key(space.values(params)) == space.key(current)
    # A value another proposer moved out of the range, or to another type, is outside.
    assert space.params({**current, "LR": 40.0}) is None
    assert space.params({**current, "STEPS": 100.5}) is None
    assert space.params({**current, "SEQ_LEN": 384}) is None          # not a power of two


def test_momentum_values_round_on_their_distance_to_one():
    space = build_space(AWKWARD)
    beta = next(d for d in space.dimensions if d.name == "BETAS[1]")
    assert beta.value(0.0312345) == 0.9688
    assert beta.value(0.00012345) == 0.999877     # never rounds up to 1
    assert beta.value(0.07) == 0.93               # no 0.9299999999999999


def test_write_rewrites_several_literals_and_nothing_else():
    space = build_space(AWKWARD)
    values = {**space.read(AWKWARD), "LR": 0.031, "BETAS[0]": 0.85, "BETAS[1]": 0.97, "STEPS": 120, "USE_X": False,
              "SHIFT": -0.25}
    new, moves = space.write(AWKWARD, values)
    assert moves == ["LR 0.04 -> 0.031", "SHIFT -0.5 -> -0.25", "STEPS 100 -> 120", "USE_X True -> False",
                     "BETAS (0.8, 0.95) -> (0.85, 0.97)"]
    assert b"LR   =   0.031    # learning rate (keep this comment)\n" in new
    assert b"BETAS = (0.85, 0.97)  # one line, two literals\n" in new
    assert space.read(new) == {**space.read(AWKWARD), **{k: v for k, v in values.items()}}
    changed = [(a, b) for a, b in zip(AWKWARD.split(b"\n"), new.split(b"\n"), strict=True) if a != b]
    assert len(changed) == 5
    assert space.write(AWKWARD, space.read(AWKWARD)) == (AWKWARD, [])   # the same point: no move


def test_write_leaves_out_constants_the_source_no_longer_has():
    space = build_space(AWKWARD)
    edited = AWKWARD.replace(b"STEPS = 100\n", b"STEPS = int(os.environ.get('STEPS', 100))\n")
    new, moves = space.write(edited, {**space.read(AWKWARD), "STEPS": 120, "LR": 0.05})
    assert moves == ["LR 0.04 -> 0.05"]
    assert b"STEPS = int(os.environ.get('STEPS', 100))\n" in new


@pytest.mark.parametrize("source", [b"x = 1\n", b"MODE = 'fast'\n"])
def test_nothing_to_search(source):
    assert not build_space(source)


def test_the_space_bounds_seq_len_on_the_value_the_cuda_profile_trains():
    from autoloop.proposers.mutate import profile_bounds

    source = TRAIN_PY.read_bytes()
    seq = next(d for d in build_space(source, profile_bounds(source, "cuda")).dimensions if d.constant == "SEQ_LEN")
    assert seq.value(seq.high) * 4 <= 512   # x4 on the cuda profile, capped at 512 by train.py
