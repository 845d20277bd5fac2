"""Validation and plumbing shared by every partition scheme.

Every scheme is a pure function ``(labels, num_clients, *, options, seed)`` that
returns one int64 index array per client. ``labels`` is either one label array
or a *tuple* of label arrays, one per split (e.g. ``(train, test)``); in the
tuple case the scheme draws one plan from the seed and allocates every split
with it, returning a tuple of client lists. The helpers here turn both inputs
into a tuple of splits, check common arguments, and hand back the right shape.
"""
from __future__ import annotations

import numbers
from typing import Any, Sequence

import numpy as np


def as_splits(labels: Any) -> tuple[tuple[np.ndarray, ...], bool]:
    """Normalize ``labels`` into a tuple of 1-D int64 arrays.

    Args:
        labels: one label array (numpy, torch tensor, list) or a tuple of them.

    Returns:
        (splits, paired): the arrays, and whether a tuple was given.

    Raises:
        ValueError: an empty tuple, a non-1-D array or a negative label.
        TypeError: a non-integer label array.
    """
    paired = isinstance(labels, tuple)
    raw = labels if paired else (labels,)
    if not raw:
        raise ValueError("labels is an empty tuple; give one label array per split")
    splits = tuple(_label_array(y, f"labels[{i}]" if paired else "labels") for i, y in enumerate(raw))
    return splits, paired


def _label_array(y: Any, name: str) -> np.ndarray:
    if hasattr(y, "detach"):  # torch tensor: avoid importing torch here
        y = y.detach().cpu().numpy()
    arr = np.asarray(y)
    if arr.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {arr.shape}")
    if arr.size and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must hold integer class ids, got dtype {arr.dtype}")
    arr = arr.astype(np.int64, copy=False)
    if arr.size and arr.min() < 0:
        raise ValueError(f"{name} holds a negative class id ({arr.min()})")
    return arr


def finish(per_split: Sequence[list[np.ndarray]], paired: bool):
    """Return one client list, or a tuple of them for paired splits."""
    out = [[np.sort(np.asarray(p, dtype=np.int64)) for p in parts] for parts in per_split]
    return tuple(out) if paired else out[0]


def make_rng(seed: Any) -> np.random.Generator:
    """A fresh generator; the seed must be a non-negative int (no hidden randomness)."""
    if isinstance(seed, bool) or not isinstance(seed, numbers.Integral):
        raise TypeError(f"seed must be a non-negative int, got {seed!r}")
    if seed < 0:
        raise ValueError(f"seed must be a non-negative int, got {seed}")
    return np.random.default_rng(int(seed))


def check_num_clients(num_clients: Any, splits: Sequence[np.ndarray] = ()) -> int:
    """Check 1 <= num_clients <= the size of every split."""
    if isinstance(num_clients, bool) or not isinstance(num_clients, numbers.Integral):
        raise TypeError(f"num_clients must be an int, got {num_clients!r}")
    if num_clients < 1:
        raise ValueError(f"num_clients must be >= 1, got {num_clients}")
    for i, y in enumerate(splits):
        if num_clients > y.size:
            where = f" in split {i}" if len(splits) > 1 else ""
            raise ValueError(
                f"num_clients={num_clients} is more than the {y.size} samples{where}"
            )
    return int(num_clients)


