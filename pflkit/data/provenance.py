"""What a dataset was read from: path, size and sha256 of every file (``DatasetMeta.files``).

A result is only reproducible if one can tell which bytes it was computed from, so
every loader records the files it read. Large folders of images or clips are
recorded as one entry (count, total size and the sha256 of their sorted listing of
relative paths and sizes) rather than hashing every image at each load.
Digests are memoized per process on (path, size, mtime), so loading the same
file twice hashes it once. `dataset_record` is what a run's results.json says about
each dataset it read (the clients' data and, when the pretraining stage has its own,
the pretraining data); `weights_record` the same for a file of model weights.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
from pathlib import Path
from typing import Iterable

log = logging.getLogger(__name__)

CHUNK = 1 << 20
NOTE_NAME = ".pflkit-download.json"  # written by pflkit.data.download beside what it installed

_digests: dict[tuple[str, int, int], str] = {}


def sha256_file(path: str | os.PathLike) -> str:
    """Hex sha256 of a file's bytes (memoized on path, size and modification time)."""
    path = Path(path)
    st = path.stat()
    key = (str(path.absolute()), st.st_size, st.st_mtime_ns)
    if key not in _digests:
        h = hashlib.sha256()
        with open(path, "rb") as f:
            for block in iter(lambda: f.read(CHUNK), b""):
                h.update(block)
        _digests[key] = h.hexdigest()
    return _digests[key]


def file_record(path: str | os.PathLike) -> dict:
    """``{"path": absolute path, "bytes": size, "sha256": digest}`` of one file read."""
    path = Path(path).absolute()
    return {"path": str(path), "bytes": path.stat().st_size, "sha256": sha256_file(path)}


def folder_record(folder: str | os.PathLike, suffixes: Iterable[str] | None = None) -> dict:
    """One entry for a folder of many files (recursively), optionally only those with ``suffixes``.

    Returns ``{"path", "files": count, "bytes": total, "sha256"}`` where the digest is
    the sha256 of the sorted lines ``relative/path<TAB>size<NEWLINE>``: it changes when a
    file is added, removed, renamed or changes size (not when bytes change in place).
    """
    folder = Path(folder).absolute()
    wanted = None if suffixes is None else {s.lower() for s in suffixes}
    entries = []
    for dirpath, _, names in os.walk(folder):
        for n in names:
            if n == NOTE_NAME or (wanted is not None and Path(n).suffix.lower() not in wanted):
                continue
            p = Path(dirpath) / n
            entries.append((p.relative_to(folder).as_posix(), p.stat().st_size))
    entries.sort()
    listing = "".join(f"{rel}\t{size}\n" for rel, size in entries)
    return {"path": str(folder), "files": len(entries), "bytes": sum(s for _, s in entries),
            "sha256": hashlib.sha256(listing.encode()).hexdigest()}


def read_note(folder: str | os.PathLike, levels: int = 2) -> dict | None:
    """The download note in ``folder`` or one of its ``levels - 1`` parents, or None."""
    folder = Path(folder)
    for p in [folder, *folder.parents][:levels]:
        note = p / NOTE_NAME
        if note.is_file():
            try:
                return json.loads(note.read_text())
            except (OSError, ValueError) as exc:
                log.warning("ignoring unreadable download note %s (%s)", note, exc)
                return None
    return None


def dataset_record(dataset) -> dict:
    """What a loaded dataset was read from: ``{"name", "source", "files", "download"}``.

    ``files`` are the loader's own records (`file_record` / `folder_record`); ``download``
    the note of a pflkit download, or None.
    """
    meta = dataset.meta
    return {"name": meta.name, "source": meta.source, "files": [dict(f) for f in meta.files],
            "download": meta.download}


def weights_record(path: str | os.PathLike, what: str) -> dict:
    """``{"what", "path", "bytes", "sha256"}`` of a file of model weights a run started from."""
    return {"what": what, **file_record(path)}
