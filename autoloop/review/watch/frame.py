"""One frame of `autoloop watch`: the night's summary, the attempts in flight with their
progress, the running best as a small block-character plot, and the last attempts.

Everything shown comes from :class:`WorkspaceViews` (the dashboard's views: the ledger and
the state files, read-only). Descriptions, reasons and progress lines are agents' text:
they go into rich ``Text`` objects (never parsed as markup) after :func:`clean` removed
the control characters that could move the cursor, clear the screen or reorder the line.
"""

from __future__ import annotations

import math
import time
import unicodedata
from typing import Any

from rich.cells import cell_len
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from autoloop.observe.console import whole_seconds
from autoloop.review.dashboard.views import WorkspaceViews

BLOCKS = " ▁▂▃▄▅▆▇█"
CURVE_HEIGHT = 4
BAR_WIDTH = 12
STATUS_STYLE = {"keep": "bold green", "discard": "yellow", "crash": "bold red", "skip": "dim", "ended": "magenta",
                "baseline": "cyan"}
# Bidirectional overrides and isolates: text that reads differently from what it holds.
_BIDI = {chr(c) for c in (*range(0x202A, 0x202F), *range(0x2066, 0x206A), 0x200E, 0x200F, 0x061C)}


def clean(text: object, limit: int = 300) -> str:
    """Untrusted text as one printable line: whitespace controls become spaces, every other
    control character (escape sequences' ESC included) and bidi control is dropped."""
    if text is None:
        return ""
    out = []
    for ch in str(text)[: limit * 2]:
        if ch in "\t\n\r\v\f":
            out.append(" ")
        elif unicodedata.category(ch) == "Cc" or ch in _BIDI:
            continue
        else:
            out.append(ch)
    line = "".join(out).strip()
    return line if len(line) <= limit else line[: limit - 1] + "…"


def frame(views: WorkspaceViews, last: int = 10, width: int = 100, height: int | None = None,
          now: float | None = None) -> RenderableType:
    """The whole screen, top to bottom; with ``height``, the last attempts listed are as
    many as fit under the rest (at least one)."""
    now = time.time() if now is None else now
    summary = views.summary()
    rows = views.attempts()["rows"]
    live = views.live()
    header = _header(summary)
    if height is not None:
        wrapped = sum(max(1, math.ceil(cell_len(line) / max(1, width))) for line in header.plain.split("\n"))
        above = wrapped + 1 + (2 + len(live["attempts"]) if live["attempts"] else 1) + bool(live["prepared"])
        last = min(last, max(1, height - above - (2 + CURVE_HEIGHT) - 3))
    values = [r["best_metric"] for r in rows if _finite(r["best_metric"]) and r["kind"] != "verify"]
    parts: list[RenderableType] = [header, Text(""), _in_flight(live, now)]
    if live["prepared"]:
        parts.append(Text("prepared, waiting: " + ", ".join(f"#{n}" for n in live["prepared"]), style="dim"))
    parts += [Text(""), Text(f"running best {clean(summary['metric_name'])}, attempt by attempt", style="bold")]
    parts += curve_lines(values, width - 14)
    parts += [Text(""), _attempts(rows[-last:] if last > 0 else [])]
    return Group(*parts)


def _finite(value: object) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def _number(value: object, spec: str = ".6f") -> str:
    return format(value, spec) if _finite(value) else "-"


def _header(s: dict[str, Any]) -> Text:
    text = Text("autoloop watch", style="bold")
    text.append(f"  night {clean(s['tag'] or '-')}  ")
    if s["running"]:
        text.append(f"running ({clean(s['phase'])})", style="green")
    elif s["phase"] == "stopped":
        text.append("stopped" + (f": {clean(s['stop_reason'])}" if s["stop_reason"] else ""), style="yellow")
    else:
        text.append("not running", style="yellow")
    text.append(f"  {s['attempts']} attempts, {s['trials']} trials")
    if s["trials_per_hour"] is not None:
        text.append(f", {s['trials_per_hour']}/h")
    if s["time_left_s"] is not None:
        text.append(f", {whole_seconds(s['time_left_s'])} left")
    text.append("   q quits\n", style="dim")
    best = s["best"]
    text.append(f"best {s['metric_name']} ")
    text.append(_number(best["metric"]), style="bold green")
    if best["trial"] is not None:
        text.append(f" (#{best['trial']}: ")
        text.append(clean(best["description"], 80))
        text.append(")")
    text.append(f"  baseline {_number(s['baseline']['metric'])}")
    if _finite(s["improvement"]):
        text.append(f"  improvement {s['improvement']:+.6f}")
    if _finite(s["noise"]):
        text.append(f"  noise ±{s['noise']:.6f}")
    return text


