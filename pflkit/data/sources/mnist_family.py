"""MNIST, USPS and MNIST-M: handwritten digits in three styles (one label space).

Published layouts searched in each data root:

* MNIST: torchvision's ``MNIST/raw/{train,t10k}-{images-idx3,labels-idx1}-ubyte`` (each file
  may also be the ``.gz`` original), the idx format of LeCun et al.
* USPS: the LIBSVM bz2 files ``usps.bz2`` and ``usps.t.bz2`` (torchvision's layout, also
  accepted inside ``usps/``): one line per image, ``label index:value ...``, labels 1..10,
  values in [-1, 1].
* MNIST-M (Ganin et al., 2016): ``mnist_m/mnist_m_{train,test}/*.png`` (32x32 RGB) with
  ``mnist_m/mnist_m_{train,test}_labels.txt`` lines ``00000000.png 5``. Not in torchvision.
"""
from __future__ import annotations

import bz2
import gzip
import struct
from pathlib import Path
from typing import Sequence

import numpy as np

from ..base import Dataset, data_roots
from .common import Found, digit_names, first_match, has_files, resolve, simple_image_dataset

MNIST_FILES = ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte")
USPS_FILES = ("usps.bz2", "usps.t.bz2")
MNIST_M_FILES = ("mnist_m_train", "mnist_m_train_labels.txt", "mnist_m_test", "mnist_m_test_labels.txt")

# idx type codes -> big-endian numpy dtypes
_IDX_DTYPES = {0x08: ">u1", 0x09: ">i1", 0x0B: ">i2", 0x0C: ">i4", 0x0D: ">f4", 0x0E: ">f8"}

HOW_MNIST = (
    "Call load_dataset('mnist', download=True) on a machine with internet (torchvision), or put the four "
    "idx files from http://yann.lecun.com/exdb/mnist/ (gzipped or not) into <data root>/MNIST/raw/, "
    "or put mnist.npz there."
)
HOW_USPS = (
    "Call load_dataset('usps', download=True) on a machine with internet (torchvision), or put usps.bz2 and "
    "usps.t.bz2 from https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass.html#usps into a data "
    "root, or put usps.npz there."
)
HOW_MNIST_M = (
    "Download mnist_m.tar.gz (the DANN authors' MNIST-M, Ganin et al. 2016; see data/README.md) and extract it "
    "into a data root so that mnist_m/mnist_m_train/ and mnist_m/mnist_m_train_labels.txt are inside it, "
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


def _fetch_torchvision(cls_name: str, splits: Sequence[bool] = (True,)):
    def fetch(target: Path) -> None:
        import torchvision  # imported lazily: only downloads need it

        for train in splits:
            getattr(torchvision.datasets, cls_name)(root=str(target), train=train, download=True)

    return fetch


def read_mnist(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True) -> Found:
    """MNIST arrays: ``mnist.npz``, else ``MNIST/raw`` idx files, else a torchvision download."""
    return resolve(
        "mnist", roots, npz_files=("mnist.npz",),
        find_raw=lambda rs: first_match(rs, ("MNIST/raw",), _mnist_folder_ok),
        read_raw=_read_mnist_folder, how=HOW_MNIST, fetch=_fetch_torchvision("MNIST"),
        download=download, use_npz=use_npz,
    )


def load_mnist(root=None, *, download: bool = False) -> Dataset:
    """MNIST as uint8 (N, 1, 28, 28): 60,000 train / 10,000 test.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: let torchvision download the idx files when no copy is found.
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
    """USPS arrays: ``usps.npz``, else the bz2 files, else a torchvision download."""
    return resolve(
        "usps", roots, npz_files=("usps.npz",),
        find_raw=lambda rs: first_match(rs, (".", "usps", "USPS"), has_files(*USPS_FILES)),
        read_raw=_read_usps_folder, how=HOW_USPS, fetch=_fetch_torchvision("USPS", (True, False)),
        download=download, use_npz=use_npz,
    )


def load_usps(root=None, *, download: bool = False) -> Dataset:
    """USPS as uint8 (N, 1, 16, 16) at its native size: 7,291 train / 2,007 test.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: let torchvision download the bz2 files when no copy is found.
    """
    return simple_image_dataset("usps", read_usps(data_roots(root), download=download), digit_names())


# ---------------------------------------------------------------- MNIST-M (png folders)


def _read_png_split(folder: Path, split: str) -> tuple[np.ndarray, np.ndarray]:
    from PIL import Image  # imported lazily: only image folders need it

    lines = (folder / f"mnist_m_{split}_labels.txt").read_text().split("\n")
    entries = [ln.split() for ln in lines if ln.strip()]
    images = []
    for name, _ in entries:
        with Image.open(folder / f"mnist_m_{split}" / name) as im:
            images.append(np.asarray(im.convert("RGB"), dtype=np.uint8))
    sizes = {im.shape for im in images}
    if len(sizes) > 1:
        raise ValueError(f"MNIST-M {split} images have several sizes: {sorted(sizes)}")
    return np.stack(images) if images else np.zeros((0, 32, 32, 3), np.uint8), np.asarray(
        [int(lab) for _, lab in entries], dtype=np.int64)


def _read_mnist_m_folder(folder: Path) -> dict[str, np.ndarray]:
    xtr, ytr = _read_png_split(folder, "train")
    xte, yte = _read_png_split(folder, "test")
    return {"x_train": xtr, "y_train": ytr, "x_test": xte, "y_test": yte}


def read_mnist_m(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True) -> Found:
    """MNIST-M arrays: ``mnist_m.npz``, else ``mnist_m_small.npz``, else the png folders."""
    return resolve(
        "mnist_m", roots, npz_files=("mnist_m.npz", "mnist_m_small.npz"),
        find_raw=lambda rs: first_match(rs, ("mnist_m",), has_files(*MNIST_M_FILES)),
        read_raw=_read_mnist_m_folder, how=HOW_MNIST_M, fetch=None, download=download, use_npz=use_npz,
    )


def load_mnist_m(root=None, *, download: bool = False) -> Dataset:
    """MNIST-M as uint8 (N, 3, 32, 32): 59,001 train / 9,001 test in the published set.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: no automatic download exists; True only changes the error message.
    """
    return simple_image_dataset("mnist_m", read_mnist_m(data_roots(root), download=download), digit_names())
