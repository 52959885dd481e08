"""`autoloop ladder`: a kept change against its parent along a scale path, on a stand-in
train.py whose metric is a known function of its size and of the change plus seeded noise
(tests/trial_scripts/ladder_value.py).

The statistics are tested as a table (core/ladder_fit.py); the five kinds of change (a gain
that holds, one that shrinks as a power law, one that flips sign, pure noise, a learning
rate whose optimum moves with size) through the plan's verdict, a pure function of the plan
and the ledger, fed the stand-in's own values; and once end to end through the real CLI in
a real git repository: a kill -9 in the middle, --resume, --json, the report and finalize.
"""

from __future__ import annotations

import difflib
import importlib.util
import json
import math
import re
from pathlib import Path

import jsonschema
import pytest
from helpers.git import git, init_repo
from helpers.loop import assert_invariants, autoloop, autoloop_in_process, read_ledger

from autoloop.core import compute_multiplier as cm
from autoloop.core import ladder_fit as lf
from autoloop.review.json_forms import schema
from autoloop.review.ladder_report import section, write_png
from autoloop.store.ledger import LedgerRecord
from autoloop.verification.ladder_plan import LadderError, LadderPlan, Side, summarize, summary_json, summary_lines
from autoloop.verification.ladder_rungs import derived_rungs, given_rungs, multiplied, tuning_constants

STAND_IN = Path(__file__).parent / "trial_scripts" / "ladder_value.py"
SOURCE = STAND_IN.read_text()
TIMEOUT = "30"


def _stand_in():
    spec = importlib.util.spec_from_file_location("ladder_value", STAND_IN)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def with_constants(source: str, **values) -> str:
    for name, value in values.items():
        source, n = re.subn(rf"^{name} = \S+", f"{name} = {value}", source, count=1, flags=re.M)
        assert n == 1, name
    return source


# ------------------------------------------------------------------------------ the statistics


def rungs_of(deltas: list[tuple[float, float, float]]) -> list[lf.RungDelta]:
    """(log10 compute, Δ, SE) -> RungDelta."""
    return [lf.RungDelta(x, d, se, 3) for x, d, se in deltas]


def test_wls_recovers_a_line_and_the_se_is_pooled_over_the_rungs():
    assert lf.wls([0, 1, 2], [1.0, 3.0, 5.0], [0.1, 0.2, 0.1]) == pytest.approx((1.0, 2.0))
    # Two rungs, three pairs each: differences (parent - change) 0.1±0.01 and 0.2±0.03.
    pairs = [[(1.10, 1.0), (1.11, 1.0), (1.09, 1.0)], [(1.20, 1.0), (1.23, 1.0), (1.17, 1.0)]]
    a, b = lf.rung_deltas([0.0, 1.0], pairs, "min")
    pooled = math.sqrt((2 * 0.01 ** 2 + 2 * 0.03 ** 2) / 4)
    assert (a.mean, b.mean) == pytest.approx((0.1, 0.2))
    assert a.se == pytest.approx(pooled / math.sqrt(3)) and b.se == a.se
    # Higher is better: the same numbers mean the change hurts.
    assert lf.rung_deltas([0.0], pairs[:1], "max")[0].mean == pytest.approx(-0.1)


