"""Office-Caltech-10, DomainNet and SUN397 loaders on tiny image folders written here in the
published layouts, and packing a folder dataset into an npz."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pflkit.data.base import ImageFiles
from pflkit.data.datasets import load_dataset
from pflkit.data.pack import pack
from pflkit.data.sources.folders import FEDBN_CLASSES



def write_image(path: Path, value: int, size=(12, 9)) -> None:
    """A flat image whose red channel encodes ``value`` (so tests can tell files apart after resizing)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    Image.new("RGB", size, (value, 255 - value, 7)).save(path)


def make_office(root: Path, per_class: int = 5) -> None:
    for d, domain in enumerate(("amazon", "caltech", "dslr", "webcam")):
        for c, cls in enumerate(("back_pack", "bike", "mug")):
            for i in range(per_class):
                write_image(root / "office_caltech_10" / domain / cls / f"frame_{i:04d}.jpg", 40 * d + 10 * c)


def test_office_caltech10_folders(tmp_path):
    make_office(tmp_path)
    (tmp_path / "office_caltech_10" / "amazon" / "mug" / "notes.txt").write_text("not an image")
    ds = load_dataset("office_caltech10", tmp_path, size=16)
    assert isinstance(ds.x_train, ImageFiles) and ds.x_train.shape == (48, 3, 16, 16)
    assert len(ds.x_test) == 12  # 20% of 5 images = 1 per (domain, class)
    assert ds.meta.class_names == ("back_pack", "bike", "mug") and ds.meta.input_shape == (3, 16, 16)
    assert ds.meta.group_names["domain"] == ("amazon", "caltech", "dslr", "webcam")
    assert np.bincount(ds.groups_test["domain"]).tolist() == [3] * 4
    assert np.bincount(ds.y_test.numpy()).tolist() == [4] * 3
    batch = ds.x_test[torch.arange(len(ds.x_test))]
    assert batch.dtype == torch.uint8 and batch.shape == (12, 3, 16, 16)
    # each image's content matches its (domain, class): red = 40 d + 10 c (JPEG keeps flat colors within a few levels)
    red = batch[:, 0].float().mean(dim=(1, 2))
    expected = 40 * torch.from_numpy(ds.groups_test["domain"]).float() + 10 * ds.y_test.float()
    assert torch.allclose(red, expected, atol=3)
    assert ds.meta.mean == (0.485, 0.456, 0.406)
    two = load_dataset("office_caltech10", tmp_path, domains=("webcam", "amazon"))
    assert two.meta.group_names["domain"] == ("webcam", "amazon") and len(two.y_train) == 24
    webcam = np.flatnonzero(two.groups_train["domain"] == 0)
    assert len(webcam) == 12 and int(two.y_train[webcam[0]]) == 0
    red = two.x_train[torch.from_numpy(webcam[:1])][0, 0].float().mean()
    assert abs(float(red) - 120) < 3  # webcam (d = 3 above) is domain 0 now; class back_pack
    with pytest.raises(ValueError, match="domains"):
        load_dataset("office_caltech10", tmp_path, domains=("mars",))


def test_domainnet_folders_fedbn_classes_and_official_lists(tmp_path):
    base = tmp_path / "domainnet"
    for domain in ("clipart", "real"):
        for cls in ("aircraft_carrier", "bird", "zebra"):
            for i in range(5):
                write_image(base / domain / cls / f"{domain}_{i:03d}.jpg", 60 + 20 * i)
    # official lists only for clipart: 2 test images of bird, the rest train
    rels = sorted(p.relative_to(base).as_posix() for p in (base / "clipart").rglob("*.jpg"))
    test = [r for r in rels if "/bird/" in r][:2]
    (base / "clipart_train.txt").write_text("".join(f"{r} 0\n" for r in rels if r not in test))
    (base / "clipart_test.txt").write_text("".join(f"{r} 0\n" for r in test))
    ds = load_dataset("domainnet", tmp_path, size=8)
    assert ds.meta.class_names == FEDBN_CLASSES and ds.meta.group_names["domain"] == ("clipart", "real")
    assert set(ds.y_train.tolist()) == {FEDBN_CLASSES.index("bird"), FEDBN_CLASSES.index("zebra")}  # no carrier
    clip_test = ds.groups_test["domain"] == 0
    assert sorted(Path(p).name for p, m in zip(ds.x_test.paths, clip_test) if m) == [Path(t).name for t in test]
    assert (ds.groups_test["domain"] == 1).sum() == 2  # real: stratified 20% of 5 per class
    assert len(ds.y_train) + len(ds.y_test) == 20
    every = load_dataset("domainnet", tmp_path, classes="all", domains=("real",))
    assert every.meta.class_names == ("aircraft_carrier", "bird", "zebra") and len(every.y_train) == 12
    with pytest.raises(ValueError, match="classes"):
        load_dataset("domainnet", tmp_path, classes=("unicorn",))


