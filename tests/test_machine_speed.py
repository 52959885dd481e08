"""Decisions that see through the machine's own jitter (docs/machine-speed.md).

End to end on the stand-in tests/trial_scripts/machine_speed.py, whose val_bpb depends on the
machine's speed (the probe's test knob AUTOLOOP_PROBE_SCALE, one factor per probed run) and on
SPEEDUP, a change that truly trains faster. The baseline and its noise runs meet machines from
0.7x to 1.3x; then a change of nothing meets a 2x machine (lucky) and a real 1.5x speed-up
meets a slow one. On the raw metric the lucky one wins and the real one does not; adjusted
to the night's median speed, the real change is kept and the lucky one refused.
"""

from __future__ import annotations

import sys
from pathlib import Path

from helpers.git import init_repo
from helpers.loop import assert_invariants, autoloop, autoloop_in_process, queue_file

STAND_IN = (Path(__file__).parent / "trial_scripts" / "machine_speed.py").read_text()
BASELINE_FACTORS = [1.0, 0.7, 1.3, 0.85, 1.15]


def night(tmp_path: Path, data_dir: Path, factors: list[float]) -> list[dict]:
    repo = init_repo(tmp_path / "repo", {"train.py": STAND_IN})
    queue_file(repo, "01_lucky.py", STAND_IN.replace("LABEL = 0", "LABEL = 1"), "a change of nothing")
    queue_file(repo, "02_real.py", STAND_IN.replace("SPEEDUP = 1.0", "SPEEDUP = 1.5"), "trains 1.5x faster")
    proc = autoloop(repo, "run", "--budget", "5", "--proposer", "queue", "--tag", "t", "--noise-runs", "4",
                    "--command", f"{sys.executable} train.py", "--machine-probe", data_dir=data_dir,
                    env={"AUTOLOOP_PROBE_SCALE": ",".join(map(str, factors))})
    assert proc.returncode == 0, proc.stdout + proc.stderr
    ledger = assert_invariants(repo)
    # raw and adjusted side by side where the person reads the night
    status = autoloop_in_process(repo, "status", data_dir=data_dir).stdout
    assert "machine speed: metric -0.1" in status and "adjusted" in status, status
    autoloop_in_process(repo, "report", data_dir=data_dir)
    assert "## Machine speed" in (repo / "results" / "report.md").read_text()
    return ledger


def verdicts(ledger: list[dict]) -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for r in ledger:
        found.setdefault(r["description"], []).append(r["status"])
    return found


def test_adjusted_decisions_keep_the_real_change_and_refuse_the_lucky_one(tmp_path, tiny_data_dir):
    ledger = night(tmp_path, tiny_data_dir, [*BASELINE_FACTORS, 2.0, 0.8, 0.8, 0.8, 0.8])
    v = verdicts(ledger)
    assert "keep" not in v["a change of nothing"], ledger
    assert v["trains 1.5x faster"][-1] == "keep", ledger
    # every run carries the machine's speed, the probe's own figures beside it
    assert [r["machine_speed"] for r in ledger[:5]] == [f * 1e6 for f in BASELINE_FACTORS]
    assert all({"probe_before", "probe_after", "kernel", "measured_speed"} <= set(r["extra"]["machine"])
               for r in ledger)
    # the decisions say both: the adjusted verdict decides, the raw one is kept beside it
    lucky = next(r for r in ledger if r["description"] == "a change of nothing")
    assert lucky["reason"].startswith("at the night's median machine speed")
    assert lucky["extra"]["adjusted"]["raw"].startswith("keep")
    real = [r for r in ledger if r["description"] == "trains 1.5x faster"]
    assert not real[0]["extra"]["adjusted"]["raw"].startswith("keep")



# -- the fit (core/machine_speed.py) and the keep decision's hook, as tables --------------------

import math  # noqa: E402
import time  # noqa: E402

import pytest  # noqa: E402

