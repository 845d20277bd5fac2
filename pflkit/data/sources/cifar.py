"""CIFAR-10 and CIFAR-100 (Krizhevsky 2009) from the python pickles or an npz.

Published layout (what the python archives extract to; ``download=True`` fetches
them into the cache with their published md5, `pflkit.data.download`):
``cifar-10-batches-py/{data_batch_1..5, test_batch, batches.meta}`` and
``cifar-100-python/{train, test, meta}``. The pickles hold only lists, bytes and
numpy arrays; they are read with an unpickler that resolves no other name (`ArraysOnly`),
so a tampered file is refused instead of running code.
"""
from __future__ import annotations

import codecs
import pickle
from pathlib import Path
from typing import Sequence

import numpy as np

try:  # numpy >= 2 (numpy.core is a deprecated alias there)
    from numpy._core.multiarray import _reconstruct, scalar
except ImportError:  # numpy 1.x
    from numpy.core.multiarray import _reconstruct, scalar

from ..base import Dataset, data_roots
from ..download import fetcher
from .common import Found, first_match, has_files, names_array, records_of, resolve
from .images import arrays_dataset

CIFAR10_DIR = "cifar-10-batches-py"
CIFAR100_DIR = "cifar-100-python"
CIFAR10_TRAIN = tuple(f"data_batch_{i}" for i in range(1, 6))

CIFAR10_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")
# CIFAR-10's two-level hierarchy: the four machine classes are "vehicle", the six animals "animal".
CIFAR10_VEHICLES = ("airplane", "automobile", "ship", "truck")
CIFAR10_SUPER_NAMES = ("vehicle", "animal")

HOW_CIFAR10 = (
    "Extract cifar-10-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html into a data root so that "
    "cifar-10-batches-py/ is inside it, or put cifar10.npz (written by `pflkit data pack cifar10`) there."
)
HOW_CIFAR100 = (
    "Extract cifar-100-python.tar.gz from https://www.cs.toronto.edu/~kriz/cifar.html into a data root so that "
    "cifar-100-python/ is inside it, or put cifar100.npz (written by `pflkit data pack cifar100`) there."
)


# Every name a CIFAR pickle may refer to: numpy's array and scalar reconstruction (under the module
# names of numpy 1 and 2) and the latin-1 encoder that protocol 2 uses for bytes written by Python 3.
_ARRAY_GLOBALS = {
    **{(m, "_reconstruct"): _reconstruct for m in ("numpy.core.multiarray", "numpy._core.multiarray")},
    **{(m, "scalar"): scalar for m in ("numpy.core.multiarray", "numpy._core.multiarray")},
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): codecs.encode,
}


class RefusedGlobal(pickle.UnpicklingError):
    """A pickle named a global that `ArraysOnly` does not resolve (the message is its dotted name)."""


class ArraysOnly(pickle.Unpickler):
    """An unpickler for data files: builtin containers, bytes, numbers and numpy arrays, nothing else.

    Any other global (a class, ``os.system``, ...) raises `RefusedGlobal` before it is looked up,
    so loading the file cannot run code.
    """

    def find_class(self, module: str, name: str):
        if (module, name) not in _ARRAY_GLOBALS:
            raise RefusedGlobal(f"{module}.{name}")
        return _ARRAY_GLOBALS[(module, name)]


def _unpickle(path: Path) -> dict:
    """One CIFAR pickle with its keys as str (the files are Python 2 pickles with bytes keys)."""
    with open(path, "rb") as f:
        try:
            d = ArraysOnly(f, encoding="bytes").load()
        except RefusedGlobal as e:
            raise ValueError(f"{path}: refusing to load {e}: a CIFAR file holds only lists, bytes and numpy arrays"
                             ) from None
        except (pickle.UnpicklingError, EOFError) as e:
            raise ValueError(f"{path}: not a CIFAR python pickle ({e})") from None
    if not isinstance(d, dict):
        raise ValueError(f"{path}: a CIFAR file holds a dict, found {type(d).__name__}")
    return {k.decode() if isinstance(k, bytes) else k: v for k, v in d.items()}


def _decode(names) -> list[str]:
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def _images(d: dict) -> np.ndarray:
    """Rows of 3072 bytes (R plane, G plane, B plane) -> (N, 32, 32, 3) like the npz schema."""
    return np.asarray(d["data"], dtype=np.uint8).reshape(-1, 3, 32, 32).transpose(0, 2, 3, 1)


