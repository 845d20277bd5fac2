"""Shared test settings: one thread per worker, the offline data folder, tolerances."""
from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
# Triton's interpreter runs the kernels on CPU tensors; it must be switched on before anything
# (torchvision does) imports triton, so it is set here rather than in tests/kernels/
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

# one place for numerical tolerances, by dtype
TOL = {
    torch.float64: {"atol": 1e-10, "rtol": 1e-8},
    torch.float32: {"atol": 1e-5, "rtol": 1e-4},
    torch.float16: {"atol": 2e-2, "rtol": 2e-2},
    torch.bfloat16: {"atol": 5e-2, "rtol": 5e-2},
}


# tests never reach the network: a missing dataset is an error, not a download attempt
os.environ.setdefault("PFLKIT_OFFLINE", "1")


# read once at start-up: tests that isolate themselves from data roots unset the variable
_SHARED = os.environ.get("PFLKIT_DATA")


def shared_data_dir() -> Path | None:
    """The folder of real offline datasets the tests may use: ``$PFLKIT_DATA`` (CI sets it), else None."""
    return Path(_SHARED) if _SHARED else None


@pytest.fixture
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None or not path.is_dir():
        pytest.skip(f"no offline data folder: set $PFLKIT_DATA (now {path})")
    return path


@pytest.fixture
def tol():
    return TOL
