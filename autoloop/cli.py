"""Command line: argument parsing, sub-commands and exit codes; the logic lives elsewhere."""

from __future__ import annotations

import argparse
import sys

from autoloop import __version__

EXIT_USAGE = 2


def _positive_int(text: str) -> int:
    try:
        value = int(text.replace("_", ""))
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {value}")
    return value


def cmd_prepare(args) -> int:
    from autoloop.data import CorpusSpec, prepare

    spec = CorpusSpec(source=args.corpus, val_bytes=args.val_bytes, audit_bytes=args.audit_bytes)
    info = prepare(spec, args.data_dir)
    for line in info.summary_lines():
        print(line)
    if args.data_dir is None and not spec.is_stdlib:
        print(f"use it with: export AUTOLOOP_DATA_DIR={info.data_dir}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    from autoloop.data import DEFAULT_AUDIT_BYTES, DEFAULT_VAL_BYTES

    parser = argparse.ArgumentParser(
        prog="autoloop",
        description="Autonomous experiment loop: propose one change to train.py, train for a fixed "
                    "budget, keep it if val_bpb improved, else reset. Every attempt is recorded.",
    )
    parser.add_argument("--version", action="version", version=f"autoloop {__version__}")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")

    p = sub.add_parser(
        "prepare", help="build the train/val/audit split of a corpus (idempotent)",
        description="Build the pinned train/validation/audit split of a corpus into a data directory "
                    "and print its size and fingerprint. Running it again on the same corpus changes "
                    "nothing. train.py prepares the default corpus by itself on first use.",
    )
    p.add_argument("--corpus", default="stdlib", metavar="SOURCE",
                   help="'stdlib' (default: this Python's standard-library sources) or a directory, "
                        "file or glob of text files")
    p.add_argument("--data-dir", default=None, metavar="DIR",
                   help="where to write the prepared data (default: $AUTOLOOP_DATA_DIR, else a "
                        "per-user cache folder named after the corpus)")
    p.add_argument("--val-bytes", type=_positive_int, default=DEFAULT_VAL_BYTES, metavar="N",
                   help=f"size of the pinned validation slice (default {DEFAULT_VAL_BYTES:,})")
    p.add_argument("--audit-bytes", type=_positive_int, default=DEFAULT_AUDIT_BYTES, metavar="N",
                   help=f"size of the held-out audit slice (default {DEFAULT_AUDIT_BYTES:,})")
    p.set_defaults(func=cmd_prepare)
    return parser


def main(argv: list[str] | None = None) -> int:
    from autoloop.data import DataError

    parser = build_parser()
    args = parser.parse_args(argv)
    if not getattr(args, "func", None):
        parser.print_help()
        return EXIT_USAGE
    try:
        return args.func(args)
    except DataError as e:
        print(f"autoloop: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("autoloop: interrupted", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
