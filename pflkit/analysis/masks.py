"""Questions asked of binary parameter masks: overlap between clients, density, per-layer shares.

FedSelect Fig. 1 shows the intersection-over-union of every pair of client masks in
ResNet-18's final linear layer; the same functions describe LotteryFL's pruning masks.
A mask is a bool tensor, or a dict of bool tensors (one per parameter) for a whole model.
"""
from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import torch

MaskLike = torch.Tensor | Mapping[str, torch.Tensor]


def _flat(mask: MaskLike, names: Sequence[str] | None = None) -> torch.Tensor:
    """One flat bool vector of a mask (the named tensors of a dict, in the given order)."""
    if isinstance(mask, torch.Tensor):
        if names is not None:
            raise TypeError("names only apply to a dict of masks")
        out = mask
    else:
        keys = list(mask) if names is None else list(names)
        missing = [k for k in keys if k not in mask]
        if missing:
            raise KeyError(f"mask has no tensor {missing[0]!r}; it has {sorted(mask)}")
        out = torch.cat([mask[k].flatten() for k in keys]) if keys else torch.zeros(0, dtype=torch.bool)
    if out.dtype != torch.bool:
        raise TypeError(f"masks must be bool tensors, got {out.dtype}")
    return out.flatten()


def iou(a: MaskLike, b: MaskLike, names: Sequence[str] | None = None) -> float:
    """|a AND b| / |a OR b|: 1 for identical masks, 0 for disjoint ones.

    Two empty masks are identical: their IoU is 1.
    """
    fa, fb = _flat(a, names), _flat(b, names)
    if fa.shape != fb.shape:
        raise ValueError(f"masks differ in size: {fa.numel()} vs {fb.numel()} entries")
    union = int((fa | fb).sum())
    return 1.0 if union == 0 else int((fa & fb).sum()) / union


def pairwise_iou(masks: Sequence[MaskLike], names: Sequence[str] | None = None) -> np.ndarray:
    """The symmetric (n, n) matrix of `iou` between every pair of masks (FedSelect Fig. 1)."""
    flat = [_flat(m, names) for m in masks]
    n = len(flat)
    out = np.ones((n, n))
    for i in range(n):
        for j in range(i + 1, n):
            out[i, j] = out[j, i] = iou(flat[i], flat[j])
    return out


def density(mask: MaskLike, names: Sequence[str] | None = None) -> float:
    """Share of True entries (e.g. the personal share of a FedSelect mask)."""
    f = _flat(mask, names)
    return float(f.float().mean()) if f.numel() else float("nan")


def sparsity(mask: MaskLike, names: Sequence[str] | None = None) -> float:
    """Share of False entries (e.g. the pruned share of a LotteryFL keep-mask)."""
    return 1.0 - density(mask, names)


def layer_density(mask: Mapping[str, torch.Tensor]) -> dict[str, float]:
    """Share of True entries in each tensor of a model mask."""
    return {k: density(v) for k, v in mask.items()}


def client_masks(client_states: Mapping[int, dict], key: str = "travel", invert: bool = True
                 ) -> dict[int, dict[str, torch.Tensor]]:
    """Each client's mask from FedSelect-style client states (``{"weights", "travel"}``).

    FedSelect keeps the positions that travel (are shared); ``invert=True`` turns them
    into the personal mask the paper plots. Clients without state are left out.
    """
    out = {}
    for cid in sorted(client_states):
        st = client_states[cid]
        if st is None or key not in st:
            continue
        out[cid] = {n: (~m if invert else m) for n, m in st[key].items()}
    return out
