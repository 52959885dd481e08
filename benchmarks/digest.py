"""How large, how complete and how quick is the research digest as a night grows?

Builds synthetic ledgers (the shape tests/test_digest.py uses: a baseline, kept changes
every ``--keep-every`` trials, discards, crashes of three kinds, skips, descriptions by
constant or in words) of each size and prints, per size: the digest's bytes against the
bound, how many kept changes it names of how many there are, how many of its sections
it could hold, and the median time to build it (it is built once per agent call, so it
must stay far below a second however long the night).

    python benchmarks/digest.py                         # 10, 100, 1,000 and 10,000 records
    python benchmarks/digest.py --sizes 1000 --keep-every 3 --limit-kb 4

Timing moves with the machine's load: compare sizes of one invocation, never figures of two.
"""

from __future__ import annotations

import argparse
import re
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from test_digest import kept_trials, section, synthetic_night

from autoloop.store.digest import research_digest

SECTIONS = ("Kept changes", "Tried without becoming the best", "Crashes", "Proposals not run", "The last")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[10, 100, 1000, 10000], help="records per ledger")
    parser.add_argument("--keep-every", type=int, default=9, help="a kept change every N trials (default 9)")
    parser.add_argument("--limit-kb", type=float, default=8.0, help="the digest's bound (default 8, as --digest-kb)")
    parser.add_argument("--repeats", type=int, default=5, help="builds timed per size (default 5)")
    args = parser.parse_args()
    limit = int(args.limit_kb * 1024)
    print(f"{'records':>8} {'bytes':>6} {'bound':>6} {'kept named':>12} {'sections':>8} {'build ms':>9}")
    for n in args.sizes:
        records = synthetic_night(n, keep_every=args.keep_every)
        times = []
        for _ in range(args.repeats):
            started = time.perf_counter()
            digest = research_digest(records, limit=limit)
            times.append(time.perf_counter() - started)
        kept = kept_trials(records)
        kept_text = section(digest, "Kept changes").split("\n", 2)[2] if "## Kept changes" in digest else ""
        named = [int(t) for t in re.findall(r"\b(\d+)\b(?! earlier)", kept_text)]
        held = sum(f"## {title}" in digest for title in SECTIONS)
        print(f"{n:>8} {len(digest.encode()):>6} {limit:>6} {sum(t in kept for t in named):>5}/{len(kept):<6} "
              f"{held:>5}/{len(SECTIONS):<2} {1000 * statistics.median(times):>9.1f}")


if __name__ == "__main__":
    main()
