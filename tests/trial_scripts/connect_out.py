"""Tries a TCP connection to 127.0.0.1:PORT (argv[1], else $AUTOLOOP_TEST_PORT) and reports it
as the metric: val_bpb 2.0 when it connected, 1.0 when it could not (--isolate works).
With a second argument, also writes that file (whose owner the test checks)."""
import os
import socket
import sys

for kind in ("net", "user"):  # which namespaces it runs in (Linux)
    if os.path.exists(f"/proc/self/ns/{kind}"):
        print(f"{kind} namespace: {os.readlink(f'/proc/self/ns/{kind}')}")
port = int(sys.argv[1] if len(sys.argv) > 1 else os.environ["AUTOLOOP_TEST_PORT"])
try:
    socket.create_connection(("127.0.0.1", port), timeout=5).close()
    print("connected")
    value = 2.0
except OSError as exc:
    print(f"could not connect: {exc}")
    value = 1.0
if len(sys.argv) > 2:
    with open(sys.argv[2], "w") as f:
        f.write("written inside the namespace\n")
print("---")
print(f"val_bpb: {value}")
