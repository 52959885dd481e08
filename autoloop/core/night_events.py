"""The night's events that reach people while nobody watches: their kinds, the payload's
schema, a proposer failure's cause, and agent text made safe to show.

A notification (``observe/notify.py``) and a hook (``observe/hooks.py``) carry the same
event: a JSON object ``{"schema": "autoloop.event", "version": 1, "kind": ..., "tag": ...,
"time": ..., "title": ..., "text": ..., "data": {...}}`` whose JSON Schema ships as
``review/schemas/event.schema.json`` (a field is only ever added within a version, as for
``attempts --json``). Pure: no files, no processes.
"""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from typing import Any

EVENT_SCHEMA = "autoloop.event"
EVENT_VERSION = 1

# Every kind, in the order docs/watching.md lists them.
EVENT_KINDS = ("new_best", "crash_streak", "proposer_failures", "stopped_by_error", "low_disk", "night_end")
# Said once a night at most, so never held back by the rate limit.
ALWAYS_SENT = frozenset({"stopped_by_error", "low_disk", "night_end"})
# How many in a row make a streak: one crash is the cost of exploring, three in a row of the
# same night mean every trial is failing the same way (a broken data path, a dead agent).
STREAK = 3
MAX_SHOWN = 300   # characters of agent text in an event (a description, a skip's reason)

# A proposer failure's cause, from its skip reason: the agent's own words as agent.py quotes
# them (presets.py's fatal lines, a CLI's exit line). First match wins.
_CAUSES = (
    ("missing binary", re.compile(r"could not start|command not found|not found: |no such file", re.I)),
    ("auth", re.compile(r"not logged in|api key|authenticat|\b401\b|unauthori[sz]ed|auth method|log ?in\b", re.I)),
    ("quota", re.compile(r"quota|rate.?limit|\b429\b|usage limit|credit|billing|insufficient|overloaded", re.I)),
    ("timeout", re.compile(r"timed out|stall", re.I)),
)
# Mentions that would page a whole Slack or Discord channel, written by an agent.
_MENTIONS = re.compile(r"@(everyone|here|channel)|<!(everyone|here|channel)>", re.I)
_CONTROL = re.compile(r"[\x00-\x1f\x7f-\x9f\u200b-\u200f\u2028-\u202e\u2066-\u2069]")


@dataclass
class NightEvent:
    kind: str
    tag: str
    title: str                      # one line, safe to show
    text: str                       # a few lines, safe to show
    data: dict[str, Any] = field(default_factory=dict)
    time: float = field(default_factory=time.time)

    def payload(self) -> dict[str, Any]:
        """The event as a hook's stdin and a webhook's body see it (event.schema.json)."""
        return {"schema": EVENT_SCHEMA, "version": EVENT_VERSION, "kind": self.kind, "tag": self.tag,
                "time": round(self.time, 3), "title": self.title, "text": self.text, "data": self.data}


def safe_text(text: object, limit: int = MAX_SHOWN) -> str:
    """Untrusted text (an agent's description or error) as one plain line: no control or
    direction characters, no channel-wide mentions, at most ``limit`` characters."""
    one = " ".join(_CONTROL.sub(" ", str(text)).split())
    one = _MENTIONS.sub(lambda m: m.group(0).replace("@", "@\u2060").replace("<!", "<\u2060!"), one)
    return one if len(one) <= limit else one[:limit - 1] + "…"


def failure_cause(reason: str | None) -> str:
    """auth, quota, missing binary, timeout or other: why a proposer failed, from its reason."""
    for cause, pattern in _CAUSES:
        if reason and pattern.search(reason):
            return cause
    return "other"
