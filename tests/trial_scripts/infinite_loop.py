print("step 00001 | loss: 5.0", flush=True)
step = 0
while True:  # the edit broke the loop's exit condition
    step += 1
