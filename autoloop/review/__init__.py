"""What the person reads: status and the morning report, the progress plot, what changed
since the last look, finalize's clean branch, doctor's checks, the dashboard and its terminal
twin (watch); and what a coding agent reads and asks through `autoloop mcp` (the attempts, the
versioned JSON, a queued patch, a stop).

Imports every layer below it, verification included.
"""