def check_positive_int(value: Any, name: str, minimum: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be an int, got {value!r}")
    if value < minimum:
        raise ValueError(f"{name} must be >= {minimum}, got {value}")
    return int(value)


def check_alpha(alpha: Any, num_clients: int, name: str = "alpha") -> np.ndarray:
    """Dirichlet concentration(s): a positive finite scalar or one per client.

    Returns:
        float array of shape (num_clients,).
    """
    try:
        arr = None if isinstance(alpha, str) else np.asarray(alpha, dtype=float)
    except (TypeError, ValueError):
        arr = None
    if arr is None or arr.ndim > 1:
        raise ValueError(f"{name} must be a positive number or one per client, got {alpha!r}")
    if arr.ndim == 1 and arr.size != num_clients:
        raise ValueError(f"{name} has {arr.size} values but num_clients={num_clients}")
    bad = ~np.isfinite(arr) | (arr <= 0)
    if np.any(bad):
        first = np.atleast_1d(arr)[np.atleast_1d(bad)][0]
        raise ValueError(f"{name} must be positive and finite, got {first}")
    return np.broadcast_to(arr, (num_clients,)).astype(float)


def per_split(value: Any, n_splits: int, name: str) -> tuple:
    """Broadcast a per-split option: a scalar applies to all splits, a tuple gives one each."""
    if isinstance(value, (tuple, list)):
        if len(value) != n_splits:
            raise ValueError(f"{name} has {len(value)} values but there are {n_splits} splits")
        return tuple(value)
    return (value,) * n_splits


def num_classes(splits: Sequence[np.ndarray]) -> int:
    """Number of class columns: max class id over all splits + 1."""
    return int(max((y.max() + 1 if y.size else 0) for y in splits))


def class_pools(y: np.ndarray, k: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Indices of each class 0..k-1 in ``y``, each shuffled."""
    order = np.argsort(y, kind="stable")
    bounds = np.searchsorted(y[order], np.arange(k + 1))
    return [rng.permutation(order[bounds[c]:bounds[c + 1]]) for c in range(k)]


def split_by_shares(idx: np.ndarray, shares: np.ndarray) -> list[np.ndarray]:
    """Cut ``idx`` into consecutive pieces of sizes ~ shares * len(idx).

    Cumulative boundaries are rounded, so every piece is within one sample of
    its exact share and the pieces cover ``idx`` exactly.
    """
    total = shares.sum()
    cum = np.cumsum(shares) / total if total > 0 else np.linspace(0, 1, len(shares) + 1)[1:]
    bounds = np.concatenate([[0], np.rint(cum * idx.size).astype(np.int64)])
    bounds[-1] = idx.size
    return [idx[bounds[i]:bounds[i + 1]] for i in range(len(shares))]


def balanced_classes(
    num_clients: int, k: int, classes: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Give each client ``k`` distinct classes, each class used (close to) equally often.

    Every class gets floor or ceil of ``num_clients * k / len(classes)`` uses
    (which classes get the extra use is random). Clients are then served in
    turn, each taking the ``k`` classes with the most remaining uses, ties
    broken at random. Taking the fullest classes keeps the invariant "no class
    has more remaining uses than clients left", so the greedy never gets stuck.

    Returns:
        int64 array (num_clients, k) of class ids.
    """
    n_cls = classes.size
    total = num_clients * k
    uses = np.full(n_cls, total // n_cls, dtype=np.int64)
    uses[rng.permutation(n_cls)[: total % n_cls]] += 1
    out = np.empty((num_clients, k), dtype=np.int64)
    for i in range(num_clients):
        tiebreak = rng.random(n_cls)
        pick = np.lexsort((tiebreak, -uses))[:k]
        uses[pick] -= 1
        out[i] = np.sort(classes[pick])
    return out


def check_groups(
    groups: Any, key: str, splits: Sequence[np.ndarray], paired: bool
) -> tuple[np.ndarray, ...]:
    """Per-sample group ids ``groups[key]`` for every split.

    Args:
        groups: dict of per-sample int arrays, or (paired splits) a tuple of dicts.
        key: the metadata key (``"domain"``, ``"speaker"``, ...).
    """
    if groups is None:
        raise ValueError(f"groups is required: a dict with a per-sample array under {key!r}")
    dicts = groups if isinstance(groups, tuple) else (groups,)
    if len(dicts) != len(splits):
        raise ValueError(
            f"groups has {len(dicts)} dicts but labels has {len(splits)} splits"
            + ("" if paired else "; pass one dict")
        )
    out = []
    for i, (g, y) in enumerate(zip(dicts, splits)):
        if not hasattr(g, "keys") or key not in g:
            have = sorted(g.keys()) if hasattr(g, "keys") else type(g).__name__
            raise ValueError(f"groups has no key {key!r} (it has {have})")
        arr = _label_array(g[key], f"groups[{key!r}]")
        if arr.size != y.size:
            raise ValueError(
                f"groups[{key!r}] has {arr.size} entries but split {i} has {y.size} labels"
            )
        out.append(arr)
    return tuple(out)
