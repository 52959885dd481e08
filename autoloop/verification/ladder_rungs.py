"""The rungs of `autoloop ladder` and what kind of change it measures, from the target's text.

* **Rungs from the size constants** (the default): rung 1 is the change's own DEPTH and
  WIDTH; each next rung doubles the parameters N ≈ 12·DEPTH·WIDTH² (the blocks' weights),
  with the (DEPTH, WIDTH) pair nearest to twice the last one's N that keeps the night's
  aspect (WIDTH a multiple of HEAD_DIM when the target has one, else of 8). With the budget
  fixed every rung trains for --budget, and the nominal compute grows as N (the tokens taken
  as equal); scaled, rung k trains for --budget × (N_k/N_1)², so that on a device whose
  throughput falls as 1/N the tokens grow with the parameters (a constant
  tokens-per-parameter ratio, Chinchilla's rule), and the nominal compute grows as N².
  Either way the nominal steps are equal in log-compute; the fit uses the compute the runs
  report (6·N·D from train.py's num_params_M and total_tokens_M) whenever they report it.
* **Rungs given** (``--rung KEY=VALUE[,KEY=VALUE]``, repeated): each sets those constants
  (the mutator's literal rewriter); ``budget=DURATION`` among them sets that rung's budget.
* **A tuning change**: one that only moves learning-rate, weight-decay, batch or schedule
  constants (by name) and nothing else; the ladder then sweeps their multiplier per rung.
"""

from __future__ import annotations

import math
import re

from autoloop.core.durations import parse_duration
from autoloop.core.errors import ConfigError
from autoloop.proposers.mutate import MutateError, find_constants
from autoloop.verification.ladder_plan import BudgetMode, LadderError, Rung
from autoloop.verification.verify import scaled_source
from autoloop.verification.verify_plan import VerifyError

TUNING = re.compile(r"(^|_)(LR|LRS|LEARNING_RATE|WEIGHT_DECAY|WD|BATCH|BATCH_SIZE|WARMUP|WARMDOWN|COOLDOWN|"
                    r"DECAY|SCHEDULE|FINAL_LR|MOMENTUM|BETAS?|LR_FRAC)(_|$)")
SIZE_KEYS = ("DEPTH", "WIDTH")


def _numbers(source: str) -> dict[str, object]:
    try:
        return {c.name: c.value for c in find_constants(source.encode("utf-8")) if not c.is_tuple}
    except MutateError as e:
        raise LadderError(str(e)) from None


def params_estimate(source: str) -> float | None:
    """12·DEPTH·WIDTH²: the weights of the blocks; None when the target lacks either."""
    values = _numbers(source)
    depth, width = values.get("DEPTH"), values.get("WIDTH")
    if isinstance(depth, int) and isinstance(width, int) and not isinstance(depth, bool) and depth > 0 and width > 0:
        return 12.0 * depth * width ** 2
    return None


def tuning_constants(parent: str, child: str) -> dict[str, float]:
    """The constants a tuning-only change moved, with the change's values; {} when the change
    does more (another constant, or any other line)."""
    old, new = _numbers(parent), _numbers(child)
    moved = {k: v for k, v in new.items() if old.get(k) != v}
    if not moved or not all(TUNING.search(k) and isinstance(v, (int, float)) and not isinstance(v, bool) and v > 0
                            for k, v in moved.items()):
        return {}
    try:
        redone = scaled_source(parent, {k: repr(v) for k, v in moved.items()}, "the parent")
    except VerifyError:
        return {}
    return {k: float(v) for k, v in moved.items()} if redone == child else {}  # type: ignore[arg-type]


def multiplied(text: str, constants: dict[str, float], multiplier: float) -> str:
    """The text with each tuning constant times the multiplier (an int stays an int, at least 1)."""
    values = _numbers(text)
    out = {}
    for k, v in constants.items():
        if isinstance(values.get(k), int):
            out[k] = str(max(1, round(v * multiplier)))
        else:
            out[k] = f"{v * multiplier:.6g}"
    return scaled_source(text, out, "the change")


