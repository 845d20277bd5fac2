"""Image-folder datasets read lazily: Office-Caltech-10, DomainNet (FedBN's 10 classes), SUN397.

These are too large to ship and have no offline copy here; the user points a
data root at the published folders. Images are decoded and resized on access
(`pflkit.data.base.ImageFiles`, side ``size``, default 64) and normalized with
the ImageNet statistics, the statistics of the pretrained ResNet-18 that
FedL2P fine-tunes on them. An ``.npz`` written by ``pflkit data pack`` holds the
decoded images instead of paths and loads into memory.
"""
from __future__ import annotations

import csv
import io
from pathlib import Path
from typing import Sequence

import numpy as np

from ..base import Dataset, ImageFiles, data_roots
from ..download import fetcher
from .common import (Found, check_choice, check_positive_int, check_subset, first_match, names_array, provenance,
                     resolve, stratified_split)
from .images import (IMAGE_SUFFIXES, IMAGENET_MEAN, IMAGENET_STD, check_images_open, image_dataset, resize_images,
                     to_nchw)

SPLIT_SEED = 0
TEST_FRACTION = 0.2  # for collections without an official split

OFFICE_DOMAINS = ("amazon", "caltech", "dslr", "webcam")
DOMAINNET_DOMAINS = ("clipart", "infograph", "painting", "quickdraw", "real", "sketch")
# FedBN (Li et al., 2021) and FedL2P use the 10 most common DomainNet classes.
FEDBN_CLASSES = ("bird", "feather", "headphones", "ice_cream", "teapot", "tiger", "whale", "windmill",
                 "wine_glass", "zebra")

HOW_OFFICE = (
    "Download Office-Caltech-10 (e.g. the office_caltech_10 folder distributed with FedBN, "
    "github.com/med-air/FedBN) and place it as "
    "<data root>/office_caltech_10/{amazon,caltech,dslr,webcam}/<class>/*.jpg, "
    "or put office_caltech10.npz (from `pflkit data pack office_caltech10`) there."
)
HOW_SUN397 = (
    "Extract SUN397.tar.gz from https://vision.princeton.edu/projects/2010/SUN/ into a data root "
    "so that SUN397/ClassName.txt and SUN397/<letter>/<category>/*.jpg are inside it (Partitions.zip optional), "
    "or put sun397.npz (from `pflkit data pack sun397`) there."
)
HOW_DOMAINNET = (
    "Download the DomainNet domains from https://ai.bu.edu/M3SDA/ and extract them as "
    "<data root>/domainnet/<domain>/<class>/*.jpg (optionally with the official <domain>_train.txt and "
    "<domain>_test.txt beside them), or put domainnet.npz (from `pflkit data pack domainnet`) there."
)


def list_images(folder: Path) -> list[Path]:
    """Image files directly inside ``folder`` (not in subfolders), sorted."""
    return sorted(p for p in folder.iterdir() if p.is_file() and p.suffix.lower() in IMAGE_SUFFIXES)


def split_arrays(paths: Sequence[Path], y, domain=None, test: np.ndarray | None = None) -> dict[str, np.ndarray]:
    """Folder-schema arrays ``paths_*``, ``y_*`` (and ``domain_*``); stratified 80/20 unless ``test`` is given.

    Stratified on (domain, class), so every domain keeps its class balance.
    """
    paths, y = names_array(str(p) for p in paths), np.asarray(y, np.int64)
    d = np.zeros(len(y), np.int64) if domain is None else np.asarray(domain, np.int64)
    if test is None:
        _, test_idx = stratified_split(d * (int(y.max(initial=0)) + 1) + y, TEST_FRACTION, SPLIT_SEED)
        test = np.zeros(len(y), bool)
        test[test_idx] = True
    out = {"paths_train": paths[~test], "y_train": y[~test], "paths_test": paths[test], "y_test": y[test]}
    if domain is not None:
        out.update(domain_train=d[~test], domain_test=d[test])
    return out


def select(a: dict[str, np.ndarray], key: str, keep: Sequence[str], option: str) -> dict[str, np.ndarray]:
    """Keep the samples whose ``key`` (``y`` or ``domain``) names are in ``keep``; renumber in ``keep``'s order.

    ``option`` is the user-facing option name, for the error message.
    """
    names_key = "class_names" if key == "y" else f"{key}_names"
    known = [str(n) for n in a[names_key]]
    keep = check_subset(option, keep, known)
    new_id = np.full(len(known), -1, np.int64)
    new_id[[known.index(k) for k in keep]] = np.arange(len(keep))
    out = dict(a)
    for split in ("train", "test"):
        mask = new_id[np.asarray(a[f"{key}_{split}"], np.int64)] >= 0
        for prefix in ("x", "paths", "y", "domain"):
            if f"{prefix}_{split}" in a:
                out[f"{prefix}_{split}"] = a[f"{prefix}_{split}"][mask]
        out[f"{key}_{split}"] = new_id[np.asarray(a[f"{key}_{split}"], np.int64)[mask]]
    out[names_key] = names_array(keep)
    return out


