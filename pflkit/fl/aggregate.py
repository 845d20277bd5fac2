"""Server-side aggregation math, written once and shared by every algorithm."""
from __future__ import annotations

from typing import Mapping, Sequence

import torch

State = Mapping[str, torch.Tensor]


def normalized_weights(weights: Sequence[float]) -> torch.Tensor:
    """Weights as a float64 CPU tensor summing to one; rejects empty or non-positive totals.

    On the host on purpose: they are checked here, and each ``w_i`` enters the device math as
    a 0-d CPU scalar, which costs no copy and no synchronization.
    """
    w = torch.as_tensor(list(weights), dtype=torch.float64, device="cpu")
    if w.numel() == 0:
        raise ValueError("aggregation needs at least one update")
    if (w < 0).any() or float(w.sum()) <= 0:
        raise ValueError(f"aggregation weights must be >= 0 with a positive sum, got {w.tolist()}")
    return w / w.sum()


def weighted_mean(states: Sequence[State], weights: Sequence[float]) -> dict[str, torch.Tensor]:
    """sum_i w_i * state_i / sum_i w_i for every floating tensor (FedAvg, FedL2P Alg. 1 line 14).

    Integer tensors (e.g. BN's ``num_batches_tracked``) are not averaged: the maximum is kept.
    """
    w = normalized_weights(weights)
    out = {}
    for key in states[0]:
        ref = states[0][key]
        if ref.is_floating_point():
            acc = torch.zeros_like(ref, dtype=torch.float64)
            for wi, s in zip(w, states):
                acc += wi * s[key].double()
            out[key] = acc.to(ref.dtype)
        else:
            out[key] = torch.stack([s[key] for s in states]).amax(0)
    return out


def masked_mean(values: Sequence[torch.Tensor], keep: Sequence[torch.Tensor], weights: Sequence[float],
                fallback: torch.Tensor) -> torch.Tensor:
    """Per-position weighted mean over the clients whose ``keep`` mask is True there.

    Positions no client keeps take ``fallback`` (FedSelect Alg. 2: shared entries are
    averaged only over clients for which they are not personal).
    """
    w = torch.as_tensor(list(weights), dtype=torch.float64, device="cpu")  # 0-d scalars, as above
    num = torch.zeros_like(fallback, dtype=torch.float64)
    den = torch.zeros_like(fallback, dtype=torch.float64)
    for wi, v, k in zip(w, values, keep):
        k = k.to(device=fallback.device, dtype=torch.float64)  # masks may be kept on the host
        num += wi * k * v.double()
        den += wi * k
    out = torch.where(den > 0, num / den.clamp_min(1e-300), fallback.double())
    return out.to(fallback.dtype)


def precision_weighted_mean(means: Sequence[torch.Tensor], precisions: Sequence[float | torch.Tensor]) -> torch.Tensor:
    """sum_j tau_j mu_j / sum_j tau_j (pFedVEM Eq. 7)."""
    tau = [torch.as_tensor(t, dtype=torch.float64, device=means[0].device) for t in precisions]
    num = sum(t * m.double() for t, m in zip(tau, means))
    den = sum(tau)
    return (num / den).to(means[0].dtype)
