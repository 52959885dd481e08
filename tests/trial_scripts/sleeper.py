import time

print("ready", flush=True)
time.sleep(60)
