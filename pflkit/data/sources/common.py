"""Helpers shared by every dataset source: lookup, npz reading, downloads, splits, option checks.

Every source reads its dataset into plain numpy arrays in the ``.npz`` schema of
``data/README.md`` (a `Found`); the loaders then turn those arrays into a
`pflkit.data.base.Dataset`. Keeping the arrays as the one intermediate form
means an ``.npz`` file, the published on-disk format and a fresh download all
go through the same builder, and `pflkit.data.pack` can write any of them. Image tensors and
the `Dataset` built from them are `pflkit.data.sources.images`'.
"""
from __future__ import annotations

import logging
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Sequence

import numpy as np

from ..base import ENV_OFFLINE, DatasetNotFoundError, cache_dir, offline
from ..provenance import file_record, folder_record, read_note

log = logging.getLogger(__name__)

@dataclass
class Found:
    """Arrays of one dataset in its ``.npz`` schema, and where they came from.

    Attributes:
        arrays: the arrays, in the npz schema of ``data/README.md``.
        source: a path (``meta.source``), ``" (subset)"`` appended for subset npz files.
        files: provenance records of the files read (`pflkit.data.provenance`).
        download: the download note when the files came from a pflkit download, else None.
    """

    arrays: dict[str, np.ndarray]
    source: str
    files: tuple[dict, ...] = ()
    download: dict | None = None


def find_npz(roots: Sequence[Path], files: Sequence[str]) -> tuple[Path | None, list[Path]]:
    """The first existing ``root / file``, trying every root for a file before the next file.

    ``files`` lists the full file before its subset, so among these roots a full
    copy anywhere wins over a subset.
    """
    searched = []
    for name in files:
        for root in roots:
            path = Path(root) / name
            searched.append(path)
            if path.is_file():
                return path, searched
    return None, searched


def root_groups(roots: Sequence[Path]) -> list[list[Path]]:
    """Roots searched as units: the explicit root alone (`DataRoots.explicit`), then the others together."""
    explicit = getattr(roots, "explicit", None)
    if explicit is None:
        return [list(roots)]
    return [[explicit], [r for r in roots if r != explicit]]


def read_npz(path: Path) -> dict[str, np.ndarray]:
    """All arrays of an ``.npz`` file, loaded eagerly and without pickles."""
    with np.load(path, allow_pickle=False) as z:
        return {k: z[k] for k in z.files}


def npz_source(path: Path) -> str:
    """``meta.source`` for an npz file; subsets (``*_small.npz``) say so."""
    return f"{path} (subset)" if path.name.endswith("_small.npz") else str(path)


def first_match(
    roots: Sequence[Path], relpaths: Sequence[str], ok: Callable[[Path], bool]
) -> tuple[Path | None, list[Path]]:
    """The first ``root / rel`` for which ``ok`` holds, and every candidate tried."""
    searched = []
    for root in roots:
        for rel in relpaths:
            path = Path(root) / rel
            searched.append(path)
            if ok(path):
                return path, searched
    return None, searched


def has_files(*names: str) -> Callable[[Path], bool]:
    """A predicate: the folder holds every one of ``names``."""
    return lambda p: p.is_dir() and all((p / n).exists() for n in names)


def records_of(*names: str) -> Callable[[Path], list[dict]]:
    """``folder -> provenance records`` of the named files inside it."""
    return lambda folder: [file_record(folder / n) for n in names]


def locate(roots, npz_files, find_raw, use_npz) -> tuple[str | None, Path | None, list[Path]]:
    """Where a dataset is: ``("npz" | "raw" | None, path, every path searched)``.

    The explicit root (``--data-root``) is searched completely first, full npz, subset
    npz, then the published layout; then the other roots, full npz anywhere before a
    subset anywhere, then the layouts.
    """
    searched: list[Path] = []
    for group in root_groups(roots):
        if use_npz:
            path, tried = find_npz(group, npz_files)
            searched += tried
            if path is not None:
                return "npz", path, searched
        folder, tried = find_raw(group)
        searched += tried
        if folder is not None:
            return "raw", folder, searched
    return None, None, searched


def resolve(
    name: str,
    roots: Sequence[Path],
    *,
    npz_files: Sequence[str],
    find_raw: Callable[[Sequence[Path]], tuple[Path | None, list[Path]]],
    read_raw: Callable[[Path], dict[str, np.ndarray]],
    how: str,
    fetch: Callable[[Path], Path] | None = None,
    download: bool = False,
    use_npz: bool = True,
    files_of: Callable[[Path], list[dict]] | None = None,
) -> Found:
    """Find a dataset: an npz or the published layout in a root (`locate`), else a download.

    Args:
        name: registry name, used in error messages.
        roots: folders to search, in order (see `pflkit.data.base.data_roots`).
        npz_files: npz file names to look for, full dataset first.
        find_raw: ``roots -> (folder or None, searched paths)`` for the published layout.
        read_raw: ``folder -> arrays`` in the npz schema.
        how: how a user obtains the dataset by hand (goes into the error message).
        fetch: ``cache -> folder``, downloads into the cache (`pflkit.data.download.fetcher`),
            or None if pflkit cannot download the dataset.
        download: whether to call ``fetch`` when nothing is found.
        use_npz: False when packing, so the real loader is used.
        files_of: ``folder -> provenance records`` of what ``read_raw`` reads; default one
            `folder_record` for the whole folder.

    Raises:
        DatasetNotFoundError: nothing found and no successful download (also when
            ``$PFLKIT_OFFLINE`` forbids downloading).
        pflkit.data.download.ChecksumError: a downloaded file is corrupt (one line, not wrapped).
    """
    kind, path, searched = locate(roots, npz_files, find_raw, use_npz)
    if kind == "npz":
        return read_npz_found(name, path)
    if kind is None:
        if not download:
            raise DatasetNotFoundError(name, searched, f"{how} {download_hint(name, fetch)}")
        path = _download(name, searched, how, fetch, find_raw)
    log.info("%s: reading %s", name, path)
    try:
        arrays = read_raw(path)
    except FileNotFoundError as exc:  # a file the layout lists is missing: the copy is incomplete
        raise DatasetNotFoundError(name, [path], f"{path} is incomplete ({exc}). {how}") from exc
    files = files_of(path) if files_of is not None else [folder_record(path)]
    return Found(arrays, str(path), tuple(files), read_note(path))


