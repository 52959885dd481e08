import time

held = []
for _ in range(40):  # up to 1 GiB, 25 MiB at a time, all pages touched
    held.append(b"x" * (25 * 2**20))
    time.sleep(0.02)
print("allocated 1 GiB and nobody stopped me")
