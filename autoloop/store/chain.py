"""The ledger's hash chain: a record that autoloop did not write, or that was edited, shows.

Each line autoloop appends ends with ``"chain":"<hex>"``, the last key of its JSON object:
``sha256(<the chain of the record before> "\\n" <the line's bytes without that key>)``. The
bytes are hashed as written, so a later version of the record's model (a new field with a
default) never changes what is checked. The first chained record links to the line before
it, an older autoloop's record without the field (its sha256), or to "" when it is the
first line: a ledger from before the chain loads as it always did, and the chain starts
where the field starts.

:func:`verify` walks the lines and returns a :class:`Break` for each that does not fit:

* a line without the field once the chain has started (appended by hand or by an agent);
* a line whose chain does not match its bytes and the chain before it (edited; or forged);
* a line the next record's chain skips (a complete, well-chained line appended by someone
  who recomputed the chain: the orchestrator chains its next record to the last one *it*
  wrote, which it holds in memory, so what was slipped in between is left out of the chain);
* a copy of a line.

A forger who reads this module and recomputes the chain *after* the night's last record is
not caught by the chain alone (it is not a signature: whatever could hold a key runs as the
same person); while a night runs, the next append catches it (above).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Sequence
from dataclasses import dataclass

FIELD = "chain"
_TAIL = re.compile(rb',"chain":"([0-9a-f]{64})"\}$')
LOOKBACK = 64   # how far back a record's link is looked for: appends slipped in between


@dataclass(frozen=True)
class Break:
    """One line that is not autoloop's as written: its 1-based number and why, one line."""

    lineno: int
    why: str

    def describe(self, name: str = "ledger.jsonl") -> str:
        return f"{name} line {self.lineno}: {self.why}"


def link(prev: str, body: bytes) -> str:
    return hashlib.sha256(prev.encode("ascii") + b"\n" + body).hexdigest()


def start(previous_line: bytes | None) -> str:
    """What the first chained record links to: the line before it (unchained), or nothing."""
    return "" if previous_line is None else hashlib.sha256(previous_line.rstrip(b"\r\n")).hexdigest()


def seal(prev: str, body_json: str) -> str:
    """The line to append: a record's JSON object (no chain key) with its chain as last key."""
    body = body_json.rstrip()
    if not body.endswith("}"):
        raise ValueError("a ledger record must be a JSON object")
    return body[:-1] + f',"{FIELD}":"{link(prev, body.encode("utf-8"))}"}}'


def split(line: bytes) -> tuple[bytes, str | None]:
    """(the line's bytes without its chain key, the chain) or (line, None) when it has none."""
    line = line.rstrip(b"\r\n")
    m = _TAIL.search(line)
    if m is None:
        return line, None
    return line[:m.start()] + b"}", m.group(1).decode("ascii")


@dataclass
class Walk:
    """What :func:`verify` found: the breaks, and the chain the next record links to."""

    breaks: list[Break]
    head: str
    chained: bool    # the chain has started (a record without it from now on is foreign)


class Chain:
    """The walk over a ledger's lines, fed one at a time (an append reads only what is new)."""

    def __init__(self) -> None:
        self.breaks: dict[int, str] = {}
        self.links: list[tuple[str, int | None]] = []   # (chain, line) of the last chained lines
        self.previous: bytes | None = None                # the last line before the chain started

    @property
    def head(self) -> str:
        return self.links[-1][0] if self.links else start(self.previous)

    def walk(self) -> Walk:
        return Walk([Break(n, why) for n, why in sorted(self.breaks.items())], self.head, bool(self.links))

    def feed(self, lineno: int, raw: bytes) -> None:
        body, chain = split(raw)
        if chain is None:
            if self.links:
                self.breaks[lineno] = "a record without the ledger's chain: not written by autoloop"
            else:
                self.previous = raw
            return
        links = self.links
        if not links:
            links.append((start(self.previous), None))
        if chain == links[-1][0]:
            self.breaks[lineno] = f"a copy of line {links[-1][1]}"
            return
        found = next((j for j in range(len(links) - 1, -1, -1) if link(links[j][0], body) == chain), None)
        if found is None:
            self.breaks[lineno] = "its chain does not match: edited after autoloop wrote it, or not written by autoloop"
        else:
            for _, skipped in links[found + 1:]:
                if skipped is not None and skipped not in self.breaks:
                    self.breaks[skipped] = "left out of the chain by the record after it: not written by autoloop"
            del links[found + 1:]
        links.append((chain, lineno))
        del links[:-LOOKBACK]


def verify(lines: Sequence[tuple[int, bytes]]) -> Walk:
    """Check the chain over (line number, bytes) of the ledger's non-blank lines, in order."""
    walk = Chain()
    for lineno, raw in lines:
        walk.feed(lineno, raw)
    return walk.walk()