@pytest.mark.parametrize("fit, held, name, says", [
    # steady: 0.05 at every rung
    ([(0, 0.05, 0.002), (1, 0.051, 0.002), (2, 0.049, 0.002)], (3, 0.05, 0.002), "HOLDS", "Δ steady or growing"),
    # a line that reaches zero at x = 4, within 30x of the held-out rung (x = 3)
    ([(0, 0.08, 0.002), (1, 0.06, 0.002), (2, 0.04, 0.002)], (3, 0.02, 0.002), "SHRINKING",
     "will vanish at about compute C=1e+04"),
    # ... at x = 8: beyond 30x the largest rung run, so no number
    ([(0, 0.08, 0.002), (1, 0.07, 0.002), (2, 0.06, 0.002)], (3, 0.05, 0.002), "SHRINKING",
     "would vanish beyond 30× the largest rung run (C=3e+04): not extrapolated"),
    ([(0, 0.04, 0.002), (1, 0.01, 0.002), (2, -0.02, 0.002)], (3, -0.05, 0.002), "SCALE-BOUND",
     "the sign flips inside the ladder"),
    ([(0, 0.001, 0.002), (1, -0.002, 0.002), (2, 0.003, 0.002)], (3, 0.0, 0.002), "NOISE",
     "no rung's Δ beyond 2 SE"),
    # the fit says 0.05, the held-out rung 0.2: nothing extrapolated
    ([(0, 0.05, 0.002), (1, 0.05, 0.002), (2, 0.05, 0.002)], (3, 0.2, 0.002), "NOT-PREDICTIVE",
     "ladder not predictive"),
    ([(0, 0.05, 0.002)], (3, 0.05, 0.002), "INCOMPLETE", "fewer than two fit rungs"),
])
def test_delta_verdicts(fit, held, name, says):
    verdict = lf.delta_verdict(rungs_of(fit), rungs_of([held])[0])
    assert verdict.name == name and says in verdict.line, verdict.line
    assert verdict.unproven == (name in ("SCALE-BOUND", "NOISE", "NOT-PREDICTIVE"))
    if name == "NOT-PREDICTIVE":
        assert "vanish" not in verdict.line


def test_a_gain_that_is_a_constant_share_of_the_reducible_loss_holds_as_a_compute_multiplier():
    """Loss 1 + 2/D, the change saving 0.2/D (10 % of the reducible loss at every size), rungs
    D = 2, 4, 8 and the held-out 16, compute ∝ D, noiseless pairs: a line in Δ predicts −0.0167
    at D = 16 (not predictive), while the change is the same ×1.11 compute at every rung."""
    ds = [2, 4, 8, 16]
    xs = [math.log10(d) for d in ds]
    parent = [1 + 2 / d for d in ds]
    deltas = rungs_of([(x, 0.2 / d, 0.0) for x, d in zip(xs, ds, strict=True)])
    in_delta = lf.delta_verdict(deltas[:3], deltas[3])
    assert in_delta.name == "NOT-PREDICTIVE" and in_delta.numbers["predicted"] == pytest.approx(-0.01667, abs=1e-4)
    curve = cm.fit_parent(xs, parent)
    assert isinstance(curve, cm.ParentCurve) and curve.kind == "power law"
    assert (curve.floor, curve.exponent) == pytest.approx((1.0, 1.0), abs=1e-4)
    mults = [cm.rung_multiplier(curve, x, loss, d) for x, loss, d in zip(xs, parent, deltas, strict=True)]
    assert [m.value for m in mults] == pytest.approx([1 / 0.9] * 4, rel=1e-4)
    verdict = cm.multiplier_verdict(deltas[:3], deltas[3], mults[:3], mults[3], curve)
    assert isinstance(verdict, lf.Verdict) and verdict.name == "HOLDS", verdict
    assert "compute multiplier stays steady above ×1" in verdict.line and "×1.11" in verdict.line, verdict.line
    assert "a line in Δ predicted -0.01667 (outside its 80 % band)" in verdict.line, verdict.line
    assert verdict.numbers["multiplier"] == pytest.approx(1 / 0.9, rel=1e-4)


def test_the_parent_curve_is_a_local_slope_or_refused_in_one_line_where_no_power_law_fits():
    # Three rungs: too few for three parameters; the segments between them are the curve.
    local = cm.fit_parent([0.0, 1.0, 2.0], [3.0, 2.0, 1.5])
    assert isinstance(local, cm.ParentCurve) and local.kind == "local slope"
    assert local.x_at(2.5) == pytest.approx(0.5) and local.x_at(1.25) == pytest.approx(2.5)
    assert local.x_at(3.5) == pytest.approx(-0.5)
    # Falling faster and faster (concave): no power law with a floor, the local slope.
    assert cm.fit_parent([0, 1, 2, 3], [3.0, 2.9, 2.6, 2.0]).kind == "local slope"
    # A parent that does not improve with scale: no compute buys the change's loss.
    why = cm.fit_parent([0, 1, 2, 3], [3.0, 2.9, 2.95, 2.8])
    assert isinstance(why, str) and why.startswith("the parent's loss does not fall along the rungs")
    # Through the plan: the verdict is read on Δ and says why, in its one line.
    plan, records = plan_for("holds", [43, 44, 45], retune=False)
    for rec in records:
        if rec.trial in (1, 5):   # the parent at rungs 1 and 3: worse at 3 than at 1
            rec.metric = 3.0 + (0.5 if rec.trial == 5 else 0.0)
    summary = summarize(plan, records)
    assert re.search(r"\(read on Δ: no compute multiplier: the parent's loss does not fall along the rungs "
                     r"\(3, 2\.84\d, 3\.5, 2\.68\d\): no compute buys the change's loss\)$", summary.verdict.line), \
        summary.verdict.line