from autoloop.core.keep import Facts, decide  # noqa: E402
from autoloop.core.machine_speed import Adjusted, Run, adjusted_inputs, fit  # noqa: E402
from autoloop.execution.machine_speed import Probe  # noqa: E402

SPEEDS = [1.0, 0.7, 1.3, 0.85, 1.15]
SEED_NOISE = [0.001, -0.002, 0.0015, 0.0, -0.0005]


def repeats(slope: float, speeds: list[float] = SPEEDS, commit: str = "a") -> list[Run]:
    return [Run(commit, 1.5 + slope * math.log(s) + e, s) for s, e in zip(speeds, SEED_NOISE, strict=True)]


@pytest.mark.parametrize(("runs", "use", "note"), [
    (repeats(-0.1), True, "decisions on adjusted values"),
    (repeats(-0.1) + repeats(-0.1, commit="b"), True, "over 10 repeats of 2 commits"),
    (repeats(0.0), False, "no gain, decisions on the raw metric"),
    (repeats(-0.1, [1.0, 1.01, 0.99, 1.0, 1.005]), False, "held steady"),   # a dedicated GPU
    (repeats(-0.1)[:3], False, "too few"),
    ([Run("a", 1.5, None), Run("a", 1.6, None)], False, "no machine speed measured"),
])
def test_fit_is_used_only_where_it_shrinks_the_spread(runs, use, note):
    f = fit(runs)
    assert f.use is use and note in f.note


def test_adjusted_values_are_at_the_median_speed():
    f = fit(repeats(-0.1))
    assert f.slope == pytest.approx(-0.1, abs=0.01) and f.reference == 1.0
    assert f.adjusted_spread is not None and f.raw_spread is not None and f.adjusted_spread < f.raw_spread / 5
    assert f.adjust(1.4, 1.0) == 1.4
    assert f.adjust(1.5 - 0.1 * math.log(2.0), 2.0) == pytest.approx(1.5, abs=0.01)
    assert fit(repeats(0.0)).adjust(1.4, 2.0) == 1.4        # not used: the raw value
    # a run of unknown speed: nothing adjusted, never half of each
    assert adjusted_inputs(f, [(1.4, None)], [(1.5, 1.0)], 0.01) is None
    assert adjusted_inputs(f, [(1.4, 2.0)], [(1.5, 1.0), (1.45, 1.3)], None) is not None


BEST = ("b0", 1.50)
ADJ = Adjusted(runs=(1.499,), best=1.50, noise=0.002, note="fit")


@pytest.mark.parametrize(("runs", "noise", "adjusted", "status", "action"), [
    ((1.45,), 0.02, None, "keep", "keep"),            # raw: a lucky run beats the best
    ((1.45,), 0.02, ADJ, "discard", "confirm"),       # adjusted, it gains 0.001 <= 2 x 0.002: re-run
    ((1.49,), 0.02, Adjusted((1.46,), 1.50, 0.002, "fit"), "keep", "keep"),    # a real gain the raw noise hid
    ((1.49,), 0.02, None, "discard", "confirm"),
    ((1.45,), 0.02, Adjusted((1.51,), 1.50, 0.002, "fit"), "discard", "discard"),
])
def test_keep_decides_on_adjusted_values_when_given(runs, noise, adjusted, status, action):
    d = decide(Facts(kind="candidate", commit="c1", runs=runs, parent=BEST, current=BEST, noise=noise,
                     adjusted=adjusted))
    assert (d.status, d.action) == (status, action), d.reason
    if adjusted is not None:
        assert d.reason.startswith("at the night's median machine speed") and "raw" in d.extra["adjusted"]
    if d.status == "keep":
        assert d.best == ("c1", pytest.approx(sum(runs) / len(runs)))   # the best's value stays raw


def test_probe_measures_this_machine(monkeypatch):
    monkeypatch.delenv("AUTOLOOP_PROBE_SCALE", raising=False)
    probe = Probe()
    assert probe.start() == {}
    time.sleep(0.3)   # the trial: /proc/stat counts in ticks
    found = probe.finish()
    assert found is not None and found["speed"] > 0 and found["probe_before"] > 0
    assert 0 <= found["others"] <= 0.95 and 0 <= found["steal"] <= 0.95


