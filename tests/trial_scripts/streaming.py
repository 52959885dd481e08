import time

for step in range(1, 5):
    print(f"step {step:05d} ({25 * step:.1f}%) | loss: {5.0 / step:.4f}")
    time.sleep(0.3)
print("val_bpb: 1.5")
