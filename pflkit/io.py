"""Files of a run: atomic writes, checkpoints that never execute code, one run per folder.

A file is either its old version or its complete new one, never half (written to a unique
temporary name, then renamed). Checkpoints are read with ``weights_only=True``: tensors, dicts,
lists and numbers only, so a crafted file in an output folder cannot run code. An output
folder is locked for the lifetime of the run that writes it. And what a long loop shows while it works: one
progress bar (`progress_bar`).
"""
from __future__ import annotations

import contextlib
import importlib.util
import json
import os
import pickle
import re
import socket
import tempfile
from pathlib import Path
from typing import Any, Iterator

import torch

TMP_SUFFIX = ".tmp"
LOCK_NAME = ".pflkit.lock"


class CheckpointError(ValueError):
    """A checkpoint or weights file that pflkit refuses to load (not tensors / plain containers)."""


class FolderLockedError(RuntimeError):
    """Another run holds the output folder."""


def atomic_write(path: str | os.PathLike, write) -> Path:
    """Call ``write(binary_file)`` on a unique temporary file, then rename it to ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=TMP_SUFFIX, dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; results are for sharing
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
    return atomic_write(path, lambda f: f.write(text.encode()))


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
    return atomic_write(path, lambda f: torch.save(obj, f))


def load_torch(path: str | os.PathLike) -> Any:
    """Load a checkpoint written by `save_torch`, refusing anything but tensors and plain containers.

    ``weights_only=True``: a file holding other objects (a crafted pickle with a payload, say)
    fails closed with a `CheckpointError` naming the file; nothing in it runs.
    """
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except (pickle.UnpicklingError, RuntimeError, AttributeError, EOFError) as e:
        reason = " ".join(str(e).split())[:200]
        raise CheckpointError(f"{path}: refusing to load: not a pflkit checkpoint of tensors and plain values "
                              f"({type(e).__name__}: {reason}); delete it, or start over with --overwrite") from None


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def remove_orphans(folder: str | os.PathLike) -> list[Path]:
    """Delete temporary files left by a killed writer (``.NAME.XXXX.tmp``) under ``folder``.

    Call it only while holding the folder's lock, so no live writer owns them.
    """
    gone = []
    for p in Path(folder).rglob(f".*{TMP_SUFFIX}"):
        if p.is_file():
            p.unlink(missing_ok=True)
            gone.append(p)
    return gone


@contextlib.contextmanager
def locked_folder(folder: str | os.PathLike) -> Iterator[Path]:
    """Hold an exclusive lock on ``folder`` for the block (created if missing).

    The lock is an OS file lock (``flock``): the kernel releases it when the process dies, even by
    ``kill -9``, so a stopped run never leaves a stale lock. A second run into the same folder
    gets a `FolderLockedError` naming the holder.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / LOCK_NAME
    f = open(path, "a+")
    try:
        try:
            import fcntl
        except ImportError:  # pragma: no cover - Windows: no locking
            fcntl = None
        if fcntl is not None:
            try:
                fcntl.flock(f.fileno(), fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                f.seek(0)
                holder = f.read().strip() or "another process"
                raise FolderLockedError(f"{folder} is in use by another pflkit run ({holder}); wait for it "
                                        "to finish or choose another --out") from None
        f.seek(0)
        f.truncate()
        f.write(f"pid {os.getpid()} on {socket.gethostname()}")
        f.flush()
        yield folder
    finally:
        f.close()


def slug(label: str) -> str:
    """A file-name-safe form of a method label: 'FT (BN C)' -> 'ft-bn-c'."""
    return re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-") or "method"


def _bar_class():
    """tqdm's widget bar in a notebook kernel that has ipywidgets (``tqdm.auto`` decides), its text bar elsewhere.

    ``tqdm.auto`` inside a kernel without ipywidgets (a plain ``pip install pflkit[dev]``, a bare JupyterLab)
    warns on stderr when imported; a notebook that only redraws committed results must leave no stderr, so
    ``tqdm.auto`` is imported only where ipywidgets can be.
    """
    if importlib.util.find_spec("ipywidgets") is not None:
        from tqdm.auto import tqdm
    else:
        from tqdm.std import tqdm
    return tqdm


def progress_bar(*args, **kwargs):
    """The progress bar every long loop uses: ``tqdm(*args, **kwargs)`` of the class `_bar_class` picks."""
    return _bar_class()(*args, **kwargs)
