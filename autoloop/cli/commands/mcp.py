"""`autoloop mcp`: serve the night over MCP on stdio, or --install a client's configuration."""

from __future__ import annotations

import argparse

from autoloop.cli.paths import repo_root


def run(args: argparse.Namespace) -> int:
    root = repo_root(args.directory)
    if args.install:
        from autoloop.review.mcp.client_setup import install

        written = install(root, args.install, allow_write=args.allow_write)
        for path in written:
            print(f"wrote {path.relative_to(root)}")
        print("commit them (git add ... && git commit): autoloop run refuses untracked files")
        return 0
    from autoloop.review.mcp.server import serve

    serve(root, allow_write=args.allow_write)
    return 0
