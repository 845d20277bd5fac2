"""Label concept drift over a class hierarchy (pFedVEM sec. 3.1).

The task is superclass prediction, but each client sees every superclass
through one random subclass of it, so the class-conditionals ``P_j(x | y)``
differ across clients while the label marginals ``P_j(y)`` stay the same
(Definition 2.1). The returned indices point at samples whose ``labels`` are
still the fine classes; the task label of sample ``n`` is ``superclass[labels[n]]``.

Client sizes (``sizes``); every client takes the same count m_j from each of its
subclasses, so its superclass marginal is exactly uniform:

* ``"spacings"`` (default; the authors' CIFAR-100 code): clients come in consecutive
  groups of ``group_size`` (5). Each group g gets a size m_g from uniform spacings:
  K - 1 distinct cut points drawn from {1, ..., B - 1} cut B into K pieces (K groups,
  B = floor(min_s n_s / group_size), n_s = the superclass's samples). With 5 subclasses
  per superclass and equal class sizes (CIFAR-100: B = 500) every sample is used once
  and the expected client size is N / J (the paper's "expected data size", Table 1:
  50000 / J); with unequal superclasses the scarcest one bounds the sizes.
* ``"uniform"`` (the authors' SUN397 code): m_j = round(U(1, max_per_superclass)), drawn
  per client (67: about 3 x 34 = 102 samples per client with 3 superclasses).
* ``"even"`` (pflkit's earlier scheme): every drawn subclass is split evenly among the
  clients that drew it; ``equal_marginals=True`` then trims each client to its smallest
  count per superclass.

Subclass choice: within a group of ``group_size`` clients the subclasses of each
superclass are distinct (the authors shuffle each superclass's 5 subclasses and give one
to each client of the group; a superclass with fewer subclasses than the group starts a
new round of distinct picks when it runs out). ``group_size = 1`` draws independently
per client (the authors' SUN397 code; with ``sizes="even"`` pflkit's earlier scheme).
For ``"spacings"`` / ``"uniform"`` clients are served in order and a client draws,
uniformly, among the allowed subclasses that still hold m_j samples (the SUN397 rule;
for CIFAR-100 it is exactly a random permutation per group); when none does, m_j is
lowered to the most the allowed subclasses can give (logged). The samples are taken
without replacement.

Later splits of paired labels (the test split) follow the plan (``test``): ``"shared"``
(the authors' code) gives every client all the samples of its subclasses, so clients
holding a subclass share its test images; ``"split"`` divides them among the holders
(in proportion to their counts in the first split; evenly with ``sizes="even"``).
"""
from __future__ import annotations

import logging

import numpy as np

from ._common import as_splits, check_num_clients, class_pools, finish, make_rng, num_classes, split_by_shares

log = logging.getLogger(__name__)

SIZES = ("spacings", "uniform", "even")
TESTS = ("shared", "split")


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


def _check_options(sizes, group_size, max_per_superclass, test, equal_marginals) -> None:
    if sizes not in SIZES:
        raise ValueError(f"sizes={sizes!r}: use one of {', '.join(SIZES)}")
    if test not in TESTS:
        raise ValueError(f"test={test!r}: use one of {', '.join(TESTS)}")
    for name, v in (("group_size", group_size), ("max_per_superclass", max_per_superclass)):
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{name}={v!r}: must be an int >= 1")
    if not equal_marginals and sizes != "even":
        raise ValueError(f"equal_marginals=False only applies to sizes='even' (sizes={sizes!r} gives every client "
                         "equal counts per superclass by construction)")


# ---------------------------------------------------------------- subclass choice


class _Groups:
    """Distinct subclasses within each group of ``size`` consecutive clients, per superclass."""

    def __init__(self, candidates, size: int):
        self.candidates, self.size = candidates, size
        self.used = [set() for _ in candidates]

    def allowed(self, client: int, s: int, left: np.ndarray | None = None) -> np.ndarray:
        """Subclasses of superclass ``s`` client ``client`` may draw (those with samples ``left``)."""
        if client % self.size == 0:  # a new group starts
            self.used[s] = set()
        cand = self.candidates[s] if left is None else self.candidates[s][left[self.candidates[s]] > 0]
        free = cand[~np.isin(cand, list(self.used[s]))]
        if free.size == 0:  # fewer (non-empty) subclasses than clients in the group: a new round of picks
            self.used[s] = set()
            free = cand
        return free


