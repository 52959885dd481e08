"""What the night shows as it goes: the console, a git note per trial, trackers, and the
observers that follow each ledger append.

Imports the core, config, store, execution and repo layers.
"""
