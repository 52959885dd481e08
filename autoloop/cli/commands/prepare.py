"""`autoloop prepare`: the pinned train/val/audit split of a corpus, built once."""

from __future__ import annotations

import argparse


def run(args: argparse.Namespace) -> int:
    from autoloop.data import CorpusSpec, prepare

    spec = CorpusSpec(source=args.corpus, val_bytes=args.val_bytes, audit_bytes=args.audit_bytes)
    info = prepare(spec, args.data_dir)
    for line in info.summary_lines():
        print(line)
    if args.data_dir is None and not spec.is_stdlib:
        print(f"use it with: export AUTOLOOP_DATA_DIR={info.data_dir}")
    return 0
