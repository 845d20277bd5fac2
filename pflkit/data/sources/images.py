"""Image tensors and the `Dataset` built from them, shared by the image sources.

uint8 arrays to (N, C, H, W) tensors, resizing, gray to RGB, per-channel statistics, and
`image_dataset`, which checks shapes and labels and assembles a `pflkit.data.base.Dataset`
with its normalization and provenance; reading image files (`open_image`, `check_images_open`).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch
import torch.nn.functional as F

from ..base import Dataset, DatasetMeta, ImageFiles
from .common import Found, check_labels, check_positive_int, provenance

# Natural-image statistics for lazy folder datasets, whose pixels we do not scan
# just to normalize them (the usual ImageNet values, which suit pretrained nets).
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff", ".webp")


def to_nchw(x: np.ndarray) -> torch.Tensor:
    """(N, H, W) or (N, H, W, C) uint8 array -> contiguous uint8 tensor (N, C, H, W)."""
    x = np.asarray(x)
    if x.dtype != np.uint8:
        raise ValueError(f"images must be uint8, got {x.dtype}")
    if x.ndim == 3:
        x = x[:, None]
    elif x.ndim == 4:
        x = x.transpose(0, 3, 1, 2)
    else:
        raise ValueError(f"images must have 3 or 4 dimensions, got shape {x.shape}")
    return torch.from_numpy(np.ascontiguousarray(x))


def resize_images(x: torch.Tensor, size: int, chunk: int = 2048) -> torch.Tensor:
    """Resize uint8 (N, C, H, W) images to (N, C, size, size), bilinear with antialiasing.

    Antialiasing matters when shrinking (Omniglot 105 -> 28 would alias thin strokes).
    Works in chunks so large sets never need a full float copy.
    """
    check_positive_int("size", size)
    n, c, h, w = x.shape
    if (h, w) == (size, size):
        return x
    out = torch.empty((n, c, size, size), dtype=torch.uint8)
    for s in range(0, n, chunk):
        part = x[s : s + chunk].float()
        part = F.interpolate(part, size=(size, size), mode="bilinear", align_corners=False, antialias=True)
        out[s : s + chunk] = part.round_().clamp_(0, 255).to(torch.uint8)
    return out


def to_rgb(x: torch.Tensor) -> torch.Tensor:
    """Gray (N, 1, H, W) -> (N, 3, H, W) by repeating the channel; RGB passes through."""
    return x.expand(-1, 3, -1, -1).contiguous() if x.shape[1] == 1 else x


def channel_stats(x: torch.Tensor) -> tuple[tuple[float, ...], tuple[float, ...]]:
    """Per-channel mean and std of uint8 images on the [0, 1] scale.

    Exact and light on memory: a 256-bin histogram per channel instead of a float copy.
    """
    if x.shape[0] == 0:
        return (0.5,) * x.shape[1], (0.25,) * x.shape[1]
    levels = torch.arange(256, dtype=torch.float64) / 255.0
    means, stds = [], []
    for c in range(x.shape[1]):
        counts = torch.bincount(x[:, c].reshape(-1), minlength=256).double()
        p = counts / counts.sum()
        mean = float((p * levels).sum())
        var = float((p * (levels - mean) ** 2).sum())
        means.append(round(mean, 6))
        stds.append(round(max(var, 1e-12) ** 0.5, 6))
    return tuple(means), tuple(stds)


def labels(y) -> torch.Tensor:
    return torch.as_tensor(np.asarray(y).astype(np.int64))


def image_dataset(
    name: str,
    x_train,
    y_train,
    x_test,
    y_test,
    *,
    class_names: Sequence[str],
    source: str,
    superclass: Sequence[int] | None = None,
    superclass_names: Sequence[str] | None = None,
    groups_train: dict[str, np.ndarray] | None = None,
    groups_test: dict[str, np.ndarray] | None = None,
    group_names: dict[str, Sequence[str]] | None = None,
    stats: tuple[tuple[float, ...], tuple[float, ...]] | None = None,
    files: Sequence[dict] = (),
    download: dict | None = None,
) -> Dataset:
    """Assemble a `Dataset` from image tensors (or `ImageFiles`) and labels.

    The normalization statistics ``stats = (mean, std)`` are measured on the
    training images when not given and the images are in memory; lazy folders
    use the ImageNet statistics. ``files`` and ``download`` are the provenance
    (`Found.files`, `Found.download`).

    Raises:
        ValueError: train and test images differ in shape, or a label is outside
            ``[0, len(class_names))``; the message names ``source``.
    """
    check_image_shapes(name, source, x_train, x_test)
    check_labels(name, source, len(class_names), y_train=y_train, y_test=y_test)
    if stats is not None:
        mean, std = stats
    elif isinstance(x_train, ImageFiles):
        mean, std = IMAGENET_MEAN[: x_train.channels], IMAGENET_STD[: x_train.channels]
    else:
        mean, std = channel_stats(x_train)
    meta = DatasetMeta(
        name=name,
        num_classes=len(class_names),
        class_names=tuple(str(c) for c in class_names),
        input_shape=tuple(int(s) for s in x_train.shape[1:]),
        mean=mean,
        std=std,
        superclass=None if superclass is None else tuple(int(s) for s in superclass),
        superclass_names=None if superclass_names is None else tuple(str(s) for s in superclass_names),
        group_names={k: tuple(str(v) for v in vs) for k, vs in (group_names or {}).items()},
        source=source,
        files=tuple(files),
        download=download,
    )
    as_int = lambda g: {k: np.asarray(v).astype(np.int64) for k, v in (g or {}).items()}  # noqa: E731
    return Dataset(meta, x_train, labels(y_train), x_test, labels(y_test), as_int(groups_train), as_int(groups_test))


def _require_image_arrays(name: str, found: Found) -> None:
    missing = [k for k in ("x_train", "y_train", "x_test", "y_test") if k not in found.arrays]
    if missing:
        raise ValueError(f"{name}: {found.source} lacks the arrays {missing}")


def arrays_dataset(name: str, found: Found, class_names: Sequence[str], **meta) -> Dataset:
    """A dataset from the plain image schema's arrays x_train, y_train, x_test, y_test (NHWC or NCHW).

    ``meta``: `image_dataset`'s other keywords (``superclass``, ``superclass_names``, ...);
    the provenance comes from ``found``.
    """
    _require_image_arrays(name, found)
    a = found.arrays
    return image_dataset(
        name, to_nchw(a["x_train"]), a["y_train"], to_nchw(a["x_test"]), a["y_test"],
        class_names=class_names, **provenance(found), **meta,
    )


def simple_image_dataset(name: str, found: Found, default_classes: Sequence[str] | None = None) -> Dataset:
    """A dataset from the plain image schema: x_train, y_train, x_test, y_test[, class_names]."""
    _require_image_arrays(name, found)
    a = found.arrays
    classes = a.get("class_names")
    if classes is None:
        n = int(a["y_train"].max(initial=0)) + 1
        classes = default_classes if default_classes is not None else [str(c) for c in range(n)]
    return arrays_dataset(name, found, [str(c) for c in classes])


def check_image_shapes(name: str, source: str, x_train, x_test) -> None:
    """ValueError naming ``source`` when train and test samples differ in shape (C, H, W)."""
    if len(x_test) and tuple(x_train.shape[1:]) != tuple(x_test.shape[1:]):
        raise ValueError(f"{name}: {source}: train images have shape {tuple(x_train.shape[1:])} but test images "
                         f"{tuple(x_test.shape[1:])}; both splits must have the same image shape")


def open_image(path, mode: str | None = None) -> np.ndarray:
    """Decode one image file to a uint8 array (converted to ``mode`` if given).

    Raises:
        FileNotFoundError: the file is missing (an incomplete copy).
        ValueError: the file is not a readable image; the message names it.
    """
    from PIL import Image, UnidentifiedImageError  # imported lazily: only image folders need it

    try:
        with Image.open(path) as im:
            return np.asarray(im.convert(mode) if mode else im, dtype=np.uint8)
    except FileNotFoundError:
        raise
    except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
        raise ValueError(f"{path} is not a readable image ({type(exc).__name__}: {exc})") from exc


def check_images_open(paths: Sequence[str]) -> None:
    """Read the header of every image file (cheap: PIL decodes lazily); ValueError naming the first bad one."""
    from PIL import Image, UnidentifiedImageError

    for path in paths:
        try:
            with Image.open(path) as im:
                im.size  # noqa: B018  (the header is parsed by open; touch it for clarity)
        except (UnidentifiedImageError, OSError, SyntaxError, ValueError) as exc:
            raise ValueError(f"{path} is not a readable image ({type(exc).__name__}: {exc})") from exc
