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

A dataset of one's own joins the registry with `register_dataset` (no module-level dict
to edit): experiment files then name it like any other (``[data] dataset = "mine"``).
Such a dataset may have no files at all, so runs identify it by `dataset_digest`, a
sha256 of its arrays and metadata.
"""
from __future__ import annotations

import dataclasses
import hashlib
import inspect
import re
from pathlib import Path
from typing import Callable

import numpy as np
import torch

from pflkit.config import reject_unknown_options

from .base import Dataset, ImageFiles, Loader
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

# Readable names for titles, table headers and the reproduction report (a name not listed reads as itself).
DATASET_NAMES = {
    "digits": "sklearn digits", "cifar10": "CIFAR-10", "cifar100": "CIFAR-100", "cifar10c": "CIFAR-10-C",
    "mnist": "MNIST", "usps": "USPS", "mnist_m": "MNIST-M", "digit_domains": "MNIST / MNIST-M / USPS",
    "omniglot": "Omniglot", "fsdd": "FSDD (spoken digits)", "speech_commands": "Speech Commands",
    "office_caltech10": "Office-Caltech-10", "domainnet": "DomainNet", "sun397": "SUN397",
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

def dataset_names() -> list[str]:
    """Registered dataset names, the default (``digits``) first."""
    return list(DATASETS)


def dataset_name(name: str) -> str:
    """The readable name of a dataset (``cifar10`` -> ``CIFAR-10``); a name without one reads as itself."""
    return DATASET_NAMES.get(name, name)


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
    """TypeError naming the first option of dataset ``name`` not in ``known``."""
    reject_unknown_options(f"dataset {name!r}", options, known)


def _loader(name: str) -> Loader:
    if name not in DATASETS:
        raise ValueError(f"unknown dataset {name!r}; known datasets: {', '.join(DATASETS)}")
    return DATASETS[name]


# ------------------------------------------------------------------ datasets of one's own

USER_DATASETS: set[str] = set()  # the names `register_dataset` added (the others are pflkit's own)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


def register_dataset(name: str, loader: Callable[..., Dataset] | Dataset, *, replace: bool = False) -> None:
    """Add a dataset of one's own to the registry, so that ``[data] dataset = name`` (or
    ``[pretrain.data]``) and `load_dataset(name)` find it.

    Args:
        name: letters, digits, ``_``, ``.`` and ``-``; not one of pflkit's own datasets.
        loader: a `Dataset`, or a function returning one. Its parameters are the dataset's
            options (``[data.options]``, `dataset_options`); each needs a default.
        replace: allow replacing a dataset registered earlier under ``name``.

    The dataset is checked (`check_dataset`) here when it is given as an object and at every
    load otherwise; its ``meta.name`` becomes ``name``.

    Raises:
        ValueError: a bad name, a name taken, a loader option without a default, a bad dataset.
        TypeError: ``loader`` is neither a `Dataset` nor callable.
    """
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"register_dataset: name={name!r}: use letters, digits, '_', '.' and '-'")
    if name in DATASETS and name not in USER_DATASETS:
        raise ValueError(f"register_dataset: name={name!r} is one of pflkit's own datasets; choose another name")
    if name in USER_DATASETS and not replace:
        raise ValueError(f"register_dataset: name={name!r} is already registered; pass replace=True to replace it")
    if isinstance(loader, Dataset):
        fixed = named(name, loader, "register_dataset(object)")
        DATASETS[name] = _as_loader(name, lambda: fixed, {})
    elif callable(loader):
        DATASETS[name] = _as_loader(name, loader, _loader_options(name, loader))
    else:
        raise TypeError(f"register_dataset: loader for {name!r} is a {type(loader).__name__}, "
                        "not a Dataset or a function returning one")
    USER_DATASETS.add(name)


def unregister_dataset(name: str) -> None:
    """Remove a dataset `register_dataset` added (pflkit's own cannot be removed)."""
    if name not in USER_DATASETS:
        raise ValueError(f"unregister_dataset: {name!r} was not added by register_dataset")
    USER_DATASETS.discard(name)
    del DATASETS[name]


def is_user_dataset(name: str) -> bool:
    """True for a name `register_dataset` added."""
    return name in USER_DATASETS


def _loader_options(name: str, fn: Callable) -> dict[str, object]:
    """``{option: default}`` of a user's loader; every parameter must be a named one with a default."""
    out = {}
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD) or p.default is p.empty:
            raise ValueError(f"register_dataset: the loader of {name!r} has parameter {p.name!r} without a "
                             "default; its parameters are the dataset's options and each needs a default")
        out[p.name] = p.default
    return out