def folder_dataset(name: str, found: Found, arrays: dict[str, np.ndarray], size: int, **meta) -> Dataset:
    """A `Dataset` from folder-schema arrays: lazy `ImageFiles` for paths, tensors for npz images.

    Every image file's header is read here (cheap), so a corrupt or non-image file is
    a load-time error naming it rather than a failure mid-training.
    """
    if "paths_train" in arrays:
        check_images_open([*arrays["paths_train"], *arrays["paths_test"]])
        x_train, x_test = ImageFiles(arrays["paths_train"], size), ImageFiles(arrays["paths_test"], size)
    else:
        x_train = resize_images(to_nchw(arrays["x_train"]), size)
        x_test = resize_images(to_nchw(arrays["x_test"]), size)
    groups = {}
    if "domain_train" in arrays:
        groups = dict(groups_train={"domain": arrays["domain_train"]}, groups_test={"domain": arrays["domain_test"]},
                      group_names={"domain": [str(d) for d in arrays["domain_names"]]})
    return image_dataset(name, x_train, arrays["y_train"], x_test, arrays["y_test"],
                         class_names=[str(c) for c in arrays["class_names"]], **provenance(found),
                         stats=(IMAGENET_MEAN, IMAGENET_STD), **groups, **meta)


def decode_paths(paths: Sequence[str], size: int, chunk: int = 256) -> np.ndarray:
    """Decode image files to uint8 (N, size, size, 3), the npz image layout (used by ``pack``)."""
    files = ImageFiles(paths, size)
    out = np.empty((len(files), size, size, 3), np.uint8)
    for s in range(0, len(files), chunk):
        out[s : s + chunk] = files[np.arange(s, min(s + chunk, len(files)))].permute(0, 2, 3, 1).numpy()
    return out


# ---------------------------------------------------------------- Office-Caltech-10


def _read_office_folder(folder: Path) -> dict[str, np.ndarray]:
    classes = sorted({c.name for d in OFFICE_DOMAINS for c in (folder / d).iterdir() if c.is_dir()})
    paths, y, dom = [], [], []
    for di, d in enumerate(OFFICE_DOMAINS):
        for ci, c in enumerate(classes):
            files = list_images(folder / d / c) if (folder / d / c).is_dir() else []
            paths += files
            y += [ci] * len(files)
            dom += [di] * len(files)
    return {**split_arrays(paths, y, dom), "class_names": names_array(classes),
            "domain_names": names_array(OFFICE_DOMAINS)}


def read_office_caltech10(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True) -> Found:
    """Office-Caltech-10 in the folder schema (paths), or its npz."""
    ok = lambda p: p.is_dir() and all((p / d).is_dir() for d in OFFICE_DOMAINS)  # noqa: E731
    return resolve("office_caltech10", roots, npz_files=("office_caltech10.npz",),
                   find_raw=lambda rs: first_match(rs, ("office_caltech_10", "office_caltech10"), ok),
                   read_raw=_read_office_folder, how=HOW_OFFICE, download=download, use_npz=use_npz)


def load_office_caltech10(root=None, *, download: bool = False, size: int = 64,
                          domains: Sequence[str] = OFFICE_DOMAINS) -> Dataset:
    """Office-Caltech-10: 10 classes in 4 domains (amazon, caltech, dslr, webcam), group ``domain``.

    No official split: a stratified 80/20 split per (domain, class) with a fixed seed.
    Images are lazy `ImageFiles` of side ``size`` (uint8, 3 channels).

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: no automatic download exists; True only changes the error message.
        size: side length images are resized to.
        domains: the domains to keep (renumbered in this order).
    """
    check_positive_int("size", size)
    found = read_office_caltech10(data_roots(root), download=download)
    arrays = select(found.arrays, "domain", domains, "domains")
    return folder_dataset("office_caltech10", found, arrays, size)


# ---------------------------------------------------------------- DomainNet


def _official_split(folder: Path, domain: str, paths: list[Path]) -> np.ndarray | None:
    """Test mask from the official ``<domain>_test.txt`` when both lists are present."""
    lists = [folder / f"{domain}_{s}.txt" for s in ("train", "test")]
    if not all(p.is_file() for p in lists):
        return None
    test = {ln.split()[0] for ln in lists[1].read_text().splitlines() if ln.strip()}
    return np.asarray([p.relative_to(folder).as_posix() in test for p in paths], bool)


