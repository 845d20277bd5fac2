"""Do the meta-nets' inputs and outputs know the clients' domains? (FedL2P sec. 4.4, Table 6, Fig. 3 / 5)

FedL2P clusters the clients by the inputs of its meta-nets (BNNet's xi, LRNet's feature
statistics x) and by their outputs (beta, eta), and compares each clustering with the
true domains:

* `cluster_ari`: spectral clustering (scikit-learn) of a similarity matrix built from the
  clients' Euclidean distances, labels assigned by discretization (Yu & Shi 2003,
  ``assign_labels="discretize"``), scored by the adjusted Rand index against the domains
  (Table 6). 1 = the domains exactly, about 0 = no better than chance.
* `domain_distance_map`: the normalized log distance map of Fig. 3 / 5:
  ``log(d(j, k) / sqrt(d(j, j) d(k, k)))`` with ``d(j, k)`` the mean Euclidean distance
  between the clients of domains j and k. Diagonal 0; an off-diagonal block > 0 means the
  domains are farther apart than their clients are within them, about 0 means mixed.

Our readings where the paper leaves a choice: the similarity is scikit-learn's RBF kernel
``exp(-gamma d^2)`` (its default affinity) with ``gamma = 1 / median(d^2)`` over distinct
pairs instead of scikit-learn's fixed ``gamma = 1``, which would make the result depend on
the units (learning rates are ~1e-3, xi can be ~1e2); within-domain distances average over
pairs of *distinct* clients (a domain with one client has no within distance: NaN).
With as many clusters as clients every client is its own cluster (spectral clustering is
undefined there), so one client per domain scores ARI 1 trivially (Office-Caltech-10's 4
clients in Table 6); points that are all identical form one cluster (ARI 0).

The ARI is scale-free: the kernel width follows the median distance, so outputs that vary
by 1e-6 around a constant cluster exactly like their inputs and score the inputs' ARI. An
output ARI therefore says nothing about *how much* the hyperparameters differ between
clients. `group_spread` measures that (the between-domain and within-domain standard
deviations, absolute and relative to the level of each coordinate) and `meta_net_clustering`
reports it beside every ARI, so that a near-constant output cannot pass for personalization.
"""
from __future__ import annotations

import numpy as np

__all__ = ["pairwise_distances", "rbf_affinity", "spectral_clusters", "adjusted_rand", "cluster_ari",
           "domain_distance_map", "report_matrix", "meta_net_ari", "META_NET_KEYS", "group_spread",
           "meta_net_spread", "meta_net_clustering", "NEAR_CONSTANT"]

# relative between-domain spread below which an output is reported as near-constant across clients
NEAR_CONSTANT = 1e-3

# report key -> (meta-net, role): the four columns of Table 6
META_NET_KEYS = {"xi": ("BNNet", "input"), "beta": ("BNNet", "output"),
                 "features": ("LRNet", "input"), "eta": ("LRNet", "output")}


def _check(x, domains=None) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim == 1:
        x = x[:, None]
    if x.ndim != 2 or x.shape[0] < 2:
        raise ValueError(f"features must be (n >= 2, d), got shape {x.shape}")
    if not np.isfinite(x).all():
        raise ValueError("features contain non-finite values")
    if domains is not None and np.shape(domains) != (x.shape[0],):
        raise ValueError(f"domains must have one entry per client ({x.shape[0]}), got shape {np.shape(domains)}")
    return x


def pairwise_distances(x) -> np.ndarray:
    """Euclidean distances between the rows of ``x`` (n, d): (n, n), zero diagonal."""
    x = _check(x)
    sq = ((x[:, None, :] - x[None, :, :]) ** 2).sum(-1)
    return np.sqrt(np.maximum(sq, 0.0))


def rbf_affinity(x, gamma: float | None = None) -> np.ndarray:
    """``exp(-gamma d^2)``; ``gamma=None`` takes 1 / the median squared distance of distinct pairs.

    When most pairs coincide (median 0), the median of the non-zero squared distances is used.
    """
    d2 = pairwise_distances(x) ** 2
    if gamma is None:
        off = d2[~np.eye(len(d2), dtype=bool)]
        scale = np.median(off) if np.median(off) > 0 else (np.median(off[off > 0]) if (off > 0).any() else 1.0)
        gamma = 1.0 / scale
    if gamma <= 0:
        raise ValueError(f"gamma must be > 0, got {gamma!r}")
    return np.exp(-gamma * d2)


