"""Composite multi-domain datasets built from single-domain ones.

``digit_domains``: MNIST, MNIST-M and USPS as three domains of one 10-class
problem, the offline stand-in for Office-Caltech-10 / DomainNet (feature shift
with known domains: FedL2P Table 3 and the ARI analysis of Table 6).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..base import Dataset
from .common import check_positive_int, check_subset
from .images import image_dataset, resize_images, to_rgb
from .mnist_family import load_mnist, load_mnist_m, load_usps

# Each domain's own loader (the ones the registry lists under the same names): a composite is built from
# the sources below it, never through the registry above it.
DOMAIN_LOADERS = {"mnist": load_mnist, "mnist_m": load_mnist_m, "usps": load_usps}
DIGIT_DOMAINS = tuple(DOMAIN_LOADERS)


def _equal_subsets(sizes: Sequence[int], cap: int | None, rng: np.random.Generator) -> list[np.ndarray]:
    """Sorted random positions, the same number per domain: min(cap, smallest domain)."""
    n = min(sizes) if cap is None else min(cap, *sizes)
    return [np.sort(rng.choice(size, size=n, replace=False)) for size in sizes]


def load_digit_domains(root=None, *, download: bool = False, size: int = 32, per_domain: int | None = None,
                       domains: Sequence[str] = DIGIT_DOMAINS, seed: int = 0) -> Dataset:
    """MNIST, MNIST-M and USPS as RGB (N, 3, size, size) uint8 images with group ``domain``.

    Every domain is loaded by its own loader in `pflkit.data.sources.mnist_family` (so npz files,
    the published layouts and downloads all work), gray images are repeated to three
    channels and everything is resized to ``size`` (default 32, MNIST-M's native size).

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: passed to each domain's loader.
        size: common side length.
        per_domain: if given, every domain keeps the same number of samples in each
            split: ``min(per_domain, smallest domain's split)``, a random subset drawn
            with ``seed``. None keeps every sample (domains then differ in size).
        domains: which of mnist, mnist_m, usps to use, in this order (= domain ids).
        seed: seed of the per-domain subsets.
    """
    check_positive_int("size", size)
    check_positive_int("per_domain", per_domain, allow_none=True)
    domains = check_subset("domains", domains, DIGIT_DOMAINS)
    parts = [DOMAIN_LOADERS[d](root, download=download) for d in domains]
    rng = np.random.default_rng(seed)
    splits = {}
    for split in ("train", "test"):
        xs = [getattr(p, f"x_{split}") for p in parts]
        ys = [getattr(p, f"y_{split}") for p in parts]
        keep = _equal_subsets([len(y) for y in ys], per_domain, rng) if per_domain else [np.arange(len(y)) for y in ys]
        xs = [resize_images(to_rgb(x[torch.from_numpy(k)]), size) for x, k in zip(xs, keep)]
        splits[split] = (
            torch.cat(xs),
            torch.cat([y[torch.from_numpy(k)] for y, k in zip(ys, keep)]),
            np.concatenate([np.full(len(k), i, np.int64) for i, k in enumerate(keep)]),
        )
    (x_tr, y_tr, d_tr), (x_te, y_te, d_te) = splits["train"], splits["test"]
    return image_dataset(
        "digit_domains", x_tr, y_tr, x_te, y_te, class_names=[str(i) for i in range(10)],
        source="; ".join(f"{d}: {p.meta.source}" for d, p in zip(domains, parts)),
        files=[f for p in parts for f in p.meta.files],
        download={d: p.meta.download for d, p in zip(domains, parts) if p.meta.download} or None,
        groups_train={"domain": d_tr}, groups_test={"domain": d_te}, group_names={"domain": domains},
    )
