"""Epochs over the training bytes: above one, val_bpb ranks memorisation, not learning.

train.py prints ``epochs:`` in its summary block, the tokens it trained on over all ranks
divided by the training split's bytes. The standard-library corpus holds about 10 MB of
them: 5 minutes on 2 CPU cores read a fraction of it, an H100 at 30-40 % MFU reads it 13-20
times. The warning names the command that fixes it: a corpus of GPU size.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

FIELD = "epochs"
FIX = "autoloop prepare --corpus climbmix, then autoloop run --corpus climbmix"


def warning(epochs: float | None) -> str | None:
    """The one-line warning for a run that read its training bytes ``epochs`` times, if any."""
    if epochs is None or not epochs > 1:
        return None
    return (f"{epochs:.1f} epochs over the training bytes: val_bpb ranks memorisation, not learning; "
            f"a larger corpus fixes it: {FIX}")


def most(metrics: Iterable[Mapping[str, float]]) -> float | None:
    """The most epochs any of the runs printed (None when none printed the figure)."""
    found = [m[FIELD] for m in metrics if isinstance(m.get(FIELD), (int, float))]
    return max(found) if found else None
