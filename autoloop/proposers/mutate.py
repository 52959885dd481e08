"""An offline proposer: one hyperparameter of the target at a time, no model needed.

It reads the module-level UPPER_CASE constants of the target with ``ast`` and proposes
one move of one constant per trial, rewriting only the bytes of that one literal (comments,
spacing and every other line stay as they were). The description of each trial is the
move itself, ``MATRIX_LR 0.04 -> 0.056``, and that is also the mutator's memory: the
moves already tried at the current best commit are read back from the ledger (records
whose ``parent`` is the best commit), so a restart never repeats one.

Which constants:
    ``NAME = <literal>`` at module level, NAME in UPPER_CASE, the literal an int, float,
    bool, (short) string, or a tuple of numbers; a leading minus counts as part of a
    number. Anything computed (``float(os.environ.get(...))``, ``WIDTH // 2``) is left
    alone, and so are the names in SKIP. Strings are found but have no moves: there is
    no "next" value of a string.

Moves, small steps first:
    float   scaled by 1.4, 0.7, 2, 0.5 (3 significant digits); a value in [0.5, 1) such
            as a momentum or a beta moves its distance to 1 instead (0.95 -> 0.93, 0.965,
            0.9, 0.975), so it never crosses 1; 0.0 tries 0.1 and 0.01
    int     a power of two doubles or halves; any other int steps +-1 and +-25%
            (the 25% steps first from 8 up)
    bool    flipped
    tuple   one element moved as above
Never nonsense: the sign of a number is kept, an int >= 1 stays >= 1, a name that reads
as a fraction (FRAC, MOMENTUM, BETA, DROPOUT, PROB) stays within [0, 1], and the bounds
in UPPER_BOUNDS hold for the value the trial's device profile trains with (profile_bounds).

Order: when the move that made the current best was ``X a -> b``, the next proposal is
``X b -> c`` one more step in the same direction (c = b * b / a, or b + (b - a) for
ints); the opposite direction of X is not tried at that best (it would go back towards
the value that just lost). Otherwise a constant with untried moves is drawn at random
(seeded by the run's seed and the trial number, so a night is reproducible), and its
first untried move is proposed. When every move at the current best has been tried, the
mutator returns None and the loop stops: no more ideas.
"""

from __future__ import annotations

import ast
import math
import os
import random
import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from autoloop.core import module_constants
from autoloop.core.duplicate_gate import code_key
from autoloop.core.layout import Layout
from autoloop.proposers.base import Proposal, ProposalFailed, ProposalRequest, ProposerError

# Constants the mutator never touches: they change what is measured or how it is
# reported, not how well the model learns.
SKIP = frozenset({
    "LOG_EVERY_S",     # progress-line interval: no effect on val_bpb
    "EVAL_BATCH",      # evaluation batch: no effect on val_bpb, only on evaluation memory
    "COMPILE_ON_CPU",  # torch.compile costs ~50 s cold on CPU: a whole short budget
    "CUDA_FULL_BATCH_GIB",  # fits the GPU batch to the GPU's memory: a safety margin, not a learning knob
    "DATA_SEED",       # the order of the training windows: another order is luck, not learning
})
# Upper bounds that keep the harness contract: evaluation uses 512-byte windows, and
# train.py's position tables need not be longer than what evaluation uses.
UPPER_BOUNDS = {"SEQ_LEN": 512}
# The bounds hold for the value a trial trains with, not the value written: train.py's device
# profiles (its PROFILES table) multiply SEQ_LEN by their "seq" factor and cap the product
# at 512, so on the cuda profile (x4) "SEQ_LEN 128 -> 256" trains the very same model.
PROFILE_FACTORS = {"SEQ_LEN": "seq"}
PROFILE_VAR = "AUTOLOOP_PROFILE"   # train.py's choice of profile by name, over the device's own
FLOAT_FACTORS = (1.4, 0.7, 2.0, 0.5)
ZERO_FLOAT_MOVES = (0.1, 0.01)
MAX_STRING = 40
_FRACTION_NAME = re.compile(r"FRAC|MOMENTUM|BETA|DROPOUT|PROB")
_DESCRIPTION = re.compile(r"^(?P<name>[A-Z][A-Z0-9_]*) (?P<old>.+) -> (?P<new>.+)$")

Number = int | float  # bool is an int too; told apart where it matters


class MutateError(ProposerError):
    """The target cannot be searched (not Python, no constants); one line for the user."""


