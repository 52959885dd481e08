print("step 00001 | loss: 5.0")
steps = len(300)
