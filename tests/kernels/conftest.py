"""Kernel tests: on a machine without CUDA the Triton kernels run in Triton's CPU interpreter.

``TRITON_INTERPRET=1`` must be set before anything imports triton (Triton's own library
functions are jitted at import). Importing pflkit does not import triton, but torchvision
does, so in a full-suite run the variable is best set at the top of tests/conftest.py; here
it is set as early as this directory allows. Tests that need the interpreter skip with that
reason when triton was already imported without it (`kernel_helpers.requires_triton`).
Tolerances come from the project-wide ``tol`` fixture (tests/conftest.py).
"""
from __future__ import annotations

import os

import pytest
import torch

if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

from pflkit import kernels  # noqa: E402


@pytest.fixture(autouse=True)
def _restore_backend():
    """Each test starts and ends with the backend setting it found."""
    previous = kernels.get_backend()
    yield
    kernels.set_backend(previous)


@pytest.fixture
def triton_launches(monkeypatch) -> list[str]:
    """The names of the Triton kernels launched while the test runs, in launch order (each launch goes
    through `LazyKernel.__getitem__`, the ``kernel[grid]`` step, which is counted and then run as usual)."""
    from pflkit.kernels import _triton_common

    launches: list[str] = []
    original = _triton_common.LazyKernel.__getitem__

    def counting(self, grid):
        launches.append(self.fn.__name__)
        return original(self, grid)

    monkeypatch.setattr(_triton_common.LazyKernel, "__getitem__", counting)
    return launches