def read_npz_found(name: str, path: Path) -> Found:
    """A `Found` from an npz file, with its provenance record."""
    log.info("%s: reading %s", name, path)
    try:
        arrays = read_npz(path)
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise ValueError(f"{name}: {path} is not a readable npz file ({type(exc).__name__}: {exc})") from exc
    return Found(arrays, npz_source(path), (file_record(path),))


def download_hint(name: str, fetch) -> str:
    """The sentence of a not-found error that says whether and how pflkit downloads ``name``."""
    if fetch is None:
        return f"pflkit cannot download {name!r} automatically."
    return (f"Or let pflkit download it into the cache {cache_dir()}: load_dataset({name!r}, download=True), "
            f"`--download` on the CLI (the notebooks download by default; {ENV_OFFLINE}=1 forbids it).")


def _download(name, searched, how, fetch, find_raw) -> Path:
    """Run ``fetch`` into the cache; a failure other than a checksum mismatch becomes a DatasetNotFoundError."""
    from ..download import ChecksumError  # imported here: download.py imports base, not sources

    if fetch is None:
        raise DatasetNotFoundError(name, searched, f"pflkit cannot download {name!r} automatically. {how}")
    target = cache_dir()
    if offline():
        raise DatasetNotFoundError(
            name, searched, f"downloads are disabled ({ENV_OFFLINE}=1), so no download into {target} was tried. {how}")
    try:
        fetch(target)
    except ChecksumError:
        raise
    except Exception as exc:  # URLError, IncompleteDownload, OSError, a bad archive, ...
        reason = " ".join(str(exc).split())[:300]
        raise DatasetNotFoundError(
            name, searched, f"the download into {target} failed ({type(exc).__name__}: {reason}). {how}"
        ) from exc
    folder, _ = find_raw([target])
    if folder is None:
        raise DatasetNotFoundError(name, searched, f"the download into {target} left no usable files. {how}")
    return folder


# ---------------------------------------------------------------- splits and checks


def stratified_split(y: np.ndarray, test_fraction: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """Sorted train / test positions holding out ``test_fraction`` of every class.

    Uses numpy's own generator (not scikit-learn's splitter) so the split does
    not change with the scikit-learn version.
    """
    check_fraction("test_fraction", test_fraction)
    y = np.asarray(y)
    rng = np.random.default_rng(seed)
    test = [rng.permutation(np.flatnonzero(y == c))[: int(round(np.sum(y == c) * test_fraction))] for c in np.unique(y)]
    test_idx = np.sort(np.concatenate(test)) if test else np.zeros(0, np.int64)
    train_idx = np.setdiff1d(np.arange(len(y)), test_idx)
    return train_idx.astype(np.int64), test_idx.astype(np.int64)


def check_fraction(key: str, value: float) -> None:
    if not isinstance(value, (int, float)) or not 0.0 <= float(value) < 1.0:
        raise ValueError(f"{key} must be a number in [0, 1), got {value!r}")


def check_positive_int(key: str, value, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < 1:
        raise ValueError(f"{key} must be a positive integer{' or None' if allow_none else ''}, got {value!r}")


def check_choice(key: str, value, choices: Iterable) -> None:
    choices = tuple(choices)
    if value not in choices:
        raise ValueError(f"{key} must be one of {choices}, got {value!r}")


def check_subset(key: str, values, known: Sequence[str]) -> tuple[str, ...]:
    """``values`` as a tuple after checking every entry is in ``known``."""
    if isinstance(values, str):
        values = (values,)
    values = tuple(values)
    bad = [v for v in values if v not in known]
    if bad or not values:
        raise ValueError(f"{key} must be a non-empty subset of {tuple(known)}, got {values!r}")
    return values


def names_array(names: Iterable[str]) -> np.ndarray:
    """A unicode array of names (what npz files can hold without pickles)."""
    return np.asarray([str(n) for n in names], dtype=np.str_)


def digit_names() -> np.ndarray:
    return names_array(str(i) for i in range(10))


def provenance(found: Found) -> dict:
    """``source``, ``files`` and ``download`` keyword arguments for `image_dataset` from a `Found`."""
    return {"source": found.source, "files": found.files, "download": found.download}


def check_labels(name: str, source: str, num_classes: int, **labels_by_split) -> None:
    """ValueError naming ``source`` when a label array holds a value outside ``[0, num_classes)``."""
    for key, y in labels_by_split.items():
        y = np.asarray(y)
        if y.size == 0:
            continue
        if not np.issubdtype(y.dtype, np.integer):
            raise ValueError(f"{name}: {source}: {key} must hold integer labels, got dtype {y.dtype}")
        lo, hi = int(y.min()), int(y.max())
        if lo < 0 or hi >= num_classes:
            bad = lo if lo < 0 else hi
            raise ValueError(f"{name}: {source}: {key} holds label {bad}, outside [0, {num_classes}) "
                             f"for {num_classes} classes")
