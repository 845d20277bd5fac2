"""Natural partition: one client per group (speaker, alphabet, drawer).

Speech Commands is "naturally partitioned by speaker, with one client per
speaker" (FedL2P sec. 4.1.1); FedL2P's *seen* pool is the 250 training
speakers with the most data, its *unseen* pool 50 of the held-out speakers.
``choose="largest"`` reproduces the former, ``choose="random"`` draws the
groups uniformly (e.g. for the unseen pool).
"""
from __future__ import annotations

import numpy as np

from ._common import as_splits, check_groups, check_num_clients, finish, make_rng

CHOICES = ("largest", "random")


def _check(labels, num_clients, groups, key, choose):
    splits, paired = as_splits(labels)
    check_num_clients(num_clients)
    if choose not in CHOICES:
        raise ValueError(f"choose must be one of {CHOICES}, got {choose!r}")
    gids = check_groups(groups, key, splits, paired)
    values, counts = np.unique(np.concatenate(gids), return_counts=True)
    if num_clients > values.size:
        raise ValueError(
            f"num_clients={num_clients} is more than the {values.size} distinct {key!r} groups"
        )
    return splits, paired, gids, values, counts


def natural_groups(labels, num_clients: int, *, groups, key: str, seed: int,
                   choose: str = "largest") -> np.ndarray:
    """Group id of each client of `natural` (same arguments), in client order."""
    _, _, _, values, counts = _check(labels, num_clients, groups, key, choose)
    return _pick(values, counts, num_clients, choose, make_rng(seed))


def _pick(values, counts, num_clients, choose, rng) -> np.ndarray:
    if choose == "largest":
        # Most samples (over all splits) first; equal sizes keep increasing group id.
        order = np.lexsort((values, -counts))
    else:
        order = rng.permutation(values.size)
    return np.sort(values[order[:num_clients]])


def natural(labels, num_clients: int, *, groups, key: str, seed: int, choose: str = "largest"):
    """One client per distinct value of ``groups[key]``.

    Args:
        labels: label array, or a tuple of label arrays (one per split).
        num_clients: number of clients (<= number of groups).
        groups: dict of per-sample group arrays (a tuple of dicts for paired
            splits; group ids are shared across splits).
        key: the metadata key, e.g. ``"speaker"``, ``"alphabet"``, ``"drawer"``.
        seed: seed of ``np.random.default_rng`` (used by ``choose="random"``).
        choose: with more groups than clients, keep the ``"largest"`` groups
            (by total samples over all splits) or ``"random"`` ones.

    Returns:
        list of int64 index arrays, client ``i`` holding all samples of group
        ``natural_groups(...)[i]`` (clients ordered by group id), or a tuple of
        such lists (a group absent from a split gives an empty array).
    """
    splits, paired, gids, values, counts = _check(labels, num_clients, groups, key, choose)
    chosen = _pick(values, counts, num_clients, choose, make_rng(seed))
    out = [[np.flatnonzero(g == v) for v in chosen] for g in gids]
    return finish(out, paired)
