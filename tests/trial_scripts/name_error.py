print("step 00001 | loss: 5.0")


def make_optimizer():
    return lr * 2  # the edit renamed LR and missed this use


make_optimizer()