def _read_domainnet_folder(folder: Path, classes: Sequence[str] | None) -> dict[str, np.ndarray]:
    present = [d for d in DOMAINNET_DOMAINS if (folder / d).is_dir()]
    found_classes = sorted({c.name for d in present for c in (folder / d).iterdir() if c.is_dir()})
    classes = list(found_classes if classes is None else classes)
    parts = []
    for di, d in enumerate(present):
        paths, y = [], []
        for ci, c in enumerate(classes):
            files = list_images(folder / d / c) if (folder / d / c).is_dir() else []
            paths += files
            y += [ci] * len(files)
        if paths:
            parts.append(split_arrays(paths, y, [di] * len(paths), test=_official_split(folder, d, paths)))
    if not parts:
        raise ValueError(f"no images of the classes {classes} under {folder}")
    arrays = {k: np.concatenate([p[k] for p in parts]) for k in parts[0]}
    return {**arrays, "class_names": names_array(classes), "domain_names": names_array(present)}


def read_domainnet(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True,
                   classes: Sequence[str] | str = FEDBN_CLASSES) -> Found:
    """DomainNet in the folder schema for ``classes`` (or ``"all"``), or its npz."""
    cls = None if classes == "all" else (classes,) if isinstance(classes, str) else tuple(classes)
    ok = lambda p: p.is_dir() and any((p / d).is_dir() for d in DOMAINNET_DOMAINS)  # noqa: E731
    return resolve("domainnet", roots, npz_files=("domainnet.npz",),
                   find_raw=lambda rs: first_match(rs, ("domainnet", "DomainNet"), ok),
                   read_raw=lambda f: _read_domainnet_folder(f, cls), how=HOW_DOMAINNET,
                   download=download, use_npz=use_npz)


def load_domainnet(root=None, *, download: bool = False, size: int = 64, classes: Sequence[str] | str = FEDBN_CLASSES,
                   domains: Sequence[str] | None = None) -> Dataset:
    """DomainNet restricted to FedBN's 10 classes by default, group ``domain`` (6 domains).

    The official ``<domain>_train.txt`` / ``<domain>_test.txt`` lists decide the split
    where they are present; otherwise a stratified 80/20 split with a fixed seed.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: no automatic download exists; True only changes the error message.
        size: side length images are resized to.
        classes: class folder names to keep, or ``"all"`` (345 classes in the full set).
        domains: domains to keep (default: every domain found).
    """
    check_positive_int("size", size)
    found = read_domainnet(data_roots(root), download=download, classes=classes)
    arrays = found.arrays
    if classes != "all":
        arrays = select(arrays, "y", classes, "classes")
    if domains is not None:
        arrays = select(arrays, "domain", domains, "domains")
    return folder_dataset("domainnet", found, arrays, size)



# ---------------------------------------------------------------- SUN397


def _sun_classes(folder: Path) -> list[str]:
    """Category paths from ClassName.txt (``/a/abbey`` -> ``a/abbey``)."""
    return [ln.strip().lstrip("/") for ln in (folder / "ClassName.txt").read_text().splitlines() if ln.strip()]


def _partition_files(folder: Path, k: int) -> list[Path]:
    for base in (folder, folder / "Partitions", folder.parent / "Partitions"):
        files = [base / f"Training_{k:02d}.txt", base / f"Testing_{k:02d}.txt"]
        if all(f.is_file() for f in files):
            return files
    raise ValueError(f"SUN397 partition {k}: Training_{k:02d}.txt / Testing_{k:02d}.txt not found in {folder}, "
                     f"{folder / 'Partitions'} or {folder.parent / 'Partitions'} (they come in Partitions.zip)")


def _read_sun_folder(folder: Path, partition: int | None) -> dict[str, np.ndarray]:
    classes = _sun_classes(folder)
    index = {c: i for i, c in enumerate(classes)}
    names = {"class_names": names_array(c.split("/", 1)[1] for c in classes)}  # "abbey", "apse/indoor"
    if partition is None:
        paths, y = [], []
        for c in classes:
            files = list_images(folder / c) if (folder / c).is_dir() else []
            paths += files
            y += [index[c]] * len(files)
        return {**split_arrays(paths, y), **names}
    out = {}
    for split, listing in zip(("train", "test"), _partition_files(folder, partition)):
        rels = [ln.strip().lstrip("/") for ln in listing.read_text().splitlines() if ln.strip()]
        out[f"paths_{split}"] = names_array(str(folder / r) for r in rels)
        out[f"y_{split}"] = np.asarray([index[r.rsplit("/", 1)[0]] for r in rels], np.int64)
    return {**out, **names}


