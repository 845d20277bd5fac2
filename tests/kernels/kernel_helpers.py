"""Shared helpers of the kernel tests: where Triton runs, markers, a dtype-aware comparison."""
from __future__ import annotations

import pytest
import torch

from pflkit import kernels
from pflkit.kernels._triton_common import interpreter_usable

# CUDA when present (compiled kernels); otherwise CPU tensors through the interpreter.
DEVICE = torch.device("cuda" if torch.cuda.is_available() else "cpu")


def _triton_skip_reason() -> str | None:
    if not kernels.triton_importable():
        return "Triton is not installed"
    if DEVICE.type == "cpu" and not interpreter_usable():
        return ("no CUDA, and Triton's interpreter is unusable: triton was imported before TRITON_INTERPRET=1 "
                "was set (set it at the top of tests/conftest.py)")
    return None


_REASON = _triton_skip_reason()
requires_triton = pytest.mark.skipif(_REASON is not None, reason=_REASON or "")
requires_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (none here)")


def assert_close(actual, expected, tol, what: str, dtype=None) -> None:
    """Compare in fp32 with the tolerance of ``dtype`` (default: the actual tensor's dtype)."""
    assert (actual is None) == (expected is None), f"{what}: one side is None"
    if actual is None:
        return
    assert actual.shape == expected.shape, f"{what}: shape {tuple(actual.shape)} vs {tuple(expected.shape)}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} vs {expected.dtype}"
    torch.testing.assert_close(actual.float().cpu(), expected.float().cpu(), **tol[dtype or actual.dtype], msg=what)
