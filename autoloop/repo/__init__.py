"""Git: the workspace (branch, commit, reset, scope check, refs), undoing what a proposer
did to git, parallel workers' worktrees, read-only views for viewers.

Imports the core, config, store and execution layers.
"""
