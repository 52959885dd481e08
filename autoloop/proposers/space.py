"""The search space over a target's constants: which values each tunable constant may take.

Built from the constants the mutator finds (``mutate.find_constants``: module-level
UPPER_CASE literals, the names in ``mutate.SKIP`` left alone), one :class:`Dimension` per
number or bool (one per element of a tuple), with ranges around the value the constant has
when the space is built, and the mutator's rules kept everywhere in them:

    float            log-uniform over [v / 4, v x 4]: the sign is kept, never 0
    float in [0.5,1) its distance to 1 (a momentum, a beta) log-uniform, the value in [0.5, 1)
    fraction         a name with FRAC, MOMENTUM, BETA, DROPOUT or PROB stays within [0, 1]
    float 0.0        uniform over [0, 0.2] (the mutator's first steps from 0 are 0.1 and 0.01)
    power of two     stays one: 2 doublings or halvings each way, never below 1
    other int        an int in [v / 2, 2 v], never below 1 when it was at least 1
    bool             either
    bounds           mutate.UPPER_BOUNDS hold on the value trained with (mutate.profile_bounds)

Float ranges are symmetric in log space (clipped to the same factor on both sides where a
bound would cut one side), so the current value is the centre of the space: where CMA-ES
starts its search. A width and a head count or head dimension (``WIDTH`` and ``N_HEADS`` or
``HEAD_DIM``, and the usual
spellings of either) that divide at build time stay divisible: the head count's range is
capped so that every pair of powers of two in the space divides, and :meth:`Space.infeasible`
names any pair that would not (the proposer draws again rather than run it).

Values are what gets written: floats rounded to 3 significant digits (as the mutator
writes them), so two suggestions that would write the same source are the same point.
This module knows nothing of Optuna: :mod:`autoloop.proposers.optuna_search` maps each
dimension to an Optuna distribution.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from autoloop.proposers.mutate import (
    _FRACTION_NAME,
    UPPER_BOUNDS,
    Constant,
    _canon,
    _is_power_of_two,
    _round,
    apply_move,
    find_constants,
    make_move,
    value_moves,
)
from autoloop.proposers.mutate import (
    Literal as SourceLiteral,
)

# Floats: log-uniform within this factor either way of the current value. As far as two of
# the mutator's largest steps (x2, x0.5) go, and narrow enough that a random point of the
# space (TPE's first draws, all constants at once) is rarely a disaster for a tuned train.py.
SPREAD = 4.0
POW2_STEPS = 2           # powers of two: this many doublings or halvings either way
ZERO_FLOAT_HIGH = 0.2    # a float at 0.0: uniform over [0, ZERO_FLOAT_HIGH]
MIN_LOG_SPREAD = 1.05    # a log range narrower than this factor is not worth searching

# A width and what must divide it: the head count (head dim = WIDTH // N_HEADS) or the head
# dimension (heads = WIDTH // HEAD_DIM, as the default train.py has it).
_WIDTH_NAME = re.compile(r"^(WIDTH|D_MODEL|N_EMBD|N_EMBED|EMBED_DIM|MODEL_DIM|DIM|HIDDEN_SIZE|N_DIM)$")
_HEADS_NAME = re.compile(r"^((N_|NUM_)?HEADS?|HEAD_DIM|HEAD_SIZE|D_HEAD)$")

Kind = Literal["bool", "pow2", "int", "log", "log1m", "linear"]
Value = bool | int | float
Key = tuple[tuple[str, object], ...]   # a point's identity: (name, canonical value) per dimension
Place = tuple[str, str, int | None]    # a dimension's name, its constant, its tuple element


@dataclass(frozen=True)
class Dimension:
    """One searched number: a scalar constant or one element of a tuple constant.

    ``param`` is the number the sampler sees: the exponent of a power of two, the distance
    to 1 of a momentum (``log1m``), the magnitude of a negative float; ``low``/``high``
    bound it. :meth:`value` turns it into what is written in the source.
    """

    name: str                 # parameter name: MATRIX_LR, ADAM_BETAS[1]
    constant: str             # the constant it belongs to
    index: int | None         # tuple element; None for a scalar
    kind: Kind
    low: float
    high: float
    negative: bool = False    # the constant is negative: the sign is kept
    log: bool = False         # sampled on a log scale (log, log1m; ints from 1 up)

    def value(self, param: Value) -> Value:
        """The constant's value for a sampled parameter (rounded as it will be written)."""
        sign = -1 if self.negative else 1
        if self.kind == "bool":
            return bool(param)
        if self.kind == "pow2":
            power: int = 2 ** int(param)   # the exponent is never below 0 (low)
            return sign * power
        if self.kind == "int":
            return sign * int(param)
        if self.kind == "log1m":
            # The distance to 1 rounded to 3 significant digits: 0.9 + a distance of 0.0312
            # is 0.9688, and 0.9999 never rounds up to 1.
            d = float(param)
            return round(1.0 - d, 2 - math.floor(math.log10(d)))
        return sign * _round(float(param)) if float(param) != 0 else 0.0

    def param(self, value: object) -> Value | None:
        """The parameter for a constant's value; None when the value is outside the space
        (another proposer moved it out of the range, or changed its type)."""
        if self.kind == "bool":
            return value if isinstance(value, bool) else None
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            return None
        if (value < 0) != self.negative and value != 0:
            return None
        magnitude = abs(value)
        if self.kind in ("pow2", "int"):
            if not isinstance(value, int):
                return None
            whole = abs(value)
            if self.kind == "pow2":
                if not _is_power_of_two(whole):
                    return None
                p: Value = whole.bit_length() - 1
            else:
                p = whole
            return p if self.low <= p <= self.high else None
        if not isinstance(value, float):
            return None
        p = 1.0 - value if self.kind == "log1m" else magnitude
        # Written values are rounded to 3 significant digits: allow for that at the edges.
        slack = 5e-3 * max(abs(self.low), abs(self.high))
        if self.low - slack <= p <= self.high + slack and (p > 0 or not self.log):
            return min(max(p, self.low), self.high)
        return None