@dataclass(frozen=True)
class Literal:
    """One bool or number literal in the source: where its bytes are, and its value.

    For ``-0.5`` the span covers ``0.5`` alone and ``negative`` is set: moves keep the
    sign, so only the digits are ever rewritten.
    """

    line: int          # 1-based line number
    start: int         # UTF-8 byte offsets within that line (what ast reports)
    end: int
    value: bool | Number   # signed value
    text: str          # the source text, sign included ("-0.5")
    negative: bool = False


@dataclass(frozen=True)
class Constant:
    name: str
    value: object                  # the Python value (tuple for a tuple)
    literals: tuple[Literal, ...]  # one for a scalar, one per element of a tuple
    is_tuple: bool = False

    def show(self, values: tuple[object, ...] | None = None, texts: list[str] | None = None) -> str:
        """How the value reads in a description: '0.04', '(0.8, 0.95)'."""
        if not self.is_tuple:
            return texts[0] if texts else self.literals[0].text
        parts = texts or [lit.text for lit in self.literals]
        return "(" + ", ".join(parts) + ("," if len(parts) == 1 else "") + ")"


@dataclass(frozen=True)
class Move:
    name: str
    index: int | None        # tuple element moved; None for a scalar
    old: object              # whole value before
    new: object              # whole value after
    literal: Literal         # the literal rewritten
    new_text: str            # its new source text (sign included)
    description: str

    @property
    def key(self) -> tuple[str, object]:
        return (self.name, _canon(self.new))


# ------------------------------------------------------------------------------ finding constants


def _number(node: ast.expr) -> tuple[Number | bool, ast.Constant, bool] | None:
    """(value, the Constant node, negative) for `1`, `-1.5`, `True`; None otherwise."""
    negative = False
    if isinstance(node, ast.UnaryOp) and isinstance(node.op, ast.USub):
        negative, node = True, node.operand
        if not isinstance(node, ast.Constant) or isinstance(node.value, bool):
            return None
    if not isinstance(node, ast.Constant) or not isinstance(node.value, (bool, int, float)):
        return None
    if node.lineno != node.end_lineno:
        return None
    value = node.value
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return (-value if negative else value), node, negative


def _literal(node: ast.expr, lines: list[bytes]) -> Literal | None:
    found = _number(node)
    if found is None:
        return None
    value, const, negative = found
    end = const.end_col_offset
    if end is None:   # ast.parse sets it on every node it reads from source
        return None
    digits = lines[const.lineno - 1][const.col_offset:end].decode("utf-8")
    return Literal(const.lineno, const.col_offset, end, value,
                   ("-" if negative else "") + digits, negative)