# -- raw and adjusted side by side (review/machine_speed.py) ----------------------------------------

from autoloop.review.machine_speed import machine_data, report_section, status_lines  # noqa: E402
from autoloop.store.ledger import LedgerRecord  # noqa: E402


def record(trial: int, attempt: int, commit: str, metric: float, speed: float | None, kind: str = "confirm",
           status: str = "keep") -> LedgerRecord:
    return LedgerRecord(trial=trial, attempt=attempt, kind=kind, started_at=0, ended_at=1, proposer="t",
                        description="d", status=status, commit=commit, metric=metric, machine_speed=speed,
                        best=commit if status == "keep" else "b0", best_metric=1.5)


def test_status_and_report_show_raw_and_adjusted():
    night = [record(0, a + 1, "b0", r.metric, r.speed, "baseline" if a == 0 else "confirm")
             for a, r in enumerate(repeats(-0.1))]
    night.append(record(1, 1, "c1", 1.5 - 0.1 * math.log(2.0), 2.0, "candidate", "discard"))
    data = machine_data(night)
    at_median = 1.5 - 0.1 * math.log(data["reference"]) if data else None   # the median speed is 1.075
    assert data is not None and data["use"] and data["adjusted"]["1"] == pytest.approx(at_median, abs=0.01)
    assert data["best_adjusted"] == pytest.approx(at_median, abs=0.005)
    [line] = status_lines(data)
    assert line.startswith("machine speed: metric -0.09") and "raw," in line and "adjusted" in line
    section = "\n".join(report_section(night, "val_bpb"))
    assert "## Machine speed" in section and "| 1 | candidate | c1 | 1.86 | 1.430685 | 1.49" in section
    # nothing probed (an old ledger): nothing shown
    assert machine_data([record(0, 1, "b0", 1.5, None, "baseline")]) is None


def test_verify_shows_contributions_at_the_median_speed_and_its_verdicts_read_them():
    from autoloop.verification.verify_plan import ChangeNote, Plan, Variant, summarize, summary_lines, unproven

    plan = Plan(tag="t", best="B", best_metric=1.48, baseline="A", direction="min", repeats=4, seeds=[1, 2, 3, 4],
                changes=[ChangeNote(trial=1, description="real", commit="B", parent="A")],
                variants=[Variant(name="best", role="best", commit="B", trial=10),
                          Variant(name="baseline", role="baseline", commit="A", trial=11),
                          Variant(name="without #1", role="without", commit="A2", trial=12, changes=[1])])
    true = {10: 1.48, 11: 1.50, 12: 1.50}
    speeds = {10: [1.4, 0.7, 1.2, 0.8], 11: [0.7, 1.3, 0.8, 1.25], 12: [0.75, 1.35, 0.7, 1.3]}
    records = [LedgerRecord(trial=t, attempt=r + 1, kind="verify", started_at=0, ended_at=1, proposer="verify",
                            description="v", status="discard", commit=plan.variants[t - 10].commit,
                            metric=true[t] - 0.1 * math.log(speeds[t][r]) + SEED_NOISE[r] / 4,
                            machine_speed=speeds[t][r], extra={"verify": {"repeat": r}})
               for t in true for r in range(4)]
    s = summarize(plan, records)
    assert s.gain is not None and s.gain.verdict == "within noise"
    assert s.gain_adjusted is not None and s.gain_adjusted.verdict == "confirmed"
    assert s.gain_adjusted.mean == pytest.approx(0.02, abs=0.003)
    text = "\n".join(summary_lines(s))
    assert "(within noise (unproven)); at the median machine speed 0.02" in text and "machine speed: metric" in text
    assert unproven(plan, records, "t", "B") == {}    # the adjusted verdict: confirmed, not dropped
