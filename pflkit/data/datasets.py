"""The dataset registry: ``load_dataset(name)`` and the list of known names.

Every dataset is found in the same order (`pflkit.data.sources.common.locate`):

1. the explicit ``root`` (``--data-root``), completely: ``NAME.npz``, then the subset
   npz (e.g. ``cifar10_small.npz``), then the published on-disk layout;
2. the other data roots, ``$PFLKIT_DATA`` then the cache (``$PFLKIT_CACHE`` or
   ``~/.cache/pflkit/data``): a full npz in any of them before a subset npz in any,
   then the published layouts;
3. only with ``download=True``: a download into the cache (`pflkit.data.download`:
   published checksums, atomic install; ``$PFLKIT_OFFLINE=1`` forbids it).

Anything missing ends in a `pflkit.data.base.DatasetNotFoundError` naming the
dataset, every path searched and how to obtain it. Every loaded dataset records
what it was read from in ``meta.source``, ``meta.files`` and ``meta.download``.
"""
from __future__ import annotations

import inspect
from pathlib import Path
from typing import Callable

from .base import Dataset, Loader
from .sources import audio, cifar, cifar10c, digits, domains, folders, mnist_family, omniglot
from .sources.common import Found

DATASETS: dict[str, Loader] = {
    "digits": digits.load_digits_dataset,  # the embedded default
    "cifar10": cifar.load_cifar10,
    "cifar100": cifar.load_cifar100,
    "mnist": mnist_family.load_mnist,
    "usps": mnist_family.load_usps,
    "mnist_m": mnist_family.load_mnist_m,
    "omniglot": omniglot.load_omniglot,
    "fsdd": audio.load_fsdd,
    "speech_commands": audio.load_speech_commands,
    "office_caltech10": folders.load_office_caltech10,
    "domainnet": folders.load_domainnet,
    "sun397": folders.load_sun397,
    "digit_domains": domains.load_digit_domains,
    "cifar10c": cifar10c.load_cifar10c,
}

# Readers return the arrays of the npz schema (before features / resizing); `pack` writes them.
READERS: dict[str, Callable[..., Found]] = {
    "digits": digits.read_digits,
    "cifar10": cifar.read_cifar10,
    "cifar100": cifar.read_cifar100,
    "mnist": mnist_family.read_mnist,
    "usps": mnist_family.read_usps,
    "mnist_m": mnist_family.read_mnist_m,
    "omniglot": omniglot.read_omniglot,
    "fsdd": audio.read_fsdd,
    "speech_commands": audio.read_speech_commands,
    "office_caltech10": folders.read_office_caltech10,
    "domainnet": folders.read_domainnet,
    "sun397": folders.read_sun397,
}

DEFAULT_DATASET = "digits"


def dataset_names() -> list[str]:
    """Registered dataset names, the default (``digits``) first."""
    return list(DATASETS)


def dataset_options(name: str) -> dict[str, object]:
    """The options ``load_dataset(name, ...)`` accepts, with their defaults."""
    params = inspect.signature(_loader(name)).parameters.values()
    return {p.name: p.default for p in params if p.kind is p.KEYWORD_ONLY and p.name != "download"}


def load_dataset(name: str, root: str | Path | None = None, *, download: bool = False, **options) -> Dataset:
    """Load a registered dataset.

    Args:
        name: one of `dataset_names()`.
        root: the data root searched first (``--data-root``).
        download: allow a download into the cache (`pflkit.data.base.cache_dir`) when no
            copy is found, for datasets with a public source (`pflkit.data.download.RESOURCES`).
        **options: dataset-specific options (see `dataset_options(name)`), e.g.
            ``size`` for omniglot and the folder datasets, ``n_mels`` for audio.

    Raises:
        ValueError: unknown dataset name, or a bad option value.
        TypeError: an option the dataset does not have.
        DatasetNotFoundError: the dataset is nowhere to be found (or the download failed,
            or ``$PFLKIT_OFFLINE`` forbids it).
        pflkit.data.download.ChecksumError: a downloaded file does not match its published checksum.
    """
    loader = _loader(name)
    check_options(name, options, dataset_options(name))
    return loader(root, download=download, **options)


def check_options(name: str, options: dict, known) -> None:
    """TypeError naming the first option not in ``known``."""
    for key in options:
        if key not in known:
            raise TypeError(f"dataset {name!r} has no option {key!r}; its options are: {', '.join(known) or 'none'}")


def _loader(name: str) -> Loader:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    return DATASETS[name]
