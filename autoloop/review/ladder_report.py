"""report.md's Ladder section and results/ladder.png, from ``ladder_plan.summarize``.

The picture: Δ per rung against compute (log scale), ± 2 SE, the fit rungs filled and the
held-out rung hollow, with the fitted line and its bootstrap 80 % band carried to the
held-out rung; for a tuning change, the best multiplier per rung against parameters and the
fitted power law. matplotlib is the ``plot`` extra: without it, one line says so.
"""

from __future__ import annotations

import io
import math
from pathlib import Path
from typing import Any

from autoloop.core.ladder_fit import fit_exponent, fit_line
from autoloop.core.layout import Layout
from autoloop.review.plot import PlotUnavailable
from autoloop.store.atomic import atomic_write
from autoloop.store.ledger import LedgerRecord
from autoloop.verification.ladder_plan import LadderSummary, RungResult, load_plan, summarize


def _md(text: str) -> str:
    # An agent's description is untrusted text: no markup of its own in the page.
    return text.replace("|", "\\|").replace("<", "&lt;").replace(">", "&gt;").replace("`", "'")


def section(s: LadderSummary, picture: str | None, note: str | None = None) -> list[str]:
    p = s.plan
    out = ["## Ladder", "",
           f"`autoloop ladder` ran #{p.change} {_md(p.description)} (`{p.child[:7]}`) against its parent "
           f"`{p.parent[:7]}` at {len(p.rungs)} rungs, {len(p.seeds)} paired seeds each, the largest held out. "
           "Δ > 0: the change helps; ± one standard error. The compute multiplier: how much more compute the "
           "parent needs to reach the change's loss (on the parameters where the compute did not grow). How the "
           "fits and the verdicts are made: docs/verification.md.", "",
           "| rung | constants | budget | parameters | compute | Δ ± SE | compute multiplier | best multiplier |",
           "|---|---|---|---|---|---|---|---|"]
    for r in s.rungs:
        d = r.delta
        delta = f"{d.mean:+.4g} ± {d.se:.2g}" if d.mean is not None and d.se is not None else "-"
        opt = f"×{2 ** r.optimum.log2_m:.3g}" if r.optimum is not None else "-"
        m = r.multiplier
        mult = "-" if m is None or m.value is None else f"×{m.value:.3g}" + (
            f" (×{m.interval[0]:.3g}..×{m.interval[1]:.3g})" if m.interval else "")
        held = " (held out)" if r.rung.held_out else ""
        out.append(f"| {r.rung.index + 1}{held} | {_md(r.rung.label())} | {r.rung.budget:g} s | {r.params:.3g} | "
                   f"{r.compute:.3g}{'' if s.measured else ' (nominal)'} | {delta} | {mult} | {opt} |")
    if s.axis == "params":
        out += ["", "The compute did not grow along the rungs (the budget fixed, the device's throughput falling "
                "as the model grows): Δ is fitted against the parameters N."]
    out += ["", f"**{_md(s.verdict.line)}**", ""]
    if picture:
        out += [f"![ladder]({picture})", ""]
    elif note:
        out += [note, ""]
    return out


def ladder_lines(results: Layout, output: Layout, records: list[LedgerRecord], tag: str | None) -> list[str]:
    """The Ladder section and its picture, when this tag has a ladder plan."""
    plan = load_plan(results)
    if plan is None or (tag and plan.tag != tag):
        return []
    summary = summarize(plan, records)
    try:
        write_png(summary, output.ladder_picture)
        return section(summary, output.ladder_picture.relative_to(output.root).as_posix())
    except PlotUnavailable as e:
        return section(summary, None, f"_No picture: {e}._")


def write_png(s: LadderSummary, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("matplotlib is not installed (pip install 'autoloop[plot]')") from None
    fig, ax = plt.subplots(figsize=(8, 5), dpi=100)
    if s.plan.retune:
        _optima(ax, s)
    else:
        _deltas(ax, s)
    ax.set_title(f"#{s.plan.change} {s.plan.description[:60]}: {s.verdict.name}")
    ax.grid(True, alpha=0.3)
    buf = io.BytesIO()
    fig.tight_layout()
    fig.savefig(buf, format="png")
    plt.close(fig)
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write(path, buf.getvalue())


def _deltas(ax: Any, s: LadderSummary) -> None:
    rows = [r for r in s.rungs if r.delta.mean is not None]

    def place(r: RungResult) -> float:   # on the fit's axis (ladder_plan.summarize)
        return r.compute if s.axis == "compute" else r.params

    for r in rows:
        err = 2 * (r.delta.se or 0.0)
        face = "white" if r.rung.held_out else "#2c5aa0"
        ax.errorbar([place(r)], [r.delta.mean], yerr=[err], fmt="o", color="#2c5aa0",
                    markerfacecolor=face, capsize=4)
    fit = [r for r in rows if not r.rung.held_out and r.delta.se is not None]
    if len(fit) >= 2:
        xs = [math.log10(place(r)) for r in fit]
        top = max(math.log10(place(r)) for r in rows)
        grid = [min(xs) + (top - min(xs)) * i / 10 for i in range(11)]
        lines = [fit_line(xs, [r.delta.mean or 0.0 for r in fit], [r.delta.se or 0.0 for r in fit], g) for g in grid]
        cs = [10 ** g for g in grid]
        ax.plot(cs, [f.pred for f in lines], color="#d95f02", label="fit (weighted)")
        ax.fill_between(cs, [f.pred_interval[0] for f in lines], [f.pred_interval[1] for f in lines],
                        color="#d95f02", alpha=0.2, label="80 % interval")
    ax.axhline(0.0, color="black", linewidth=0.8)
    ax.set_xscale("log")
    ax.set_xlabel(("compute 6·N·D" + ("" if s.measured else " (nominal)")) if s.axis == "compute" else
                  "parameters N (the compute did not grow along the rungs)")
    ax.set_ylabel("Δ (± 2 SE); hollow: held out")
    ax.legend(loc="best")


def _optima(ax: Any, s: LadderSummary) -> None:
    rows = [r for r in s.rungs if r.optimum is not None]
    for r in rows:
        o = r.optimum
        assert o is not None
        face = "white" if r.rung.held_out else "#2c5aa0"
        ax.errorbar([r.params], [2 ** o.log2_m], fmt="o", color="#2c5aa0", markerfacecolor=face,
                    yerr=[[2 ** o.log2_m - 2 ** (o.log2_m - 2 * o.se)], [2 ** (o.log2_m + 2 * o.se) - 2 ** o.log2_m]],
                    capsize=4)
    fit = [r.optimum for r in rows if not r.rung.held_out and r.optimum is not None]
    if len(fit) >= 2:
        line, _ = fit_exponent(fit)
        ns = [r.params for r in rows]
        ax.plot(ns, [10 ** line.log10_m(math.log10(n)) for n in ns], color="#d95f02",
                label=f"best multiplier ∝ N^{line.exponent:+.3f}")
        ax.legend(loc="best")
    ax.set_xscale("log")
    ax.set_yscale("log", base=2)
    ax.set_xlabel("parameters N")
    ax.set_ylabel(f"best multiplier of {', '.join(s.plan.retune)}")
