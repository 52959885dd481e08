"""The keep decision (autoloop.core.keep.decide) as a table: facts in, status / action / best /
reason out, one row per case the engine meets. Pure: no git, no ledger, no trial."""

from __future__ import annotations

import pytest

from autoloop.core.keep import MAX_REPLAYS, Decision, Facts, Rules, decide

A, B, C = "a" * 40, "b" * 40, "c" * 40   # the best it started from, the candidate, a newer best
STRICT = Rules(keep_rule="strict")
NOISE = Rules(keep_rule="noise", noise_z=2.0)
SANE = Rules(keep_rule="strict", sanity_bound=0.1)


def cand(*runs: float, **kw) -> Facts:
    """A candidate B built on A (best 1.0); the best has not moved unless `current` says so."""
    kw.setdefault("parent", (A, 1.0))
    kw.setdefault("current", kw["parent"])
    return Facts(kind=kw.pop("kind", "candidate"), commit=B, runs=tuple(runs), **kw)


# (id, facts, status, action, best after, a substring of the reason)
ROWS = [
    # -- a run whose number cannot be judged: the best does not move
    ("crash", cand(crash=("trivial", "NameError: name 'lr' is not defined")),
     "crash", "discard", (A, 1.0), "NameError"),
    ("crash-while-best-moved", cand(crash=("timeout", "hard timeout"), current=(C, 0.8)),
     "crash", "discard", (C, 0.8), "hard timeout"),
    ("tampered-beats-a-win", cand(0.5, tampered=("autoloop/evaluate.py",), rules=STRICT),
     "crash", "discard", (A, 1.0), "tampered: autoloop/evaluate.py"),
    ("tampered-beats-a-crash", cand(crash=("trivial", "x"), tampered=("program.md",)),
     "crash", "discard", (A, 1.0), "tampered: program.md"),
    ("other-data", cand(0.5, other_data="evaluated on other data (fingerprint x, expected y)"),
     "crash", "discard", (A, 1.0), "evaluated on other data"),
    ("no-metric", cand(), "crash", "discard", (A, 1.0), "no usable metric"),
    ("baseline-crash", Facts(kind="baseline", commit=A, crash=("fundamental", "out of memory")),
     "crash", "discard", (None, None), "out of memory"),
    # -- the baseline and the noise samples
    ("baseline", Facts(kind="baseline", commit=A, runs=(1.3,)), "keep", "keep", (A, 1.3), "baseline"),
    ("noise-sample", Facts(kind="confirm", commit=A, runs=(1.0, 1.2), noise_sample=(1, 2), parent=(A, 1.0),
                           current=(A, 1.0)),
     "keep", "keep", (A, 1.1), "noise sample 1/2"),
    # -- judged against the best it started from
    ("strict-keep", cand(0.9, rules=STRICT), "keep", "keep", (B, 0.9), "improved by 0.1000"),
    ("strict-tie", cand(1.0, rules=STRICT), "discard", "discard", (A, 1.0), "no improvement"),
    ("strict-worse", cand(1.2, rules=STRICT), "discard", "discard", (A, 1.0), "no improvement (+0.2000"),
    ("min-delta", cand(0.95, rules=Rules(keep_rule="strict", min_delta=0.1)),
     "discard", "discard", (A, 1.0), "<= min_delta 0.1000"),
    ("max-direction", cand(1.2, rules=Rules(direction="max", keep_rule="strict")), "keep", "keep", (B, 1.2),
     "improved"),
    ("noise-clear-gain", cand(0.7, noise=0.1, rules=NOISE), "keep", "keep", (B, 0.7), "improved"),
    ("noise-borderline-asks-to-confirm", cand(0.9, noise=0.1, rules=NOISE),
     "discard", "confirm", (A, 1.0), "within noise"),
    ("noise-confirmed", cand(0.8, 0.85, noise=0.1, can_confirm=False, rules=NOISE),   # 0.175 > 2 x 0.1 / sqrt 2
     "keep", "keep", (B, 0.825), "mean of 2 runs"),
    ("noise-not-confirmed", cand(0.9, 1.0, noise=0.1, can_confirm=False, rules=NOISE),
     "discard", "discard", (A, 1.0), "within noise (mean of 2 runs"),
    ("auto-without-noise-is-strict", cand(0.99, rules=Rules()), "keep", "keep", (B, 0.99), "improved"),
    ("sanity-bound-asks-to-confirm", cand(0.5, rules=SANE), "discard", "confirm", (A, 1.0), "sanity bound"),
    ("sanity-bound-reproduced", cand(0.5, 0.55, can_confirm=False, rules=SANE),
     "keep", "keep", (B, 0.525), "mean of 2 runs"),
    ("sanity-bound-not-reproduced", cand(0.5, 1.1, can_confirm=False, rules=SANE),
     "discard", "discard", (A, 1.0), "did not reproduce"),
    # -- another worker moved the best while it ran
    ("moved-loss", cand(1.2, current=(C, 0.8), rules=STRICT),
     "discard", "discard", (C, 0.8), f"(best has moved to {C[:7]} meanwhile)"),
    ("moved-win-replays", cand(0.9, current=(C, 0.8), merge="clean", rules=STRICT),
     "discard", "replay", (C, 0.8), "replaying it there"),
    ("moved-confirm-replays-instead", cand(0.5, current=(C, 0.8), merge="clean", rules=SANE),
     "discard", "replay", (C, 0.8), f"beat its start {A[:7]}"),
    ("moved-win-conflicts", cand(0.9, current=(C, 0.8), merge="conflict", rules=STRICT),
     "discard", "stale", (C, 0.8), "conflicts with the new best"),
    ("moved-win-already-in", cand(0.9, current=(C, 0.8), merge="already_in", rules=STRICT),
     "discard", "stale", (C, 0.8), "already in the new best"),
    ("moved-win-kept-moving", cand(0.9, current=(C, 0.8), merge="clean", replays=MAX_REPLAYS, rules=STRICT),
     "discard", "stale", (C, 0.8), "the best kept moving (3 replays)"),
]


