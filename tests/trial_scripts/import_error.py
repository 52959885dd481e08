print("step 00001 | loss: 5.0")
import autoloop_no_such_module  # noqa: E402,F401
