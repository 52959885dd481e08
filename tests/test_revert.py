"""core/revert.py: a kept change taken out of a text (or replayed onto one) by a three-way
merge without context lines, by constant where the texts differ only in constants' values."""

from __future__ import annotations

from autoloop.core.revert import Edit, merge3, plan_takeouts, rebase_constants, take_out

BASE = "import os\n\nLR = 0.01\nWARMUP = 10\nDEPTH = 2\n\n\ndef main():\n    x = 1\n    y = 2\n    return x + y\n"


def edit(text: str, old: str, new: str) -> str:
    assert text.count(old) == 1, old
    return text.replace(old, new)


def test_changes_on_neighbouring_lines_come_out_one_by_one():
    a = edit(BASE, "LR = 0.01", "LR = 0.02")
    ab = edit(a, "WARMUP = 10", "WARMUP = 12")
    assert merge3(a, ab, BASE) == edit(BASE, "WARMUP = 10", "WARMUP = 12")   # the first out of the best
    assert merge3(ab, ab, a) == a                                            # the second
    # The same outside the constants (the line merge): two statements of a function, next to each other.
    x = edit(BASE, "x = 1", "x = 5")
    xy = edit(x, "y = 2", "y = 7")
    assert merge3(x, xy, BASE) == edit(BASE, "y = 2", "y = 7")
    # A change replayed forwards onto a text that lacks the change before it (finalize).
    assert merge3(a, BASE, ab) == edit(BASE, "WARMUP = 10", "WARMUP = 12")


def test_only_the_same_lines_conflict():
    a = edit(BASE, "LR = 0.01", "LR = 0.02")
    assert merge3(a, edit(a, "LR = 0.02", "LR = 0.03"), BASE) is None     # a later change rewrote it
    assert merge3(a, edit(BASE, "LR = 0.01", "LR = 0.01"), BASE) == BASE  # undone since: nothing to take out
    x = edit(BASE, "x = 1", "x = 5")
    assert merge3(x, edit(x, "x = 5", "x = 6"), BASE) is None
    # Two insertions at the same place: which goes first is unknown.
    assert merge3(BASE, edit(BASE, "\ndef main", "\nA = 1\ndef main"), edit(BASE, "\ndef main", "\nB = 1\ndef main")) \
        is None
    # The same edit on both sides is taken once.
    assert merge3(BASE, x, x) == x


def test_constants_come_apart_by_name_where_lines_cannot():
    """Two constants on one line: the lines conflict; by constant they come apart (a value
    over several lines, a non-ASCII one before another on its line too). A text that does
    not parse has the lines alone."""
    base = "A = 1; B = 2\nBETAS = (0.8,\n         0.95)\nC = 'é'; D = 3\n"
    a = edit(base, "A = 1", "A = 5")
    ab = edit(a, "B = 2", "B = 7")
    assert merge3(a, ab, base) == edit(base, "B = 2", "B = 7")
    betas = edit(base, "0.95)", "0.99)")
    assert merge3(betas, edit(betas, "C = 'é'", "C = 'è'"), base) == edit(base, "C = 'é'", "C = 'è'")
    # Different lines of one value come apart as lines; the same line set twice does not.
    assert merge3(betas, edit(betas, "(0.8,", "(0.9,"), base) == edit(base, "(0.8,", "(0.9,")
    assert merge3(betas, edit(betas, "0.99)", "0.9)"), base) is None
    d = edit(base, "D = 3", "D = 4")
    assert merge3(d, edit(d, "C = 'é'", "C = 'è'"), base) == edit(base, "C = 'é'", "C = 'è'")
    assert merge3(a, edit(a, "A = 5", "A = 6"), base) is None
    broken = "A = 1\nB = (\n"
    assert merge3(broken, edit(broken, "A = 1", "A = 2"), edit(broken, "B = (", "B = [")) == "A = 2\nB = [\n"


def test_plan_takeouts_groups_only_what_overlaps():
    texts = [BASE]
    for old, new in (("LR = 0.01", "LR = 0.02"), ("WARMUP = 10", "WARMUP = 12"), ("LR = 0.02", "LR = 0.03"),
                     ("x = 1", "x = 5")):
        texts.append(edit(texts[-1], old, new))
    edits = [Edit(p, c) for p, c in zip(texts, texts[1:], strict=False)]
    best = texts[-1]
    plan = plan_takeouts(best, edits)
    assert [t.members for t in plan] == [(0, 2), (1,), (3,)]
    assert plan[0].text == edit(edit(BASE, "WARMUP = 10", "WARMUP = 12"), "x = 1", "x = 5")
    assert plan[1].text == take_out(best, [edits[1]]) == edit(best, "WARMUP = 12", "WARMUP = 10")
    # A change whose line a later one put back: taking it out leaves the best as it is.
    back = edit(best, "LR = 0.03", "LR = 0.01")
    plan = plan_takeouts(back, [*edits, Edit(best, back)])
    assert plan[0].members == (0,) and plan[0].text == back
    # #2 (0.02 -> 0.03) comes out of a best at 0.01 only with the change that put it back.
    assert plan[1].members == (1,)
    assert plan[2].members == (2, 4) and plan[2].text == edit(back, "LR = 0.01", "LR = 0.02")
    # Without that change among the kept ones, #2 does not come out at all.
    plan = plan_takeouts(back, edits)
    assert [(t.members, t.text is None) for t in plan] == [((0,), False), ((1,), False), ((2,), True), ((3,), False)]


def test_a_change_of_constants_rebases_onto_a_text_that_moved_the_same_ones():
    """A proposal prepared on an old best (LR 0.01 -> 0.04) set onto a new best that moved LR
    to 0.02 and WARMUP to 12: the proposal's LR, the new best's WARMUP, and the move said from
    the new best's value."""
    best = edit(edit(BASE, "LR = 0.01", "LR = 0.02 "), "WARMUP = 10", "WARMUP = 12")   # an agent's trailing blank
    proposal = edit(BASE, "LR = 0.01", "LR = 0.04")
    assert merge3(BASE, best, proposal) is None   # the lines conflict
    text, moved = rebase_constants(BASE, best, proposal)
    assert text == edit(best, "LR = 0.02 ", "LR = 0.04 ") and moved == [("LR", "0.02", "0.04")]
    # The new best holds the proposal's value already: nothing moves.
    assert rebase_constants(BASE, edit(BASE, "LR = 0.01", "LR = 0.04"), proposal) == (proposal, [])
    # A difference outside the constants' values is no rebase: only a real merge may join them.
    assert rebase_constants(BASE, best, edit(proposal, "x = 1", "x = 5")) is None
    assert rebase_constants(BASE, best, edit(BASE, "LR = 0.01", "LR = (0.04)")) is None
    assert rebase_constants(BASE, best, "not python (") is None