def _sized(d0: int, w0: int, q: int, target: float, floor: tuple[int, int]) -> tuple[int, int]:
    """The (depth, width) with 12·d·w² within about 10 % of target, nearest the night's aspect,
    neither smaller than the last rung's (floor) and the pair not the same."""
    best: tuple[tuple[float, float], int, int] | None = None
    top_d = max(2, math.ceil(4 * d0 * target / (12 * d0 * w0 * w0)))
    top_w = q * max(2, math.ceil(4 * w0 * math.sqrt(target / (12 * d0 * w0 * w0)) / q))
    for d in range(floor[0], top_d + 1):
        for w in range(floor[1], top_w + 1, q):
            n = 12.0 * d * w * w
            if (d, w) == floor:
                continue
            key = (round(abs(math.log(n / target)), 1), abs(math.log((w / d) / (w0 / d0))))
            if best is None or key < best[0]:
                best = (key, d, w)
    assert best is not None
    return best[1], best[2]


def derived_rungs(source: str, count: int, budget: float, mode: BudgetMode) -> list[Rung]:
    """``count`` rungs from the target's DEPTH and WIDTH, doubling N each step."""
    values = _numbers(source)
    d0, w0 = values.get("DEPTH"), values.get("WIDTH")
    if not (isinstance(d0, int) and isinstance(w0, int)) or isinstance(d0, bool) or d0 < 1 or w0 < 1:
        raise LadderError("the target has no DEPTH and WIDTH integer constants to derive the rungs from: give "
                          "them with --rung KEY=VALUE[,KEY=VALUE] (repeated, smallest first)")
    head = values.get("HEAD_DIM")
    q = head if isinstance(head, int) and not isinstance(head, bool) and head > 0 and w0 % head == 0 else 8
    n0 = 12.0 * d0 * w0 * w0
    rungs, floor = [], (d0, w0)
    for k in range(count):
        d, w = (d0, w0) if k == 0 else _sized(d0, w0, q, n0 * 2 ** k, floor)
        n = 12.0 * d * w * w
        floor = (d, w)
        scale = (n / n0) ** 2 if mode == "scaled" else 1.0
        rungs.append(Rung(index=k, values={"DEPTH": str(d), "WIDTH": str(w)}, budget=budget * scale,
                          params_est=n, compute_est=(n / n0) ** (2 if mode == "scaled" else 1)))
    return rungs


def at_rung(source: str, values: dict[str, str], where: str, spec: str | None = None) -> str:
    """The target at a rung; each key must be a number constant there."""
    try:
        return scaled_source(source, values, where)
    except VerifyError as e:
        label = spec or "rung " + ",".join(f"{k}={v}" for k, v in values.items())
        raise LadderError(f"{label}: {str(e).split(': ', 1)[-1]}") from None


def given_rungs(specs: list[str], source: str, budget: float, mode: BudgetMode) -> list[Rung]:
    """The rungs of --rung KEY=VALUE[,KEY=VALUE] (and budget=DURATION), smallest first."""
    parsed: list[tuple[dict[str, str], float | None]] = []
    for spec in specs:
        values: dict[str, str] = {}
        own: float | None = None
        for part in filter(None, (p.strip() for p in spec.split(","))):
            key, sep, value = part.partition("=")
            if not sep or not key.strip() or not value.strip():
                raise LadderError(f"--rung {spec}: expected KEY=VALUE[,KEY=VALUE]")
            if key.strip() == "budget":
                try:
                    own = parse_duration(value.strip())
                except ConfigError as e:
                    raise LadderError(f"--rung {spec}: {e}") from None
            else:
                values[key.strip()] = value.strip()
        parsed.append((values, own))
    n = [params_estimate(at_rung(source, v, "the change's target", f"--rung {spec}"))
         for (v, _), spec in zip(parsed, specs, strict=True)]
    n0 = n[0] if n and n[0] else None
    rungs = []
    for k, ((values, own), nk) in enumerate(zip(parsed, n, strict=True)):
        ratio = nk / n0 if nk and n0 else None
        b = own if own is not None else budget * (ratio ** 2 if mode == "scaled" and ratio else 1.0)
        rungs.append(Rung(index=k, values=values, budget=b, params_est=nk,
                          compute_est=ratio ** (2 if mode == "scaled" else 1) if ratio else None))
    if all(r.compute_est for r in rungs):   # smallest first, whatever order they were given in
        ordered = sorted(rungs, key=lambda r: r.compute_est or 0.0)
        rungs = [r.model_copy(update={"index": k}) for k, r in enumerate(ordered)]
    return rungs
