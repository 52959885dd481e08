"""Leaves a daemon behind: fork, setsid, fork again; the grandchild writes its pid to
argv[1] and would sleep a minute after this script has exited."""
import os
import sys
import time

pid_file = sys.argv[1]
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        with open(pid_file + ".tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace(pid_file + ".tmp", pid_file)
        time.sleep(60)
    os._exit(0)
while not os.path.exists(pid_file):
    time.sleep(0.01)
print("val_bpb: 1.5")
