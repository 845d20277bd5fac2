"""MNIST, USPS and MNIST-M: handwritten digits in three styles (one label space).

Published layouts searched in each data root:

* MNIST: torchvision's ``MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (each file
  may also be the ``.gz`` original), the idx format of LeCun et al.
* USPS: the LIBSVM bz2 files ``usps.bz2`` and ``usps.t.bz2`` (torchvision's layout, also
  accepted inside ``usps/``): one line per image, ``label index:value ...``, labels 1..10,
  values in [-1, 1].
* MNIST-M (Ganin et al., 2016): ``mnist_m/mnist_m_{train,test}/*.png`` (32x32 RGB) with
  ``mnist_m/mnist_m_{train,test}_labels.txt`` lines ``00000000.png 5`` (the DANN authors'
  tarball), or the public re-release that ``download=True`` fetches (github.com/liyxi/mnist-m,
  28x28 RGB, 60,000 / 10,000): ``MNISTM/processed/mnist_m_{train,test}.pt``, each a pair
  (uint8 images (N, 28, 28, 3), int64 labels) read with ``torch.load(weights_only=True)``.
  Not in torchvision.

``download=True`` goes through `pflkit.data.download` (published md5 checked, atomic install).
"""
from __future__ import annotations

import bz2
import gzip
import struct
from pathlib import Path
from typing import Sequence

import numpy as np

from ..base import Dataset, data_roots
from ..download import fetcher
from ..provenance import file_record, folder_record
from .common import Found, digit_names, first_match, has_files, records_of, resolve
from .images import open_image, simple_image_dataset

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
USPS_FILES = ("usps.bz2", "usps.t.bz2")
MNIST_M_FILES = ("mnist_m_train", "mnist_m_train_labels.txt", "mnist_m_test", "mnist_m_test_labels.txt")
MNIST_M_PT = ("mnist_m_train.pt", "mnist_m_test.pt")

# idx type codes -> big-endian numpy dtypes
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

HOW_MNIST = (
    "Put the four idx files from http://yann.lecun.com/exdb/mnist/ (gzipped or not) into <data root>/MNIST/raw/, "
    "or put mnist.npz there."
)
HOW_USPS = (
    "Put usps.bz2 and usps.t.bz2 from https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass.html#usps "
    "into a data root, or put usps.npz there."
)
HOW_MNIST_M = (
    "Extract the DANN authors' mnist_m.tar.gz (Ganin et al. 2016; see data/README.md) into a data root so that "
    "mnist_m/mnist_m_train/ and mnist_m/mnist_m_train_labels.txt are inside it, or extract "
    "mnist_m_{train,test}.pt.tar.gz from https://github.com/liyxi/mnist-m/releases into <data root>/MNISTM/processed/, "
    "or put mnist_m.npz / mnist_m_small.npz there."
)


# ---------------------------------------------------------------- MNIST (idx files)


def read_idx(path: Path) -> np.ndarray:
    """An idx file (optionally gzipped): 2 zero bytes, a type code, ndim, big-endian int32 dims, data."""
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rb") as f:
        data = f.read()
    if len(data) < 4 or data[0] != 0 or data[1] != 0 or data[2] not in _IDX_DTYPES:
        raise ValueError(f"{path} is not an idx file (magic bytes {data[:4]!r})")
    ndim = data[3]
    dims = struct.unpack(f">{ndim}I", data[4 : 4 + 4 * ndim])
    arr = np.frombuffer(data, dtype=_IDX_DTYPES[data[2]], offset=4 + 4 * ndim)
    if arr.size != int(np.prod(dims)):
        raise ValueError(f"{path}: header says {dims}, found {arr.size} values")
    return arr.reshape(dims).astype(arr.dtype.newbyteorder("="))


def _idx_path(folder: Path, stem: str) -> Path:
    plain = folder / stem
    return plain if plain.exists() else folder / f"{stem}.gz"


def _mnist_folder_ok(folder: Path) -> bool:
    return folder.is_dir() and all(_idx_path(folder, s).exists() for s in MNIST_FILES)


def _read_mnist_folder(folder: Path) -> dict[str, np.ndarray]:
    xtr, ytr, xte, yte = (read_idx(_idx_path(folder, s)) for s in MNIST_FILES)
    return {"x_train": xtr.astype(np.uint8), "y_train": ytr.astype(np.int64),
            "x_test": xte.astype(np.uint8), "y_test": yte.astype(np.int64)}


def read_mnist(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True) -> Found:
    """MNIST arrays: ``mnist.npz``, else ``MNIST/raw`` idx files, else a download into the cache."""
    return resolve(
        "mnist", roots, npz_files=("mnist.npz",),
        find_raw=lambda rs: first_match(rs, ("MNIST/raw",), _mnist_folder_ok),
        read_raw=_read_mnist_folder, how=HOW_MNIST, fetch=fetcher("mnist"),
        download=download, use_npz=use_npz, files_of=lambda f: [file_record(_idx_path(f, n)) for n in MNIST_FILES],
    )


def load_mnist(root=None, *, download: bool = False) -> Dataset:
    """MNIST as uint8 (N, 1, 28, 28): 60,000 train / 10,000 test.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: download the idx files into the cache when no copy is found.
    """
    return simple_image_dataset("mnist", read_mnist(data_roots(root), download=download), digit_names())


# ---------------------------------------------------------------- USPS (LIBSVM bz2)