def _bar(percent: Any) -> Text:
    if not _finite(percent):
        return Text("-")
    share = min(1.0, max(0.0, percent / 100))
    full = round(share * BAR_WIDTH)
    return Text("█" * full, style="green") + Text("░" * (BAR_WIDTH - full), style="dim") + Text(f" {percent:.0f}%")


def _in_flight(live: dict[str, Any], now: float) -> RenderableType:
    if not live["attempts"]:
        return Text("nothing in flight", style="dim")
    table = Table(title="in flight", title_justify="left", expand=True, box=None, header_style="bold")
    for name, kwargs in (("worker", {}), ("#", {}), ("kind", {}), ("phase", {}), ("progress", {}),
                         ("loss", {"justify": "right"}), ("time", {"justify": "right"}),
                         ("description", {"ratio": 1, "no_wrap": True, "overflow": "ellipsis"})):
        table.add_column(name, **kwargs)
    for a in live["attempts"]:
        started = a["attempt_started_at"]
        table.add_row(clean(a["worker"] or "-"), f"#{a['label']}", clean(a["kind"]), clean(a["phase"]),
                      _bar(a.get("percent")), _number(a.get("loss"), ".4f"),
                      whole_seconds(now - started) if _finite(started) else "-",
                      _what(a))
    return table


def _what(attempt: dict[str, Any]) -> Text:
    """The description; while there is none yet (proposing), who is proposing."""
    if attempt["description"]:
        return Text(clean(attempt["description"]))
    return Text(f"({clean(attempt['proposer'])} at work)" if attempt["proposer"] else "", style="dim")


def curve_lines(values: list[float], width: int, height: int = CURVE_HEIGHT) -> list[Text]:
    """The values as an area plot ``height`` lines tall in eighth blocks, one column per
    value (stretched to up to 4 columns each when few, the last of each bucket when many),
    the highest and lowest value labelled on the left."""
    if not values:
        return [Text("(no result yet)", style="dim")]
    width = max(8, width)
    if len(values) > width:
        values = [values[min(len(values) - 1, (i + 1) * len(values) // width - 1)] for i in range(width)]
    else:
        values = [v for v in values for _ in range(max(1, min(4, width // len(values))))]
    lo, hi = min(values), max(values)
    span = (hi - lo) or 1.0
    levels = [1 + round((v - lo) / span * (height * 8 - 1)) for v in values]
    lines = []
    for row in range(height):
        base = (height - 1 - row) * 8
        label = _number(hi, ".6f") if row == 0 else _number(lo, ".6f") if row == height - 1 else ""
        cells = "".join(BLOCKS[min(8, max(0, level - base))] for level in levels)
        lines.append(Text(f"{label:>11} ┤", style="dim") + Text(cells, style="cyan"))
    return lines


def _attempts(rows: list[dict[str, Any]]) -> RenderableType:
    if not rows:
        return Text("no attempts recorded yet", style="dim")
    title = f"last {len(rows)} attempt" + "s" * (len(rows) != 1)
    table = Table(title=title, title_justify="left", expand=True, box=None, header_style="bold")
    for name, kwargs in (("#", {}), ("status", {}), ("metric", {"justify": "right"}), ("Δ", {"justify": "right"}),
                         ("conf", {"justify": "right"}), ("worker", {}), ("time", {"justify": "right"}),
                         ("description", {"ratio": 1, "no_wrap": True, "overflow": "ellipsis"})):
        table.add_column(name, **kwargs)
    for r in rows:
        status = "baseline" if r["kind"] == "baseline" else r["status"]
        shown = status + (f" ({r['crash']})" if r["crash"] else "")
        text = Text(clean(r["description"]))
        if r["status"] in ("crash", "skip", "ended") and r["reason"]:
            text.append(" — " + clean(r["reason"]), style="dim")
        table.add_row(f"#{r['label']}", Text(clean(shown), style=STATUS_STYLE.get(status, "")),
                      _number(r["metric"]), _number(r["delta"], "+.6f"),
                      f"{r['confidence']:.1f}σ" if _finite(r["confidence"]) else "-",
                      f"w{r['worker']}" if r["worker"] is not None else "-", whole_seconds(r["seconds"]),
                      text)
    return table