@pytest.mark.parametrize("facts, status, action, best, reason", [r[1:] for r in ROWS], ids=[r[0] for r in ROWS])
def test_decide(facts: Facts, status, action, best, reason):
    d = decide(facts)
    assert isinstance(d, Decision)
    assert (d.status, d.action) == (status, action)
    assert d.best[0] == best[0] and (d.best[1] == pytest.approx(best[1]) if best[1] is not None else d.best[1] is None)
    assert reason in d.reason, d.reason


def test_what_the_record_carries():
    """The facts a decision leaves for the record's extra are data, never control flow."""
    tampered = decide(cand(0.5, tampered=("program.md",), rules=STRICT))
    assert tampered.extra == {"tampered": ["program.md"], "invalid_metric": 0.5} and tampered.noise is None
    sample = decide(Facts(kind="confirm", commit=A, runs=(1.0, 1.2), noise_sample=(1, 2), parent=(A, 1.0)))
    assert sample.extra["noise_samples"] == [1.0, 1.2] and sample.noise == pytest.approx(0.1414, abs=1e-4)
    confirmed = decide(cand(0.8, 0.85, noise=0.1, can_confirm=False, rules=NOISE))
    assert confirmed.extra == {"runs": [0.8, 0.85]} and confirmed.noise == 0.1
    assert confirmed.confidence == pytest.approx(1.75)
    stale = decide(cand(0.9, current=(C, 0.8), merge="conflict", rules=STRICT))
    assert stale.extra == {"beat_start": A, "stale": True}
    replay = decide(cand(0.9, current=(C, 0.8), merge="clean", rules=STRICT))
    assert replay.extra == {"beat_start": A}
    for d in (tampered, sample, confirmed, stale, replay):
        assert not {"confirm", "replay"} & set(d.extra)
