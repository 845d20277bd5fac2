"""Per-class Dirichlet split and the TV distance to novel clients (pFedHN sec. 5.3).

pFedHN draws ``p_i ~ Dir(alpha 1_K)`` for every client, normalizes over
clients so that ``sum_i p_hat_{i,j} = 1`` for every class ``j``, and gives
client ``i`` the share ``p_hat_{i,j}`` of class ``j``'s samples. Unlike the
LDA split (`dirichlet`), every sample is used and client sizes vary.
``alpha`` may differ per client: 90 training clients at 0.1 and 10 novel
clients at 0.5 are one call with a length-100 ``alpha``. The novel-client
figure (pFedHN Fig. 2 / 7) plots accuracy against the total variation
distance between a novel client's empirical label distribution and its
nearest training client, computed by `nearest_tv`.
"""
from __future__ import annotations

import numpy as np

from ._common import (
    as_splits, check_alpha, check_num_clients, class_pools, finish, make_rng, num_classes,
    split_by_shares,
)
from .dirichlet import draw_proportions


def _normalize_over_clients(p: np.ndarray) -> np.ndarray:
    total = p.sum(axis=0, keepdims=True)
    # A class on which every client drew (numerically) zero mass: share it equally.
    return np.where(total > 0, p / np.where(total > 0, total, 1.0), 1.0 / p.shape[0])


def class_dirichlet_proportions(labels, num_clients: int, *, alpha, seed: int) -> np.ndarray:
    """The plan of `class_dirichlet`: ``p_hat`` (num_clients, K), columns summing to 1.

    Exactly the shares `class_dirichlet` uses with the same arguments.
    """
    splits, _ = as_splits(labels)
    check_num_clients(num_clients, splits)
    alphas = check_alpha(alpha, num_clients)
    return _normalize_over_clients(draw_proportions(make_rng(seed), alphas, num_classes(splits)))


def class_dirichlet(labels, num_clients: int, *, alpha, seed: int):
    """pFedHN sec. 5.3: class ``j`` is split among clients in shares ``p_hat_{:,j}``.

    Args:
        labels: label array, or a tuple of label arrays (one per split); paired
            splits share ``p_hat``, so each client's test set follows its train
            distribution.
        num_clients: number of clients.
        alpha: Dirichlet concentration (> 0), scalar or one per client.
        seed: seed of ``np.random.default_rng``.

    Returns:
        list of int64 index arrays (one per client; sizes vary), or a tuple of
        such lists. Every sample goes to exactly one client; each client's count
        of class ``j`` is within one of ``p_hat_{i,j} * n_j``.
    """
    splits, paired = as_splits(labels)
    check_num_clients(num_clients, splits)
    alphas = check_alpha(alpha, num_clients)
    rng = make_rng(seed)
    k = num_classes(splits)
    p_hat = _normalize_over_clients(draw_proportions(rng, alphas, k))
    out = []
    for y in splits:
        per_class = [split_by_shares(pool, p_hat[:, j]) for j, pool in enumerate(class_pools(y, k, rng))]
        out.append([np.concatenate([pieces[i] for pieces in per_class] + [np.empty(0, np.int64)])
                    for i in range(num_clients)])
    return finish(out, paired)


def _as_distributions(h, name: str) -> np.ndarray:
    arr = np.asarray(h, dtype=float)
    if arr.ndim == 0 or arr.shape[-1] == 0:
        raise ValueError(f"{name} must have a non-empty last (class) axis, got shape {arr.shape}")
    if np.any(~np.isfinite(arr)) or np.any(arr < 0):
        raise ValueError(f"{name} must hold non-negative finite counts or probabilities")
    total = arr.sum(axis=-1, keepdims=True)
    if np.any(total <= 0):
        raise ValueError(f"{name} has a row with zero total mass; it is not a distribution")
    return arr / total


def total_variation(p, q) -> np.ndarray:
    """Total variation distance ``TV(p, q) = 1/2 sum_j |p_j - q_j|``.

    Args:
        p, q: histograms (counts) or probability vectors along the last axis;
            each is normalized to sum to 1 first. Leading axes broadcast.

    Returns:
        TV distance(s) in [0, 1] (a float array; 0-d for two vectors).
    """
    p, q = _as_distributions(p, "p"), _as_distributions(q, "q")
    if p.shape[-1] != q.shape[-1]:
        raise ValueError(f"p has {p.shape[-1]} classes but q has {q.shape[-1]}")
    return 0.5 * np.abs(p - q).sum(axis=-1)


def nearest_tv(novel_hists, train_hists, *, return_index: bool = False):
    """TV distance of each novel client to its nearest training client (pFedHN Fig. 2).

    Args:
        novel_hists: (n_novel, K) label histograms of the novel clients.
        train_hists: (n_train, K) label histograms of the training clients.
        return_index: also return which training client is nearest.

    Returns:
        (n_novel,) distances, and with ``return_index`` the (n_novel,) indices.
    """
    novel = np.atleast_2d(np.asarray(novel_hists, dtype=float))
    train = np.atleast_2d(np.asarray(train_hists, dtype=float))
    tv = total_variation(novel[:, None, :], train[None, :, :])  # (n_novel, n_train)
    nearest = tv.argmin(axis=1)
    dist = tv[np.arange(tv.shape[0]), nearest]
    return (dist, nearest) if return_index else dist