def read_sun397(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True,
                partition: int | None = None) -> Found:
    """SUN397 in the folder schema, or its npz (only when no ``partition`` is asked for)."""
    if partition is not None:
        check_choice("partition", partition, range(1, 11))
    return resolve("sun397", roots, npz_files=("sun397.npz",),
                   find_raw=lambda rs: first_match(rs, ("SUN397",), lambda p: (p / "ClassName.txt").is_file()),
                   read_raw=lambda f: _read_sun_folder(f, partition), how=HOW_SUN397, fetch=fetcher("sun397"),
                   download=download, use_npz=use_npz and partition is None)


def read_sun397_hierarchy(path: str | Path, level: int, class_names: Sequence[str]) -> tuple[list[int], list[str]]:
    """Superclass of each class from the official three-level hierarchy CSV.

    The CSV (``hierarchy_three_levels.zip`` of the SUN database, exported as CSV) has one
    row per category: its path (``'/a/abbey'``), three 0/1 columns for level 1 (indoor;
    outdoor, natural; outdoor, man-made) and then one 0/1 column per level-2 group. A
    category marked in several columns (a few are both indoor and outdoor) takes the
    first. Level-2 names are prefixed with their level-1 name, since e.g.
    "transportation" exists under indoor and under man-made.
    """
    check_choice("superclass_level", level, (1, 2))
    text = Path(path).read_text(encoding="utf-8-sig")
    # Spreadsheet exports differ in delimiter; the one that splits the header most is it.
    delim = max(",;\t", key=lambda d: len(next(csv.reader([text.splitlines()[0]], delimiter=d))))
    rows = [r for r in csv.reader(io.StringIO(text), delimiter=delim) if r and r[0].strip()]
    header, body = [h.strip() for h in rows[0]], rows[1:]
    flag = lambda r, j: j < len(r) and r[j].strip() not in ("", "0", "0.0")  # noqa: E731
    pick = {}
    for r in body:
        name = r[0].strip().strip("'\"").lstrip("/")
        name = name.split("/", 1)[1] if "/" in name and len(name.split("/", 1)[0]) == 1 else name
        top = next((j for j in (1, 2, 3) if flag(r, j)), None)
        mid = next((j for j in range(4, len(header)) if flag(r, j)), None)
        if top is None or (level == 2 and mid is None):
            raise ValueError(f"{path}: category {name!r} has no level-{level} mark")
        pick[name] = (top, mid)
    missing = [c for c in class_names if c not in pick]
    if missing:
        raise ValueError(f"{path} does not list {len(missing)} SUN397 classes, e.g. {missing[:3]}")
    if level == 1:
        return [pick[c][0] - 1 for c in class_names], header[1:4]
    columns = list(range(4, len(header)))
    top_of = {j: max((1, 2, 3), key=lambda t: sum(v == (t, j) for v in pick.values())) for j in columns}
    names = [f"{header[top_of[j]]}/{header[j]}" for j in columns]
    return [columns.index(pick[c][1]) for c in class_names], names


def load_sun397(root=None, *, download: bool = False, size: int = 64, partition: int | None = None,
                hierarchy: str | Path | None = None, superclass_level: int | None = None) -> Dataset:
    """SUN397 scenes (397 classes), lazy `ImageFiles` of side ``size``.

    Split: the official ``Training_<k>.txt`` / ``Testing_<k>.txt`` (50 + 50 images per
    class) when ``partition=k`` is given, otherwise a stratified 80/20 split of every
    image with a fixed seed. Superclasses (pFedVEM's label-concept-drift task) come
    from the official three-level hierarchy CSV passed as ``hierarchy``; there is no
    hierarchy without it.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: download SUN397.tar.gz (tens of GB) into the cache when no copy is found.
        size: side length images are resized to.
        partition: official partition 1..10, or None.
        hierarchy: path of the three-level hierarchy CSV.
        superclass_level: 1 (3 superclasses) or 2 (16); default 1 when ``hierarchy`` is given.

    Raises:
        ValueError: ``superclass_level`` given without ``hierarchy``.
    """
    check_positive_int("size", size)
    if superclass_level is not None and hierarchy is None:
        raise ValueError("sun397: superclass_level needs hierarchy=<path of the official three-level hierarchy "
                         "CSV> (hierarchy_three_levels.zip from https://vision.princeton.edu/projects/2010/SUN/)")
    found = read_sun397(data_roots(root), download=download, partition=partition)
    meta = {}
    if hierarchy is not None:
        classes = [str(c) for c in found.arrays["class_names"]]
        sup, names = read_sun397_hierarchy(hierarchy, superclass_level or 1, classes)
        meta = dict(superclass=sup, superclass_names=names)
    return folder_dataset("sun397", found, found.arrays, size, **meta)
