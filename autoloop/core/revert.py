"""Taking a kept change out of a text, or putting it onto another: one rule for both.

A kept change is an edit of the target, from its parent's text to its commit's. Taking it
out of the best is that edit run backwards onto the best; replaying it onto another text
(finalize, when an earlier change was left out) is the edit run forwards. Both are a
three-way merge (:func:`merge3`) that conflicts only where the two sides change the *same*
lines: no context lines, so two constants on consecutive lines (train.py keeps one per
line) come out one at a time. Where the lines do conflict but all three texts differ only
in the values of their UPPER_CASE constants (``module_constants``), the merge is by
constant instead: two constants set on one line still come apart.

:func:`plan_takeouts` says how each of a night's kept changes comes out of the best: alone,
together with the later changes that truly rewrote its lines (found edit by edit, not the
whole run after it), or not at all.
"""

from __future__ import annotations

import difflib
import functools
import re
from dataclasses import dataclass

from autoloop.core import module_constants

# A change of base's lines [i1, i2) into new lines; i1 == i2 is an insertion at i1.
Hunk = tuple[int, int, tuple[str, ...]]


@dataclass(frozen=True)
class Edit:
    """One kept change of the target: its parent's text and its commit's."""

    parent: str
    commit: str


@dataclass(frozen=True)
class Takeout:
    """Kept changes (indexes into the edits, in order) taken out of the best together, and
    the best's text without them; None when they do not come out."""

    members: tuple[int, ...]
    text: str | None


# ------------------------------------------------------------------------------ the merge


def merge3(base: str, ours: str, theirs: str) -> str | None:
    """``ours`` with the edit from ``base`` to ``theirs`` applied; None on a conflict (both
    sides change the same lines, or the same constant, differently)."""
    merged = _merge_lines(base, ours, theirs)
    if merged is not None:
        return merged   # where the lines come apart, the constants do too, alike
    return _merge_constants(base, ours, theirs)


def _merge_lines(base: str, ours: str, theirs: str) -> str | None:
    old = base.splitlines(keepends=True)
    hunks = set(_hunks(old, ours.splitlines(keepends=True)))
    other = set(_hunks(old, theirs.splitlines(keepends=True)))
    for a in hunks - other:
        if any(_clash(a, b) for b in other - hunks):
            return None
    out: list[str] = []
    at = 0
    # Insertions sort before a replacement that starts at the same line; neither side's own
    # hunks overlap, and the other side's were just shown not to touch them.
    for i1, i2, new in sorted(hunks | other):
        out += old[at:i1]
        out += new
        at = i2
    return "".join(out + old[at:])


def _hunks(old: list[str], new: list[str]) -> list[Hunk]:
    """The edit from old to new; a block of lines replaced by as many is one hunk per line
    (two constants set on consecutive lines are two edits, each its own)."""
    # The common head and tail are left out of the matcher: a kept change touches a few
    # lines of a long file, and this runs many times per verification.
    head = 0
    while head < min(len(old), len(new)) and old[head] == new[head]:
        head += 1
    tail = 0
    while tail < min(len(old), len(new)) - head and old[-1 - tail] == new[-1 - tail]:
        tail += 1
    a, b = old[head:len(old) - tail], new[head:len(new) - tail]
    hunks: list[Hunk] = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, a, b, autojunk=False).get_opcodes():
        if tag == "replace" and i2 - i1 == j2 - j1:
            hunks += [(head + i, head + i + 1, (b[j1 + i - i1],)) for i in range(i1, i2)]
        elif tag != "equal":
            hunks.append((head + i1, head + i2, tuple(b[j1:j2])))
    return hunks


def _clash(a: Hunk, b: Hunk) -> bool:
    """Two different hunks on the same base lines (next to each other is no clash)."""
    (a1, a2, _), (b1, b2, _) = a, b
    if a1 == a2 and b1 == b2:
        return a1 == b1            # two insertions at one place: which goes first is unknown
    if a1 == a2:
        return b1 < a1 < b2        # an insertion inside the other's lines
    if b1 == b2:
        return a1 < b1 < a2
    return a1 < b2 and b1 < a2


# ------------------------------------------------------------------------------ by constant

_LINE_BREAK = re.compile(r"\r\n|\r|\n")


def _merge_constants(base: str, ours: str, theirs: str) -> str | None:
    """The merge by constant; None when it does not apply (a text that does not parse, no
    constants, a difference outside the constants' values) or conflicts (a constant set
    differently on both sides)."""
    cut_base, cut_ours, cut_theirs = (_constant_values(text) for text in (base, ours, theirs))
    if cut_base is None or cut_ours is None or cut_theirs is None:
        return None
    frame, b = cut_base
    if not b or cut_ours[0] != frame or cut_theirs[0] != frame:
        return None
    values = []
    for vb, vo, vt in zip(b, cut_ours[1], cut_theirs[1], strict=True):
        if vo != vb and vt != vb and vo != vt:
            return None
        values.append(vt if vo == vb else vo)
    out = [frame[0]]
    for value, after in zip(values, frame[1:], strict=True):
        out += [value, after]
    return "".join(out)