def _draw_choices(rng, num_clients, candidates, group_size: int = 1) -> np.ndarray:
    """Up-front plan for ``sizes="even"``: (num_clients, n_superclasses) subclass drawn by each client.

    ``group_size = 1`` keeps pflkit's earlier draw (independent, uniform) exactly.
    """
    if group_size == 1:
        cols = [cand[rng.integers(0, cand.size, size=num_clients)] for cand in candidates]
        return np.stack(cols, axis=1)
    groups, out = _Groups(candidates, group_size), np.empty((num_clients, len(candidates)), np.int64)
    for i in range(num_clients):
        for s in range(len(candidates)):
            out[i, s] = rng.choice(groups.allowed(i, s))
            groups.used[s].add(int(out[i, s]))
    return out


# ---------------------------------------------------------------- sizes


def spacing_sizes(rng, num_clients: int, group_size: int, budget: int) -> np.ndarray:
    """Per-client target m_j: group g's piece of ``budget`` cut at K - 1 distinct random points.

    The authors' CIFAR-100 split (K = J / 5 groups, budget = the 500 images of a class):
    every piece is >= 1, the pieces sum to ``budget`` and each has expectation budget / K.
    """
    k = -(-num_clients // group_size)
    if budget < k:
        raise ValueError(f"{num_clients} clients in {k} groups of {group_size} need at least {k} samples per "
                         f"client slot of the scarcest superclass, which has {budget}: use fewer clients")
    cuts = np.sort(rng.choice(np.arange(1, budget), k - 1, replace=False))
    pieces = np.diff(np.concatenate([[0], cuts, [budget]]))
    return pieces[np.arange(num_clients) // group_size]


def uniform_sizes(rng, num_clients: int, cap: int) -> np.ndarray:
    """Per-client target m_j = round(U(1, cap)) (the authors' SUN397 code: cap 67, mean 34)."""
    return np.asarray([round(rng.uniform(1, cap)) for _ in range(num_clients)], np.int64)


def _sequential(rng, y, sc, candidates, targets, group_size):
    """Serve clients in order: per superclass one allowed subclass holding m_j samples, m_j taken.

    Returns (choices, takes, pools): takes[j][s] are the indices client j got from superclass s.
    """
    pools = class_pools(y, sc.size, rng)
    left = np.asarray([p.size for p in pools])
    start = np.zeros(sc.size, np.int64)
    groups = _Groups(candidates, group_size)
    n, S = len(targets), len(candidates)
    choices, takes, lowered = np.empty((n, S), np.int64), [], 0
    for j, want in enumerate(targets):
        allowed = [groups.allowed(j, s, left) for s in range(S)]
        empty = [s for s in range(S) if allowed[s].size == 0]
        if empty:
            raise ValueError(f"superclass {empty[0]} has no samples left for client {j}: use fewer clients or "
                             "smaller sizes")
        m = int(min(want, *(left[a].max() for a in allowed)))
        lowered += m < want
        row = []
        for s, a in enumerate(allowed):
            c = int(rng.choice(a[left[a] >= m]))
            choices[j, s] = c
            groups.used[s].add(c)
            row.append(pools[c][start[c]:start[c] + m])
            start[c] += m
            left[c] -= m
        takes.append(row)
    if lowered:
        log.info("concept_drift: %d of %d clients got fewer samples per superclass than drawn (no allowed "
                 "subclass had enough left)", lowered, n)
    return choices, takes


def _plan(splits, sc, candidates, num_clients, rng, sizes, group_size, max_per_superclass):
    """(choices, takes of the first split) for the sequential sizes."""
    y = splits[0]
    if sizes == "spacings":
        per_super = [np.isin(y, c).sum() for c in candidates]
        targets = spacing_sizes(rng, num_clients, group_size, int(min(per_super)) // group_size)
    else:
        targets = uniform_sizes(rng, num_clients, max_per_superclass)
    return _sequential(rng, y, sc, candidates, targets, group_size)


# ---------------------------------------------------------------- later splits


def _later_split(y, choices, first_counts, sc, rng, test: str) -> list[np.ndarray]:
    """A later split (test) of paired labels, following the plan ``choices``."""
    pools = class_pools(y, sc.size, rng)
    if test == "shared":
        return [np.concatenate([pools[c] for c in row]) for row in choices]
    pieces = [[None] * choices.shape[1] for _ in range(len(choices))]
    for c in np.unique(choices):
        who = np.argwhere(choices == c)
        shares = np.asarray([first_counts[i][s] for i, s in who], float)
        for (i, s), part in zip(who, split_by_shares(pools[c], shares)):
            pieces[i][s] = part
    return [np.concatenate(row) for row in pieces]


def _even(splits, choices, sc, rng, equal_marginals: bool, test: str):
    """pflkit's earlier allocation: each drawn subclass split evenly among its holders (per split)."""
    drawn, holders = np.unique(choices, return_counts=True)
    out = []
    for k, y in enumerate(splits):
        if k > 0 and test == "shared":
            out.append(_later_split(y, choices, None, sc, rng, "shared"))
            continue
        row_counts = np.bincount(y, minlength=sc.size)
        short = row_counts[drawn] < holders
        if short.any():
            c = drawn[short][0]
            raise ValueError(
                f"subclass {c} has {row_counts[c]} samples in split {k} but {holders[short][0]} "
                "clients drew it; use fewer clients or more data"
            )
        pools = class_pools(y, sc.size, rng)
        pieces = [[None] * choices.shape[1] for _ in range(len(choices))]
        for c in drawn:
            who = np.argwhere(choices == c)  # (client, superclass column) pairs, client order
            for (i, s), part in zip(who, np.array_split(pools[c], len(who))):
                pieces[i][s] = part
        if equal_marginals:
            pieces = [[p[:min(q.size for q in row)] for p in row] for row in pieces]
        out.append([np.concatenate(row) for row in pieces])
    return out


# ---------------------------------------------------------------- public API


def concept_drift_choices(labels, num_clients: int, *, superclass, seed: int, sizes: str = "spacings",
                          group_size: int = 5, max_per_superclass: int = 67, test: str = "shared",
                          equal_marginals: bool = True) -> np.ndarray:
    """Which subclass each client of `concept_drift` drew (same arguments, same plan).

    Returns:
        int64 array (num_clients, n_superclasses); column ``s`` is for the
        ``s``-th smallest superclass id.
    """
    splits, _, sc, _, candidates = _check(labels, num_clients, superclass)
    _check_options(sizes, group_size, max_per_superclass, test, equal_marginals)
    rng = make_rng(seed)
    if sizes == "even":
        return _draw_choices(rng, num_clients, candidates, group_size)
    return _plan(splits, sc, candidates, num_clients, rng, sizes, group_size, max_per_superclass)[0]


def concept_drift(labels, num_clients: int, *, superclass, seed: int, sizes: str = "spacings",
                  group_size: int = 5, max_per_superclass: int = 67, test: str = "shared",
                  equal_marginals: bool = True):
    """pFedVEM's concept-drift partition: one random subclass per superclass per client.

    Args:
        labels: fine (sub)class labels, or a tuple of them (one per split: train, then test);
            paired splits share each client's subclass choices.
        num_clients: number of clients J.
        superclass: array mapping class id -> superclass id (length >= the
            number of classes); every superclass needs a subclass with samples.
        seed: seed of ``np.random.default_rng``.
        sizes: ``"spacings"`` (authors, CIFAR-100), ``"uniform"`` (authors, SUN397) or
            ``"even"`` (pflkit's earlier scheme); module docstring.
        group_size: clients per group with distinct subclasses (authors: 5; 1 = independent draws).
        max_per_superclass: the largest m_j of ``sizes="uniform"`` (authors: 67).
        test: ``"shared"`` (authors) or ``"split"``: how later paired splits follow the plan.
        equal_marginals: with ``sizes="even"``, trim every client to the same count per superclass.

    Returns:
        list of int64 index arrays (one per client), or a tuple of such lists. With
        ``test="shared"`` the later splits' arrays of clients holding a subclass overlap.

    Raises:
        ValueError: bad ``superclass`` map or option, too many clients for the data, or
            (``sizes="even"``) a drawn subclass with fewer samples than clients drawing it.
    """
    splits, paired, sc, counts, candidates = _check(labels, num_clients, superclass)
    _check_options(sizes, group_size, max_per_superclass, test, equal_marginals)
    rng = make_rng(seed)
    if sizes == "even":
        choices = _draw_choices(rng, num_clients, candidates, group_size)
        return finish(_even(splits, choices, sc, rng, equal_marginals, test), paired)
    choices, takes = _plan(splits, sc, candidates, num_clients, rng, sizes, group_size, max_per_superclass)
    out = [[np.concatenate(row) for row in takes]]
    first_counts = [[p.size for p in row] for row in takes]
    for y in splits[1:]:
        out.append(_later_split(y, choices, first_counts, sc, rng, test))
    return finish(out, paired)
