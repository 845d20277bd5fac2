"""One structural comparison for the tests that check two runs give the same numbers."""
from __future__ import annotations

import dataclasses
import math

import numpy as np
import torch


def assert_tree(a, b, path: str = "$", *, tol: dict | None = None) -> None:
    """Nested states, metrics and histories equal: the same types, dict keys in the same order, tensor
    dtypes / shapes / ``requires_grad``; values bitwise (``tol=None``; NaN equals NaN) or, for floats,
    to ``tol`` (``{"atol", "rtol"}``, e.g. ``tests.conftest.TOL[torch.float32]``)."""
    assert type(a) is type(b), f"{path}: {type(a).__name__} != {type(b).__name__}"
    if isinstance(a, torch.Tensor):
        assert a.dtype == b.dtype and a.shape == b.shape and a.requires_grad == b.requires_grad, path
        if not a.is_floating_point():
            assert torch.equal(a, b), path
        elif tol is None:
            assert torch.equal(a.isnan(), b.isnan()) and torch.equal(a.nan_to_num(), b.nan_to_num()), path
        else:
            torch.testing.assert_close(a, b, **tol, equal_nan=True, msg=path)
    elif isinstance(a, np.ndarray):
        assert a.dtype == b.dtype and a.shape == b.shape, path
        if tol is None or a.dtype.kind != "f":
            assert np.array_equal(a, b, equal_nan=a.dtype.kind == "f"), path
        else:
            np.testing.assert_allclose(a, b, **tol, equal_nan=True, err_msg=path)
    elif isinstance(a, dict):
        assert list(a) == list(b), f"{path}: keys {list(a)} != {list(b)}"
        for k in a:
            assert_tree(a[k], b[k], f"{path}[{k!r}]", tol=tol)
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), path
        for i, (x, y) in enumerate(zip(a, b)):
            assert_tree(x, y, f"{path}[{i}]", tol=tol)
    elif dataclasses.is_dataclass(a) and not isinstance(a, type):
        for f in dataclasses.fields(a):
            assert_tree(getattr(a, f.name), getattr(b, f.name), f"{path}.{f.name}", tol=tol)
    elif isinstance(a, torch.nn.Module):
        assert_tree(a.state_dict(), b.state_dict(), path, tol=tol)
    elif isinstance(a, float) and (math.isnan(a) or tol is not None):
        assert (math.isnan(a) and math.isnan(b)) or math.isclose(a, b, rel_tol=tol["rtol"], abs_tol=tol["atol"]), \
            f"{path}: {a!r} != {b!r}"
    else:
        assert a == b, f"{path}: {a!r} != {b!r}"