def rebase_constants(base: str, ours: str, theirs: str) -> tuple[str, list[tuple[str, str, str]]] | None:
    """A change of constants (``base`` to ``theirs``) set onto ``ours`` even where ``ours``
    moved the same constants: ``ours`` with each constant the change set at the change's
    value, and [(name, ours' value, the change's value)] of those that now differ. None when
    the texts differ in more than their constants' values (then only a real merge may join
    them). How a proposal prepared on an old best survives a keep that moved the same
    learning rate: the proposal meant "LR = 0.04", not "LR 0.02 -> 0.04"."""
    cuts = [_constant_values(text) for text in (base, ours, theirs)]
    tree = module_constants.parse(base)
    if tree is None or any(c is None for c in cuts):
        return None
    (frame, b), (frame_o, o), (frame_t, t) = cuts   # type: ignore[misc]
    # Blanks at a line's end do not count (an editor's, or an agent's "A = 0.9 "); the new
    # best's text is what the result is made of.
    if not b or _bare(frame_o) != _bare(frame) or _bare(frame_t) != _bare(frame):
        return None
    names = [name for name, _ in module_constants.assignments(tree)]
    values, moved = [], []
    for name, vb, vo, vt in zip(names, b, o, t, strict=True):
        values.append(vt if vt != vb else vo)
        if vt != vb and vt != vo:
            moved.append((name, vo, vt))
    out = [frame_o[0]]
    for value, after in zip(values, frame_o[1:], strict=True):
        out += [value, after]
    return "".join(out), moved


_TRAILING = re.compile(r"[ \t]+(?=\r?\n|$)")


def _bare(frame: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(_TRAILING.sub("", piece) for piece in frame)


@functools.lru_cache(maxsize=64)
def _constant_values(text: str) -> tuple[tuple[str, ...], tuple[str, ...]] | None:
    """The text cut around each constant's value: the pieces between the values (one more
    than the values) and the values' source; None when it does not parse."""
    tree = module_constants.parse(text)
    if tree is None:
        return None
    starts = [0] + [m.end() for m in _LINE_BREAK.finditer(text)] + [len(text)]

    def offset(line: int, col: int) -> int:
        # ast's columns count UTF-8 bytes.
        start = starts[line - 1]
        return start + len(text[start:starts[line]].encode("utf-8")[:col].decode("utf-8", errors="ignore"))

    frame, values, at = [], [], 0
    for _name, value in module_constants.assignments(tree):
        if value.end_lineno is None or value.end_col_offset is None:
            return None
        begin, end = offset(value.lineno, value.col_offset), offset(value.end_lineno, value.end_col_offset)
        frame.append(text[at:begin])
        values.append(text[begin:end])
        at = end
    frame.append(text[at:])
    return tuple(frame), tuple(values)


# ------------------------------------------------------------------------------ taking changes out


def take_out(best: str, edits: list[Edit]) -> str | None:
    """``best`` without the given kept changes (in their order), the latest reverted first;
    None when one does not come out."""
    text: str | None = best
    for edit in reversed(edits):
        if text is None:
            return None
        text = merge3(edit.commit, text, edit.parent)
    return text


def _rewrites(edits: list[Edit], group: list[int], k: int) -> bool:
    """Whether kept change ``k`` rewrote lines that the group's (earlier) changes set: the
    group's revert and k's edit, both onto k's parent, clash."""
    edit = edits[k]
    without = take_out(edit.parent, [edits[m] for m in group])
    return without is not None and merge3(edit.parent, edit.commit, without) is None


def _group_of(best: str, edits: list[Edit], i: int) -> Takeout:
    """Change i taken out with just the later changes built on its lines (and on theirs);
    failing that, with every change up to the first run that comes out; else not at all."""
    alone = take_out(best, [edits[i]])
    if alone is not None:
        return Takeout((i,), alone)
    group = [i]
    for k in range(i + 1, len(edits)):
        if _rewrites(edits, group, k):
            group.append(k)
    text = take_out(best, [edits[m] for m in group])
    for j in range(i + 1, len(edits)):
        if text is not None:
            break
        group = sorted(set(group) | set(range(i, j + 1)))
        text = take_out(best, [edits[m] for m in group])
    return Takeout(tuple(group), text) if text is not None else Takeout((i,), None)


def plan_takeouts(best: str, edits: list[Edit]) -> list[Takeout]:
    """How each kept change (in ledger order) comes out of the best: every change is a member
    of exactly one takeout, in the order of their first members. Groups that share a member
    are joined."""
    takeouts: list[Takeout] = []
    placed: set[int] = set()
    for i in range(len(edits)):
        if i in placed:
            continue
        found = _group_of(best, edits, i)
        joined = [t for t in takeouts if set(t.members) & set(found.members)]
        if joined and found.text is not None:
            members = tuple(sorted(set(found.members).union(*(t.members for t in joined))))
            takeouts = [t for t in takeouts if t not in joined]
            found = Takeout(members, take_out(best, [edits[m] for m in members]))
        takeouts.append(found)
        placed.update(found.members)
    return sorted(takeouts, key=lambda t: t.members[0])