def _read_cifar10_folder(folder: Path) -> dict[str, np.ndarray]:
    batches = [_unpickle(folder / b) for b in CIFAR10_TRAIN]
    test = _unpickle(folder / "test_batch")
    return {
        "x_train": np.concatenate([_images(b) for b in batches]),
        "y_train": np.concatenate([np.asarray(b["labels"], np.int64) for b in batches]),
        "x_test": _images(test),
        "y_test": np.asarray(test["labels"], np.int64),
        "class_names": names_array(_decode(_unpickle(folder / "batches.meta")["label_names"])),
    }


def _read_cifar100_folder(folder: Path) -> dict[str, np.ndarray]:
    train, test, meta = (_unpickle(folder / n) for n in ("train", "test", "meta"))
    fine, coarse = np.asarray(train["fine_labels"], np.int64), np.asarray(train["coarse_labels"], np.int64)
    return {
        "x_train": _images(train), "y_train": fine,
        "x_test": _images(test), "y_test": np.asarray(test["fine_labels"], np.int64),
        "class_names": names_array(_decode(meta["fine_label_names"])),
        "superclass": _fine_to_coarse(fine, coarse, len(meta["fine_label_names"])),
        "superclass_names": names_array(_decode(meta["coarse_label_names"])),
    }


def _fine_to_coarse(fine: np.ndarray, coarse: np.ndarray, num_fine: int) -> np.ndarray:
    """The coarse label of each fine class, checked to be a function of the fine label."""
    out = np.full(num_fine, -1, dtype=np.int64)
    out[fine] = coarse
    if (out < 0).any() or not np.array_equal(out[fine], coarse):
        raise ValueError("CIFAR-100: the coarse labels are not a function of the fine labels")
    return out


def read_cifar10(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True) -> Found:
    """CIFAR-10 arrays: ``cifar10.npz``, else ``cifar10_small.npz``, else the pickles, else a download."""
    return resolve(
        "cifar10", roots, npz_files=("cifar10.npz", "cifar10_small.npz"),
        find_raw=lambda rs: first_match(rs, (CIFAR10_DIR,), has_files(*CIFAR10_TRAIN, "test_batch", "batches.meta")),
        read_raw=_read_cifar10_folder, how=HOW_CIFAR10, fetch=fetcher("cifar10"), download=download, use_npz=use_npz,
        files_of=records_of(*CIFAR10_TRAIN, "test_batch", "batches.meta"),
    )


def read_cifar100(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True) -> Found:
    """CIFAR-100 arrays: ``cifar100.npz``, else the pickles, else a download."""
    return resolve(
        "cifar100", roots, npz_files=("cifar100.npz",),
        find_raw=lambda rs: first_match(rs, (CIFAR100_DIR,), has_files("train", "test", "meta")),
        read_raw=_read_cifar100_folder, how=HOW_CIFAR100, fetch=fetcher("cifar100"), download=download,
        use_npz=use_npz, files_of=records_of("train", "test", "meta"),
    )


def load_cifar10(root=None, *, download: bool = False) -> Dataset:
    """CIFAR-10 as uint8 (N, 3, 32, 32); superclass vehicle (0) / animal (1).

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: download the archive into the cache when no copy is found.
    """
    found = read_cifar10(data_roots(root), download=download)
    classes = _decode(found.arrays.get("class_names", CIFAR10_CLASSES))
    superclass = [0 if c in CIFAR10_VEHICLES else 1 for c in classes]
    return arrays_dataset("cifar10", found, classes, superclass=superclass, superclass_names=CIFAR10_SUPER_NAMES)


def load_cifar100(root=None, *, download: bool = False) -> Dataset:
    """CIFAR-100 as uint8 (N, 3, 32, 32): y = fine label, ``meta.superclass`` = its coarse label.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: download the archive into the cache when no copy is found.
    """
    found = read_cifar100(data_roots(root), download=download)
    a = found.arrays
    classes = _decode(a["class_names"]) if "class_names" in a else [str(i) for i in range(100)]
    has_super = "superclass" in a and "superclass_names" in a
    return arrays_dataset("cifar100", found, classes, superclass=a["superclass"] if has_super else None,
                          superclass_names=_decode(a["superclass_names"]) if has_super else None)
