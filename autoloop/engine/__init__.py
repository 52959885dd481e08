"""The night: opening it, recovery, the scheduler's worker slots, a trial's state machine,
look-ahead, a candidate's preparation, an attempt, and the arbiter that owns the best.

Imports every layer below it: core, config, store, execution, repo, observe, proposers.
"""
