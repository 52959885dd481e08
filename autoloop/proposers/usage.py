"""What an agent call cost, as its CLI reported it: read from the call's own output.

Only what the CLI itself prints is recorded; nothing is estimated from prices or prompt
sizes. The formats (checked against the installed CLIs, presets.py's versions):

* Claude Code ``-p --output-format json``: one JSON object at the end,
  ``{"type": "result", ..., "total_cost_usd": 0.0123, "usage": {"input_tokens": ...,
  "cache_creation_input_tokens": ..., "cache_read_input_tokens": ..., "output_tokens": ...}}``
  (``--output-format stream-json`` ends with the same object on a line of its own);
* Codex CLI ``exec --json``: JSON lines, one ``{"type": "turn.completed", "usage":
  {"input_tokens": ..., "cached_input_tokens": ..., "output_tokens": ...}}`` per turn:
  tokens, no cost;
* Aider: ``Tokens: 2.3k sent, 120 received. Cost: $0.01 message, $0.02 session.``:
  the last such line's session cost and the sums of the tokens.

Gemini CLI's text output reports nothing. :func:`read_usage` returns None when the output
carries no report: the loop then says so once, and ``--max-agent-cost`` cannot count it.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from typing import Any, overload

_AIDER = re.compile(r"^Tokens: ([\d.]+[kKmM]?) sent(?:, ([\d.]+[kKmM]?) cache \w+)*, ([\d.]+[kKmM]?) received\."
                    r"(?: Cost: \$([\d.]+) message, \$([\d.]+) session\.)?")


@dataclass(frozen=True)
class Usage:
    """One call's usage; None where the CLI did not say."""

    cost_usd: float | None
    input_tokens: int | None
    output_tokens: int | None
    cached_tokens: int | None    # input read from (or written to) the provider's prompt cache
    reported_by: str             # "claude json result", "codex turn.completed", "aider tokens line"

    def as_extra(self) -> dict[str, Any]:
        return {k: v for k, v in asdict(self).items() if v is not None}


def read_usage(output: str) -> Usage | None:
    """The usage the output of one agent call reports, or None."""
    return _claude(output) or _codex(output) or _aider(output)


def _json_lines(output: str) -> Iterator[dict[str, Any]]:
    for line in output.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            if isinstance(value, dict):
                yield value


def _claude(output: str) -> Usage | None:
    result = None
    for event in _json_lines(output):
        if event.get("type") == "result" and ("total_cost_usd" in event or "usage" in event):
            result = event   # the last one: a stream ends with it
    if result is None:
        return None
    usage = result.get("usage")
    usage = usage if isinstance(usage, dict) else {}
    cached = _int(usage.get("cache_read_input_tokens"), 0) + _int(usage.get("cache_creation_input_tokens"), 0)
    return Usage(_float(result.get("total_cost_usd")), _int(usage.get("input_tokens")),
                 _int(usage.get("output_tokens")), cached if usage else None, "claude json result")


def _codex(output: str) -> Usage | None:
    turns = [e["usage"] for e in _json_lines(output) if e.get("type") == "turn.completed"
             and isinstance(e.get("usage"), dict)]
    if not turns:
        return None
    return Usage(None, sum(_int(t.get("input_tokens"), 0) for t in turns),
                 sum(_int(t.get("output_tokens"), 0) for t in turns),
                 sum(_int(t.get("cached_input_tokens"), 0) for t in turns), "codex turn.completed")


def _aider(output: str) -> Usage | None:
    found = [m for m in (_AIDER.match(line.strip()) for line in output.splitlines()) if m]
    if not found:
        return None
    session = next((m.group(5) for m in reversed(found) if m.group(5)), None)
    return Usage(_float(session), sum(_count(m.group(1)) for m in found), sum(_count(m.group(3)) for m in found),
                 None, "aider tokens line")


def _count(text: str) -> int:
    scale = {"k": 1e3, "m": 1e6}.get(text[-1].lower(), 1)
    return round(float(text.rstrip("kKmM")) * scale)


@overload
def _int(value: object, default: int) -> int: ...
@overload
def _int(value: object, default: None = None) -> int | None: ...
def _int(value: object, default: int | None = None) -> int | None:
    return int(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else default


def _float(value: Any) -> float | None:   # float() raises on what it cannot read
    try:
        return float(value) if value is not None and not isinstance(value, bool) else None
    except (TypeError, ValueError):
        return None
