"""CIFAR-10-C made by pflkit: the CIFAR-10 test split under common corruptions (FedL2P Table 3).

FedL2P (sec. 4.1.1) takes the CIFAR-10 test split under ten corruptions at severity 3
(`pflkit.data.corruptions`), one feature-shift domain per corruption, and splits each
among 25 clients with Dir(alpha) label skew (the ``domains`` partition with
``key="corruption"``). Each client's data is then split 80 / 20 into train / test and 20%
of train held out for validation: a federation with ``split="pool"``.

The dataset is generated from whatever CIFAR-10 copy `pflkit.data.sources.cifar` finds
(the full set, or the offline subset's 2,000 test images), deterministically given
``seed``. Every sample is in the train split (the test split is empty), with the group
``corruption``; the normalization statistics are the clean CIFAR-10 training split's, so
a model pretrained on CIFAR-10 sees the corrupted images through its own preprocessing.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..base import Dataset, data_roots
from ..corruptions import CORRUPTIONS, corrupt
from .cifar import read_cifar10
from .common import check_positive_int, check_subset
from .images import channel_stats, image_dataset, to_nchw

DEFAULT_CLASSES = ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship", "truck")


def _decode(names) -> list[str]:
    return [n.decode() if isinstance(n, bytes) else str(n) for n in names]


def load_cifar10c(root=None, *, download: bool = False, severity: int = 3,
                  corruptions: Sequence[str] = CORRUPTIONS, per_corruption: int | None = None,
                  seed: int = 0) -> Dataset:
    """The CIFAR-10 test split under each corruption, as uint8 (N, 3, 32, 32) with group ``corruption``.

    Args:
        root: data root searched first for CIFAR-10 (then ``$PFLKIT_DATA``, ``~/.cache/pflkit/data``).
        download: download CIFAR-10 into the cache when no copy is found.
        severity: corruption severity 1-5 (FedL2P: 3).
        corruptions: which corruptions, in this order (= group ids); default FedL2P's ten.
        per_corruption: if given, the first ``min(per_corruption, N)`` images of a seeded
            permutation of the test split (the same images under every corruption, as in
            the published set); None keeps the whole test split.
        seed: seeds the image subset and the corruptions' randomness.

    Raises:
        ValueError: a bad severity, corruption name or ``per_corruption``.
    """
    check_positive_int("per_corruption", per_corruption, allow_none=True)
    corruptions = check_subset("corruptions", corruptions, CORRUPTIONS)
    if isinstance(severity, bool) or not isinstance(severity, (int, np.integer)) or not 1 <= severity <= 5:
        raise ValueError(f"severity must be an integer in 1..5, got {severity!r}")
    found = read_cifar10(data_roots(root), download=download)
    a = found.arrays
    x, y = np.asarray(a["x_test"]), np.asarray(a["y_test"], dtype=np.int64)
    if per_corruption is not None:
        keep = np.sort(np.random.default_rng(seed).permutation(len(y))[:per_corruption])
        x, y = x[keep], y[keep]
    images = np.concatenate([corrupt(x, name, severity, seed=seed) for name in corruptions])
    groups = np.repeat(np.arange(len(corruptions), dtype=np.int64), len(y))
    classes = _decode(a["class_names"]) if "class_names" in a else list(DEFAULT_CLASSES)
    empty_x = np.zeros((0,) + images.shape[1:], dtype=np.uint8)
    return image_dataset(
        "cifar10c", to_nchw(images), np.tile(y, len(corruptions)), to_nchw(empty_x), np.zeros(0, np.int64),
        class_names=classes, source=f"{found.source} corrupted by pflkit (severity {severity}, seed {seed})",
        files=found.files, download=found.download,
        groups_train={"corruption": groups}, groups_test={"corruption": np.zeros(0, np.int64)},
        group_names={"corruption": corruptions}, stats=channel_stats(to_nchw(np.asarray(a["x_train"]))),
    )
