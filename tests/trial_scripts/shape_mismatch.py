import torch

print("step 00001 | loss: 5.0")
x = torch.ones(4, 3)
head = torch.nn.Linear(5, 6)  # the edit changed the width on one side only
head(x)