def test_an_optimum_is_the_parabolas_vertex_and_its_exponent_is_fitted_against_size():
    # The metric (log2 m - t*)² with t* = -0.5 per doubling of N: exponent -0.5 exactly.
    optima = []
    for k in range(4):
        runs = {m: [(math.log2(m) + 0.5 * k) ** 2 + e for e in (-0.001, 0.001)] for m in lf.MULTIPLIERS}
        optima.append(lf.rung_optimum(k * math.log10(2), runs, "min"))
    assert [o.log2_m for o in optima] == pytest.approx([0.0, -0.5, -1.0, -1.5], abs=1e-6)
    fit, _ = lf.fit_exponent(optima[:3])
    assert fit.exponent == pytest.approx(-0.5, abs=1e-6)
    verdict = lf.retune_verdict({"LR": 0.02}, optima[:3], optima[3], optima[3].log_params)
    assert verdict.name == "RETUNE-AT-SCALE" and "use LR = 0.007071" in verdict.line, verdict.line
    far = lf.retune_verdict({"LR": 0.02}, optima[:3], optima[3], optima[3].log_params + 2)
    assert "beyond 30× the largest rung's parameters: not extrapolated" in far.line and "use LR" not in far.line
    # An optimum at the sweep's edge says so.
    edge = lf.rung_optimum(0.0, {m: [-math.log2(m)] for m in lf.MULTIPLIERS}, "min")
    assert edge.edge and edge.log2_m == 2.0


# ------------------------------------------------------------------------------ rungs and kinds of change


def test_rungs_from_the_size_constants_double_the_parameters_in_equal_log_steps():
    rungs = derived_rungs(SOURCE, 4, 10.0, "fixed")
    assert [r.values for r in rungs][:2] == [{"DEPTH": "2", "WIDTH": "64"}, {"DEPTH": "4", "WIDTH": "64"}]
    ratios = [b.params_est / a.params_est for a, b in zip(rungs, rungs[1:], strict=False)]
    assert all(1.8 < r < 2.2 for r in ratios), ratios
    assert {r.budget for r in rungs} == {10.0}
    scaled = derived_rungs(SOURCE, 3, 10.0, "scaled")
    assert scaled[1].budget == pytest.approx(40.0) and scaled[1].compute_est == pytest.approx(4.0)
    with pytest.raises(LadderError, match="no DEPTH and WIDTH"):
        derived_rungs(SOURCE.replace("WIDTH = 64", "SIZE = 64"), 4, 10.0, "fixed")


def test_given_rungs_are_sorted_smallest_first_and_checked():
    rungs = given_rungs(["DEPTH=8,WIDTH=64,budget=20s", "DEPTH=2", "DEPTH=4"], SOURCE, 10.0, "fixed")
    assert [r.values["DEPTH"] for r in rungs] == ["2", "4", "8"] and [r.budget for r in rungs] == [10.0, 10.0, 20.0]
    with pytest.raises(LadderError, match="has no constant HEIGHT"):
        given_rungs(["HEIGHT=3"], SOURCE, 10.0, "fixed")
    with pytest.raises(LadderError, match="expected KEY=VALUE"):
        given_rungs(["DEPTH"], SOURCE, 10.0, "fixed")


