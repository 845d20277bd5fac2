"""Dataset containers shared by every loader, partition and federation.

A `Dataset` holds a train and a test split as tensors (or a lazy `ImageFiles`
for collections too large for memory), the labels as int64 tensors, and
per-sample metadata arrays (domain, speaker, alphabet, drawer, ...) that the
partitions use. Images are kept as uint8 (N, C, H, W); `to_float` turns a
batch into normalized float32 with the dataset's per-channel mean and std.
Audio datasets store float32 log-mel features (N, 1, n_mels, frames) and
have mean 0 / std 1 per channel (already standardized).
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch

ENV_ROOT = "PFLKIT_DATA"
ENV_CACHE = "PFLKIT_CACHE"
ENV_OFFLINE = "PFLKIT_OFFLINE"


class DatasetNotFoundError(FileNotFoundError):
    """Raised when a dataset is in none of the places pflkit looks.

    The message names the dataset, every path searched and how to obtain it.
    """

    def __init__(self, name: str, searched: Sequence[str | os.PathLike], how: str):
        self.name, self.searched, self.how = name, [str(p) for p in searched], how
        paths = "\n".join(f"  - {p}" for p in self.searched) or "  (no path)"
        super().__init__(
            f"dataset {name!r} was not found. Searched:\n{paths}\nHow to obtain it: {how}"
        )


@dataclass(frozen=True)
class DatasetMeta:
    """What a model and a partition need to know about a dataset.

    Attributes:
        name: registry name, e.g. ``"cifar10"``.
        num_classes: number of distinct values of ``y``.
        class_names: one name per class id.
        input_shape: (C, H, W) of one sample as the model receives it.
        mean, std: per-channel normalization applied by `to_float` to uint8 images.
        superclass: superclass id of each class (CIFAR-100 coarse labels, Omniglot
            alphabets, SUN397 hierarchy, CIFAR-10 vehicle/animal); None if the
            dataset has no hierarchy.
        superclass_names: one name per superclass id.
        group_names: for each per-sample metadata key (``"domain"``, ``"speaker"``,
            ``"alphabet"``, ``"drawer"``), the name of each group id.
        source: where the arrays were read from (a path or a URL-less description).
        files: provenance, one dict per file read: ``{"path": absolute path, "bytes": size,
            "sha256": hex digest}``. A folder of many images or clips is one entry for the
            folder instead: ``{"path", "files": count, "bytes": total size, "sha256": digest of
            the sorted listing of (relative path, size)}`` (`pflkit.data.provenance`).
        download: when the files came from a pflkit download, the note written then
            (``{"urls": [...], "files": [{"url", "filename", "bytes", "sha256", "checksum"}], ...}``);
            None otherwise.
    """

    name: str
    num_classes: int
    class_names: tuple[str, ...]
    input_shape: tuple[int, ...]
    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    superclass: tuple[int, ...] | None = None
    superclass_names: tuple[str, ...] | None = None
    group_names: dict[str, tuple[str, ...]] = field(default_factory=dict)
    source: str = ""
    files: tuple[dict, ...] = ()
    download: dict | None = None


class ImageFiles:
    """A lazy image collection: decodes and resizes files on access.

    Indexing with an int64 tensor or array of positions returns a uint8 tensor
    (n, C, size, size). Used for folder datasets too large to hold in memory.
    """

    def __init__(self, paths: Sequence[str | os.PathLike], size: int, channels: int = 3):
        self.paths = [str(p) for p in paths]
        self.size, self.channels = int(size), int(channels)

    def __len__(self) -> int:
        return len(self.paths)

    @property
    def shape(self) -> tuple[int, ...]:
        return (len(self.paths), self.channels, self.size, self.size)

    def __getitem__(self, index) -> torch.Tensor:
        from PIL import Image  # imported lazily: only folder datasets need it

        idx = np.asarray(index).reshape(-1)
        mode = "RGB" if self.channels == 3 else "L"
        out = torch.empty((len(idx), self.channels, self.size, self.size), dtype=torch.uint8)
        for k, i in enumerate(idx):
            with Image.open(self.paths[int(i)]) as im:
                im = im.convert(mode).resize((self.size, self.size), Image.BILINEAR)
                arr = np.asarray(im, dtype=np.uint8)
            arr = arr[None] if arr.ndim == 2 else arr.transpose(2, 0, 1)
            out[k] = torch.from_numpy(np.ascontiguousarray(arr))
        return out


Array = torch.Tensor | ImageFiles


@dataclass
class Dataset:
    """A dataset with a train and a test split and per-sample metadata.

    ``groups_train[key]`` / ``groups_test[key]`` are int64 numpy arrays, one entry per
    sample, for metadata keys such as ``"domain"`` or ``"speaker"`` (names of the ids
    in ``meta.group_names[key]``). A dataset without an official test split has
    empty test tensors (0 samples); federations then split each client's pool.
    """

    meta: DatasetMeta
    x_train: Array
    y_train: torch.Tensor
    x_test: Array
    y_test: torch.Tensor
    groups_train: dict[str, np.ndarray] = field(default_factory=dict)
    groups_test: dict[str, np.ndarray] = field(default_factory=dict)

    def __post_init__(self):
        for split, x, y, groups in (
            ("train", self.x_train, self.y_train, self.groups_train),
            ("test", self.x_test, self.y_test, self.groups_test),
        ):
            if len(x) != len(y):
                raise ValueError(f"{self.meta.name}: x_{split} has {len(x)} samples, y_{split} {len(y)}")
            for key, g in groups.items():
                if len(g) != len(y):
                    raise ValueError(f"{self.meta.name}: group {key!r} of {split} has {len(g)} entries, not {len(y)}")

    @property
    def name(self) -> str:
        return self.meta.name


def to_float(x: torch.Tensor, meta: DatasetMeta) -> torch.Tensor:
    """Turn a uint8 image batch into normalized float32; float batches pass through."""
    if x.dtype != torch.uint8:
        return x.float()
    mean = torch.tensor(meta.mean, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    std = torch.tensor(meta.std, dtype=torch.float32, device=x.device).view(1, -1, 1, 1)
    return (x.float().div_(255.0) - mean) / std


class DataRoots(list):
    """Data roots in search order (a list of `Path`).

    ``explicit`` is the caller's own root (``--data-root``) when one was given: it is
    searched completely (full npz, subset npz, published layout) before any other root.
    """

    explicit: Path | None = None


def cache_dir() -> Path:
    """Where downloads land and the last data root: ``$PFLKIT_CACHE`` or ``~/.cache/pflkit/data``."""
    env = os.environ.get(ENV_CACHE)
    return Path(env).expanduser().absolute() if env else Path.home() / ".cache" / "pflkit" / "data"


def offline() -> bool:
    """True when ``$PFLKIT_OFFLINE`` is set to a true value (1, true, yes): no network attempt."""
    return os.environ.get(ENV_OFFLINE, "").strip().lower() in ("1", "true", "yes", "on")


def data_roots(root: str | os.PathLike | None = None) -> DataRoots:
    """The folders searched for dataset files, in order.

    ``root`` (``--data-root``) first, then ``$PFLKIT_DATA``, then the cache (`cache_dir`).
    """
    roots = []
    if root is not None:
        roots.append(Path(root).expanduser().absolute())
    if os.environ.get(ENV_ROOT):
        roots.append(Path(os.environ[ENV_ROOT]).expanduser().absolute())
    roots.append(cache_dir())
    out = DataRoots()
    for r in roots:
        if r not in out:
            out.append(r)
    if root is not None:
        out.explicit = out[0]
    return out


Loader = Callable[..., Dataset]
