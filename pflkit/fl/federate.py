"""Building a federation: a `Dataset` and a partition scheme turned into clients.

Two ways to give every client its splits (`build_federation`):

* ``split="pool"`` (FedL2P sec. 4.1.1): partition the pooled samples (train and
  test together), then hold out ``test_fraction`` of each client's samples for
  test and ``val_fraction`` of the rest for validation (80/20, then 20%).
* ``split="paired"`` (pFedHN, FedSelect): partition the dataset's train and test
  splits with one plan (same classes and shares per client); validation is
  ``val_fraction`` of each client's train part.

`federation_for` is the one call from an experiment's ``[data]`` settings; a federation of
one's own without a scheme is `pflkit.fl.federation.Federation.from_indices`.
"""
from __future__ import annotations

import inspect

import numpy as np
import torch

from pflkit.data.base import Dataset
from pflkit.data.partition import PARTITIONS
from pflkit.fl.federation import Client, Federation, majority, pooled, pooled_groups


def _scheme_kwargs(fn, options: dict, groups, superclass) -> dict:
    params = inspect.signature(fn).parameters
    kw = dict(options)
    if "groups" in params and "groups" not in kw:
        kw["groups"] = groups
    if "superclass" in params and "superclass" not in kw:
        if superclass is None:
            raise ValueError("this partition needs a superclass map, but the dataset has none")
        kw["superclass"] = np.asarray(superclass)
    return kw


