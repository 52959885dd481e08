"""Which statements of a Python source are its module-level UPPER_CASE constants.

One definition for everything that reads train.py's knobs by name: the mutator and the
search space (which move them), the duplicate gate (which names the constants a skipped
change set), the agent proposer (which describes a change by them) and ``revert`` (which
takes a kept change out by constant). Each reads the value in its own way (the literal's
bytes, ``ast.unparse``, the source segment); what counts as a constant is decided here
only, so they never disagree about a name.
"""

from __future__ import annotations

import ast
import re

# UPPER_CASE with a leading letter: WIDTH, MATRIX_LR, ADAM_BETAS; not _PRIVATE or Mixed.
NAME = re.compile(r"^[A-Z][A-Z0-9_]*$")


def assignments(tree: ast.Module) -> list[tuple[str, ast.expr]]:
    """(name, value) of each ``NAME = value`` or ``NAME: type = value`` at module level,
    in file order. A name assigned twice appears twice (the last one is in force)."""
    found = []
    for stmt in tree.body:
        if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
            target, value = stmt.targets[0], stmt.value
        elif isinstance(stmt, ast.AnnAssign) and stmt.value is not None and stmt.simple:
            target, value = stmt.target, stmt.value
        else:
            continue
        if isinstance(target, ast.Name) and NAME.match(target.id):
            found.append((target.id, value))
    return found


def sources(text: str) -> dict[str, str] | None:
    """Each constant's name -> the source of its value, on one line; None when the text
    does not parse. How a change is described by its knobs (the agent, the trackers)."""
    tree = parse(text)
    if tree is None:
        return None
    out: dict[str, str] = {}
    for name, value in assignments(tree):
        segment = ast.get_source_segment(text, value)
        if segment is not None:
            out[name] = " ".join(segment.split())
    return out


def parse(source: str | bytes) -> ast.Module | None:
    """The module's tree; None when it is not Python (a half-written edit)."""
    try:
        return ast.parse(source)
    except (SyntaxError, ValueError):
        return None
