"""Analyses behind pFedHN's figures: novel clients (Fig. 2 / 7), mix-and-match (Fig. 3), budgets (Table 2),
spectral normalization (Table 4: how personal the generated weights are, what sigma the layers divide by).

Pure functions of federations, per-client results, generated tensors and networks: they give the arrays the
notebooks plot.
Nothing here trains or runs a model: `pflkit.run.stages` trains a method on a chosen federation and
`pflkit.algorithms.pfedhn.mix_and_match` evaluates the generated models.
"""
from __future__ import annotations

import numpy as np
import torch

from pflkit.data.partition import nearest_tv
from pflkit.fl.federate import contiguous_group
from pflkit.fl.federation import Federation


# ---------------------------------------------------------------- Fig. 3


def row_normalize(acc) -> np.ndarray:
    """(acc_ij - min_l acc_il) / (max_l acc_il - min_l acc_il) per row (Fig. 3); constant rows -> 1."""
    a = np.asarray(acc, dtype=np.float64)
    lo, hi = a.min(1, keepdims=True), a.max(1, keepdims=True)
    span = hi - lo
    return np.where(span > 0, (a - lo) / np.where(span > 0, span, 1.0), 1.0)


def client_classes(fed: Federation, split: str = "train") -> list[tuple[str, ...]]:
    """Names of the classes each client holds (the row / column labels of Fig. 3)."""
    names = fed.meta.class_names
    return [tuple(names[c] for c in np.flatnonzero(h)) for h in fed.histograms(split)]


# ---------------------------------------------------------------- Fig. 2 / 7


def class_shares(*feds: Federation, split: str = "train") -> np.ndarray:
    """p_hat over the clients of ``feds`` taken together (sec. 5.3): p_hat[i, j] is client i's share
    of all class-j samples held by these clients, so every used column sums to 1 over the clients.

    With the training and the novel clients of one partition, this is the p_hat the paper's
    allocation defines (p_i ~ Dir(alpha), normalized over all clients per class).
    """
    return _shares(np.concatenate([f.histograms(split) for f in feds]).astype(np.float64))


def _shares(h: np.ndarray) -> np.ndarray:
    """Each row's share of every column's total (0 where a column is empty)."""
    total = h.sum(axis=0, keepdims=True)
    return np.divide(h, total, out=np.zeros_like(h), where=total > 0)


def novel_tv(train: Federation, novel: Federation, split: str = "train", *,
             basis: str = "p_hat") -> tuple[np.ndarray, np.ndarray]:
    """TV distance of every novel client to its nearest training client (sec. 5.3, Fig. 2 / 7), from the
    two federations' class histograms (`tv_to_nearest`).

    Returns:
        ``(distances, nearest training client ids)``, both of length ``novel.num_clients``.
    """
    return tv_to_nearest(train.histograms(split), novel.histograms(split), basis=basis)


def tv_to_nearest(train_hist, novel_hist, *, basis: str = "p_hat") -> tuple[np.ndarray, np.ndarray]:
    """TV distance of every novel client to its nearest training client, from class histograms (clients x
    classes: the federations' own, or those a pFedHN run with unseen clients stores in its report).

    ``basis="p_hat"`` (the paper: "the TV is computed over the empirical distributions p_hat"):
    TV = 1/2 sum_j |p_hat_novel,j - p_hat_train,j| with p_hat from `class_shares` over the
    training and novel clients together, used as they are (a p_hat row is a client's share of
    each class, not renormalized over classes). ``basis="labels"``: the older measure, TV
    between the two clients' label distributions (histograms normalized per client).

    Returns:
        ``(distances, nearest training client ids)``, both of length ``len(novel_hist)``.
    """
    train_hist, novel_hist = np.asarray(train_hist, dtype=np.float64), np.asarray(novel_hist, dtype=np.float64)
    if basis == "labels":
        return nearest_tv(novel_hist, train_hist, return_index=True)
    if basis != "p_hat":
        raise ValueError(f"basis={basis!r}: use 'p_hat' (the paper) or 'labels'")
    shares = _shares(np.concatenate([train_hist, novel_hist]))
    p_train, p_novel = shares[:len(train_hist)], shares[len(train_hist):]
    tv = 0.5 * np.abs(p_novel[:, None, :] - p_train[None, :, :]).sum(-1)  # (n_novel, n_train)
    nearest = tv.argmin(axis=1)
    return tv[np.arange(len(tv)), nearest], nearest


# ---------------------------------------------------------------- Table 2


def group_accuracy(per_client: list[float] | np.ndarray, num_groups: int) -> list[float]:
    """Mean accuracy of each budget group (contiguous equal groups, as pFedHN assigns budgets)."""
    acc = np.asarray(per_client, dtype=np.float64)
    groups = np.array([contiguous_group(i, len(acc), num_groups) for i in range(len(acc))])
    return [float(acc[groups == g].mean()) for g in range(num_groups)]


# ---------------------------------------------------------------- Table 4 (App. C.3, spectral normalization)


def personal_share(generated: list[dict]) -> dict[str, float]:
    """How much of each generated tensor depends on the client: for tensors ``theta_i`` of clients
    i = 1..n (one dict per client, as `HyperNetwork.forward` returns), the mean over clients of
    ``||theta_i - mean_j theta_j||`` divided by ``||mean_j theta_j||``.

    0 means one model for everyone (FedAvg's); pFedHN personalizes through the part above it.
    """
    out = {}
    for name in generated[0]:
        stacked = torch.stack([g[name].detach().flatten() for g in generated])
        shared = stacked.mean(dim=0)
        out[name] = float((stacked - shared).norm(dim=1).mean() / shared.norm())
    return out


def linear_spectral_norms(net) -> dict[str, float]:
    """The largest singular value of the raw weight of every ``nn.Linear`` of ``net``: for a spectrally
    normalized layer (``torch.nn.utils.parametrizations.spectral_norm``) its unnormalized ``original``,
    the sigma it divides by. To first order a gradient step of size lr on the raw weight moves the
    normalized weight by lr / sigma^2 times the gradient with respect to it."""
    out = {}
    for name, module in net.named_modules():
        if isinstance(module, torch.nn.Linear):
            para = getattr(module, "parametrizations", None)
            raw = para.weight.original if para is not None and hasattr(para, "weight") else module.weight
            out[name] = float(torch.linalg.matrix_norm(raw.detach(), ord=2))
    return out
