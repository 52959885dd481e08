"""One module per sub-command of ``autoloop``: each has ``run(args) -> int``, the exit status.

autoloop/cli/main.py builds the parser and imports a command's module only when that command
runs, so ``autoloop status`` does not pay for GitPython or ``autoloop doctor``'s checks.
"""
