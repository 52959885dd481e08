"""The oldest torch the default train.py runs on, and the 16-bit type a GPU trains in.

train.py normalises with ``F.rms_norm``, which torch 2.4 added: on torch 2.2 and 2.3 the
first step fails with an AttributeError, after the night has started. Nothing else it or
the harness uses is newer (``torch.amp.GradScaler("cuda")`` is 2.3, fused AdamW on a CPU
2.4, the rest 2.0), so 2.4 is the floor, checked by doctor and before a night starts.

``AUTOLOOP_TORCH_VERSION`` is for tests only (docs/gpu.md): the version read instead of the
installed one, so that a test can show the refusal on a machine with a new torch.
"""

from __future__ import annotations

import os
import re
from importlib import metadata

FLOOR = (2, 4)
VERSION_VAR = "AUTOLOOP_TORCH_VERSION"


def installed_version() -> str | None:
    """torch's version as installed (read from its metadata: importing torch takes seconds)."""
    if os.environ.get(VERSION_VAR):
        return os.environ[VERSION_VAR]
    try:
        return metadata.version("torch")
    except metadata.PackageNotFoundError:
        return None


def refusal(version: str | None) -> str | None:
    """One line when ``version`` is below the floor, else None (unknown versions pass)."""
    found = re.match(r"^(\d+)\.(\d+)", version or "")
    if found is None or (int(found[1]), int(found[2])) >= FLOOR:
        return None
    floor = ".".join(map(str, FLOOR))
    return (f"torch {version} is too old: train.py needs torch >= {floor} (F.rms_norm); upgrade it with the "
            f"CUDA build you have, e.g. pip install 'torch>={floor}' --index-url https://download.pytorch.org/whl/cu124")


def half_precision(capability: tuple[int, int]) -> str:
    """What train.py's bf16 switch trains in on a GPU of this compute capability (its half_dtype)."""
    return "bf16" if capability[0] >= 8 else "fp16 with a GradScaler (no bf16 tensor cores below sm80)"
