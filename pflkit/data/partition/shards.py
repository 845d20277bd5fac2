"""Fixed-size class shards (FedSelect sec. 4).

FedSelect gives each of its 10 clients ``s`` classes of CIFAR-10 (s = 2 or 4)
with exactly 20 training and 100 test samples per class. Classes are spread
over clients as evenly as possible (the greedy of `pathological`), and every
client takes ``samples_per_class`` fresh samples of each of its classes, so
clients never share a sample; samples nobody needs stay unused.
"""
from __future__ import annotations

import numpy as np

from ._common import (
    as_splits, balanced_classes, check_num_clients, check_positive_int, class_pools, finish,
    make_rng, num_classes, per_split,
)


def _check(splits, num_clients, classes_per_client, samples_per_class):
    check_num_clients(num_clients)
    k = check_positive_int(classes_per_client, "classes_per_client")
    present = np.unique(np.concatenate(splits))
    if k > present.size:
        raise ValueError(f"classes_per_client={k} is more than the {present.size} classes present")
    spc = tuple(check_positive_int(s, "samples_per_class")
                for s in per_split(samples_per_class, len(splits), "samples_per_class"))
    # Worst case before any draw: a class used ceil(C k / K) times must hold that many shards.
    max_uses = -(-num_clients * k // present.size)
    for i, (y, s) in enumerate(zip(splits, spc)):
        counts = np.bincount(y, minlength=num_classes(splits))
        for c in present:
            if counts[c] < max_uses * s:
                where = f" in split {i}" if len(splits) > 1 else ""
                raise ValueError(
                    f"class {c} has {counts[c]} samples{where} but up to {max_uses} clients "
                    f"need samples_per_class={s} each ({max_uses * s}); lower samples_per_class, "
                    "num_clients or classes_per_client"
                )
    return present, k, spc


def shard_classes(labels, num_clients: int, *, classes_per_client: int, samples_per_class,
                  seed: int) -> np.ndarray:
    """The plan of `shards`: (num_clients, classes_per_client) class ids per client."""
    splits, _ = as_splits(labels)
    present, k, _ = _check(splits, num_clients, classes_per_client, samples_per_class)
    return balanced_classes(num_clients, k, present, make_rng(seed))


def shards(labels, num_clients: int, *, classes_per_client: int, samples_per_class, seed: int):
    """``s`` classes per client, exactly ``samples_per_class`` samples of each.

    Args:
        labels: label array, or a tuple of label arrays (one per split); paired
            splits share each client's classes.
        num_clients: number of clients.
        classes_per_client: ``s`` distinct classes per client.
        samples_per_class: samples of each of its classes a client gets; a tuple
            gives one value per split, e.g. ``(20, 100)`` for FedSelect's train/test.
        seed: seed of ``np.random.default_rng``.

    Returns:
        list of int64 index arrays of size ``s * samples_per_class`` each, or a
        tuple of such lists.

    Raises:
        ValueError: naming a class with fewer samples than the clients using it
            need (checked for the most-used count before drawing).
    """
    splits, paired = as_splits(labels)
    present, k, spc = _check(splits, num_clients, classes_per_client, samples_per_class)
    rng = make_rng(seed)
    chosen = balanced_classes(num_clients, k, present, rng)
    n_cls = num_classes(splits)
    out = []
    for y, s in zip(splits, spc):
        pools = class_pools(y, n_cls, rng)
        start = np.zeros(n_cls, dtype=np.int64)
        parts = []
        for row in chosen:
            parts.append(np.concatenate([pools[c][start[c]:start[c] + s] for c in row]))
            start[row] += s
        out.append(parts)
    return finish(out, paired)
