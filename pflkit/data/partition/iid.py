"""IID partition: shuffle and cut into (nearly) equal pieces.

The reference point every non-IID scheme is compared against (FedL2P's
alpha = 1000 is "practically" this).
"""
from __future__ import annotations

import numpy as np

from ._common import as_splits, check_num_clients, finish, make_rng


def iid(labels, num_clients: int, *, seed: int):
    """Split the samples uniformly at random into equal-size clients.

    Client sizes differ by at most one (the first ``N % num_clients`` clients
    get one extra sample). With paired splits each split is shuffled and cut
    on its own: an IID plan has nothing to share across splits.

    Args:
        labels: label array, or a tuple of label arrays (one per split).
        num_clients: number of clients (1 <= num_clients <= samples per split).
        seed: seed of ``np.random.default_rng``.

    Returns:
        list of int64 index arrays (one per client), or a tuple of such lists.
    """
    splits, paired = as_splits(labels)
    check_num_clients(num_clients, splits)
    rng = make_rng(seed)
    out = [np.array_split(rng.permutation(y.size), num_clients) for y in splits]
    return finish(out, paired)