def spectral_clusters(x, n_clusters: int, *, gamma: float | None = None, seed: int = 0) -> np.ndarray:
    """Cluster labels (n,) of the rows of ``x``: spectral clustering with discretized labels.

    Args:
        x: (n, d) features, one row per client.
        n_clusters: number of clusters (FedL2P: the number of domains).
        gamma: RBF width (see `rbf_affinity`); None = median heuristic.
        seed: ``random_state`` of the eigen-solver and the discretization.
    """
    x = _check(x)
    if isinstance(n_clusters, bool) or not isinstance(n_clusters, (int, np.integer)) or n_clusters < 1:
        raise ValueError(f"n_clusters must be a positive integer, got {n_clusters!r}")
    n = len(x)
    if n_clusters >= n:
        return np.arange(n)
    if n_clusters == 1 or not pairwise_distances(x).any():
        return np.zeros(n, dtype=np.int64)
    from sklearn.cluster import SpectralClustering

    model = SpectralClustering(n_clusters=int(n_clusters), affinity="precomputed", assign_labels="discretize",
                               random_state=seed)
    return model.fit_predict(rbf_affinity(x, gamma)).astype(np.int64)


def adjusted_rand(labels_true, labels_pred) -> float:
    """Adjusted Rand index (Hubert & Arabie 1985) of two labelings (scikit-learn)."""
    from sklearn.metrics import adjusted_rand_score

    return float(adjusted_rand_score(np.asarray(labels_true), np.asarray(labels_pred)))


def cluster_ari(x, domains, *, n_clusters: int | None = None, gamma: float | None = None, seed: int = 0) -> float:
    """ARI between the spectral clustering of ``x`` and the true ``domains`` (Table 6).

    ``n_clusters`` defaults to the number of distinct domains.
    """
    x = _check(x, domains)
    k = len(np.unique(domains)) if n_clusters is None else n_clusters
    return adjusted_rand(domains, spectral_clusters(x, k, gamma=gamma, seed=seed))


def domain_distance_map(x, domains) -> tuple[np.ndarray, np.ndarray]:
    """The normalized log distance map of FedL2P Fig. 3 / 5.

    Returns:
        ``(names, m)``: the sorted distinct domains and the (D, D) matrix
        ``m[j, k] = log(d(j, k) / sqrt(d(j, j) d(k, k)))``, where ``d(j, k)`` is the mean
        distance between clients of domain j and of domain k (distinct clients when j = k).
        Rows / columns of a domain with one client, or zero within-distance, are NaN.
    """
    x = _check(x, domains)
    g = np.asarray(domains)
    names = np.unique(g)
    dist = pairwise_distances(x)
    members = [np.flatnonzero(g == name) for name in names]
    d = np.empty((len(names), len(names)))
    for j, a in enumerate(members):
        for k, b in enumerate(members):
            block = dist[np.ix_(a, b)]
            if j == k:
                block = block[~np.eye(len(a), dtype=bool)]
            d[j, k] = block.mean() if block.size else np.nan
    within = np.sqrt(np.where(np.diag(d) > 0, np.diag(d), np.nan))
    with np.errstate(divide="ignore", invalid="ignore"):
        m = np.log(d / np.outer(within, within))
    return names, m


def report_matrix(rows: list[dict], key: str) -> np.ndarray:
    """(clients, dims) matrix of one field of a FedL2P hyperparameter report.

    ``rows`` is `pflkit.algorithms.fedl2p.hyperparameter_report`'s output (or the
    ``*.report.json`` the runner writes); ``key`` is ``"xi"``, ``"beta"``, ``"features"``,
    ``"eta"`` (dicts are read in their stored order) or ``"sparsity"``.
    """
    if not rows:
        raise ValueError("report_matrix: the report has no clients")
    if key not in rows[0]:
        raise ValueError(f"report_matrix: unknown key {key!r}; the report has {sorted(rows[0])}")

    def values(v):
        return list(v.values()) if isinstance(v, dict) else (v if isinstance(v, list) else [v])

    return np.array([values(r[key]) for r in rows], dtype=np.float64)


