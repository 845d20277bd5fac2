"""scikit-learn's 8x8 handwritten digits: the embedded default dataset (always offline).

The UCI optical-recognition digits that ship inside scikit-learn (1,797 images,
values 0..16). They need no download, so every smoke run, test and tutorial
can start from them.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..base import Dataset
from ..provenance import file_record
from .common import Found, digit_names, stratified_split
from .images import simple_image_dataset

SPLIT_SEED = 0
TEST_FRACTION = 0.2


def read_digits(roots: Sequence[Path] = (), *, download: bool = False, use_npz: bool = True) -> Found:
    """The digits as arrays in the plain image schema, split 80/20 per class.

    Pixel values 0..16 are scaled to 0..255 (rounded) so they share the uint8
    convention of every other image dataset. There is no official split; the
    stratified 80/20 split uses a fixed seed so it is the same everywhere.
    ``roots``, ``download`` and ``use_npz`` are accepted for a uniform reader
    signature and ignored (the data are embedded).
    """
    from sklearn.datasets import load_digits  # imported lazily: only this dataset needs it

    bunch = load_digits()
    x = np.rint(np.asarray(bunch.images, dtype=np.float64) * (255.0 / 16.0)).astype(np.uint8)
    y = np.asarray(bunch.target, dtype=np.int64)
    train, test = stratified_split(y, TEST_FRACTION, SPLIT_SEED)
    arrays = {
        "x_train": x[train], "y_train": y[train], "x_test": x[test], "y_test": y[test],
        "class_names": digit_names(),
    }
    return Found(arrays, f"scikit-learn load_digits (embedded; stratified 80/20 split, seed {SPLIT_SEED})",
                 _sklearn_files())


def _sklearn_files() -> tuple[dict, ...]:
    """Provenance: the data file inside scikit-learn that ``load_digits`` reads (if it is where we expect)."""
    import sklearn.datasets

    path = Path(sklearn.datasets.__file__).parent / "data" / "digits.csv.gz"
    return (file_record(path),) if path.is_file() else ()


def load_digits_dataset(root=None, *, download: bool = False) -> Dataset:
    """sklearn digits as uint8 images (N, 1, 8, 8): 1,438 train / 359 test, 10 classes.

    Args:
        root: ignored (the data are embedded in scikit-learn).
        download: ignored.
    """
    return simple_image_dataset("digits", read_digits())
