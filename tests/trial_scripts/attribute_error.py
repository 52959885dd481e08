import math

print("step 00001 | loss: 5.0")
print(math.tau2)