def find_constants(source: bytes) -> list[Constant]:
    """The module-level UPPER_CASE constants of a Python source, in file order."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError) as e:
        raise MutateError(f"cannot parse the target as Python ({e.__class__.__name__}: {e})") from None
    lines = source.split(b"\n")
    found: list[Constant] = []
    for name, value in module_constants.assignments(tree):
        if name in SKIP:
            continue
        if isinstance(value, ast.Tuple) and value.elts:
            elements = [_literal(e, lines) for e in value.elts]
            numbers = [e for e in elements if e is not None and not isinstance(e.value, bool)]
            if len(numbers) == len(elements):
                found.append(Constant(name, tuple(e.value for e in numbers), tuple(numbers), True))
            continue
        if isinstance(value, ast.Constant) and isinstance(value.value, str):
            if len(value.value) <= MAX_STRING:
                found.append(Constant(name, value.value, ()))
            continue
        lit = _literal(value, lines)
        if lit is not None:
            found.append(Constant(name, lit.value, (lit,)))
    # A constant assigned twice: the last assignment is the one in force.
    last = {c.name: c for c in found}
    return [c for c in found if last[c.name] is c]


# ------------------------------------------------------------------------------ moves


def _is_power_of_two(n: int) -> bool:
    return n >= 1 and n & (n - 1) == 0


def _round(x: float) -> float:
    """Three significant digits: proposals read as 0.056, not 0.05600000000000001."""
    return float(f"{x:.3g}")


def _allowed(name: str, old: Number, new: Number, bounds: Mapping[str, int] = UPPER_BOUNDS) -> bool:
    """The sanity rules every proposed value obeys."""
    if new == old or (isinstance(new, float) and not math.isfinite(new)):
        return False
    if old > 0 and new <= 0 or old < 0 and new >= 0:
        return False                      # the sign is kept
    if isinstance(old, int) and old >= 1 and new < 1:
        return False
    if _FRACTION_NAME.search(name) and not 0 <= new <= 1:
        return False
    bound = bounds.get(name)
    return bound is None or new <= bound


def value_moves(name: str, old: bool | Number, bounds: Mapping[str, int] = UPPER_BOUNDS) -> list[bool | Number]:
    """The new values one step away from `old`, small steps first."""
    if isinstance(old, bool):
        return [not old]
    candidates: list[Number]
    if isinstance(old, int):
        if old == 0:
            candidates = [1]
        elif _is_power_of_two(abs(old)):
            candidates = [old * 2, old // 2 if old > 0 else -(-old // 2)]
        elif abs(old) >= 8:   # +-1 would be lost in the noise: the 25% steps first
            candidates = [round(old * 1.25), round(old * 0.75), old + 1, old - 1]
        else:
            candidates = [old + 1, old - 1, round(old * 1.25), round(old * 0.75)]
    elif old == 0:
        candidates = list(ZERO_FLOAT_MOVES)
    elif 0.5 <= old < 1:
        candidates = [_round(1 - (1 - old) * f) for f in FLOAT_FACTORS]
    else:
        candidates = [_round(old * f) for f in FLOAT_FACTORS]
    out: list[Number] = []
    for new in candidates:
        if _allowed(name, old, new, bounds) and new not in out:
            out.append(new)
    return out


def continuation(name: str, a: bool | Number, b: bool | Number,
                 bounds: Mapping[str, int] = UPPER_BOUNDS) -> bool | Number | None:
    """One more step from b in the direction a -> b took; None when there is none."""
    if isinstance(b, bool) or isinstance(a, bool) or a == b:
        return None
    c: Number
    if isinstance(a, int) and isinstance(b, int):
        if _is_power_of_two(abs(a)) and _is_power_of_two(abs(b)):
            c = b * 2 if abs(b) > abs(a) else (b // 2 if b > 0 else -(-b // 2))
        else:
            c = b + (b - a)
    elif a == 0:
        c = _round(b * 2)
    elif 0.5 <= a < 1 and 0.5 <= b < 1:
        c = _round(1 - (1 - b) ** 2 / (1 - a))
    else:
        c = _round(b * b / a)
    return c if _allowed(name, b, c, bounds) else None


def format_value(new: bool | Number, like: Literal) -> str:
    """Source text for `new`, in the style of the literal it replaces."""
    if isinstance(new, bool):
        return repr(new)
    if isinstance(new, int):
        return str(new)
    digits = like.text.lstrip("-")
    if "e" in digits.lower():             # keep scientific style: 3e-4 -> 4.2e-4
        mantissa, exponent = f"{abs(new):.2e}".split("e")
        mantissa = mantissa.rstrip("0").rstrip(".")
        text = f"{mantissa}e{int(exponent)}"
    else:
        text = repr(abs(new))
    return ("-" if new < 0 else "") + text


def make_move(const: Constant, index: int, new: bool | Number) -> Move:
    """The move setting literal `index` of `const` to `new`."""
    lit = const.literals[index]
    text = format_value(new, lit)
    if const.is_tuple:
        values: list[object] = [lit.value for lit in const.literals]   # const.value, element by element
        values[index] = new
        texts = [lit.text for lit in const.literals]
        texts[index] = text
        new_value: object = tuple(values)
        shown = const.show(texts=texts)
    else:
        new_value, shown = new, text
    return Move(const.name, index if const.is_tuple else None, const.value, new_value, lit, text,
                f"{const.name} {const.show()} -> {shown}")


def constant_moves(const: Constant, bounds: Mapping[str, int] = UPPER_BOUNDS) -> list[Move]:
    return [make_move(const, index, new)
            for index, lit in enumerate(const.literals)
            for new in value_moves(const.name, lit.value, bounds)]


def profile_bounds(source: bytes, device: str, profile: str | None = None) -> dict[str, int]:
    """UPPER_BOUNDS on the values as written, for a trial on ``device`` (cpu, cuda, mps):
    a bound divided by the factor the target's PROFILES table gives that device's profile
    (``profile``, when named, wins as it does in train.py). A target without the table,
    or without that profile, trains what is written: the bounds as they are."""
    factors = _profiles(source).get(profile or device, {})
    bounds = dict(UPPER_BOUNDS)
    for name, key in PROFILE_FACTORS.items():
        factor = factors.get(key)
        if name in bounds and isinstance(factor, int) and not isinstance(factor, bool) and factor >= 1:
            bounds[name] = max(1, bounds[name] // factor)
    return bounds


def _profiles(source: bytes) -> dict[str, dict[str, object]]:
    """The module-level ``PROFILES = {"name": dict(key=literal, ...)}`` table (or with
    ``{"key": literal}`` dicts) of a source, read with ast; {} when there is none."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return {}
    for node in tree.body:
        if (isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name)
                and node.targets[0].id == "PROFILES" and isinstance(node.value, ast.Dict)):
            table: dict[str, dict[str, object]] = {}
            for key, value in zip(node.value.keys, node.value.values, strict=True):
                if isinstance(key, ast.Constant) and isinstance(key.value, str):
                    table[key.value] = _profile_entries(value)
            return table
    return {}