SUN_CLASSES = ["/a/abbey", "/a/apse/indoor", "/b/bakery/shop", "/b/beach"]
HEADER = ["category", "indoor", "outdoor, natural", "outdoor, man-made", "shopping and dining", "workplace",
          "home or hotel", "transportation", "sports and leisure", "cultural", "water, ice, snow", "mountains",
          "forest", "man-made elements", "transportation", "cultural or historical", "sports fields", "industrial",
          "houses", "commercial"]
MARKS = {"/a/abbey": (3, 15), "/a/apse/indoor": (1, 9), "/b/bakery/shop": (1, 4), "/b/beach": (2, 10)}


def make_sun(root: Path, per_class: int = 5) -> Path:
    base = root / "SUN397"
    base.mkdir(parents=True)
    (base / "ClassName.txt").write_text("".join(c + "\n" for c in SUN_CLASSES))
    for k, c in enumerate(SUN_CLASSES):
        for i in range(per_class):
            write_image(base / c.lstrip("/") / f"sun_{k}{i:03d}.jpg", 50 * k)
    return base


def write_hierarchy(path: Path, delimiter: str) -> Path:
    rows = [delimiter.join(f'"{h}"' if delimiter in h else h for h in HEADER)]
    for c, (top, mid) in MARKS.items():
        flags = ["0"] * (len(HEADER) - 1)
        flags[top - 1] = flags[mid - 1] = "1"
        if c == "/a/apse/indoor":
            flags[2] = "1"  # also marked man-made: the first mark (indoor) wins
        rows.append(delimiter.join([f"'{c}'"] + flags))
    path.write_text("\n".join(rows) + "\n")
    return path


@pytest.mark.parametrize("delimiter", [",", ";"])
def test_sun397_folders_and_hierarchy(tmp_path, delimiter):
    make_sun(tmp_path)
    ds = load_dataset("sun397", tmp_path, size=8)
    assert ds.meta.class_names == ("abbey", "apse/indoor", "bakery/shop", "beach") and ds.meta.superclass is None
    assert len(ds.y_train) == 16 and np.bincount(ds.y_test.numpy()).tolist() == [1] * 4
    csv_path = write_hierarchy(tmp_path / "three_levels.csv", delimiter)
    top = load_dataset("sun397", tmp_path, hierarchy=csv_path)
    assert top.meta.superclass == (2, 0, 0, 1)
    assert top.meta.superclass_names == ("indoor", "outdoor, natural", "outdoor, man-made")
    mid = load_dataset("sun397", tmp_path, hierarchy=csv_path, superclass_level=2)
    assert mid.meta.superclass == (11, 5, 0, 6) and len(mid.meta.superclass_names) == 16
    assert mid.meta.superclass_names[0] == "indoor/shopping and dining"
    assert mid.meta.superclass_names[11] == "outdoor, man-made/cultural or historical"
    with pytest.raises(ValueError, match="superclass_level needs hierarchy"):
        load_dataset("sun397", tmp_path, superclass_level=1)


def test_sun397_official_partition(tmp_path):
    base = make_sun(tmp_path)
    files = {c: sorted(p.relative_to(base).as_posix() for p in (base / c.lstrip("/")).glob("*.jpg"))
             for c in SUN_CLASSES}
    (base / "Partitions").mkdir()
    (base / "Partitions" / "Training_03.txt").write_text("".join(f"/{f[0]}\n/{f[1]}\n" for f in files.values()))
    (base / "Partitions" / "Testing_03.txt").write_text("".join(f"/{f[2]}\n" for f in files.values()))
    ds = load_dataset("sun397", tmp_path, partition=3)
    assert ds.y_train.tolist() == [0, 0, 1, 1, 2, 2, 3, 3] and ds.y_test.tolist() == [0, 1, 2, 3]
    assert Path(ds.x_test.paths[2]).name == Path(files["/b/bakery/shop"][2]).name
    with pytest.raises(ValueError, match="Training_01.txt"):
        load_dataset("sun397", tmp_path, partition=1)
    with pytest.raises(ValueError, match="partition"):
        load_dataset("sun397", tmp_path, partition=11)


def test_pack_folder_dataset_decodes_images(tmp_path):
    make_office(tmp_path, per_class=5)
    lazy = load_dataset("office_caltech10", tmp_path, size=10)
    out = pack("office_caltech10", tmp_path, size=10)
    with np.load(out, allow_pickle=False) as z:
        assert z["x_train"].shape == (48, 10, 10, 3) and z["x_train"].dtype == np.uint8
        assert not any(k.startswith("paths") for k in z.files)
        assert z["domain_names"].tolist() == ["amazon", "caltech", "dslr", "webcam"]
    packed = load_dataset("office_caltech10", tmp_path, size=10)  # the npz is now found first
    assert isinstance(packed.x_train, torch.Tensor) and packed.meta.source == str(out)
    assert torch.equal(packed.x_test, lazy.x_test[torch.arange(len(lazy.x_test))])
    assert torch.equal(packed.y_train, lazy.y_train) and packed.meta.group_names == lazy.meta.group_names
    assert packed.meta.mean == lazy.meta.mean  # the same normalization whichever copy is read
