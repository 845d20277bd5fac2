"""Batch augmentations applied on tensors (no per-sample Python loop)."""
from __future__ import annotations

import torch
import torch.nn.functional as F

AUGMENTS = ("none", "crop_flip")


def augment_batch(x: torch.Tensor, kind: str, generator: torch.Generator | None = None, pad: int = 4) -> torch.Tensor:
    """Augment a float batch (N, C, H, W).

    ``"crop_flip"``: zero-pad by ``pad`` pixels, take a random H x W crop per image
    and flip half the images horizontally (the standard CIFAR recipe).
    """
    if kind == "none":
        return x
    if kind != "crop_flip":
        raise ValueError(f"augment={kind!r}: use one of {AUGMENTS}")
    n, _, h, w = x.shape
    padded = F.pad(x, (pad, pad, pad, pad))
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    rows = (dy.view(n, 1) + torch.arange(h).view(1, h)).to(x.device)
    cols = (dx.view(n, 1) + torch.arange(w).view(1, w)).to(x.device)
    out = padded[torch.arange(n, device=x.device).view(n, 1, 1, 1), torch.arange(x.shape[1], device=x.device).view(1, -1, 1, 1),
                 rows.view(n, 1, h, 1), cols.view(n, 1, 1, w)]
    flip = (torch.rand(n, generator=generator) < 0.5).to(x.device)
    out[flip] = out[flip].flip(-1)
    return out
