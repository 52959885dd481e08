"""Git: the workspace (branch, commit, reset, scope check, refs), undoing what a proposer
did to git, parallel workers' worktrees, read-only views for viewers, plumbing on a private
index (finalize's branch).

Imports the core, config, store and execution layers.
"""
