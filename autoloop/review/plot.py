"""results/progress.png: the night at a glance.

The metric of every attempt in ledger order: discarded attempts faint, kept ones
highlighted, joined by the running-best step line and labelled with their short
descriptions; attempts far worse than the kept ones sit as small triangles on the
chart's "worse" edge (one diverged run must not flatten the picture); crashes have no
metric and sit in a strip under the chart, one row per class. The legend stands to the
right of the chart, where it hides nothing.

matplotlib is an optional extra (``pip install autoloop[plot]``); without it
:class:`PlotUnavailable` says so and the report goes on without the picture.
"""

from __future__ import annotations

import io
import math
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from autoloop.store.atomic import atomic_write
from autoloop.store.ledger import LedgerRecord
from autoloop.store.queries import baseline_estimate, best_before, infer_direction, is_noise_sample, running_best

if TYPE_CHECKING:   # matplotlib is optional: imported when a picture is drawn
    from matplotlib.artist import Artist
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure
    from matplotlib.transforms import Bbox

    from autoloop.core.contributions import Estimate

WIDTH_IN, HEIGHT_IN, DPI = 12.0, 6.75, 100   # 1200 x 675 pixels
LABEL_CHARS = 34
MAX_LABELS = 10      # more labels than this stop reading at a glance: the largest changes get them

KEEP_COLOR = "#1a9850"
LABEL_COLOR = "#14532d"
DISCARD_COLOR = "#8c8c8c"
BASELINE_COLOR = "#2c5aa0"
CRASH_STYLE = {   # class -> (marker, colour)
    "trivial": ("x", "#e08214"),
    "fundamental": ("X", "#c51b1b"),
    "timeout": ("s", "#7b3294"),
}


class PlotUnavailable(Exception):
    """No picture can be drawn here; the message says why (and what to install)."""


def _short(text: str, n: int = LABEL_CHARS) -> str:
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def _finite(x: float | None) -> bool:
    return x is not None and math.isfinite(x)


def y_range(kept: list[float], others: list[float], direction: str) -> tuple[float, float]:
    """Limits showing every kept point, with room on the better side for the labels, and
    the other attempts up to one kept-range beyond the worst kept one (or better than the
    best); anything farther is drawn on the edge instead."""
    sign = 1 if direction == "min" else -1          # work in "badness": higher is worse
    k = [v * sign for v in kept]
    o = [v * sign for v in others]
    best, worst = min(k), max(k)
    spread = worst - best
    if spread <= 0:   # only the baseline: take the scale from how far the others landed
        spread = 2 * statistics.median([abs(v - worst) for v in o]) if o else 0.0
        spread = max(spread, abs(worst) * 0.002, 1e-6)
    shown = [v for v in o if best - spread <= v <= worst + spread]
    top = max([worst + 0.25 * spread, *shown])
    bottom = min([best, *shown]) - 0.32 * spread
    top += 0.04 * (top - bottom)
    return (bottom, top) if sign == 1 else (-top, -bottom)


class Point(NamedTuple):
    """An attempt on the chart: its place in ledger order, its metric (finite, or NaN for an
    attempt without one) and its record."""

    x: int
    y: float
    record: LedgerRecord


@dataclass
class Night:
    """What the chart shows, sorted once: each kind of attempt with its place on the x axis."""

    judged: list[LedgerRecord]
    kept: list[Point]          # kept, with a finite metric (the baseline, at the mean of its runs, too)
    samples: list[Point]       # noise samples: re-runs of the best, drawn as such (not kept changes)
    line: list[tuple[int, float]]   # the running best (queries.running_best) at each attempt that has one
    sigma: float | None        # the baseline's runs' spread
    others: list[Point]        # neither kept nor crashed, with a finite metric
    no_metric: list[int]       # neither crashed nor with a finite metric: drawn on the worse edge
    crashes: list[Point]
    baseline: Point | None
    changes: list[Point]       # the kept ones but the baseline
    refs: dict[int, float | None]   # id(record) -> the best in force when it was judged


