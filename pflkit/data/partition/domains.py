"""Feature-shift clients: every client lives in one domain (FedL2P sec. 4.1.1).

Each domain (CIFAR-10-C corruption, Office-Caltech-10 / DomainNet source) is
split among ``num_clients / n_domains`` clients: IID inside the domain, or
with the LDA label skew of `dirichlet` when ``alpha`` is given (FedL2P:
DomainNet 6 domains x 25 clients with ``Dir(alpha)``; CIFAR-10-C 10
corruptions x 25 clients). ``equalize=True`` first subsamples every domain to
the size of the smallest one, as FedL2P does for Office-Caltech-10 and
DomainNet. Clients are numbered domain by domain, in increasing domain id:
client ``i`` belongs to domain ``domain_assignment(...)[i]``.
"""
from __future__ import annotations

import numpy as np

from ._common import (
    as_splits, check_alpha, check_groups, check_num_clients, class_pools, finish, make_rng,
    num_classes,
)
from .dirichlet import draw_proportions, lda_allocate


def _check(labels, num_clients, groups, key, alpha):
    splits, paired = as_splits(labels)
    check_num_clients(num_clients)
    gids = check_groups(groups, key, splits, paired)
    domains = np.unique(np.concatenate(gids))
    if num_clients % domains.size:
        raise ValueError(
            f"num_clients={num_clients} is not divisible by the {domains.size} domains of {key!r}"
        )
    per = num_clients // domains.size
    alphas = None if alpha is None else check_alpha(alpha, num_clients)
    return splits, paired, gids, domains, per, alphas


def domain_assignment(labels, num_clients: int, *, groups, key: str = "domain") -> np.ndarray:
    """Domain id of each client of `domains` (same arguments): int64 (num_clients,)."""
    _, _, _, doms, per, _ = _check(labels, num_clients, groups, key, None)
    return np.repeat(doms, per)


def _members(g: np.ndarray, domains: np.ndarray, equalize: bool, rng) -> list[np.ndarray]:
    """Shuffled sample indices of each domain, cut to the smallest domain if asked."""
    members = [rng.permutation(np.flatnonzero(g == d)) for d in domains]
    if equalize:
        smallest = min(m.size for m in members)
        members = [m[:smallest] for m in members]
    return members


def domains(labels, num_clients: int, *, groups, seed: int, alpha=None, equalize: bool = False,
            key: str = "domain"):
    """Split each domain among ``num_clients / n_domains`` clients.

    Args:
        labels: label array, or a tuple of label arrays (one per split).
        num_clients: a multiple of the number of domains (== it for one client per domain).
        groups: dict with a per-sample domain id under ``key`` (a tuple of dicts
            for paired splits). Domains are the distinct ids over all splits.
        seed: seed of ``np.random.default_rng``.
        alpha: None for IID clients within a domain; otherwise the `dirichlet`
            concentration (scalar or one per client). Paired splits share the
            clients' label proportions.
        equalize: subsample every domain to the smallest domain's size first
            (per split).
        key: metadata key holding the domain id.

    Returns:
        list of int64 index arrays (one per client, never mixing domains), or a
        tuple of such lists.
    """
    splits, paired, gids, doms, per, alphas = _check(labels, num_clients, groups, key, alpha)
    for i, (g, y) in enumerate(zip(gids, splits)):
        sizes = np.array([np.count_nonzero(g == d) for d in doms])
        if equalize:
            sizes[:] = sizes.min()
        if sizes.min() < per and (len(splits) == 1 or sizes.min() > 0):
            d = doms[sizes.argmin()]
            raise ValueError(
                f"domain {d} has {sizes.min()} samples in split {i}, fewer than its {per} clients"
            )
    rng = make_rng(seed)
    k = num_classes(splits)
    q = None if alphas is None else draw_proportions(rng, alphas, k)  # the shared plan
    out = []
    for y, g in zip(splits, gids):
        parts = []
        for j, m in enumerate(_members(g, doms, equalize, rng)):
            if q is None:
                parts += np.array_split(m, per)
            else:
                pools = [m[p] for p in class_pools(y[m], k, rng)]
                parts += lda_allocate(pools, q[j * per:(j + 1) * per], [m.size // per] * per, rng)
        out.append(parts)
    return finish(out, paired)