@dataclass(frozen=True)
class Space:
    """The dimensions of one target's constants, and the pairs that must stay divisible."""

    dimensions: tuple[Dimension, ...]
    divisible: tuple[tuple[str, str], ...] = ()   # (width dim, heads dim): width % heads == 0

    def __bool__(self) -> bool:
        return bool(self.dimensions)

    @property
    def names(self) -> list[str]:
        return [d.name for d in self.dimensions]

    def values(self, params: dict[str, Value]) -> dict[str, Value]:
        """Parameter name -> the value written, for the dimensions the params cover."""
        return {d.name: d.value(params[d.name]) for d in self.dimensions if d.name in params}

    def params(self, values: Mapping[str, object]) -> dict[str, Value] | None:
        """The parameters of a point given as values; None unless every dimension is in range."""
        out: dict[str, Value] = {}
        for d in self.dimensions:
            if d.name not in values:
                return None
            p = d.param(values[d.name])
            if p is None:
                return None
            out[d.name] = p
        return out

    def infeasible(self, values: dict[str, Value]) -> str | None:
        """Why a point must not be run (a width its head count does not divide), or None."""
        for width, heads in self.divisible:
            w, h = values.get(width), values.get(heads)
            if isinstance(w, int) and isinstance(h, int) and h != 0 and w % h:
                return f"{width} {w} is not divisible by {heads} {h}"
        return None

    def read(self, source: bytes) -> dict[str, Value]:
        """The current value of each dimension in a source (those it still has)."""
        constants = {c.name: c for c in find_constants(source)}
        out: dict[str, Value] = {}
        for d in self.dimensions:
            const = constants.get(d.constant)
            literal = _literal_of(const, d)
            if literal is not None:
                out[d.name] = literal.value
        return out

    def write(self, source: bytes, values: dict[str, Value]) -> tuple[bytes, list[str]]:
        """The source with each dimension's literal set to its value, and the moves made
        ('MATRIX_LR 0.02 -> 0.031', one per constant changed, in file order). Dimensions
        whose constant the source no longer has (or no longer has as a literal) are left
        out. Every other byte is unchanged."""
        constants = {c.name: c for c in find_constants(source)}
        edits: dict[str, dict[int, Value]] = {}   # constant -> literal index -> new value
        for d in self.dimensions:
            const = constants.get(d.constant)
            literal = _literal_of(const, d)
            if literal is None or d.name not in values:
                continue
            new = values[d.name]
            if _canon(new) != _canon(literal.value):
                edits.setdefault(d.constant, {})[d.index or 0] = new
        moves, descriptions = [], []
        for const in (c for c in constants.values() if c.name in edits):
            texts = [lit.text for lit in const.literals]
            for index, new in sorted(edits[const.name].items()):
                move = make_move(const, index, new)
                moves.append(move)
                texts[index] = move.new_text
            descriptions.append(f"{const.name} {const.show()} -> {const.show(texts=texts)}")
        # Last literal first: a rewrite never shifts the byte offsets of one still to come.
        for move in sorted(moves, key=lambda m: (m.literal.line, m.literal.start), reverse=True):
            source = apply_move(source, move)
        return source, descriptions

    def key(self, values: Mapping[str, object]) -> Key:
        """A hashable identity of a point: two points with one key write the same source."""
        return tuple((name, _canon(values.get(name))) for name in self.names)


def _literal_of(const: Constant | None, d: Dimension) -> SourceLiteral | None:
    if const is None:
        return None
    index = d.index or 0
    if const.is_tuple != (d.index is not None) or index >= len(const.literals):
        return None
    return const.literals[index]