def _night(records: list[LedgerRecord]) -> Night:
    # The full rung: a scout run's number (--scout) is on another scale.
    judged = [r for r in records if r.status != "skip" and r.fidelity == "full"]
    estimate = baseline_estimate(records)
    points = [Point(x, estimate.metric if estimate and r.kind == "baseline" and r.status == "keep" else
                    r.metric if r.metric is not None else math.nan, r) for x, r in enumerate(judged)]
    samples = [p for p in points if p.record.status == "keep" and is_noise_sample(p.record) and _finite(p.y)]
    kept = [p for p in points if p.record.status == "keep" and _finite(p.y) and not is_noise_sample(p.record)]
    baseline = next((p for p in kept if p.record.kind == "baseline"), kept[0] if kept else None)
    shown = dict(zip((id(r) for r in records), running_best(records), strict=True))
    line = [(p.x, value) for p in points if (value := shown[id(p.record)]) is not None]
    return Night(
        judged=judged, kept=kept, samples=samples, line=line, sigma=estimate.sigma if estimate else None,
        others=[p for p in points if p.record.status not in ("keep", "crash") and _finite(p.record.metric)],
        no_metric=[p.x for p in points if p.record.status != "crash" and not _finite(p.record.metric)],
        crashes=[p for p in points if p.record.status == "crash"],
        baseline=baseline,
        changes=[p for p in kept if baseline is None or p.record is not baseline.record],
        refs=dict(zip((id(r) for r in records), best_before(records), strict=True)))