def _profile_entries(node: ast.expr) -> dict[str, object]:
    pairs: list[tuple[str, ast.expr]] = []
    if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "dict":
        pairs = [(kw.arg, kw.value) for kw in node.keywords if kw.arg is not None]
    elif isinstance(node, ast.Dict):
        pairs = [(k.value, v) for k, v in zip(node.keys, node.values, strict=True)
                 if isinstance(k, ast.Constant) and isinstance(k.value, str)]
    return {k: v.value for k, v in pairs if isinstance(v, ast.Constant)}


def apply_move(source: bytes, move: Move) -> bytes:
    """The source with the one literal rewritten: every other byte unchanged."""
    lines = source.split(b"\n")
    lit = move.literal
    line = lines[lit.line - 1]
    # The span holds the digits; the minus sign (if any) is outside it and stays.
    digits = move.new_text[1:] if lit.negative else move.new_text
    lines[lit.line - 1] = line[:lit.start] + digits.encode("utf-8") + line[lit.end:]
    return b"\n".join(lines)


# ------------------------------------------------------------------------------ memory


def _canon(value: object) -> object:
    """A hashable, type-stable key: 0.5 and 0.50 alike, True never equal to 1."""
    if isinstance(value, tuple):
        return tuple(_canon(v) for v in value)
    if isinstance(value, bool):
        return ("bool", value)
    if isinstance(value, (int, float)):
        return ("num", float(value))
    return ("other", repr(value))


def parse_description(text: str) -> tuple[str, object, object] | None:
    """'MATRIX_LR 0.04 -> 0.056' -> ('MATRIX_LR', 0.04, 0.056); None for anything else."""
    match = _DESCRIPTION.match(text.strip())
    if not match:
        return None
    try:
        old, new = ast.literal_eval(match["old"]), ast.literal_eval(match["new"])
    except (ValueError, SyntaxError, MemoryError, RecursionError):
        return None
    return match["name"], old, new


def _records(request: ProposalRequest) -> list[dict[str, Any]]:
    """The whole ledger when the loop says where it is (memory must survive restarts and
    outlast the short tail), else the tail it passed."""
    if request.results_dir is not None and Layout(Path(request.results_dir)).ledger.exists():
        from autoloop.store.ledger import Ledger

        return [r.model_dump(mode="json") for r in Ledger(Path(request.results_dir)).records()] + request.in_flight
    return list(request.ledger_tail) + request.in_flight


@dataclass(frozen=True)
class Earlier:
    """What earlier comparable nights say to the mutator (proposers/warm_start.py)."""

    tried: set[tuple[str, object]]                 # moves measured on this very code
    kept: list[tuple[str, object, object]]         # moves that were kept, oldest first


def _earlier(request: ProposalRequest, source: bytes) -> Earlier | None:
    if not request.earlier:
        return None
    code = code_key(source.decode("utf-8", errors="replace"))
    tried = {(name, _canon(new)) for p in request.earlier if p.parent_code == code
             for name, _, new in _moves(p.description)}
    return Earlier(tried, [move for p in request.earlier if p.status == "keep" for move in _moves(p.description)])


def _moves(description: str) -> list[tuple[str, object, object]]:
    """The moves a description names: the mutator's one, or Optuna's list of them."""
    return [parsed for part in description.split(", ") if (parsed := parse_description(part)) is not None]


def tried_at(records: list[dict[str, Any]], best: str | None) -> set[tuple[str, object]]:
    """(name, new value) of every move already made on top of `best` (any outcome)."""
    tried: set[tuple[str, object]] = set()
    for r in records:
        if r.get("parent") != best or r.get("kind") in ("baseline", "confirm"):
            continue
        parsed = parse_description(r.get("description") or "")
        if parsed:
            tried.add((parsed[0], _canon(parsed[2])))
    return tried


def last_win(records: list[dict[str, Any]], best: str | None) -> tuple[str, object, object] | None:
    """The move that made `best` the best commit, if it was one."""
    for r in reversed(records):
        if r.get("status") == "keep" and r.get("commit") == best and best is not None:
            return parse_description(r.get("description") or "")
    return None


# ------------------------------------------------------------------------------ the proposer


