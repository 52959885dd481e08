print("step 00001 | loss: 5.0")
lr = 0.1
    warmup = 10
