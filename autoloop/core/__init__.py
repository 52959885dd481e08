"""The pure rules and names: no files, no processes, no git.

Errors, durations, the names of every path and ref, crash classification, the metric
rules and the keep decision, the statistics of a contribution, a source's constants and
the duplicate gate, a kept change taken out of a text. Imports nothing of autoloop outside this layer.
"""