def test_a_change_that_only_moves_a_learning_rate_is_a_tuning_change():
    assert tuning_constants(SOURCE, with_constants(SOURCE, LR="0.04")) == {"LR": 0.04}
    assert tuning_constants(SOURCE, with_constants(SOURCE, TRICK="1")) == {}
    assert tuning_constants(SOURCE, with_constants(SOURCE, LR="0.04", TRICK="1")) == {}
    assert tuning_constants(SOURCE, with_constants(SOURCE, LR="0.04") + "\nprint()\n") == {}
    assert "LR = 0.005 " in multiplied(SOURCE, {"LR": 0.02}, 0.25)


# ------------------------------------------------------------------------------ the five kinds, by the plan's verdict


def plan_for(kind: str, seeds: list[int], retune: bool) -> tuple[LadderPlan, list[LedgerRecord]]:
    """A plan over the stand-in's derived rungs and the records its runs would write."""
    lv = _stand_in()
    rungs = derived_rungs(SOURCE, 4, 1.0, "fixed")
    rungs[-1] = rungs[-1].model_copy(update={"held_out": True})
    sides, records, trial = [], [], 1
    for rung in rungs:
        depth, width = int(rung.values["DEPTH"]), int(rung.values["WIDTH"])
        variants = [("parent", None, 0, 0.02)]
        variants += [("sweep", m, 0, 0.02 * m) for m in lf.MULTIPLIERS] if retune else [("change", None, 1, 0.02)]
        for role, mult, trick, lr in variants:
            sides.append(Side(rung=rung.index, role=role, multiplier=mult, commit="c" * 40, trial=trial))
            n, d, _ = lv.compute(depth, width)
            for k, seed in enumerate(seeds):
                value = lv.true_value(depth, width, trick, kind, lr) + lv.noise(seed, depth, width, trick, kind, lr)
                records.append(LedgerRecord.model_construct(
                    trial=trial, attempt=k + 1, kind="verify", status="discard", metric=value, reason="",
                    extra={"ladder": {"repeat": k}}, metrics={"num_params_M": n / 1e6, "total_tokens_M": d / 1e6}))
            trial += 1
    plan = LadderPlan(tag="t", best="b" * 40, change=1, description=kind, parent="p" * 40, child="c" * 40,
                      direction="min", seeds=seeds, rungs=rungs, sides=sides,
                      retune={"LR": 0.02} if retune else {})
    return plan, records


@pytest.mark.parametrize("kind, verdict", [("holds", "HOLDS"), ("shrink", "SHRINKING"), ("flip", "SCALE-BOUND"),
                                           ("noise", "NOISE"), ("fraction", "HOLDS"), ("fading", "SHRINKING")])
def test_each_kind_of_change_gets_its_verdict(kind, verdict):
    plan, records = plan_for(kind, [43, 44, 45], retune=False)
    summary = summarize(plan, records)
    assert summary.left == 0 and summary.measured
    assert summary.verdict.name == verdict, "\n".join(summary_lines(summary))


def test_the_kinds_read_in_compute_multipliers_give_theirs_with_an_interval():
    """On the loss with a floor: a constant share of the reducible loss is ×1.23 at every rung
    (10^(−2·log10 0.9)), its Δ halving per decade; a fading gain's multiplier falls to ×1 at
    c = 2 (C = 100× the first rung's), where the verdict says it does."""
    plan, records = plan_for("fraction", [43, 44, 45], retune=False)
    s = summarize(plan, records)
    truth = 0.9 ** -2
    for r in s.rungs:
        assert r.multiplier is not None and r.multiplier.value == pytest.approx(truth, rel=0.02)
        lo, hi = r.multiplier.interval
        assert lo <= truth <= hi
    assert s.verdict.numbers["multiplier_low"] <= truth <= s.verdict.numbers["multiplier_high"]
    assert "multiplier ×1.2" in summary_lines(s)[1]
    out = json.loads(summary_json(s))
    jsonschema.validate(out, schema("ladder"))
    assert out["rungs"][3]["compute_multiplier"] == pytest.approx(truth, rel=0.02)
    plan, records = plan_for("fading", [43, 44, 45], retune=False)
    s = summarize(plan, records)
    first = s.rungs[0].compute
    assert s.verdict.numbers["reaches_one_at"] == pytest.approx(100 * first, rel=0.3), s.verdict.line
    assert [round(r.multiplier.value, 2) for r in s.rungs] == [1.26, 1.17, 1.1, 1.03]


