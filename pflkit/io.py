"""Atomic writes: a file is either its old version or its complete new one, never half."""
from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

import torch


def _atomic(path: str | os.PathLike, write) -> Path:
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    return path


def _default(o):
    if isinstance(o, torch.Tensor):
        return o.tolist()
    if hasattr(o, "tolist"):
        return o.tolist()
    if isinstance(o, (set, tuple)):
        return list(o)
    if isinstance(o, Path):
        return str(o)
    raise TypeError(f"not JSON serializable: {type(o).__name__}")


def write_json(path: str | os.PathLike, obj: Any) -> Path:
    """Write ``obj`` as indented JSON, atomically (non-finite floats become null)."""
    text = json.dumps(_clean(obj), indent=2, default=_default, allow_nan=False)
    return _atomic(path, lambda f: f.write(text.encode()))


def _clean(o):
    if isinstance(o, float) and (o != o or o in (float("inf"), float("-inf"))):
        return None
    if isinstance(o, dict):
        return {str(k): _clean(v) for k, v in o.items()}
    if isinstance(o, (list, tuple)):
        return [_clean(v) for v in o]
    return o


def read_json(path: str | os.PathLike) -> Any:
    with open(path) as f:
        return json.load(f)


def save_torch(path: str | os.PathLike, obj: Any) -> Path:
    """torch.save, atomically."""
    return _atomic(path, lambda f: torch.save(obj, f))


def load_torch(path: str | os.PathLike) -> Any:
    """Load a checkpoint written by `save_torch` (pflkit's own files: full unpickling)."""
    return torch.load(path, map_location="cpu", weights_only=False)
