"""Numbered lines without end (64 KiB at a time, about 10 MiB/s), until its output pipe
breaks or 60 s pass: a trial still printing when its orchestrator is killed."""
import sys
import time

started = time.monotonic()
n = 0
while time.monotonic() - started < 60:
    block = "".join(f"line {n + i:09d} " + "x" * 48 + "\n" for i in range(1024)).encode()
    n += 1024
    try:
        sys.stdout.buffer.write(block)
        sys.stdout.buffer.flush()
    except BrokenPipeError:
        break
    time.sleep(0.006)
