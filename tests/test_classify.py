"""classify() on log tails that cannot be produced on a CPU-only machine (CUDA messages, in
the formats of torch's own sources: c10/cuda/CUDACachingAllocator.cpp, CUDAException.cpp,
CUDAMiscFunctions.cpp), chained tracebacks, and the harness's own end states."""

from __future__ import annotations

from pathlib import Path

import pytest

from autoloop.core.classify import RULES, classify
from autoloop.execution.runner import RunOutcome


def failed(log_tail: str, exit_code: int | None = 1, signal: int | None = None, **fields) -> RunOutcome:
    return RunOutcome(exit_code=exit_code, signal=signal, log_tail=log_tail, log_path=Path("x.log"), **fields)


FRAMES = '''\
Traceback (most recent call last):
  File "/ws/train.py", line 352, in <module>
    main()
  File "/ws/train.py", line 311, in main
    loss = step_fn(x, y)
           ^^^^^^^^^^^^^
  File "/venv/lib/python3.11/site-packages/torch/nn/modules/module.py", line 1775, in _call_impl
    return forward_call(*args, **kwargs)
'''

# The allocator's message since torch 2.1 (CUDACachingAllocator.cpp, TORCH_CHECK_WITH(OutOfMemoryError, ...)).
CUDA_OOM = FRAMES + (
    "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB. GPU 0 has a total capacity of "
    "139.72 GiB of which 1.06 GiB is free. Including non-PyTorch memory, this process has 138.64 GiB memory in "
    "use. Of the allocated memory 136.10 GiB is allocated by PyTorch, and 1.98 GiB is reserved by PyTorch but "
    "unallocated. If reserved but unallocated memory is large try setting "
    "PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid fragmentation.  See documentation for Memory "
    "Management  (https://docs.pytorch.org/docs/stable/notes/cuda.html"
    "#optimizing-memory-usage-with-pytorch-cuda-alloc-conf)\n")

# c10_cuda_check_implementation: "CUDA error: " + cudaGetErrorString, the help line, the async suffix, DSA info.
ILLEGAL_ACCESS_MESSAGE = (
    "CUDA error: an illegal memory access was encountered\n"
    "Search for `cudaErrorIllegalAddress' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html"
    " for more information.\n"
    "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace below might be "
    "incorrect.\n"
    "For debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
    "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")


@pytest.mark.parametrize("log_tail, reason", [
    (CUDA_OOM, "CUDA out of memory (tried to allocate 2.00 GiB) (train.py:311)"),
    # The format before torch 2.1, as a RuntimeError.
    (FRAMES + "RuntimeError: CUDA out of memory. Tried to allocate 20.00 MiB (GPU 0; 7.93 GiB total capacity; "
              "130.35 MiB already allocated; 47.06 MiB free; 188.00 MiB reserved in total by PyTorch)\n",
     "CUDA out of memory (tried to allocate 20.00 MiB) (train.py:311)"),
    (FRAMES + "torch.AcceleratorError: " + ILLEGAL_ACCESS_MESSAGE,
     "CUDA error: an illegal memory access was encountered (train.py:311)"),
    (FRAMES + "RuntimeError: " + ILLEGAL_ACCESS_MESSAGE,
     "CUDA error: an illegal memory access was encountered (train.py:311)"),
    ("/pytorch/aten/src/ATen/native/cuda/IndexKernel.cu:92: operator(): block: [0,0,0], thread: [0,0,0] "
     "Assertion `-sizes[i] <= index && index < sizes[i] && \"index out of bounds\"` failed.\n" + FRAMES
     + "torch.AcceleratorError: CUDA error: device-side assert triggered\n"
       "Search for `cudaErrorAssert' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES.html"
       " for more information.\n",
     "CUDA error: device-side assert triggered (train.py:311)"),
    (FRAMES + "torch.AcceleratorError: CUDA error: unspecified launch failure\n",
     "CUDA error: unspecified launch failure (train.py:311)"),
    (FRAMES + "RuntimeError: [enforce fail at alloc_cpu.cpp:127] err == 0. DefaultCPUAllocator: can't allocate "
              "memory: you tried to allocate 40000000000000 bytes. Error code 12 (Cannot allocate memory)\n",
     "host out of memory (tried to allocate 40000000000000 bytes) (train.py:311)"),
    (FRAMES + "MemoryError\n", "out of memory: MemoryError (train.py:311)"),
    ("step 00012 | loss: 4.1\nFAIL: loss exploded to 13.100 at step 12 (started at 4.300)\n",
     "FAIL: loss exploded to 13.100 at step 12 (started at 4.300)"),
])
def test_device_and_divergence_failures_are_fundamental(log_tail, reason):
    assert classify(failed(log_tail)) == ("fundamental", reason)


def test_cpp_abort_with_cuda_error_names_the_cuda_error():
    tail = ("[W CUDAGuardImpl.h:119] Warning: CUDA warning: an illegal memory access was encountered\n"
            "terminate called after throwing an instance of 'c10::Error'\n"
            "  what():  " + ILLEGAL_ACCESS_MESSAGE)
    assert classify(failed(tail, exit_code=None, signal=6)) == (
        "fundamental", "CUDA error: an illegal memory access was encountered")


def test_the_final_exception_of_a_chain_wins():
    oom_then_typo = (CUDA_OOM + "\nDuring handling of the above exception, another exception occurred:\n\n"
                     + FRAMES.replace("line 311", "line 315") + "NameError: name 'batch_sz' is not defined\n")
    assert classify(failed(oom_then_typo)) == ("trivial", "NameError: name 'batch_sz' is not defined (train.py:315)")

    typo_then_oom = (FRAMES + "KeyError: 'lr'\n\nThe above exception was the direct cause of the following "
                     "exception:\n\n" + CUDA_OOM)
    assert classify(failed(typo_then_oom)).reason.startswith("CUDA out of memory")