def test_a_ladder_whose_compute_stays_flat_is_fitted_against_the_parameters(tmp_path):
    """A fixed wall-clock budget on a device whose throughput falls as 1/N: every rung trains
    about the same compute (as measured on the CPU), so the fit's axis is N, and it says so."""
    plan, records = plan_for("shrink", [43, 44, 45], retune=False)
    for rec in records:   # D = 1e12 / (6 N): C the same at every rung, give or take 10 %
        n = rec.metrics["num_params_M"] * 1e6
        rec.metrics["total_tokens_M"] = 1e12 / (6 * n) * (1 + 0.1 * (rec.trial % 3 == 0)) / 1e6
    summary = summarize(plan, records)
    assert summary.axis == "params" and summary.verdict.name == "SHRINKING", "\n".join(summary_lines(summary))
    lines = summary_lines(summary)
    assert re.match(r"compute does not grow along the rungs \(C 1(\.\d+)?e\+12 to 1\.\d+e\+12: the budget fixed at 1s",
                    lines[-2]), lines[-2]
    assert "at N=" in lines[-1] and "per decade of parameters" in lines[-1], lines[-1]
    assert json.loads(summary_json(summary))["axis"] == "params"
    assert "fitted against the parameters N" in "\n".join(section(summary, None))
    write_png(summary, tmp_path / "ladder.png")
    assert (tmp_path / "ladder.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    # Compute that grows by a quarter or more per rung is the axis, as before.
    assert lf.along_compute([1.0, 1.25, 2.0, 8.0]) and not lf.along_compute([1.0, 1.2, 2.0, 8.0])


def test_a_learning_rate_whose_optimum_moves_with_size_is_retuned_and_its_exponent_found(tmp_path):
    plan, records = plan_for("holds", [43, 44, 45], retune=True)
    summary = summarize(plan, records)
    v = summary.verdict
    assert v.name == "RETUNE-AT-SCALE", v.line
    lines = summary_lines(summary)
    assert lines[-1] == v.line and "best multiplier ×" in lines[1] and "a sweep of LR" in lines[0]
    assert json.loads(summary_json(summary))["rungs"][3]["best_multiplier"] == pytest.approx(2 ** -1.5, rel=0.05)
    write_png(summary, tmp_path / "ladder.png")
    assert (tmp_path / "ladder.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    truth = _stand_in().TRUE_EXPONENT
    assert v.numbers["exponent_low"] <= truth <= v.numbers["exponent_high"], v.line
    assert v.numbers["exponent"] == pytest.approx(truth, abs=0.05)
    held = summary.rungs[-1]
    # The value to use at the held-out size: 0.02 x (N/N0)^-0.5.
    expected = 0.02 * (held.params / _stand_in().N0) ** truth
    assert v.numbers["target_multiplier"] * 0.02 == pytest.approx(expected, rel=0.05)


# ------------------------------------------------------------------------------ end to end


def patch(description: str, old: str, new: str) -> str:
    diff = difflib.unified_diff(old.splitlines(keepends=True), new.splitlines(keepends=True), "a/train.py",
                                "b/train.py")
    return f"{description}\n" + "".join(diff)


RUNGS = ("--rung", "DEPTH=2,WIDTH=64", "--rung", "DEPTH=4,WIDTH=64", "--rung", "DEPTH=4,WIDTH=128")


def test_a_ladder_killed_mid_way_resumes_and_its_verdict_reaches_the_report_and_finalize(tmp_path, tiny_data_dir):
    """A night keeps a change that helps small models and hurts large ones (#1) and a learning
    rate (#2); the ladder of #1 is killed in the middle of a run, refused without --resume,
    resumed with --json: SCALE-BOUND, every run measured once, the branch where it was; the
    report has its section and picture, and finalize --drop-unproven leaves #1 out."""
    base = with_constants(SOURCE, KIND='"flip"', LR="0.01")
    trick = with_constants(base, TRICK="1")
    repo = init_repo(tmp_path / "repo", {"train.py": base})
    queue = repo / "results" / "queue"
    queue.mkdir(parents=True)
    (queue / "01.patch").write_text(patch("TRICK 0 -> 1", base, trick))
    (queue / "02.patch").write_text(patch("LR 0.01 -> 0.02", trick, with_constants(trick, LR="0.02")))
    proc = autoloop_in_process(repo, "run", "--budget", "1", "--timeout", TIMEOUT, "--proposer", "queue",
                               "--tag", "t", "--keep-rule", "strict", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    night = read_ledger(repo)
    assert [r["status"] for r in night] == ["keep", "keep", "keep"]
    best = git(repo, "rev-parse", "HEAD")

    ladder = ("ladder", "--budget", "1", "--timeout", TIMEOUT, "--change", "1", "--seeds", "2", *RUNGS)
    # Trials 3..8: (parent, change) at each rung; killed as the change's first run at rung 2 starts.
    proc = autoloop(repo, *ladder, data_dir=tiny_data_dir, env={"AUTOLOOP_FAULT_KILL_AT": "running:6.1"})
    assert proc.returncode == -9, proc.stdout + proc.stderr
    assert len([r for r in read_ledger(repo) if r["kind"] == "verify"]) == 5
    proc = autoloop(repo, *ladder, data_dir=tiny_data_dir)
    assert proc.returncode == 1 and "pass --resume" in proc.stderr

    proc = autoloop(repo, *ladder, "--resume", "--json", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "recovery: trial 6.1 was interrupted during running" in proc.stderr
    out = json.loads(proc.stdout)
    jsonschema.validate(out, schema("ladder"))
    assert out["verdict"]["name"] == "SCALE-BOUND" and out["change"] == 1 and out["compute_measured"]
    assert [r["held_out"] for r in out["rungs"]] == [False, False, True]
    assert out["rungs"][0]["delta"] > 0 > out["rungs"][2]["delta"]
    runs = [r for r in read_ledger(repo) if r["kind"] == "verify"]
    measured = sorted((r["trial"], r["extra"]["ladder"]["repeat"]) for r in runs if "ladder" in r["extra"])
    assert measured == sorted((t, k) for t in range(3, 9) for k in range(2))
    assert [(r["trial"], r["reason"]) for r in runs if "ladder" not in r["extra"]] == \
        [(6, "interrupted (orchestrator stopped during running)")]
    seeds = {r["extra"]["ladder"]["repeat"]: r["seed"] for r in runs if "ladder" in r["extra"]}
    assert seeds == {0: 43, 1: 44}
    assert git(repo, "rev-parse", "HEAD") == best and git(repo, "status", "--porcelain") == ""
    assert_invariants(repo)

    proc = autoloop_in_process(repo, "report", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stderr
    report = (repo / "results" / "report.md").read_text()
    section = report.split("## Ladder", 1)[1]
    assert "**SCALE-BOUND: the sign flips inside the ladder" in section and "| 3 (held out) |" in section
    assert "![ladder](ladder.png)" in section
    assert (repo / "results" / "ladder.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"

    proc = autoloop_in_process(repo, "finalize", "--drop-unproven", data_dir=tiny_data_dir)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "left out: trial 1 TRICK 0 -> 1 (SCALE-BOUND in autoloop ladder)" in proc.stdout
    assert git(repo, "log", "--format=%s", "autoloop/t-final").splitlines()[1] == "LR 0.01 -> 0.02"

    # Bad input: one line each, nothing run.
    before = len(read_ledger(repo))
    proc = autoloop_in_process(repo, "ladder", "--budget", "1", "--change", "0", data_dir=tiny_data_dir)
    assert (proc.returncode, proc.stderr) == (1, "autoloop: --change 0: not a kept change; the kept changes are "
                                                 "trials 1, 2\n")
    proc = autoloop_in_process(repo, "ladder", "--budget", "1", "--rung", "HEIGHT=3", "--rung", "DEPTH=3",
                               "--rung", "DEPTH=4", data_dir=tiny_data_dir)
    assert (proc.returncode, proc.stderr) == (1, "autoloop: --rung HEIGHT=3: the change's target has no constant "
                                                 "HEIGHT set to a number or bool\n")
    assert len(read_ledger(repo)) == before