def meta_net_ari(rows: list[dict], domains, *, seed: int = 0, keys=tuple(META_NET_KEYS)) -> dict[str, float]:
    """Table 6 for one run: ARI of the clustering of each of xi, beta, features, eta vs the domains.

    A key whose matrix is empty (e.g. beta without BN layers) gives NaN.
    """
    out = {}
    for key in keys:
        m = report_matrix(rows, key)
        out[key] = cluster_ari(m, domains, seed=seed) if m.size and m.shape[1] else float("nan")
    return out


def group_spread(x, groups) -> dict[str, float]:
    """How much per-client values differ between groups (domains) and within them.

    For each coordinate k of ``x`` (n clients, d coordinates): the group means ``m_gk``
    (each group weighted equally), ``between_k`` = their standard deviation over groups,
    ``within_k`` = the root of the mean over groups of the variance inside the group
    (population variances, ddof 0), ``level_k`` = ``|mean over clients of x_k|``.
    Coordinates are summarized by their root mean square:

    * ``between``, ``within``: ``sqrt(mean_k between_k^2)``, ``sqrt(mean_k within_k^2)``
      (the units of ``x``: beta's, or learning rates);
    * ``between_rel``, ``within_rel``: the same of ``between_k / level_k`` and
      ``within_k / level_k`` (scale-free, e.g. eta's spread as a share of each tensor's
      learning rate); coordinates with level 0 are left out (NaN if all are);
    * ``level``: ``sqrt(mean_k level_k^2)``; ``separation``: ``between / within``
      (inf when the groups are internally constant but differ, NaN when both are 0).

    Args:
        x: (n,) or (n, d) values, one row per client.
        groups: (n,) group (domain) of each client; at least two groups.
    """
    x = _check(x, groups)
    g = np.asarray(groups)
    names = np.unique(g)
    if len(names) < 2:
        raise ValueError(f"group_spread needs at least two groups, got {len(names)}")
    means = np.stack([x[g == name].mean(0) for name in names])
    between = means.std(0)
    within = np.sqrt(np.mean([x[g == name].var(0) for name in names], axis=0))
    level = np.abs(x.mean(0))

    def rms(v):
        v = v[np.isfinite(v)]
        return float(np.sqrt(np.mean(v ** 2))) if v.size else float("nan")

    with np.errstate(divide="ignore", invalid="ignore"):
        rel_b, rel_w = between / level, within / level
        b, w = rms(between), rms(within)
        sep = b / w if w > 0 else (float("inf") if b > 0 else float("nan"))
    return {"between": b, "within": w, "between_rel": rms(np.where(level > 0, rel_b, np.nan)),
            "within_rel": rms(np.where(level > 0, rel_w, np.nan)), "level": rms(level), "separation": sep}


def meta_net_spread(rows: list[dict], domains, *, keys=tuple(META_NET_KEYS)) -> dict[str, dict]:
    """`group_spread` of each of xi, beta, features, eta of a FedL2P report against the domains."""
    out = {}
    for key in keys:
        m = report_matrix(rows, key)
        out[key] = group_spread(m, domains) if m.size and m.shape[1] else {
            k: float("nan") for k in ("between", "within", "between_rel", "within_rel", "level", "separation")}
    return out


def meta_net_clustering(rows: list[dict], domains, *, seed: int = 0, keys=tuple(META_NET_KEYS)) -> dict[str, dict]:
    """Table 6 with its scale: per key, ``{"ari", **group_spread, "near_constant"}``.

    ``near_constant`` is True when the between-domain spread is below `NEAR_CONSTANT` of the
    values' level: the clustering (and its ARI) then reflects the inputs' structure carried
    through an almost constant map, not hyperparameters that differ between clients.
    """
    aris = meta_net_ari(rows, domains, seed=seed, keys=keys)
    spreads = meta_net_spread(rows, domains, keys=keys)
    return {k: {"ari": aris[k], **spreads[k],
                "near_constant": _near_constant(spreads[k])} for k in keys}


def _near_constant(spread: dict) -> bool:
    # exactly equal group means (e.g. every beta clamped to 0) count as constant too
    return bool(spread["between"] == 0 or spread["between_rel"] < NEAR_CONSTANT)
