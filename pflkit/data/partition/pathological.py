"""Pathological class split of pFedMe, used by pFedHN (pFedHN sec. 5.1).

Each client gets ``k`` distinct classes (2 of CIFAR-10, 10 of CIFAR-100 in
pFedHN), every class used (close to) equally often across clients. For
client ``i`` and each of its classes ``c`` a weight ``a_{i,c} ~ U(low, high)``
(U(.4, .6) in the paper) is drawn, and the client receives the fraction
``a_{i,c} / sum_j a_{j,c}`` of class ``c``'s samples (the sum over the clients
holding ``c``). Client sizes therefore vary, and every sample of a used class
is assigned. Classes no client drew (when ``num_clients * k < K``) stay unused.
"""
from __future__ import annotations

import numpy as np

from ._common import (
    as_splits, balanced_classes, check_num_clients, check_positive_int, class_pools, finish,
    make_rng, num_classes, split_by_shares,
)


def _check(splits, num_clients, classes_per_client, low, high) -> tuple[np.ndarray, int]:
    check_num_clients(num_clients, splits)
    k = check_positive_int(classes_per_client, "classes_per_client")
    present = np.unique(np.concatenate(splits))
    if k > present.size:
        raise ValueError(f"classes_per_client={k} is more than the {present.size} classes present")
    lo, hi = float(low), float(high)
    if not (np.isfinite(lo) and np.isfinite(hi) and 0 < lo <= hi):
        raise ValueError(f"need 0 < low <= high (finite), got low={low}, high={high}")
    return present, k


def _draw_shares(rng, num_clients, k, present, n_cls, low, high) -> np.ndarray:
    """The plan: (num_clients, K) matrix of shares; column c sums to 1 if c is used."""
    chosen = balanced_classes(num_clients, k, present, rng)
    a = np.zeros((num_clients, n_cls))
    rows = np.repeat(np.arange(num_clients), k)
    a[rows, chosen.ravel()] = rng.uniform(low, high, size=num_clients * k)
    total = a.sum(axis=0, keepdims=True)
    return np.divide(a, total, out=np.zeros_like(a), where=total > 0)


def pathological_shares(
    labels, num_clients: int, *, classes_per_client: int, seed: int, low: float = 0.4,
    high: float = 0.6,
) -> np.ndarray:
    """The plan of `pathological`: shares ``a_{i,c} / sum_j a_{j,c}``, shape (num_clients, K).

    Zero where client ``i`` does not hold class ``c``; exactly the shares
    `pathological` uses with the same arguments.
    """
    splits, _ = as_splits(labels)
    present, k = _check(splits, num_clients, classes_per_client, low, high)
    return _draw_shares(make_rng(seed), num_clients, k, present, num_classes(splits), low, high)


def pathological(
    labels, num_clients: int, *, classes_per_client: int, seed: int, low: float = 0.4,
    high: float = 0.6,
):
    """pFedMe / pFedHN class split with U(low, high) shares.

    Args:
        labels: label array, or a tuple of label arrays (one per split); paired
            splits share the classes and the weights ``a_{i,c}``.
        num_clients: number of clients.
        classes_per_client: ``k`` distinct classes per client (<= number of classes).
        seed: seed of ``np.random.default_rng``.
        low, high: bounds of the uniform weights (0 < low <= high).

    Returns:
        list of int64 index arrays (one per client), or a tuple of such lists.
        Client ``i`` holds within one sample of ``share_{i,c} * n_c`` of class ``c``.
    """
    splits, paired = as_splits(labels)
    present, k = _check(splits, num_clients, classes_per_client, low, high)
    rng = make_rng(seed)
    n_cls = num_classes(splits)
    shares = _draw_shares(rng, num_clients, k, present, n_cls, low, high)
    out = []
    for y in splits:
        pieces = [split_by_shares(pool, shares[:, c]) if shares[:, c].any() else None
                  for c, pool in enumerate(class_pools(y, n_cls, rng))]
        used = [p for p in pieces if p is not None]
        out.append([np.concatenate([p[i] for p in used] + [np.empty(0, np.int64)])
                    for i in range(num_clients)])
    return finish(out, paired)