class MutateProposer:
    """Hyperparameter search over the target's constants, one literal per trial."""

    name = "mutate"
    can_fix = False

    def propose(self, request: ProposalRequest) -> Proposal | None:
        if request.fix is not None:
            return None   # a mutation cannot be repaired: the loop records the crash and moves on
        path = Path(request.workspace) / request.target
        source = path.read_bytes()
        try:
            constants = find_constants(source)
        except MutateError as e:
            raise ProposalFailed(str(e)) from None
        bounds = profile_bounds(source, request.device, os.environ.get(PROFILE_VAR) or None)
        move = self.choose(constants, _records(request), request.parent, request.seed, request.trial, bounds,
                           earlier=_earlier(request, source))
        if move is None:
            return None
        new_source = apply_move(source, move)
        check = {c.name: c.value for c in find_constants(new_source)}
        if _canon(check.get(move.name)) != _canon(move.new):   # never write what we did not mean
            raise ProposalFailed(f"rewriting {move.name} did not give {move.new!r}")
        path.write_bytes(new_source)
        return Proposal(description=move.description, source="mutate")

    @staticmethod
    def choose(constants: list[Constant], records: list[dict[str, Any]], best: str | None, seed: int,
               trial: int, bounds: Mapping[str, int] = UPPER_BOUNDS, earlier: Earlier | None = None) -> Move | None:
        tried = tried_at(records, best)
        by_name = {c.name: c for c in constants}
        if earlier is not None:
            # Warm start: what earlier nights measured on this very code is not tried again,
            # and the last value they kept for each constant is tried first, re-based onto this
            # best's values. Only the last: an earlier keep a later one superseded would go back
            # (benchmarks/warm_start.py --start from lost ground to a cold night until this).
            tried |= earlier.tried
            seen: set[str] = set()
            for name, _, new in reversed(earlier.kept):
                if name in seen:
                    continue
                seen.add(name)
                const = by_name.get(name)
                if (const is not None and not const.is_tuple and isinstance(new, (int, float))
                        and _canon(const.value) != _canon(new) and (name, _canon(new)) not in tried
                        and type(const.value) is type(new)):
                    return make_move(const, 0, new)
        options: dict[str, list[Move]] = {}
        for const in constants:
            moves = [m for m in constant_moves(const, bounds) if m.key not in tried]
            if moves:
                options[const.name] = moves

        won = last_win(records, best)
        if won is not None and won[0] in by_name:
            name, a, b = won
            const = by_name[name]
            if _canon(const.value) == _canon(b):
                follow = _follow_up(const, a, b, bounds)
                if follow is not None and follow.key not in tried:
                    return follow
                # Going back towards the value that just lost is not worth a trial here.
                if name in options:
                    options[name] = [m for m in options[name] if not _reverses(m, a, b)]
                    if not options[name]:
                        del options[name]
        if not options:
            return None
        rng = random.Random(f"autoloop-mutate:{seed}:{trial}")
        name = rng.choice(sorted(options))
        return options[name][0]


def _changed_element(a: object, b: object) -> tuple[int, object, object] | None:
    """(index, element of a, element of b) when the tuples a and b differ in one element alone."""
    if isinstance(a, tuple) and isinstance(b, tuple) and len(a) == len(b):
        diff = [i for i, (x, y) in enumerate(zip(a, b, strict=True)) if _canon(x) != _canon(y)]
        return (diff[0], a[diff[0]], b[diff[0]]) if len(diff) == 1 else None
    return None


def _follow_up(const: Constant, a: object, b: object, bounds: Mapping[str, int] = UPPER_BOUNDS) -> Move | None:
    """The move one more step in the direction of a -> b."""
    changed = _changed_element(a, b) if const.is_tuple else (0, a, b)
    if changed is None:
        return None
    index, x, y = changed
    if not isinstance(x, (bool, int, float)) or not isinstance(y, (bool, int, float)):
        return None
    c = continuation(const.name, x, y, bounds)
    return None if c is None else make_move(const, index, c)


def _reverses(move: Move, a: object, b: object) -> bool:
    """Whether `move` goes from b back towards a (on the element a -> b changed)."""
    if isinstance(a, tuple):
        changed = _changed_element(a, b)
        if changed is None or move.index != changed[0] or not isinstance(move.new, tuple):
            return False
        _, x, y = changed
        new = move.new[changed[0]]
    else:
        x, y, new = a, b, move.new
    if (isinstance(y, bool) or not isinstance(x, (int, float)) or not isinstance(y, (int, float))
            or not isinstance(new, (int, float))):
        return False
    return (new - y) * (y - x) < 0
