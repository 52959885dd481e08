import ctypes

print("step 00001 | loss: 5.0", flush=True)
ctypes.string_at(0)  # read address 0: SIGSEGV in native code
