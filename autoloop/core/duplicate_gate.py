"""The duplicate gate: a change already tried from the same best is not trained again.

An agent that forgets (or a mutator on a plateau) proposes what was tried before; a run
of the budget to learn what the ledger already says is the most expensive way to be told.
Two versions of the target are the *same change* from one best when they are equal once
comments and whitespace are ignored and number literals are read as values (``0.06``,
``6e-2`` and ``0.060`` are one value), so a constant set to a value already tried from
this best is caught whatever its spelling. Comparing whole files from the same parent is
comparing their diffs against it.

Pure functions of source text; ``candidate.screen`` asks :func:`same_as` with the
attempts of the ledger built on the current best.
"""

from __future__ import annotations

import ast
import hashlib
import io
import tokenize
from collections.abc import Iterable
from dataclasses import dataclass

from autoloop.core import module_constants

# Tokens that carry no meaning for Python (comments, blank lines, the encoding marker).
_IGNORED = {tokenize.COMMENT, tokenize.NL, tokenize.ENCODING, tokenize.ENDMARKER}


@dataclass(frozen=True)
class Earlier:
    """An earlier attempt from the same best: its label (``12``, ``12.2``) and its target."""

    label: str
    source: str


def normalise(source: str) -> tuple[str, ...]:
    """The source as Python sees it: its tokens without comments, blank lines and spacing,
    with numbers as values. Indentation stays (it is meaning). Text that does not
    tokenize (a broken edit) falls back to its lines with ``#`` comments and spacing removed."""
    try:
        out = []
        for tok in tokenize.generate_tokens(io.StringIO(source).readline):
            if tok.type in _IGNORED:
                continue
            if tok.type == tokenize.NUMBER:
                out.append(_number(tok.string))
            elif tok.type == tokenize.NEWLINE:
                out.append(";")
            else:
                out.append(tok.string)
        return tuple(out)
    except (tokenize.TokenError, IndentationError, SyntaxError):
        lines = (line.split("#", 1)[0] for line in source.splitlines())
        return tuple("".join(line.split()) for line in lines if line.strip())


def code_key(source: str) -> str:
    """A short key of the source as :func:`normalise` reads it: equal keys, the same code
    (how the gate knows an earlier night's parent is this night's, whatever its commit)."""
    return hashlib.sha256("\x00".join(normalise(source)).encode("utf-8", "replace")).hexdigest()[:16]


def same_as(candidate: str, earlier: Iterable[Earlier]) -> Earlier | None:
    """The first earlier attempt whose target is the same change as ``candidate``, or None."""
    mine = normalise(candidate)
    return next((e for e in earlier if normalise(e.source) == mine), None)


def changed_constants(base: str, candidate: str) -> list[str]:
    """``NAME = value`` for each module-level constant the candidate sets differently from
    the base (for the skip's reason); empty when either does not parse."""
    old, new = _constants(base), _constants(candidate)
    if old is None or new is None:
        return []
    return [f"{name} = {value}" for name, value in new.items() if old.get(name) != value]


def _constants(source: str) -> dict[str, str] | None:
    tree = module_constants.parse(source)
    if tree is None:
        return None
    # Values as Python reads them: 6e-2 is 0.06.
    return {name: ast.unparse(value) for name, value in module_constants.assignments(tree)}


def _number(text: str) -> str:
    try:
        value = ast.literal_eval(text)
    except (ValueError, SyntaxError):
        return text
    return repr(value)   # 0.060 and 6e-2 are 0.06; 3 and 3.0 stay apart (an int and a float)
