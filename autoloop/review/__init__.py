"""What the person reads: status and the morning report, the progress plot, what changed
since the last look, finalize's clean branch, the dashboard and its terminal twin (watch).

Imports every layer below it, verification included.
"""