def write_progress_png(records: list[LedgerRecord], path: Path, *, tag: str | None = None,
                       direction: str | None = None) -> Path:
    """Draw the progress chart of ``records`` (ledger order) into ``path``."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("matplotlib is not installed (pip install autoloop[plot])") from None

    direction = direction or infer_direction(records)
    night = _night(records)
    metric = records[-1].metric_name if records else "val_bpb"
    better_word = "lower" if direction == "min" else "higher"

    fig = plt.figure(figsize=(WIDTH_IN, HEIGHT_IN), dpi=DPI)
    grid = fig.add_gridspec(2, 1, height_ratios=[5.2, 1], hspace=0.08, left=0.1, right=0.8, top=0.875,
                            bottom=0.09)
    ax = fig.add_subplot(grid[0])
    strip = fig.add_subplot(grid[1], sharex=ax)

    fig.suptitle(_headline(night, metric, direction, tag), fontsize=15, fontweight="bold", x=0.1, ha="left",
                 y=0.972)
    sampled = f"{len(night.samples)} noise sample{'s' if len(night.samples) != 1 else ''}, " if night.samples else ""
    subtitle = fig.text(0.1, 0.905, f"{len(night.judged)} attempts: {len(night.changes)} kept, {sampled}"
                        f"{sum(r.status == 'discard' for r in night.judged)} discarded, {len(night.crashes)} crashed"
                        f"   ({better_word} is better)", fontsize=10.5, color="#444444", ha="left")

    handles: list[Artist] = []
    if night.kept:
        _draw_metrics(ax, night, direction, handles)
    else:
        ax.text(0.5, 0.5, "no attempt has produced a metric yet", transform=ax.transAxes, ha="center",
                va="center", fontsize=13, color="#666666")
        ax.set_yticks([])
    ax.set_ylabel(f"{metric} ({better_word} is better)", fontsize=11)
    ax.grid(True, alpha=0.25)
    ax.tick_params(labelbottom=False)
    for side in ("top", "right"):
        ax.spines[side].set_visible(False)
    _draw_crashes(strip, night.crashes, handles, len(night.judged))
    if handles:
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.015, 1.0), fontsize=9.5, frameon=False,
                  borderaxespad=0, labelspacing=0.9)

    placed = _label_kept(fig, ax, night, direction)
    if placed < len(night.changes):
        subtitle.set_text(subtitle.get_text()
                          + f"; labels on {placed} of {len(night.changes)} kept changes, the largest that fit")
    return _save(fig, Path(path))


def _save(fig: Figure, path: Path) -> Path:
    import matplotlib.pyplot as plt

    path.parent.mkdir(parents=True, exist_ok=True)
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=DPI)
    plt.close(fig)
    atomic_write(path, image.getvalue())
    return path


def _headline(night: Night, metric: str, direction: str, tag: str | None) -> str:
    """Baseline -> best, or why there is no such step yet."""
    where = f"autoloop/{tag}: " if tag else ""
    if night.baseline and night.changes:
        base_v = night.baseline.y
        best_v = night.line[-1][1] if night.line else (min if direction == "min" else max)(p.y for p in night.kept)
        delta = best_v - base_v
        pct = f", {100 * delta / base_v:+.2f}%" if base_v else ""
        return f"{where}{metric} {base_v:.4f} → {best_v:.4f} ({delta:+.4f}{pct})"
    if night.baseline:
        return f"{where}{metric} {night.baseline.y:.4f}: no change has beaten the baseline yet"
    return f"{where}{metric}: no attempt has produced one yet"


def _draw_metrics(ax: Axes, night: Night, direction: str, handles: list[Artist]) -> None:
    """The other attempts, the running best through the kept points, the kept points and the baseline."""
    from matplotlib.lines import Line2D

    y0, y1 = y_range([p.y for p in night.kept], [p.y for p in night.others + night.samples], direction)
    ax.set_ylim(y0, y1)
    _draw_others(ax, night, direction, (y0, y1), handles)

    # Running best: the best the night held after each attempt (a noise sample re-measures
    # the best, it does not step it: queries.running_best), on to the last attempt.
    if night.line:
        step_x = [x for x, _ in night.line] + [len(night.judged) - 1]
        step_y = [y for _, y in night.line] + [night.line[-1][1]]
        ax.step(step_x, step_y, where="post", color=KEEP_COLOR, lw=2.0, alpha=0.9, zorder=3)
        handles.append(Line2D([], [], color=KEEP_COLOR, lw=2, label="running best"))
    if night.samples:
        ax.scatter([p.x for p in night.samples], [p.y for p in night.samples], s=40, facecolors="none",
                   edgecolors=BASELINE_COLOR, linewidths=1.3, zorder=4)
        handles.append(Line2D([], [], marker="o", ls="", markerfacecolor="none", color=BASELINE_COLOR,
                              markersize=7, label=f"noise sample ({len(night.samples)})"))
    if night.changes:
        ax.scatter([p.x for p in night.changes], [p.y for p in night.changes], s=70, color=KEEP_COLOR,
                   edgecolors="white", linewidths=1.2, zorder=4)
        handles.append(Line2D([], [], marker="o", ls="", color=KEEP_COLOR, markersize=8, label="kept"))
    bx, by, _ = night.baseline or night.kept[0]   # kept is not empty: the baseline is its own or its first
    ax.scatter([bx], [by], s=110, marker="D", color=BASELINE_COLOR, edgecolors="white", linewidths=1.2, zorder=5)
    handles.append(Line2D([], [], marker="D", ls="", color=BASELINE_COLOR, markersize=8, label="baseline"))
    spread = f" ± {night.sigma:.4f}" if night.sigma is not None else ""
    ax.annotate(f"baseline {by:.4f}{spread}", (bx, by), xytext=(8, 8 if direction == "min" else -8),
                textcoords="offset points", fontsize=9, color=BASELINE_COLOR, zorder=6,
                va="bottom" if direction == "min" else "top")


def _draw_others(ax: Axes, night: Night, direction: str, limits: tuple[float, float],
                 handles: list[Artist]) -> None:
    """Other attempts: faint dots in range, triangles on the edge beyond it."""
    from matplotlib.lines import Line2D

    y0, y1 = limits
    inside = [(p.x, p.y) for p in night.others if y0 <= p.y <= y1]
    above = [p.x for p in night.others if p.y > y1] + (night.no_metric if direction == "min" else [])
    below = [p.x for p in night.others if p.y < y0] + (night.no_metric if direction == "max" else [])
    if inside:
        ax.scatter([x for x, _ in inside], [y for _, y in inside], s=30, color=DISCARD_COLOR, alpha=0.55,
                   linewidths=0, zorder=2)
        handles.append(Line2D([], [], marker="o", ls="", color=DISCARD_COLOR, alpha=0.6, label="discarded"))
    pad = 0.02 * (y1 - y0)
    for xs_edge, y, marker in ((above, y1 - pad, "^"), (below, y0 + pad, "v")):
        if xs_edge:
            ax.scatter(xs_edge, [y] * len(xs_edge), marker=marker, s=34, color=DISCARD_COLOR, alpha=0.75,
                       linewidths=0, zorder=2, clip_on=False)
    if above or below:
        handles.append(Line2D([], [], marker="^" if above else "v", ls="", color=DISCARD_COLOR,
                              label=f"discarded, off the scale ({len(above) + len(below)})"))


def _draw_crashes(strip: Axes, crashes: list[Point], handles: list[Artist], attempts: int) -> None:
    """The crash strip under the chart: one row per class that occurred; the x axis of both."""
    from matplotlib.lines import Line2D
    from matplotlib.ticker import MaxNLocator

    classes = [c for c in CRASH_STYLE if any(p.record.crash == c for p in crashes)]
    classes += sorted({p.record.crash or "fundamental" for p in crashes} - set(classes))
    for row, cls in enumerate(classes):
        marker, color = CRASH_STYLE.get(cls, ("o", "#555555"))
        pts = [p.x for p in crashes if (p.record.crash or "fundamental") == cls]
        width = 2 if marker == "x" else 0.8
        strip.scatter(pts, [row] * len(pts), marker=marker, s=55, color=color, linewidths=width, zorder=3)
        handles.append(Line2D([], [], marker=marker, ls="", color=color, markersize=8, markeredgewidth=width,
                              label=f"crash: {cls} ({len(pts)})"))
    if classes:
        strip.set_yticks(range(len(classes)))
        strip.set_yticklabels(classes, fontsize=9)
        strip.set_ylim(-0.7, len(classes) - 0.3)
    else:
        strip.set_yticks([])
        strip.text(0.5, 0.5, "no crashes", transform=strip.transAxes, ha="center", va="center", fontsize=10,
                   color="#666666")
    strip.set_ylabel("crashes", fontsize=10)
    strip.grid(True, axis="x", alpha=0.25)
    for side in ("top", "right"):
        strip.spines[side].set_visible(False)
    strip.set_xlabel("attempt (ledger order)", fontsize=11)
    strip.xaxis.set_major_locator(MaxNLocator(integer=True))
    if attempts:
        strip.set_xlim(-0.8, attempts - 1 + max(0.8, 0.02 * attempts))


def _label_kept(fig: Figure, ax: Axes, night: Night, direction: str) -> int:
    """Label kept points with their short description and delta, largest change first,
    each at the first of a few spots around its point (the better side of the
    running-best line first: nothing else is drawn there) that stays inside the chart and
    clear of the kept points and the labels already placed, and, if such a spot exists,
    of the discarded points too. A change with no clear spot goes unlabelled (its dot is
    still there). Returns how many were labelled."""
    if not night.changes:
        return 0
    spots = _Spots(fig, ax, night)
    better = -1 if direction == "min" else 1
    offsets = [(dx, better * dy) for dy in (8, 21, 34) for dx in (5, -5)] + [(dx, -better * 8) for dx in (-5, 5)]

    def size(p: Point) -> float:
        ref = night.refs.get(id(p.record))
        return abs(p.y - ref) if ref is not None else 0.0

    placed = 0
    for p in sorted(night.changes, key=size, reverse=True):
        if placed >= MAX_LABELS:
            break
        ref = night.refs.get(id(p.record))
        text = _short(p.record.description) + (f" ({p.y - ref:+.4f})" if ref is not None else "")
        if any(spots.place(text, p, dx, dy, strict) for strict in (True, False) for dx, dy in offsets):
            placed += 1
    return placed


class _Spots:
    """Where a label may go on the chart: inside it, clear of what is already there."""

    def __init__(self, fig: Figure, ax: Axes, night: Night) -> None:
        self.ax = ax
        # Agg's canvas (matplotlib.use above) has get_renderer; FigureCanvasBase does not declare it.
        self.renderer = fig.canvas.get_renderer()  # type: ignore[attr-defined]  # see the line above
        self.frame = ax.get_window_extent(self.renderer)
        self.taken = [t.get_window_extent(self.renderer) for t in ax.texts]   # the baseline's label
        self.points = {id(p.record): ax.transData.transform((p.x, p.y)) for p in night.changes}
        self.faint = [ax.transData.transform((p.x, p.y)) for p in night.others]

    def place(self, text: str, p: Point, dx: int, dy: int, strict: bool) -> bool:
        """Draw the label at (dx, dy) points from ``p`` if that spot is clear; else draw nothing."""
        from matplotlib.text import Text

        note = self.ax.annotate(text, (p.x, p.y), xytext=(dx, dy), textcoords="offset points", fontsize=8.5,
                                color=LABEL_COLOR, ha="left" if dx > 0 else "right",
                                va="bottom" if dy > 0 else "top", zorder=6, annotation_clip=False,
                                bbox=dict(boxstyle="round,pad=0.12", fc="white", ec="none", alpha=0.8),
                                arrowprops=dict(arrowstyle="-", color=KEEP_COLOR, lw=0.8, alpha=0.7,
                                                shrinkA=0, shrinkB=4))
        # The text's own box (Annotation's extent includes the leader line to the point).
        note.update_positions(self.renderer)
        box = Text.get_window_extent(note, self.renderer).padded(2)
        if self._clear(box, id(p.record), strict):
            self.taken.append(box)
            return True
        note.remove()
        return False

    def _clear(self, box: Bbox, own: int, strict: bool) -> bool:
        frame = self.frame
        if not (box.x0 >= frame.x0 + 2 and box.x1 <= frame.x1 - 2 and box.y0 >= frame.y0 + 2
                and box.y1 <= frame.y1 - 2):
            return False
        if any(box.overlaps(t) for t in self.taken):
            return False
        if any(_covers(box, px, py, 5) for key, (px, py) in self.points.items() if key != own):
            return False
        return not strict or not any(_covers(box, px, py, 2) for px, py in self.faint)


def _covers(box: Bbox, px: float, py: float, margin: float) -> bool:
    return bool(box.x0 - margin <= px <= box.x1 + margin and box.y0 - margin <= py <= box.y1 + margin)


# ------------------------------------------------------------------------------ autoloop verify: contributions


def write_contributions_png(rows: Sequence[tuple[str, Estimate | None, Estimate | None]], path: Path, *,
                            metric: str = "val_bpb", title: str = "") -> Path:
    """results/verify/contributions.png: one horizontal bar per kept change (and the total
    gain), its length the contribution (``contributions.Estimate``: mean, half-width), its
    whisker the 95 % interval; a second, hatched bar for the same at the larger scale.
    ``rows``: (label, estimate at the night's scale or None, estimate at scale or None).
    Positive is better whatever the metric's direction; zero is drawn: a whisker across it
    is a change within noise."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("matplotlib is not installed (pip install autoloop[plot])") from None
    shown = [(label, small, scale) for label, small, scale in rows
             if getattr(small, "mean", None) is not None or getattr(scale, "mean", None) is not None]
    if not shown:
        raise PlotUnavailable("no contribution has been measured yet")
    height = max(2.5, 0.55 * len(shown) + 1.4)
    fig, ax = plt.subplots(figsize=(WIDTH_IN * 0.8, height), dpi=DPI)
    any_scale = any(getattr(scale, "mean", None) is not None for _, _, scale in shown)
    bar = 0.38 if any_scale else 0.6
    for i, (_label, small, scale) in enumerate(shown):
        y = len(shown) - 1 - i
        styles: tuple[dict[str, Any], dict[str, Any]] = (
            {"color": KEEP_COLOR}, {"color": "white", "edgecolor": BASELINE_COLOR, "hatch": "//"})
        for est, offset, style in ((small, bar / 2 if any_scale else 0.0, styles[0]), (scale, -bar / 2, styles[1])):
            if est is None or est.mean is None:
                continue
            err = [[est.half], [est.half]] if est.half is not None else None
            ax.barh(y + offset, est.mean, height=bar, xerr=err, capsize=4, error_kw={"ecolor": "#333333"}, **style)
    ax.axvline(0.0, color="#333333", linewidth=1.0)
    ax.set_yticks(range(len(shown)), [_short(label, 48) for label, _, _ in reversed(shown)])
    ax.set_xlabel(f"contribution: how much better {metric} is with it (95% interval, paired by seed)")
    if any_scale:
        from matplotlib.patches import Patch

        ax.legend(handles=[Patch(color=KEEP_COLOR, label="the night's scale"),
                           Patch(facecolor="white", edgecolor=BASELINE_COLOR, hatch="//", label="at scale")],
                  loc="upper left", bbox_to_anchor=(1.01, 1.0), frameon=False)   # beside: it hides no bar
    if title:
        ax.set_title(title, fontsize=11)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, format="png", dpi=DPI)
    plt.close(fig)
    atomic_write(path, image.getvalue())
    return path


def write_study_png(nights: list[dict[str, Any]], path: Path, *, metric: str = "val_bpb") -> Path:
    """The running best of the study across its comparable nights (history.py's rows), with
    each night's own best as a point."""
    try:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt
    except ImportError:
        raise PlotUnavailable("matplotlib is not installed (pip install autoloop[plot])") from None
    shown = [n for n in nights if n["comparable"] and n["best"] is not None]
    fig, ax = plt.subplots(figsize=(8, 3.2), dpi=110)
    xs = list(range(len(shown)))
    ax.step(xs, [n["running_best"] for n in shown], where="post", color="#1a9850", label="study best")
    ax.scatter(xs, [n["best"] for n in shown], color="#2c5aa0", zorder=3, label="the night's best")
    ax.set_xticks(xs, [_short(n["tag"], 16) for n in shown])
    ax.set_ylabel(metric)
    ax.set_title("The study across nights (comparable nights only)")
    ax.legend(loc="best", fontsize=8)
    fig.tight_layout()
    return _save(fig, path)
