"""Label concept drift over a class hierarchy (pFedVEM sec. 3.1).

The task is superclass prediction, but each client sees every superclass
through one random subclass of it, so the class-conditionals ``P_j(x | y)``
differ across clients while the label marginals ``P_j(y)`` stay the same
(Definition 2.1). Every subclass's samples are shuffled and split evenly
among the clients that drew it, so client sizes vary ("random sampling
without replacement"); with ``equal_marginals=True`` each client then keeps
the same number of samples of every superclass (the minimum over its
superclasses), making ``P_j(y)`` exactly uniform on every client.

The returned indices point at samples whose ``labels`` are still the fine
classes; the task label of sample ``n`` is ``superclass[labels[n]]``.
"""
from __future__ import annotations

import numpy as np

from ._common import as_splits, check_num_clients, class_pools, finish, make_rng, num_classes


def _check(labels, num_clients, superclass):
    splits, paired = as_splits(labels)
    check_num_clients(num_clients)
    if superclass is None:
        raise ValueError("superclass is required: an array mapping class id -> superclass id")
    sc = np.asarray(superclass.detach().cpu().numpy() if hasattr(superclass, "detach") else superclass)
    if sc.ndim != 1 or sc.size == 0 or not np.issubdtype(sc.dtype, np.integer) or sc.min() < 0:
        raise ValueError(
            "superclass must be a non-empty 1-D array of non-negative int superclass ids, "
            f"got shape {sc.shape} and dtype {sc.dtype}"
        )
    k = num_classes(splits)
    if sc.size < k:
        raise ValueError(
            f"superclass has length {sc.size} but the labels contain class {k - 1}: "
            "the map is missing classes"
        )
    counts = np.stack([np.bincount(y, minlength=sc.size) for y in splits])
    usable = (counts > 0).all(axis=0)  # a subclass must have samples in every split
    supers = np.unique(sc)
    candidates = [np.flatnonzero((sc == s) & usable) for s in supers]
    for s, cand in zip(supers, candidates):
        if cand.size == 0:
            raise ValueError(f"superclass {s} has no subclass with samples in every split")
    return splits, paired, sc.astype(np.int64), counts, candidates


def _draw_choices(rng, num_clients, candidates) -> np.ndarray:
    """The plan: (num_clients, n_superclasses) subclass drawn by each client."""
    cols = [cand[rng.integers(0, cand.size, size=num_clients)] for cand in candidates]
    return np.stack(cols, axis=1)


def concept_drift_choices(labels, num_clients: int, *, superclass, seed: int,
                          equal_marginals: bool = True) -> np.ndarray:
    """Which subclass each client of `concept_drift` drew (same arguments).

    Returns:
        int64 array (num_clients, n_superclasses); column ``s`` is for the
        ``s``-th smallest superclass id.
    """
    _, _, _, _, candidates = _check(labels, num_clients, superclass)
    return _draw_choices(make_rng(seed), num_clients, candidates)


def concept_drift(labels, num_clients: int, *, superclass, seed: int,
                  equal_marginals: bool = True):
    """pFedVEM's concept-drift partition: one random subclass per superclass per client.

    Args:
        labels: fine (sub)class labels, or a tuple of them (one per split);
            paired splits share each client's subclass choices.
        num_clients: number of clients.
        superclass: array mapping class id -> superclass id (length >= the
            number of classes); every superclass needs a subclass with samples.
        seed: seed of ``np.random.default_rng``.
        equal_marginals: trim every client to the same count per superclass.

    Returns:
        list of int64 index arrays (one per client), or a tuple of such lists.

    Raises:
        ValueError: bad ``superclass`` map, or (after drawing the plan, before
            allocating) a drawn subclass with fewer samples than clients drawing it.
    """
    splits, paired, sc, counts, candidates = _check(labels, num_clients, superclass)
    rng = make_rng(seed)
    choices = _draw_choices(rng, num_clients, candidates)
    drawn, holders = np.unique(choices, return_counts=True)
    for split, row in enumerate(counts):
        short = row[drawn] < holders
        if short.any():
            c = drawn[short][0]
            raise ValueError(
                f"subclass {c} has {row[c]} samples in split {split} but {holders[short][0]} "
                "clients drew it; use fewer clients or more data"
            )
    out = []
    for y in splits:
        pools = class_pools(y, sc.size, rng)
        pieces = [[None] * choices.shape[1] for _ in range(num_clients)]
        for c in drawn:
            who = np.argwhere(choices == c)  # (client, superclass column) pairs, client order
            for (i, s), part in zip(who, np.array_split(pools[c], len(who))):
                pieces[i][s] = part
        if equal_marginals:
            pieces = [[p[:min(q.size for q in row)] for p in row] for row in pieces]
        out.append([np.concatenate(row) for row in pieces])
    return finish(out, paired)
