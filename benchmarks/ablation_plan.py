"""How kept changes come out of the best: git's three-line merge against core/revert.py.

Draws nights of N kept changes of this checkout's train.py (each sets one constant to a new
value, every seventh also adds a comment line), then plans verify's ablation two ways:

* before: ``git merge-file`` (three lines of context), a change that does not revert
  grouped with every change after it up to the first run that does (verify until now);
* now: ``core.revert.plan_takeouts`` (no context lines, by constant; grouped only with the
  later changes that rewrote its lines).

Prints, per night, how many changes come out alone, how many groups and their sizes, the
changes in a group whose lines no other member touched (riders measured only with their
neighbours), and the seconds each plan took.

    python benchmarks/ablation_plan.py                  # 5 nights of 20 kept changes
    python benchmarks/ablation_plan.py --changes 40 --nights 3 --seed 7
"""

from __future__ import annotations

import argparse
import random
import re
import subprocess
import tempfile
import time
from pathlib import Path

from autoloop.core.revert import Edit, plan_takeouts

TRAIN = Path(__file__).resolve().parent.parent / "train.py"
CONSTANT = re.compile(r"^([A-Z][A-Z0-9_]*) = (-?[0-9][0-9.e-]*)\b", re.M)


def night(source: str, n: int, rng: random.Random) -> tuple[list[str], list[set[str]]]:
    """The texts of a chain of n kept changes, and the constants each one set."""
    names = [m.group(1) for m in CONSTANT.finditer(source)]
    texts, touched = [source], []
    for k in range(n):
        name = rng.choice(names)
        text = re.sub(rf"^({name} = )(-?[0-9][0-9.e-]*)", lambda m: f"{m.group(1)}{rng.random():.4f}",
                      texts[-1], count=1, flags=re.M)
        if k % 7 == 6:
            text = text.replace("\n\n\n", f"\n\n# kept change {k + 1}\n\n", 1)
        texts.append(text)
        touched.append({name})
    return texts, touched


def merge_file(base: str, ours: str, theirs: str, tmp: Path) -> str | None:
    for name, text in (("base", base), ("ours", ours), ("theirs", theirs)):
        (tmp / name).write_text(text)
    out = subprocess.run(["git", "merge-file", "-p", str(tmp / "ours"), str(tmp / "base"), str(tmp / "theirs")],
                         capture_output=True, text=True)
    return out.stdout if out.returncode == 0 else None


def before(texts: list[str], tmp: Path) -> list[tuple[int, ...]]:
    """verify's grouping until now: change i with the changes after it up to the first that reverts."""
    best, groups, i = texts[-1], [], 0
    n = len(texts) - 1
    while i < n:
        j = next((j for j in range(i, n) if merge_file(texts[j + 1], best, texts[i], tmp) is not None), None)
        groups.append(tuple(range(i, (j if j is not None else i) + 1)))
        i = (j if j is not None else i) + 1
    return groups


def riders(groups: list[tuple[int, ...]], touched: list[set[str]]) -> int:
    """Members of a group that share no constant with another member: grouped for nothing."""
    return sum(1 for g in groups if len(g) > 1 for m in g
               if not any(touched[m] & touched[o] for o in g if o != m))


def line(label: str, groups: list[tuple[int, ...]], touched: list[set[str]], seconds: float) -> str:
    sizes = sorted((len(g) for g in groups if len(g) > 1), reverse=True)
    alone = sum(1 for g in groups if len(g) == 1)
    return (f"  {label:<7} alone {alone:3d}  groups {len(sizes):3d} (sizes {sizes or '-'})  "
            f"grouped with no shared constant {riders(groups, touched):3d}  {seconds:6.2f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--changes", type=int, default=20)
    parser.add_argument("--nights", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    source = TRAIN.read_text()
    rng = random.Random(args.seed)
    with tempfile.TemporaryDirectory(prefix="ablation-plan-") as tmp:
        for k in range(args.nights):
            texts, touched = night(source, args.changes, rng)
            print(f"night {k + 1}: {args.changes} kept changes of {TRAIN.name} ({len(source.splitlines())} lines)")
            t0 = time.perf_counter()
            old = before(texts, Path(tmp))
            t1 = time.perf_counter()
            edits = [Edit(a, b) for a, b in zip(texts, texts[1:], strict=False)]
            new = [t.members for t in plan_takeouts(texts[-1], edits)]
            t2 = time.perf_counter()
            print(line("before", old, touched, t1 - t0))
            print(line("now", new, touched, t2 - t1))


if __name__ == "__main__":
    main()