# ------------------------------------------------------------------------------ building


def build_space(source: bytes, bounds: Mapping[str, int] = UPPER_BOUNDS) -> Space:
    """The space around the constants of a source (raises mutate.MutateError when it does
    not parse). Strings, and constants the mutator has no move for, are not in it.
    ``bounds``: mutate.profile_bounds for the trial's device (the written values' bounds)."""
    dims: list[Dimension] = []
    for const in find_constants(source):
        for index, literal in enumerate(const.literals):
            if not value_moves(const.name, literal.value, bounds):
                continue
            name = f"{const.name}[{index}]" if const.is_tuple else const.name
            dim = _dimension(name, const.name, index if const.is_tuple else None, literal.value, bounds)
            if dim is not None:
                dims.append(dim)
    dims, divisible = _keep_divisible(dims, find_constants(source))
    return Space(tuple(dims), divisible)


def _dimension(name: str, constant: str, index: int | None, v: Value,
               bounds: Mapping[str, int] = UPPER_BOUNDS) -> Dimension | None:
    base: Place = (name, constant, index)
    if isinstance(v, bool):
        return Dimension(*base, kind="bool", low=0, high=1)
    bound = bounds.get(constant)
    negative = v < 0
    fraction = bool(_FRACTION_NAME.search(constant))
    if isinstance(v, int):
        m = abs(v)
        if m >= 1 and _is_power_of_two(m):
            e = m.bit_length() - 1
            high = e + POW2_STEPS
            if bound is not None and not negative:
                high = min(high, int(math.log2(bound)))
            return Dimension(*base, kind="pow2", low=max(0, e - POW2_STEPS), high=high, negative=negative)
        low, high = (max(1, m // 2), max(m * 2, m + 2)) if m >= 1 else (0, 2)
        if bound is not None and not negative:
            high = min(high, bound)
        return Dimension(*base, kind="int", low=low, high=high, negative=negative, log=low >= 1)
    if v == 0:
        return Dimension(*base, kind="linear", low=0.0, high=ZERO_FLOAT_HIGH)
    if 0.5 <= v < 1:
        # As the mutator: a momentum or a beta moves its distance to 1, so it never crosses 1;
        # below 0.5 a momentum stops being one.
        return _log_range(base, "log1m", 1.0 - v, cap=0.5)
    if fraction and v == 1.0:
        return Dimension(*base, kind="linear", low=0.0, high=1.0)
    cap = 1.0 if fraction else (float(bound) if bound is not None and not negative else None)
    return _log_range(base, "log", abs(v), cap=cap, negative=negative)


def _log_range(base: Place, kind: Kind, centre: float, cap: float | None, negative: bool = False) -> Dimension:
    factor = SPREAD if cap is None else min(SPREAD, cap / centre)
    if cap is not None and factor < MIN_LOG_SPREAD:   # without a cap the factor is SPREAD
        # At (or next to) its bound: the range opens on the one side that is left.
        return Dimension(*base, kind=kind, low=centre / SPREAD, high=max(cap, centre), negative=negative, log=True)
    return Dimension(*base, kind=kind, low=centre / factor, high=centre * factor, negative=negative, log=True)


def _keep_divisible(dims: list[Dimension],
                    constants: list[Constant]) -> tuple[list[Dimension], tuple[tuple[str, str], ...]]:
    """Find width/heads pairs that divide now; cap a power-of-two head count at the
    smallest width in the space, so that every pair of powers of two divides."""
    values = {c.name: c.value for c in constants if isinstance(c.value, int) and not isinstance(c.value, bool)}
    by_name = {d.name: d for d in dims}
    widths = [n for n in values if _WIDTH_NAME.match(n)]
    heads = [n for n in values if _HEADS_NAME.match(n)]
    pairs = []
    for w in widths:
        for h in heads:
            if values[h] <= 0 or values[w] % values[h]:
                continue   # not a divisibility this target relies on
            pairs.append((w, h))
            dw, dh = by_name.get(w), by_name.get(h)
            if dw and dh and dw.kind == "pow2" and dh.kind == "pow2":
                # Powers of two divide when the divisor is not the larger: cap the divisor at
                # the smallest width, or at its current value where that is larger (a head
                # dimension of 64 beside widths from 32), and then raise the smallest width to
                # the divisor's largest.
                current = values[h].bit_length() - 1
                high = min(dh.high, max(current, dw.low))
                by_name[h] = Dimension(dh.name, dh.constant, dh.index, dh.kind, dh.low, high, dh.negative, dh.log)
                if dw.low < high:
                    by_name[w] = Dimension(dw.name, dw.constant, dw.index, dw.kind, high, dw.high, dw.negative,
                                           dw.log)
    return [by_name[d.name] for d in dims], tuple(pairs)
