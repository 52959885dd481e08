"""`autoloop prepare`: the pinned train/val/audit split of a corpus, built once."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from autoloop.data import CorpusSpec, DataError, prepare

    spec = CorpusSpec(source=args.corpus, val_bytes=args.val_bytes, audit_bytes=args.audit_bytes,
                      shards=args.shards)
    if args.shards is not None and spec.hub is None:
        raise DataError(f"--shards is for a named corpus (climbmix), not '{args.corpus}'")
    info = prepare(spec, args.data_dir)
    for line in info.summary_lines():
        print(line)
    if spec.hub is not None and args.data_dir is None:
        print(f"use it with: autoloop run --corpus {spec.source}")
    elif args.data_dir is None and not spec.is_stdlib:
        print(f"use it with: export AUTOLOOP_DATA_DIR={info.data_dir}")
    return 0
