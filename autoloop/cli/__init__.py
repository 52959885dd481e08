"""The command line: argument parsing, one function per sub-command, exit codes.

The top layer: it may import every other. ``autoloop.cli:main`` is the console script.
"""

from autoloop.cli.main import main

__all__ = ["main"]