def _as_loader(name: str, fn: Callable, options: dict) -> Loader:
    """A registry loader, ``load(root=None, *, download=False, **options)``, around a user's function."""
    def load(root=None, *, download: bool = False, **opts) -> Dataset:
        return named(name, fn(**opts), f"register_dataset({getattr(fn, '__qualname__', type(fn).__name__)})")

    params = [inspect.Parameter("root", inspect.Parameter.POSITIONAL_OR_KEYWORD, default=None),
              inspect.Parameter("download", inspect.Parameter.KEYWORD_ONLY, default=False)]
    params += [inspect.Parameter(k, inspect.Parameter.KEYWORD_ONLY, default=v) for k, v in options.items()]
    load.__signature__ = inspect.Signature(params)  # what `dataset_options` reads
    return load


def named(name: str, dataset, origin: str) -> Dataset:
    """``dataset``, checked, with ``meta.name`` = ``name`` (and ``meta.source`` = ``origin`` if it had none)."""
    check_dataset(dataset, name)
    meta = dataset.meta
    if meta.name == name and meta.source:
        return dataset
    return dataclasses.replace(dataset, meta=dataclasses.replace(meta, name=name, source=meta.source or origin))


def check_dataset(dataset, name: str | None = None) -> None:
    """A one-line ValueError (TypeError for a wrong type) when ``dataset`` cannot make a federation:
    no samples, non-integer labels, labels outside ``[0, num_classes)``, class names of another count,
    train and test samples of different shapes."""
    what = f"dataset {name or getattr(getattr(dataset, 'meta', None), 'name', '?')!r}"
    if not isinstance(dataset, Dataset):
        raise TypeError(f"{what}: a {type(dataset).__name__}, not a pflkit.data.Dataset")
    meta = dataset.meta
    if len(meta.class_names) != meta.num_classes:
        raise ValueError(f"{what}: meta.num_classes={meta.num_classes} but {len(meta.class_names)} class names")
    if len(dataset.y_train) + len(dataset.y_test) == 0:
        raise ValueError(f"{what}: has no samples")
    for split in ("train", "test"):
        x, y = getattr(dataset, f"x_{split}"), getattr(dataset, f"y_{split}")
        if not isinstance(x, (torch.Tensor, ImageFiles)) or not isinstance(y, torch.Tensor):
            raise TypeError(f"{what}: x_{split} / y_{split} must be torch tensors (x may be ImageFiles)")
        if y.dim() != 1 or y.is_floating_point() or y.dtype == torch.bool:
            raise ValueError(f"{what}: y_{split} must be a 1-D integer tensor, not {y.dtype} of shape {tuple(y.shape)}")
        if len(y) and (int(y.min()) < 0 or int(y.max()) >= meta.num_classes):
            raise ValueError(f"{what}: y_{split} holds labels outside [0, {meta.num_classes}) "
                             f"(min {int(y.min())}, max {int(y.max())})")
    if len(dataset.y_train) and len(dataset.y_test) and \
            tuple(dataset.x_train.shape[1:]) != tuple(dataset.x_test.shape[1:]):
        raise ValueError(f"{what}: train samples of shape {tuple(dataset.x_train.shape[1:])}, test samples of "
                         f"shape {tuple(dataset.x_test.shape[1:])}")


def dataset_digest(dataset: Dataset) -> str:
    """sha256 of a dataset's content: every array (dtype, shape, bytes; an `ImageFiles` by its paths and
    size), the per-sample groups and the metadata a model or partition reads. Two datasets with the
    same digest give the same runs, with or without files behind them."""
    h = hashlib.sha256()
    meta = dataset.meta
    h.update(repr((meta.num_classes, tuple(meta.class_names), tuple(meta.input_shape), tuple(meta.mean),
                   tuple(meta.std), meta.superclass)).encode())
    for split in ("train", "test"):
        for part in (getattr(dataset, f"x_{split}"), getattr(dataset, f"y_{split}")):
            _hash_array(h, part)
        groups = getattr(dataset, f"groups_{split}")
        for key in sorted(groups):
            h.update(key.encode())
            _hash_array(h, torch.as_tensor(np.asarray(groups[key])))
    return h.hexdigest()


def _hash_array(h, x) -> None:
    if isinstance(x, ImageFiles):
        h.update(repr((x.size, x.channels)).encode())
        h.update("\n".join(x.paths).encode())
        return
    t = x.detach().to("cpu").contiguous()
    h.update(f"{t.dtype}{tuple(t.shape)}".encode())
    h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b"")