def read_usps_file(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """A LIBSVM USPS file -> uint8 images (N, 16, 16) and labels 0..9.

    Values in [-1, 1] map to ``floor((v + 1) / 2 * 255)``, torchvision's mapping, so the
    pixels equal what torchvision's USPS gives. Features absent from a line are 0
    (LIBSVM's sparse convention).
    """
    images, targets = [], []
    with bz2.open(path, "rt") as f:
        for line in f:
            parts = line.split()
            if not parts:
                continue
            row = np.zeros(256, dtype=np.float32)
            for item in parts[1:]:
                index, value = item.split(":")
                row[int(index) - 1] = float(value)
            images.append(row)
            targets.append(int(float(parts[0])) - 1)
    x = np.clip((np.stack(images) + 1.0) / 2.0 * 255.0, 0, 255).astype(np.uint8).reshape(-1, 16, 16)
    return x, np.asarray(targets, dtype=np.int64)


def _read_usps_folder(folder: Path) -> dict[str, np.ndarray]:
    xtr, ytr = read_usps_file(folder / USPS_FILES[0])
    xte, yte = read_usps_file(folder / USPS_FILES[1])
    return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}


def read_usps(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True) -> Found:
    """USPS arrays: ``usps.npz``, else the bz2 files, else a download into the cache."""
    return resolve(
        "usps", roots, npz_files=("usps.npz",),
        find_raw=lambda rs: first_match(rs, (".", "usps", "USPS"), has_files(*USPS_FILES)),
        read_raw=_read_usps_folder, how=HOW_USPS, fetch=fetcher("usps"),
        download=download, use_npz=use_npz, files_of=records_of(*USPS_FILES),
    )


def load_usps(root=None, *, download: bool = False) -> Dataset:
    """USPS as uint8 (N, 1, 16, 16) at its native size: 7,291 train / 2,007 test.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: download the bz2 files into the cache when no copy is found.
    """
    return simple_image_dataset("usps", read_usps(data_roots(root), download=download), digit_names())


# ---------------------------------------------------------------- MNIST-M (png folders)


def _read_png_split(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    lines = (folder / f"mnist_m_{split}_labels.txt").read_text().split("\n")
    entries = [ln.split() for ln in lines if ln.strip()]
    images = [open_image(folder / f"mnist_m_{split}" / name, "RGB") for name, _ in entries]
    sizes = {im.shape for im in images}
    if len(sizes) > 1:
        raise ValueError(f"MNIST-M {split} images have several sizes: {sorted(sizes)}")
    return np.stack(images) if images else np.zeros((0, 32, 32, 3), np.uint8), np.asarray(
        [int(lab) for _, lab in entries], dtype=np.int64)


def read_pt_split(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """One liyxi/mnist-m ``.pt`` file: a pair (uint8 images (N, H, W, 3), labels), loaded without pickles."""
    import torch

    obj = torch.load(path, map_location="cpu", weights_only=True)
    if not (isinstance(obj, (tuple, list)) and len(obj) == 2 and all(isinstance(t, torch.Tensor) for t in obj)):
        raise ValueError(f"{path} does not hold a pair (images, labels) of tensors")
    x, y = obj
    if x.dtype != torch.uint8 or x.ndim != 4 or x.shape[-1] != 3 or len(x) != len(y):
        raise ValueError(f"{path}: expected uint8 images (N, H, W, 3) and N labels, got {tuple(x.shape)} "
                         f"{x.dtype} and {tuple(y.shape)}")
    return x.numpy(), y.numpy().astype(np.int64)


def _read_mnist_m_folder(folder: Path) -> dict[str, np.ndarray]:
    if (folder / MNIST_M_PT[0]).is_file():
        (xtr, ytr), (xte, yte) = (read_pt_split(folder / n) for n in MNIST_M_PT)
    else:
        xtr, ytr = _read_png_split(folder, "train")
        xte, yte = _read_png_split(folder, "test")
    return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}


def _mnist_m_records(folder: Path) -> list[dict]:
    if (folder / MNIST_M_PT[0]).is_file():
        return [file_record(folder / n) for n in MNIST_M_PT]
    return [folder_record(folder / f"mnist_m_{s}") for s in ("train", "test")] + [
        file_record(folder / f"mnist_m_{s}_labels.txt") for s in ("train", "test")]


def read_mnist_m(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True) -> Found:
    """MNIST-M arrays: ``mnist_m.npz``, else ``mnist_m_small.npz``, else the png folders or the
    ``.pt`` files, else a download of the ``.pt`` release into the cache."""
    def find_raw(rs):
        folder, tried = first_match(rs, ("mnist_m",), has_files(*MNIST_M_FILES))
        if folder is None:
            folder, more = first_match(rs, ("MNISTM/processed",), has_files(*MNIST_M_PT))
            tried += more
        return folder, tried

    return resolve(
        "mnist_m", roots, npz_files=("mnist_m.npz", "mnist_m_small.npz"), find_raw=find_raw,
        read_raw=_read_mnist_m_folder, how=HOW_MNIST_M, fetch=fetcher("mnist_m"), download=download,
        use_npz=use_npz, files_of=_mnist_m_records,
    )


def load_mnist_m(root=None, *, download: bool = False) -> Dataset:
    """MNIST-M as uint8 (N, 3, H, W): 32x32, 59,001 train / 9,001 test in the DANN png set;
    28x28, 60,000 / 10,000 in the ``.pt`` re-release that ``download=True`` fetches.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then the cache).
        download: download the ``.pt`` re-release into the cache when no copy is found.
    """
    return simple_image_dataset("mnist_m", read_mnist_m(data_roots(root), download=download), digit_names())
