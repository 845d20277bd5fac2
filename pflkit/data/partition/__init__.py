"""Partition schemes: pure ``(labels, num_clients, *, options, seed) -> index arrays``.

One scheme per file. Each returns a list of disjoint int64 index arrays into
``labels`` (one per client); given a tuple of label arrays (one per split,
e.g. ``(train, test)``) it draws one plan and returns a tuple of lists, so a
client's test set follows its train distribution.

| scheme | paper | file |
|---|---|---|
| ``iid`` | reference | iid.py |
| ``dirichlet`` | FedL2P sec. 4.1 (LDA, equal sizes) | dirichlet.py |
| ``class_dirichlet`` | pFedHN sec. 5.3 (novel clients) | class_dirichlet.py |
| ``pathological`` | pFedMe / pFedHN sec. 5.1 | pathological.py |
| ``shards`` | FedSelect sec. 4 | shards.py |
| ``domains`` | FedL2P sec. 4.1.1 (CIFAR-10-C, Office-Caltech-10, DomainNet) | domains.py |
| ``natural`` | FedL2P Speech Commands (speaker), Omniglot (alphabet) | natural.py |
| ``concept_drift`` | pFedVEM sec. 3.1 | concept_drift.py |
"""
from __future__ import annotations

import inspect
from typing import Callable

import numpy as np

from pflkit.config import reject_unknown_options

from ._common import as_splits
from .class_dirichlet import class_dirichlet, class_dirichlet_proportions, nearest_tv, total_variation
from .concept_drift import concept_drift, concept_drift_choices
from .dirichlet import dirichlet, dirichlet_proportions
from .domains import domain_assignment, domains
from .iid import iid
from .natural import natural, natural_groups
from .pathological import pathological, pathological_shares
from .shards import shard_classes, shards

PARTITIONS: dict[str, Callable] = {
    "iid": iid,
    "dirichlet": dirichlet,
    "class_dirichlet": class_dirichlet,
    "pathological": pathological,
    "shards": shards,
    "domains": domains,
    "natural": natural,
    "concept_drift": concept_drift,
}


def _keyword_options(fn: Callable) -> dict[str, inspect.Parameter]:
    params = inspect.signature(fn).parameters
    return {n: p for n, p in params.items() if p.kind is p.KEYWORD_ONLY and n != "seed"}


def partition(scheme: str, labels, num_clients: int, *, seed: int, **options):
    """Run the partition scheme named ``scheme`` after checking its options.

    Args:
        scheme: a key of `PARTITIONS`.
        labels: label array, or a tuple of label arrays (one per split).
        num_clients: number of clients.
        seed: seed of the scheme's ``np.random.default_rng``.
        **options: the scheme's keyword options (e.g. ``alpha=0.1``).

    Returns:
        what the scheme returns: a list of index arrays, or a tuple of lists.

    Raises:
        ValueError: unknown scheme (the message lists the known ones).
        TypeError: an option the scheme does not take, or a required one missing.
    """
    if scheme not in PARTITIONS:
        raise ValueError(f"unknown partition scheme {scheme!r}; known: {sorted(PARTITIONS)}")
    fn = PARTITIONS[scheme]
    accepted = _keyword_options(fn)
    reject_unknown_options(f"partition scheme {scheme!r}", options, accepted)
    missing = sorted(n for n, p in accepted.items() if p.default is p.empty and n not in options)
    if missing:
        raise TypeError(f"partition scheme {scheme!r} needs option {missing[0]!r}")
    return fn(labels, num_clients, seed=seed, **options)


def label_histogram(labels, parts, num_classes: int) -> np.ndarray:
    """Per-client class counts.

    Args:
        labels: label array, or a tuple of label arrays (one per split).
        parts: the scheme's output for ``labels`` (a list, or a tuple of lists).
        num_classes: number of columns; labels must be below it.

    Returns:
        int64 array (num_clients, num_classes), or a tuple of them for paired splits.
    """
    splits, paired = as_splits(labels)
    per_split = parts if paired else (parts,)
    if not isinstance(per_split, tuple) or len(per_split) != len(splits):
        raise ValueError("parts must be one client list per label split")
    for y in splits:
        if y.size and y.max() >= num_classes:
            raise ValueError(f"labels contain class {y.max()} but num_classes={num_classes}")
    out = tuple(
        np.stack([np.bincount(y[np.asarray(p, dtype=np.int64)], minlength=num_classes) for p in ps])
        if len(ps) else np.zeros((0, num_classes), dtype=np.int64)
        for y, ps in zip(splits, per_split)
    )
    return out if paired else out[0]


__all__ = [
    "PARTITIONS", "partition", "label_histogram", "iid", "dirichlet", "dirichlet_proportions",
    "class_dirichlet", "class_dirichlet_proportions", "total_variation", "nearest_tv",
    "pathological", "pathological_shares", "shards", "shard_classes", "domains",
    "domain_assignment", "natural", "natural_groups", "concept_drift", "concept_drift_choices",
]