def test_fail_line_and_traceback_the_later_one_wins():
    printed_then_fail = (FRAMES + "ValueError: printed by a handler that carried on\n"
                         "step 00040 | loss: nan\nFAIL: loss is nan at step 40\n")
    assert classify(failed(printed_then_fail)) == ("fundamental", "FAIL: loss is nan at step 40")
    fail_then_crash = "FAIL: not really\n" + FRAMES + "NameError: name 'x' is not defined\n"
    assert classify(failed(fail_then_crash)) == ("trivial", "NameError: name 'x' is not defined (train.py:311)")


def test_shape_mismatch_under_torch_compile_is_trivial():
    tail = FRAMES + ("torch._dynamo.exc.TorchRuntimeError: Dynamo failed to run FX node with fake tensors: "
                     "call_function <built-in method matmul>(*(FakeTensor(..., size=(16, 256, 128)), "
                     "FakeTensor(..., size=(96, 128))), **{}): got RuntimeError('a and b must have same reduction "
                     "dim, but got [4096, 128] X [96, 128].')\n")
    verdict = classify(failed(tail))
    assert verdict.kind == "trivial"
    assert verdict.reason.startswith("shape mismatch: torch._dynamo.exc.TorchRuntimeError")
    assert verdict.reason.endswith("...") and len(verdict.reason) == 200


@pytest.mark.parametrize("exception", [
    "ValueError: not enough values to unpack (expected 3, got 2)",
    "IndexError: index out of range in self",
    "KeyError: 'embed'",
    "AssertionError",
    "ZeroDivisionError: division by zero",
    "UnboundLocalError: cannot access local variable 'lr' where it is not associated with a value",
    "einops.EinopsError: Error while processing rearrange-reduction pattern \"b t (h d) -> b h t d\".",
    "RuntimeError: The size of tensor a (128) must match the size of tensor b (64) at non-singleton dimension 2",
    "RuntimeError: shape '[16, 256, 4, 32]' is invalid for input of size 262144",
    "RuntimeError: Expected all tensors to be on the same device, but found at least two devices, cuda:0 and cpu!",
])
def test_bugs_in_the_edit_are_trivial(exception):
    verdict = classify(failed(FRAMES + exception + "\n"))
    assert verdict.kind == "trivial" and exception.split(": ")[0] in verdict.reason
    assert verdict.reason.endswith("(train.py:311)")


def test_syntax_error_of_the_main_script_has_no_traceback_header():
    tail = '  File "/ws/train.py", line 40\n    DEPTH = = 4\n            ^\nSyntaxError: invalid syntax\n'
    assert classify(failed(tail)) == ("trivial", "SyntaxError: invalid syntax (train.py:40)")


@pytest.mark.parametrize("exit_code, signal, reason", [
    (None, 7, "killed by SIGBUS"),
    (None, 4, "killed by SIGILL"),
    (None, 9, "killed by SIGKILL (likely the host out-of-memory killer)"),
    (139, None, "killed by SIGSEGV (exit 139)"),  # a wrapper such as `uv run` or a shell
])
def test_signals_are_fundamental(exit_code, signal, reason):
    assert classify(failed("step 00001 | loss: 5.0\n", exit_code=exit_code, signal=signal)) == ("fundamental", reason)


@pytest.mark.parametrize("log_tail, reason", [
    (FRAMES + "RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED\n",
     "unclassified: RuntimeError: cuDNN error: CUDNN_STATUS_EXECUTION_FAILED"),
    ("step 00001 | loss: 5.0\nsomething odd happened\n[autoloop] a note of the runner\n",
     "unclassified: something odd happened"),
    ("", "unclassified: exit code 3 with no output"),
])
def test_unknown_failures_are_fundamental_and_unclassified(log_tail, reason):
    assert classify(failed(log_tail, exit_code=3)) == ("fundamental", reason)


def test_the_harness_end_states():
    base = {"log_path": Path("x.log"), "log_tail": FRAMES + "NameError: name 'x' is not defined\n"}
    assert classify(RunOutcome(signal=15, timed_out=True, killed_reason="timeout", timeout_s=600, **base)) == (
        "timeout", "hard timeout 600 s exceeded")
    assert classify(RunOutcome(signal=15, killed_reason="max_rss", max_rss_gb=4.0, peak_rss_mb=4200, **base)) == (
        "fundamental", "host memory cap 4.0 GiB exceeded (peak 4.10 GiB)")
    # A stop request outranks a timeout that happened to expire while stopping.
    assert classify(RunOutcome(signal=15, timed_out=True, killed_reason="stopped", **base)) == (
        "fundamental", "interrupted")


def test_exit_zero_is_judged_by_the_metric():
    base = {"exit_code": 0, "log_path": Path("x.log"), "log_tail": "---\nval_bpb: 1.1\n"}
    assert classify(RunOutcome(metric=1.1, **base)) == ("ok", "val_bpb 1.100000")
    assert classify(RunOutcome(**base)) == ("trivial", "no val_bpb reported")
    assert classify(RunOutcome(metric_name="loss", **base)) == ("trivial", "no loss reported")
    assert classify(RunOutcome(metric_error="val_bpb is nan", **base)) == ("fundamental", "val_bpb is nan")


def test_the_table_is_data():
    kinds = {rule.kind for rule in RULES}
    assert kinds == {"ok", "trivial", "fundamental", "timeout"}
    assert RULES[-1].reason.startswith("unclassified")
