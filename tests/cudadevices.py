"""Test-suite helper: how many CUDA devices torch sees, asked when a test's skip condition is
evaluated (at its set-up: write the condition as a string, ``skipif("cuda_devices() < 2")``),
not when its module is collected. Every pytest-xdist worker collects every module, and a
module that imported torch made each of them import it (about a second of CPU each, at the
start of the run, before any test can begin)."""
from __future__ import annotations


def cuda_devices() -> int:
    """The CUDA devices torch sees (0 without CUDA)."""
    import torch
    return torch.cuda.device_count() if torch.cuda.is_available() else 0
