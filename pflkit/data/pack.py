"""Write a dataset as one ``.npz`` file in the schema of ``data/README.md``.

``pack`` reads a dataset through its real loader (the published on-disk layout,
or a download into the cache), never through an existing npz, and writes the
arrays the loaders read back: images as uint8 (N, H, W) or (N, H, W, C), audio as
int16 clips concatenated with their offsets, labels, groups and names. A user
who downloaded a dataset once can so keep a single compact file (and copy it to
machines without internet). The write is atomic: a temporary file in the same
folder, then ``os.replace``.
"""
from __future__ import annotations

import inspect
import logging
import os
import tempfile
from pathlib import Path

import numpy as np

from .base import data_roots
from .datasets import READERS, check_options
from .sources.common import check_positive_int
from .sources.folders import decode_paths

log = logging.getLogger(__name__)

DEFAULT_PACK_SIZE = 64  # side length of images decoded from folder datasets


def packable_names() -> list[str]:
    """Datasets `pack` can write (composites such as ``digit_domains`` are built from these)."""
    return list(READERS)


def pack(name: str, root: str | Path | None = None, out_path: str | Path | None = None, *,
         download: bool = False, size: int = DEFAULT_PACK_SIZE, **options) -> Path:
    """Read ``name`` from its published layout (or a download) and write ``out_path``.

    Args:
        name: one of `packable_names()`.
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        out_path: where to write; default ``<first data root>/<name>.npz``, the
            file `load_dataset` looks for first.
        download: allow a download into the cache when no copy is found.
        size: side length for the images of the folder datasets (office_caltech10,
            domainnet, sun397), which are decoded and resized here; ignored otherwise.
        **options: reader options, e.g. ``sets`` for omniglot, ``classes`` for domainnet,
            ``partition`` for sun397.

    Returns:
        The path written.

    Raises:
        ValueError: a dataset pack cannot write.
        TypeError: an option its reader does not have.
        DatasetNotFoundError: the published files are missing and no download succeeded.
    """
    if name not in READERS:
        raise ValueError(f"cannot pack {name!r}; packable datasets: {', '.join(READERS)}")
    check_positive_int("size", size)
    reader = READERS[name]
    params = inspect.signature(reader).parameters
    check_options(name, options, [p for p in params if p not in ("roots", "download", "use_npz")])
    roots = data_roots(root)
    out = Path(out_path) if out_path is not None else roots[0] / f"{name}.npz"
    found = reader(roots, download=download, use_npz=False, **options)
    arrays = dict(found.arrays)
    for split in ("train", "test"):
        if f"paths_{split}" in arrays:
            log.info("%s: decoding %d %s images at %dx%d", name, len(arrays[f"paths_{split}"]), split, size, size)
            arrays[f"x_{split}"] = decode_paths(arrays.pop(f"paths_{split}"), size)
    write_npz(out, arrays)
    log.info("%s: wrote %s from %s", name, out, found.source)
    return out


def write_npz(path: str | Path, arrays: dict[str, np.ndarray]) -> None:
    """Atomically write a compressed npz (a reader never sees a half-written file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as f:  # a file object, so numpy does not append ".npz"
            np.savez_compressed(f, **{k: np.asarray(v) for k, v in arrays.items()})
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
