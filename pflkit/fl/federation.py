"""A federation: clients with train / val / test splits over one pooled dataset.

`build_federation` turns a `Dataset` and a partition scheme into clients. Two
ways to give every client its splits:

* ``split="pool"`` (FedL2P sec. 4.1.1): partition the pooled samples (train and
  test together), then hold out ``test_fraction`` of each client's samples for
  test and ``val_fraction`` of the rest for validation (80/20, then 20%).
* ``split="paired"`` (pFedHN, FedSelect): partition the dataset's train and test
  splits with one plan (same classes and shares per client); validation is
  ``val_fraction`` of each client's train part.

Clients keep index arrays into the pooled tensors (no copies). The federation is
saved with a run (`save` / `load`) so every method sees exactly the same split.

A federation of one's own (`Federation.from_indices`) takes each client's index sets
and, optionally, domain labels as given, with no partition scheme at all.
"""
from __future__ import annotations

import hashlib
import inspect
import json
import os
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np
import torch

from pflkit.data.base import Dataset, DatasetMeta, ImageFiles, to_float
from pflkit.data.transforms import augment_batch

SPLITS = ("train", "val", "test")


def _concat(a, b):
    if isinstance(a, ImageFiles):
        return ImageFiles(a.paths + list(b.paths), a.size, a.channels)
    return torch.cat([a, b]) if len(b) else a


