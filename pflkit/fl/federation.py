"""A federation: clients with train / val / test splits over one pooled dataset.

The types (`Client`, `Federation`) and what a federation does once made: its clients'
batches, subsets, histograms, saving and loading, its digest. `pflkit.fl.federate` builds
one from a dataset and a partition scheme.

Clients keep index arrays into the pooled tensors (no copies). The federation is
saved with a run (`save` / `load`) so every method sees exactly the same split.

A federation of one's own (`Federation.from_indices`) takes each client's index sets
and, optionally, domain labels as given, with no partition scheme at all.
"""
from __future__ import annotations

import hashlib
import json
import os
from dataclasses import dataclass, field, replace
from typing import Iterator

import numpy as np
import torch

from pflkit.data.base import Dataset, DatasetMeta, ImageFiles, to_float
from pflkit.data.transforms import AUGMENTS, augment_batch

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
        meta, x, y = pooled(dataset, recipe.get("task", "label"))
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
        if augment not in AUGMENTS:
            raise ValueError(f"augment={augment!r}: use one of {', '.join(AUGMENTS)}")
        meta, x, y = pooled(dataset, task)
        sets = _client_index_sets(train, test, val, len(y))
        ids, names = _domain_ids(domains, len(sets))
        unseen = _unseen_ids(unseen, len(sets))
        groups = pooled_groups(dataset)
        clients = []
        for i, s in enumerate(sets):
            everything = np.concatenate(list(s.values()))
            info = {"num_train": int(len(s["train"])), **{k: majority(g[everything]) for k, g in groups.items()}}
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
        meta, x, y = pooled(dataset, self.recipe.get("task", "label"))
        if len(y) != len(self.y):
            raise ValueError(f"the federation holds {len(self.y)} pooled samples, dataset {dataset.name!r} {len(y)}")
        clients = [Client(c.id, x, y, c.splits, meta, dict(c.info), c.augment) for c in self.clients]
        return Federation(meta, x, y, clients, dict(self.recipe))


def pooled(dataset: Dataset, task: str):
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


def pooled_groups(dataset: Dataset) -> dict[str, np.ndarray]:
    keys = set(dataset.groups_train) | set(dataset.groups_test)
    out = {}
    for k in keys:
        a = dataset.groups_train.get(k, np.full(len(dataset.y_train), -1))
        b = dataset.groups_test.get(k, np.full(len(dataset.y_test), -1))
        out[k] = np.concatenate([np.asarray(a), np.asarray(b)]).astype(np.int64)
    return out


def majority(values: np.ndarray) -> int:
    """The most frequent non-negative id (-1 marks samples without that metadata)."""
    known = values[values >= 0]
    return int(np.bincount(known).argmax()) if len(known) else -1
