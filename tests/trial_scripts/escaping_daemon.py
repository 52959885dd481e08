"""Leaves a daemon that escapes every kind of tracking but a cgroup: setsid, a double fork,
an empty environment (no token), its parent gone. Writes the daemon's pid to argv[1]."""
import os
import sys
import time

if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(sys.argv[1] + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(sys.argv[1] + ".tmp", sys.argv[1])
        os.execve(sys.executable, [sys.executable, "-c", "import time; time.sleep(120)"], {})
    os._exit(0)
while not os.path.exists(sys.argv[1]):
    time.sleep(0.01)
print("left a daemon behind")
