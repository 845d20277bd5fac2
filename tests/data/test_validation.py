"""Load-time validation: bad files are one-line errors naming the file, not tracebacks mid-training."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from pflkit.data.datasets import load_dataset



def images(n, *shape):
    return np.random.default_rng(n).integers(0, 256, (n, *shape), dtype=np.uint8)


def test_npz_with_train_and_test_shapes_differing_names_the_file(tmp_path):
    path = tmp_path / "mnist.npz"
    np.savez(path, x_train=images(4, 28, 28), y_train=np.arange(4), x_test=images(2, 32, 32), y_test=np.arange(2))
    with pytest.raises(ValueError) as err:
        load_dataset("mnist", tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and "(1, 28, 28)" in msg and "(1, 32, 32)" in msg
    np.savez(path, x_train=images(4, 32, 32, 3), y_train=np.arange(4), x_test=images(2, 32, 32), y_test=np.arange(2))
    with pytest.raises(ValueError, match=r"\(3, 32, 32\).*\(1, 32, 32\)"):  # RGB train, gray test
        load_dataset("mnist", tmp_path)


@pytest.mark.parametrize("bad, split", [(10, "y_train"), (-1, "y_test")])
def test_labels_outside_the_classes_name_the_file(tmp_path, bad, split):
    y = {"y_train": np.arange(4), "y_test": np.arange(2)}
    y[split] = y[split].copy()
    y[split][1] = bad
    path = tmp_path / "usps.npz"
    np.savez(path, x_train=images(4, 16, 16), x_test=images(2, 16, 16), **y)
    with pytest.raises(ValueError) as err:
        load_dataset("usps", tmp_path)
    msg = str(err.value)
    assert "\n" not in msg and str(path) in msg and f"{split} holds label {bad}" in msg and "[0, 10)" in msg


def test_cifar100_npz_with_a_label_beyond_its_class_names(tmp_path):
    path = tmp_path / "cifar100.npz"
    np.savez(path, x_train=images(3, 32, 32, 3), y_train=np.array([0, 1, 3]), x_test=images(1, 32, 32, 3),
             y_test=np.array([0]), class_names=np.array(["a", "b", "c"]))
    with pytest.raises(ValueError, match=r"y_train holds label 3, outside \[0, 3\)"):
        load_dataset("cifar100", tmp_path)


def test_valid_npz_still_loads(tmp_path):
    np.savez(tmp_path / "mnist.npz", x_train=images(4, 28, 28), y_train=np.array([0, 9, 3, 3]),
             x_test=images(2, 28, 28), y_test=np.array([9, 0]))
    ds = load_dataset("mnist", tmp_path)
    assert ds.y_train.tolist() == [0, 9, 3, 3] and ds.meta.num_classes == 10


def write_office(root: Path) -> None:
    for domain in ("amazon", "caltech", "dslr", "webcam"):
        for cls in ("bike", "mug"):
            for i in range(5):
                path = root / "office_caltech_10" / domain / cls / f"{i}.jpg"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.new("RGB", (8, 8), (10 * i, 0, 0)).save(path)


def test_folder_dataset_with_a_corrupt_image_names_it_at_load_time(tmp_path):
    write_office(tmp_path)
    assert len(load_dataset("office_caltech10", tmp_path, size=8).y_train) == 32
    bad = tmp_path / "office_caltech_10" / "dslr" / "mug" / "3.jpg"
    bad.write_bytes(b"this is not a jpeg")
    with pytest.raises(ValueError) as err:
        load_dataset("office_caltech10", tmp_path, size=8)
    assert str(bad) in str(err.value) and "not a readable image" in str(err.value)


def test_mnist_m_png_corrupt_image_names_it(tmp_path):
    for split, n in (("train", 3), ("test", 2)):
        folder = tmp_path / "mnist_m" / f"mnist_m_{split}"
        folder.mkdir(parents=True)
        for i in range(n):
            Image.fromarray(images(1, 32, 32, 3)[0]).save(folder / f"{i:08d}.png")
        (tmp_path / "mnist_m" / f"mnist_m_{split}_labels.txt").write_text("".join(f"{i:08d}.png {i}\n" for i in range(n)))
    assert load_dataset("mnist_m", tmp_path).y_train.tolist() == [0, 1, 2]
    bad = tmp_path / "mnist_m" / "mnist_m_test" / "00000001.png"
    bad.write_bytes(b"\x89PNG truncated")
    with pytest.raises(ValueError, match="00000001.png is not a readable image"):
        load_dataset("mnist_m", tmp_path)
