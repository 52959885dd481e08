"""Many processes appending to one ledger: throughput, and proof that nothing tears or goes missing.

    python benchmarks/ledger_concurrency.py                 # 8 workers x 1000 records, fsync on
    python benchmarks/ledger_concurrency.py --no-fsync --workers 16 --records 2000

Each worker appends records tagged (worker, seq); afterwards every line must be whole
JSON and every (worker, seq) present exactly once, in each worker's order.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import sys
import tempfile
import time
from pathlib import Path

from autoloop.store.ledger import Ledger, LedgerRecord


def worker(results_dir: str, w: int, count: int, fsync: bool, start) -> None:
    start.wait()
    ledger = Ledger(Path(results_dir), fsync=fsync)
    for seq in range(count):
        ledger.append(LedgerRecord(trial=w, attempt=seq + 1, started_at=0.0, ended_at=1.0,
                                   proposer="bench", description="x" * (seq % 300), status="keep",
                                   metric=1.0, extra={"worker": w, "seq": seq}),
                      write_tsv=(seq == count - 1))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--workers", type=int, default=8)
    ap.add_argument("--records", type=int, default=1000, help="per worker")
    ap.add_argument("--no-fsync", action="store_true")
    args = ap.parse_args()

    with tempfile.TemporaryDirectory() as d:
        ctx = multiprocessing.get_context("fork" if "fork" in multiprocessing.get_all_start_methods()
                                          else "spawn")
        start = ctx.Event()
        procs = [ctx.Process(target=worker, args=(d, w, args.records, not args.no_fsync, start))
                 for w in range(args.workers)]
        for p in procs:
            p.start()
        t0 = time.perf_counter()
        start.set()
        for p in procs:
            p.join()
        elapsed = time.perf_counter() - t0

        seen: dict[tuple[int, int], int] = {}
        for line in (Path(d) / "ledger.jsonl").read_text().splitlines():
            extra = json.loads(line)["extra"]
            key = (extra["worker"], extra["seq"])
            seen[key] = seen.get(key, 0) + 1
        total = args.workers * args.records
        missing = total - len(seen)
        dupes = sum(1 for n in seen.values() if n > 1)
        ok = missing == 0 and dupes == 0 and all(p.exitcode == 0 for p in procs)
        print(f"{total} appends by {args.workers} processes in {elapsed:.2f}s "
              f"({total / elapsed:.0f}/s, fsync {'off' if args.no_fsync else 'on'}): "
              f"{'OK' if ok else 'FAILED'} (missing {missing}, duplicated {dupes})")
        return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