@dataclass
class Client:
    """One client's view of the pooled data: index arrays per split plus metadata."""

    id: int
    x: torch.Tensor | ImageFiles
    y: torch.Tensor
    splits: dict[str, np.ndarray]
    meta: DatasetMeta
    info: dict = field(default_factory=dict)
    augment: str = "none"

    def num(self, split: str = "train") -> int:
        return int(len(self.splits[split]))

    def labels(self, split: str = "train") -> torch.Tensor:
        return self.y[torch.as_tensor(self.splits[split], dtype=torch.long, device=self.y.device)]

    def take(self, idx: np.ndarray, device=None, generator: torch.Generator | None = None,
             augment: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """Float inputs and labels of pooled positions ``idx`` (optionally augmented)."""
        t = torch.as_tensor(idx, dtype=torch.long, device=self.y.device)  # where the pooled data lives
        xb = self.x[t]
        xb = to_float(xb, self.meta)
        if augment and self.augment != "none":
            xb = augment_batch(xb, self.augment, generator)
        yb = self.y[t]
        if device is not None:
            xb, yb = xb.to(device, non_blocking=True), yb.to(device, non_blocking=True)
        return xb, yb

    def tensors(self, split: str, device=None) -> tuple[torch.Tensor, torch.Tensor]:
        """The whole split as one batch (evaluation, statistics)."""
        return self.take(self.splits[split], device)

    def batches(self, split: str, batch_size: int, generator: torch.Generator | None = None,
                shuffle: bool = False, device=None, augment: bool = False,
                drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Mini-batches of a split; shuffled with ``generator`` when ``shuffle``."""
        idx = self.splits[split]
        if shuffle:
            order = torch.randperm(len(idx), generator=generator, device="cpu").numpy()  # host-side order
            idx = idx[order]
        stop = len(idx) - (len(idx) % batch_size if drop_last else 0)
        for s in range(0, stop, batch_size):
            yield self.take(idx[s:s + batch_size], device, generator, augment)

    def random_batch(self, split: str, batch_size: int, generator: torch.Generator, device=None,
                     augment: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
        """One batch drawn without replacement (pFedHN-style local steps)."""
        idx = self.splits[split]
        pick = torch.randperm(len(idx), generator=generator, device="cpu")[: min(batch_size, len(idx))].numpy()
        return self.take(idx[pick], device, generator, augment)

    def histogram(self, split: str = "train") -> np.ndarray:
        return np.bincount(self.labels(split).numpy(), minlength=self.meta.num_classes)


@dataclass
class Federation:
    """Clients over one pooled dataset, with the recipe that made them."""

    meta: DatasetMeta
    x: torch.Tensor | ImageFiles
    y: torch.Tensor
    clients: list[Client]
    recipe: dict = field(default_factory=dict)

    @property
    def num_clients(self) -> int:
        return len(self.clients)

    @property
    def num_classes(self) -> int:
        return self.meta.num_classes

    @property
    def seen_ids(self) -> list[int]:
        """Clients that take part in training; the others ("unseen", FedL2P sec. 4.3) are only tested."""
        unseen = set(self.recipe.get("unseen", []))
        return [c.id for c in self.clients if c.id not in unseen]

    @property
    def unseen_ids(self) -> list[int]:
        return sorted(self.recipe.get("unseen", []))

    def sizes(self, split: str = "train") -> np.ndarray:
        return np.array([c.num(split) for c in self.clients])

    def subset(self, ids) -> Federation:
        """The clients ``ids`` as a federation of their own, renumbered 0..len(ids)-1 in that order; the
        recipe records the original ids (``subset``) and keeps the unseen ones among them, renumbered.

        pFedHN's 90 training / 10 novel clients (sec. 5.3) and Table 2's budget groups are subsets.
        """
        ids = [int(i) for i in ids]
        if not ids or len(set(ids)) != len(ids) or min(ids) < 0 or max(ids) >= self.num_clients:
            raise ValueError(f"ids must be distinct client ids in [0, {self.num_clients}), got {ids[:10]}")
        clients = [replace(self.clients[i], id=j) for j, i in enumerate(ids)]
        recipe = {**self.recipe, "subset": ids}
        if "unseen" in self.recipe:
            recipe["unseen"] = [j for j, i in enumerate(ids) if i in set(self.unseen_ids)]
        return Federation(self.meta, self.x, self.y, clients, recipe)

    def histograms(self, split: str = "train") -> np.ndarray:
        """Label counts, clients x classes."""
        return np.stack([c.histogram(split) for c in self.clients])

    def group_of_clients(self, key: str) -> np.ndarray:
        """Each client's (majority) value of a metadata key, e.g. its domain."""
        if not all(key in c.info for c in self.clients):
            raise KeyError(f"federation clients carry no {key!r} metadata; known: {sorted(self.clients[0].info)}")
        return np.array([c.info[key] for c in self.clients])

    def save(self, path: str | os.PathLike) -> None:
        """Write the client index arrays and recipe (atomically) to ``path`` (.npz)."""
        arrays = {f"{c.id}/{s}": c.splits[s] for c in self.clients for s in SPLITS}
        arrays["__recipe__"] = np.array(json.dumps(self.recipe, default=str))
        arrays["__info__"] = np.array(json.dumps([c.info for c in self.clients], default=str))
        from pflkit.io import atomic_write

        atomic_write(path, lambda f: np.savez_compressed(f, **arrays))

    @classmethod
    def load(cls, path: str | os.PathLike, dataset: Dataset) -> "Federation":
        """Rebuild a saved federation over the same dataset."""
        with np.load(path, allow_pickle=False) as z:
            recipe = json.loads(str(z["__recipe__"]))
            infos = json.loads(str(z["__info__"]))
            n = len(infos)
            parts = [{s: z[f"{i}/{s}"] for s in SPLITS} for i in range(n)]
        meta, x, y = _pool(dataset, recipe.get("task", "label"))
        clients = [Client(i, x, y, parts[i], meta, infos[i], recipe.get("augment", "none")) for i in range(n)]
        return cls(meta, x, y, clients, recipe)

    @classmethod
    def from_indices(cls, dataset: Dataset, train, test, val=None, *, domains=None, unseen=(),
                     task: str = "label", augment: str = "none") -> "Federation":
        """A federation of one's own: client ``i`` gets exactly ``train[i]``, ``val[i]`` and ``test[i]``.

        Indices are positions in the pooled samples, the dataset's train split then its test
        split (test sample ``j`` is ``len(dataset.y_train) + j``); a dataset with everything in
        its train split has plain positions. No sample may appear twice in one client (within
        or across its splits); clients may share samples.

        Args:
            dataset: the data the indices point into.
            train, test: one integer index set per client; every training set non-empty.
            val: one index set per client, or None (no validation split: then stages that keep
                their best state by validation need ``keep_best = false``).
            domains: one label per client (ints >= 0 or strings), recorded as each client's
                ``info["domain"]`` (`group_of_clients("domain")`) and in the recipe.
            unseen: ids of clients that never train and are only tested (FedL2P sec. 4.3).
            task: ``"label"`` or ``"superclass"``; augment: training batch augmentation.

        Raises:
            ValueError: one line naming the client and split of a bad index set, or the bad argument.
        """
        from pflkit.data.transforms import AUGMENTS

        if augment not in AUGMENTS:
            raise ValueError(f"augment={augment!r}: use one of {', '.join(AUGMENTS)}")
        meta, x, y = _pool(dataset, task)
        sets = _client_index_sets(train, test, val, len(y))
        ids, names = _domain_ids(domains, len(sets))
        unseen = _unseen_ids(unseen, len(sets))
        groups = _groups(dataset)
        clients = []
        for i, s in enumerate(sets):
            everything = np.concatenate(list(s.values()))
            info = {"num_train": int(len(s["train"])), **{k: _majority(g[everything]) for k, g in groups.items()}}
            if ids is not None:
                info["domain"] = ids[i]
            info["pool"] = "unseen" if i in unseen else "seen"
            clients.append(Client(i, x, y, s, meta, info, augment))
        recipe = {"unseen": unseen, "dataset": dataset.name, "scheme": "given", "num_clients": len(sets),
                  "split": "given", "task": task, "augment": augment, "domains": ids, "domain_names": names}
        fed = cls(meta, x, y, clients, recipe)
        fed.recipe["indices_sha256"] = fed.digest()
        return fed

    def digest(self) -> str:
        """sha256 of every client's index sets (in client and split order): equal digests, equal splits."""
        h = hashlib.sha256()
        for c in self.clients:
            for s in SPLITS:
                idx = np.ascontiguousarray(c.splits[s], dtype=np.int64)
                h.update(f"{c.id}/{s}/{len(idx)}:".encode())
                h.update(idx.tobytes())
        return h.hexdigest()

    def rebind(self, dataset: Dataset) -> "Federation":
        """The same clients (index sets, info, recipe) over ``dataset``: the same samples, e.g. normalized
        with other statistics (`pflkit.run.pretraining.client_data`). The pooled sizes must agree."""
        meta, x, y = _pool(dataset, self.recipe.get("task", "label"))
        if len(y) != len(self.y):
            raise ValueError(f"the federation holds {len(self.y)} pooled samples, dataset {dataset.name!r} {len(y)}")
        clients = [Client(c.id, x, y, c.splits, meta, dict(c.info), c.augment) for c in self.clients]
        return Federation(meta, x, y, clients, dict(self.recipe))


def _pool(dataset: Dataset, task: str):
    """Pooled inputs and task labels (train first, then test)."""
    meta = dataset.meta
    y = torch.cat([dataset.y_train, dataset.y_test]).long()
    if task == "superclass":
        if meta.superclass is None:
            raise ValueError(f"dataset {meta.name!r} has no superclass map; task='superclass' is impossible")
        y = torch.as_tensor(meta.superclass, dtype=torch.long)[y]
        names = meta.superclass_names or tuple(str(i) for i in range(max(meta.superclass) + 1))
        meta = replace(meta, num_classes=len(names), class_names=tuple(names), superclass=None, superclass_names=None)
    elif task != "label":
        raise ValueError(f"task={task!r}: use 'label' or 'superclass'")
    return meta, _concat(dataset.x_train, dataset.x_test), y


def _client_index_sets(train, test, val, n: int) -> list[dict[str, np.ndarray]]:
    """Checked per-client ``{"train", "val", "test"}`` int64 index arrays (`Federation.from_indices`)."""
    given = {"train": train, "test": test, "val": val}
    counts = {k: len(v) for k, v in given.items() if v is not None}
    if len(set(counts.values())) != 1:
        raise ValueError(f"one index set per client in each split: got {counts}")
    if counts["train"] == 0:
        raise ValueError("no clients: train and test need one index set per client")
    out = []
    for i in range(counts["train"]):
        s = {k: _index_set(given[k][i] if given[k] is not None else [], n, f"client {i} {k}") for k in SPLITS}
        if len(s["train"]) == 0:
            raise ValueError(f"client {i} train: empty; every client needs training samples")
        values, times = np.unique(np.concatenate(list(s.values())), return_counts=True)
        if (times > 1).any():
            raise ValueError(f"client {i}: samples {values[times > 1][:5].tolist()} appear twice in its index sets")
        out.append(s)
    return out


def _index_set(values, n: int, where: str) -> np.ndarray:
    """One index set as a 1-D int64 array of positions in ``[0, n)``."""
    a = np.asarray(values.cpu() if isinstance(values, torch.Tensor) else values)
    if a.size == 0:
        return np.zeros(0, dtype=np.int64)
    if a.ndim != 1 or not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{where}: expected a 1-D set of integer positions, got {a.dtype} of shape {a.shape}")
    if a.min() < 0 or a.max() >= n:
        raise ValueError(f"{where}: positions must be in [0, {n}) (the pooled samples); "
                         f"got {int(a.min())}..{int(a.max())}")
    return a.astype(np.int64)


def _domain_ids(domains, num_clients: int) -> tuple[list[int] | None, list[str] | None]:
    """(an id per client, the names of string labels in order of first appearance) of ``domains``."""
    if domains is None:
        return None, None
    domains = list(domains)
    if len(domains) != num_clients:
        raise ValueError(f"domains: {len(domains)} labels for {num_clients} clients")
    if all(isinstance(d, str) for d in domains):
        names = list(dict.fromkeys(domains))
        return [names.index(d) for d in domains], names
    if all(isinstance(d, (int, np.integer)) and not isinstance(d, bool) and d >= 0 for d in domains):
        return [int(d) for d in domains], None
    raise ValueError(f"domains: use integers >= 0 or strings, one per client; got {domains[:5]}")


def _unseen_ids(unseen, num_clients: int) -> list[int]:
    ids = sorted({int(c) for c in unseen})
    if ids and (ids[0] < 0 or ids[-1] >= num_clients):
        raise ValueError(f"unseen: client ids must be in [0, {num_clients}); got {ids}")
    if len(ids) == num_clients:
        raise ValueError("unseen: every client is unseen; at least one must train")
    return ids


def _groups(dataset: Dataset) -> dict[str, np.ndarray]:
    keys = set(dataset.groups_train) | set(dataset.groups_test)
    out = {}
    for k in keys:
        a = dataset.groups_train.get(k, np.full(len(dataset.y_train), -1))
        b = dataset.groups_test.get(k, np.full(len(dataset.y_test), -1))
        out[k] = np.concatenate([np.asarray(a), np.asarray(b)]).astype(np.int64)
    return out


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


def _majority(values: np.ndarray) -> int:
    """The most frequent non-negative id (-1 marks samples without that metadata)."""
    known = values[values >= 0]
    return int(np.bincount(known).argmax()) if len(known) else -1


def _holdout(idx: np.ndarray, frac: float, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """Split ``idx`` into (rest, held) with round(frac * n) held out (at least 1 if frac > 0 and n > 1)."""
    idx = rng.permutation(idx)
    k = int(round(frac * len(idx)))
    if frac > 0 and k == 0 and len(idx) > 1:
        k = 1
    return np.sort(idx[k:]), np.sort(idx[:k])


def federation_for(data, dataset: Dataset, seed: int) -> "Federation":
    """The federation an experiment's data settings give over ``dataset`` for one seed.

    ``data``: an experiment's ``[data]`` (or ``[pretrain.data]``) settings, `pflkit.run.experiments.DataConfig`:
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
    from pflkit.data.partition import PARTITIONS

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
    meta, x, y = _pool(dataset, task)
    fine = torch.cat([dataset.y_train, dataset.y_test]).numpy()
    groups = _groups(dataset)
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
        info.update({key: _majority(g[everything]) for key, g in groups.items()})
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
