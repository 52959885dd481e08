print("step 00001 | loss: 5.0")


def schedule(:
    return 1