def _holdout(idx: np.ndarray, frac: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split ``idx`` into (rest, held) with round(frac * n) held out (at least 1 if frac > 0 and n > 1)."""
    idx = rng.permutation(idx)
    k = int(round(frac * len(idx)))
    if frac > 0 and k == 0 and len(idx) > 1:
        k = 1
    return np.sort(idx[k:]), np.sort(idx[:k])


def federation_for(data, dataset: Dataset, seed: int) -> Federation:
    """The federation an experiment's data settings give over ``dataset`` for one seed.

    ``data``: an experiment's ``[data]`` (or ``[pretrain.data]``) settings, `pflkit.run.experiment_config.DataConfig`:
    every engine, notebook and analysis builds its clients through this one call, so they all see the
    same partition, holdouts, unseen clients and augmentation.
    """
    return build_federation(dataset, data.scheme, data.num_clients, seed=seed, split=data.split,
                            test_fraction=data.test_fraction, val_fraction=data.val_fraction, task=data.task,
                            augment=data.augment, unseen_clients=data.unseen_clients,
                            unseen_pick=data.unseen_pick, **data.partition)


def contiguous_group(client_id: int, num_clients: int, num_groups: int) -> int:
    """Equal contiguous groups of client ids: clients [0, n/G) are group 0, and so on (pFedHN Table 2)."""
    return client_id * num_groups // num_clients


def build_federation(dataset: Dataset, scheme: str, num_clients: int, *, seed: int, split: str = "pool",
                     test_fraction: float = 0.2, val_fraction: float = 0.2, task: str = "label",
                     augment: str = "none", unseen_clients: int = 0, unseen_pick: str = "random",
                     **options) -> Federation:
    """Partition a dataset among clients and give each a train / val / test split.

    Args:
        dataset: from `pflkit.data.load_dataset`.
        scheme: a name in `pflkit.data.partition.PARTITIONS`.
        num_clients: number of clients C.
        seed: seeds the partition and the per-client holdouts.
        split: ``"pool"`` or ``"paired"`` (module docstring).
        test_fraction: share of each client's samples held out for test (``pool``).
        val_fraction: share of each client's remaining train samples held out for validation.
        task: ``"label"`` or ``"superclass"`` (predict the superclass; pFedVEM's concept drift).
        augment: batch augmentation for training (``"none"``, ``"crop_flip"``).
        unseen_clients: this many clients (chosen at random from the seed) never take part
            in training and are only tested: FedL2P's unseen pool (sec. 4.3, Table 4).
        unseen_pick: ``"random"`` (from the seed) or ``"last"``: the last ``unseen_clients`` ids (pFedHN
            sec. 5.3, whose novel clients come last in the partition, with their own alpha).
        **options: the scheme's own options (alpha, classes_per_client, ...).
    """
    if scheme not in PARTITIONS:
        raise ValueError(f"partition scheme {scheme!r} unknown; known: {', '.join(sorted(PARTITIONS))}")
    if split not in ("pool", "paired"):
        raise ValueError(f"split={split!r}: use 'pool' or 'paired'")
    for key, frac in (("test_fraction", test_fraction), ("val_fraction", val_fraction)):
        if not 0 <= frac < 1:
            raise ValueError(f"{key}={frac!r}: must be in [0, 1)")
    if not 0 <= unseen_clients < num_clients:
        raise ValueError(f"unseen_clients={unseen_clients!r}: must be in [0, num_clients={num_clients})")
    if unseen_pick not in ("random", "last"):
        raise ValueError(f"unseen_pick={unseen_pick!r}: use 'random' or 'last'")
    if split == "paired" and len(dataset.y_test) == 0:
        raise ValueError(f"split='paired' needs a test split, but dataset {dataset.name!r} has none; use split='pool'")
    meta, x, y = pooled(dataset, task)
    fine = torch.cat([dataset.y_train, dataset.y_test]).numpy()
    groups = pooled_groups(dataset)
    n_train = len(dataset.y_train)
    fn = PARTITIONS[scheme]
    # concept drift partitions by fine class; every other scheme by the task label
    part_labels = fine if "superclass" in inspect.signature(fn).parameters else y.numpy()
    rng = np.random.default_rng(seed + 7919)
    if split == "pool":
        kw = _scheme_kwargs(fn, options, groups, dataset.meta.superclass)
        parts = fn(part_labels, num_clients, seed=seed, **kw)
        splits = []
        for p in parts:
            rest, test = _holdout(np.asarray(p), test_fraction, rng)
            train, val = _holdout(rest, val_fraction, rng)
            splits.append({"train": train, "val": val, "test": test})
    else:
        g_pair = ({k: v[:n_train] for k, v in groups.items()}, {k: v[n_train:] for k, v in groups.items()})
        kw = _scheme_kwargs(fn, options, g_pair, dataset.meta.superclass)
        tr_parts, te_parts = fn((part_labels[:n_train], part_labels[n_train:]), num_clients, seed=seed, **kw)
        splits = []
        for p, q in zip(tr_parts, te_parts):
            train, val = _holdout(np.asarray(p), val_fraction, rng)
            splits.append({"train": train, "val": val, "test": np.sort(np.asarray(q) + n_train)})
    clients = []
    for i, s in enumerate(splits):
        s = {k: np.asarray(v, dtype=np.int64) for k, v in s.items()}
        info = {"num_train": int(len(s["train"]))}
        everything = np.concatenate([s["train"], s["val"], s["test"]])
        info.update({key: majority(g[everything]) for key, g in groups.items()})
        clients.append(Client(i, x, y, s, meta, info, augment))
    empty = [c.id for c in clients if c.num("train") == 0]
    if empty:
        raise ValueError(f"clients {empty[:10]} received no training samples; use fewer clients or another scheme")
    unseen = (list(range(num_clients - unseen_clients, num_clients)) if unseen_pick == "last" else
              sorted(np.random.default_rng(seed + 104729).permutation(num_clients)[:unseen_clients].tolist()))
    for c in clients:
        c.info["pool"] = "unseen" if c.id in unseen else "seen"
    recipe = {"unseen": unseen, "dataset": dataset.name, "scheme": scheme, "num_clients": num_clients, "seed": seed, "split": split,
              "test_fraction": test_fraction, "val_fraction": val_fraction, "task": task, "augment": augment,
              "options": {k: v for k, v in options.items() if k not in ("groups", "superclass")}}
    if unseen_pick != "random":  # named only when not the default, so earlier recipes keep their digests
        recipe["unseen_pick"] = unseen_pick
    return Federation(meta, x, y, clients, recipe)
