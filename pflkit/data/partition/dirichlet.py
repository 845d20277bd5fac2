"""Latent-Dirichlet-allocation (LDA) label skew with equal client sizes (FedL2P sec. 4.1).

FedL2P follows the LDA partition of Hsu et al. / FedMA: every client ``i``
draws label proportions ``q_i ~ Dir(alpha * 1_K)`` and then receives an equal
number of samples whose labels follow ``q_i`` as closely as the remaining pool
allows. Clients are filled one after another; a client's draws that land on a
class with no samples left are redrawn from ``q_i`` renormalized over the
classes that still have samples (so later clients can be pushed away from
their ``q_i`` when a class runs out). ``alpha -> inf`` gives IID clients,
``alpha -> 0`` one class per client; FedL2P uses 1000 (practically IID), 1.0,
0.5 and 0.1.
"""
from __future__ import annotations

import numpy as np

from ._common import (
    as_splits, check_alpha, check_num_clients, check_positive_int, class_pools, finish,
    make_rng, num_classes, per_split,
)


def draw_proportions(rng: np.random.Generator, alphas: np.ndarray, k: int) -> np.ndarray:
    """One ``Dir(alpha_i * 1_k)`` draw per client: array (num_clients, k)."""
    return np.stack([rng.dirichlet(np.full(k, a)) for a in alphas])


def _draw_counts(q: np.ndarray, n: int, room: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Class counts of ``n`` draws from ``q``, redrawing any draw on a full class.

    Equivalent to drawing samples one at a time from ``q`` renormalized over
    the non-exhausted classes: a multinomial draw is capped at each class's
    room and the excess is redrawn among the classes with room left; every
    round fills at least one class, so at most K + 1 rounds run.
    """
    counts = np.zeros_like(room)
    need = n
    while need > 0:
        free = room - counts
        p = np.where(free > 0, q, 0.0)
        if not p.sum() > 0:  # q has (numerically) no mass on what is left
            p = free.astype(float)  # fall back to the pool's own proportions
        draw = rng.multinomial(need, p / p.sum())
        got = np.minimum(draw, free)
        counts += got
        need -= int(got.sum())
    return counts


def lda_allocate(
    pools: list[np.ndarray], q: np.ndarray, sizes, rng: np.random.Generator
) -> list[np.ndarray]:
    """Fill clients one by one from per-class pools following proportions ``q``.

    Args:
        pools: shuffled sample indices of each class (length K).
        q: (num_clients, K) label proportions, rows summing to 1.
        sizes: samples per client; their sum must not exceed the pool.
        rng: generator for the count draws.

    Returns:
        one index array per client.
    """
    room = np.array([p.size for p in pools], dtype=np.int64)
    start = np.zeros_like(room)
    parts = []
    for qi, n in zip(q, sizes):
        counts = _draw_counts(qi, int(n), room - start, rng)
        parts.append(np.concatenate(
            [pools[c][start[c]:start[c] + counts[c]] for c in range(len(pools))]
            + [np.empty(0, dtype=np.int64)]
        ))
        start += counts
    return parts


def _check_sizes(samples_per_client, num_clients: int, splits) -> tuple[int, ...]:
    sizes = per_split(samples_per_client, len(splits), "samples_per_client")
    out = []
    for i, (s, y) in enumerate(zip(sizes, splits)):
        s = y.size // num_clients if s is None else check_positive_int(s, "samples_per_client")
        if s * num_clients > y.size:
            raise ValueError(
                f"samples_per_client={s} x num_clients={num_clients} exceeds the "
                f"{y.size} samples of split {i}"
            )
        out.append(s)
    return tuple(out)


def dirichlet_proportions(labels, num_clients: int, *, alpha, seed: int) -> np.ndarray:
    """The plan of `dirichlet` for the same arguments: ``q`` (num_clients, K).

    Row ``i`` is client ``i``'s target label distribution ``q_i ~ Dir(alpha_i 1_K)``,
    exactly the draw `dirichlet` makes with this seed.
    """
    splits, _ = as_splits(labels)
    check_num_clients(num_clients, splits)
    alphas = check_alpha(alpha, num_clients)
    return draw_proportions(make_rng(seed), alphas, num_classes(splits))


def dirichlet(labels, num_clients: int, *, alpha, seed: int, samples_per_client=None):
    """FedL2P's LDA partition: ``q_i ~ Dir(alpha 1_K)``, equal client sizes.

    Args:
        labels: label array, or a tuple of label arrays (one per split); paired
            splits share the proportions ``q_i``, so each client's test set has
            the label distribution of its train set.
        num_clients: number of clients.
        alpha: concentration (> 0), a scalar or one value per client.
        seed: seed of ``np.random.default_rng``.
        samples_per_client: samples per client (default ``N // num_clients``);
            a tuple gives one value per split.

    Returns:
        list of int64 index arrays (one per client, each of the same size), or
        a tuple of such lists for paired splits.
    """
    splits, paired = as_splits(labels)
    check_num_clients(num_clients, splits)
    alphas = check_alpha(alpha, num_clients)
    sizes = _check_sizes(samples_per_client, num_clients, splits)
    rng = make_rng(seed)
    k = num_classes(splits)
    q = draw_proportions(rng, alphas, k)  # the plan: drawn first, shared by all splits
    out = [lda_allocate(class_pools(y, k, rng), q, [s] * num_clients, rng)
           for y, s in zip(splits, sizes)]
    return finish(out, paired)
