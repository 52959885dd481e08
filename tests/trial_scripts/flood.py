import sys

line = b"x" * 1023 + b"\n"
block = line * 1024  # 1 MiB
for _ in range(200):
    sys.stdout.buffer.write(block)
sys.stdout.buffer.flush()
print("val_bpb: 1.75")
