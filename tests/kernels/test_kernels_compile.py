"""Every Triton kernel variant compiles to a cubin for real GPUs (no GPU needed).

The interpreter checks the arithmetic; only the compiler checks that the kernels are valid
compiled Triton (types, layouts, register use). See compile_check.py; it runs in a fresh
process because an interpreted launch leaves Triton's language module patched.
"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from kernel_helpers import requires_triton

SCRIPT = Path(__file__).with_name("compile_check.py")


def _compile(*args: str) -> None:
    done = subprocess.run([sys.executable, str(SCRIPT), *args], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, (done.stdout + done.stderr)[-4000:]
    assert "0 failures" in done.stdout


@requires_triton
def test_kernels_compile_for_a100_bf16():
    """bf16 variants for sm_80: the conversions most likely to break; ~7 s cold, ~3 s cached."""
    _compile("80", "--dtypes", "bf16")


@pytest.mark.slow
@requires_triton
def test_kernels_compile_for_t4_a100_h100_all_dtypes():
    _compile("75", "80", "90", "--dtypes", "fp32,fp16,bf16")
