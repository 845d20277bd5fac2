"""Image dataset loaders on small files written here in each dataset's published format,
on the shared offline npz files, and the registry's errors."""
from __future__ import annotations

import bz2
import gzip
import os
import pickle
import socket
import struct
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from pflkit.data.base import DatasetNotFoundError, to_float
from pflkit.data.datasets import DATASET_NAMES, DATASETS, dataset_name, dataset_names, dataset_options, load_dataset
from pflkit.data.pack import pack

SHARED = Path(os.environ.get("PFLKIT_DATA") or "/nonexistent-pflkit-data")  # CI sets $PFLKIT_DATA
needs_shared = pytest.mark.skipif(not SHARED.is_dir(), reason="no offline data folder: set $PFLKIT_DATA")
RNG = np.random.default_rng(0)



def images(n, h, w, c=None):
    shape = (n, h, w) if c is None else (n, h, w, c)
    return RNG.integers(0, 256, size=shape, dtype=np.uint8)


# ---------------------------------------------------------------- registry and digits


def test_registry_names_and_option_errors():
    assert dataset_names()[0] == "digits" and set(dataset_names()) == set(DATASETS)
    assert set(DATASET_NAMES) == set(DATASETS)  # every dataset of pflkit's own has its readable name
    assert dataset_name("cifar10") == "CIFAR-10" and dataset_name("mine") == "mine"
    with pytest.raises(ValueError, match="unknown dataset 'imagenet'.*digits.*cifar10.*sun397"):
        load_dataset("imagenet")
    with pytest.raises(TypeError, match="'digits' has no option 'size'"):
        load_dataset("digits", size=32)
    with pytest.raises(TypeError, match="'omniglot' has no option 'n_mels'"):
        load_dataset("omniglot", n_mels=3)
    assert dataset_options("omniglot") == {"size": 28, "sets": None}


def test_digits_embedded_default():
    from sklearn.datasets import load_digits

    ds = load_dataset("digits")
    assert ds.x_train.shape == (1438, 1, 8, 8) and ds.x_test.shape == (359, 1, 8, 8)
    assert ds.x_train.dtype == torch.uint8 and ds.y_train.dtype == torch.int64
    # stratified 80/20: every class keeps 20% (rounded) of its samples in test
    counts = np.bincount(load_digits().target)
    assert np.bincount(ds.y_test.numpy()).tolist() == [int(round(0.2 * c)) for c in counts]
    # pixels are 0..16 scaled to 0..255; the set of images is the sklearn one
    all_x = torch.cat([ds.x_train, ds.x_test]).reshape(-1, 64).numpy().astype(np.int64)
    ref = np.rint(load_digits().data * 255 / 16).astype(np.int64)
    assert sorted(map(bytes, all_x.astype(np.uint8))) == sorted(map(bytes, ref.astype(np.uint8)))
    # deterministic, and the statistics are the training pixels' own
    assert torch.equal(load_dataset("digits").x_test, ds.x_test)
    z = to_float(ds.x_train, ds.meta)
    assert abs(float(z.mean())) < 1e-5 and abs(float(z.std()) - 1) < 1e-3


# ---------------------------------------------------------------- CIFAR pickles


def write_pickle(path: Path, obj) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as f:
        pickle.dump(obj, f, protocol=2)


def cifar_rows(x_nhwc):
    return x_nhwc.transpose(0, 3, 1, 2).reshape(len(x_nhwc), -1)  # R plane, G plane, B plane


def test_cifar10_pickles(tmp_path):
    folder = tmp_path / "cifar-10-batches-py"
    names = [b"airplane", b"automobile", b"bird", b"cat", b"deer", b"dog", b"frog", b"horse", b"ship", b"truck"]
    xs, ys = [], []
    for i in range(1, 6):
        x, y = images(4, 32, 32, 3), list(RNG.integers(0, 10, 4))
        write_pickle(folder / f"data_batch_{i}", {b"batch_label": b"b", b"labels": y, b"data": cifar_rows(x)})
        xs.append(x)
        ys += y
    xt, yt = images(3, 32, 32, 3), [8, 9, 0]
    write_pickle(folder / "test_batch", {b"labels": yt, b"data": cifar_rows(xt)})
    write_pickle(folder / "batches.meta", {b"label_names": names, b"num_cases_per_batch": 4})
    ds = load_dataset("cifar10", tmp_path)
    assert ds.x_train.shape == (20, 3, 32, 32) and ds.x_test.shape == (3, 3, 32, 32)
    assert torch.equal(ds.x_train, torch.from_numpy(np.concatenate(xs).transpose(0, 3, 1, 2)))
    assert ds.y_train.tolist() == ys and ds.y_test.tolist() == yt and ds.y_test.dtype == torch.int64
    assert ds.meta.class_names[0] == "airplane" and ds.meta.superclass_names == ("vehicle", "animal")
    assert ds.meta.superclass == (0, 0, 1, 1, 1, 1, 1, 1, 0, 0)
    assert ds.meta.source == str(folder)
    x = np.concatenate(xs) / 255.0
    np.testing.assert_allclose(ds.meta.mean, x.mean(axis=(0, 1, 2)), atol=1e-6)
    np.testing.assert_allclose(ds.meta.std, x.std(axis=(0, 1, 2)), atol=1e-6)


def test_cifar100_pickles(tmp_path):
    folder = tmp_path / "cifar-100-python"
    fine = np.arange(100).repeat(2)
    coarse = (fine * 7) % 20  # any function of the fine label
    x = images(200, 32, 32, 3)
    write_pickle(folder / "train", {b"fine_labels": fine.tolist(), b"coarse_labels": coarse.tolist(),
                                    b"data": cifar_rows(x)})
    write_pickle(folder / "test", {b"fine_labels": [5, 6], b"coarse_labels": [15, 2], b"data": cifar_rows(x[:2])})
    write_pickle(folder / "meta", {b"fine_label_names": [f"f{i}".encode() for i in range(100)],
                                   b"coarse_label_names": [f"c{i}".encode() for i in range(20)]})
    ds = load_dataset("cifar100", tmp_path)
    assert ds.x_train.shape == (200, 3, 32, 32) and ds.meta.num_classes == 100
    assert torch.equal(ds.x_test, torch.from_numpy(x[:2].transpose(0, 3, 1, 2)))
    assert ds.y_train.tolist() == fine.tolist() and ds.y_test.tolist() == [5, 6]
    assert ds.meta.superclass == tuple((np.arange(100) * 7) % 20) and len(ds.meta.superclass_names) == 20
    assert ds.meta.class_names[3] == "f3" and ds.meta.superclass_names[4] == "c4"


class _MakeDir:
    """A pickled object whose loading would call os.mkdir(path)."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return os.mkdir, (self.path,)


@pytest.mark.parametrize("tamper", ["payload", "garbage", "not a dict"])
def test_cifar_pickles_that_name_other_code_or_are_broken_are_refused(tmp_path, tamper):
    folder = tmp_path / "cifar-10-batches-py"
    for i in range(1, 6):
        write_pickle(folder / f"data_batch_{i}", {b"labels": [1, 2], b"data": cifar_rows(images(2, 32, 32, 3))})
    write_pickle(folder / "test_batch", {b"labels": [3], b"data": cifar_rows(images(1, 32, 32, 3))})
    write_pickle(folder / "batches.meta", {b"label_names": [b"a"] * 10})
    victim, marker = folder / "data_batch_3", tmp_path / "ran"
    if tamper == "payload":
        write_pickle(victim, {b"labels": _MakeDir(marker), b"data": cifar_rows(images(2, 32, 32, 3))})
    elif tamper == "garbage":
        victim.write_bytes(b"this is not a pickle")
    else:
        write_pickle(victim, [1, 2])
    with pytest.raises(ValueError) as err:
        load_dataset("cifar10", tmp_path)
    message = str(err.value)
    assert str(victim) in message and "\n" not in message
    assert {"payload": f"refusing to load {os.mkdir.__module__}.mkdir", "garbage": "not a CIFAR python pickle",
            "not a dict": "holds a dict, found list"}[tamper] in message
    assert not marker.exists()


# ---------------------------------------------------------------- MNIST idx, USPS bz2, MNIST-M png


def write_idx(path: Path, arr: np.ndarray, gz: bool = False) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    data = bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(np.uint8).tobytes()
    (gzip.open if gz else open)(str(path) + (".gz" if gz else ""), "wb").write(data)


def make_mnist(root: Path, n_train=12, n_test=5):
    raw = root / "MNIST" / "raw"
    arrays = [images(n_train, 28, 28), RNG.integers(0, 10, n_train),
              images(n_test, 28, 28), RNG.integers(0, 10, n_test)]
    names = ["train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"]
    for i, (name, arr) in enumerate(zip(names, arrays)):
        write_idx(raw / name, arr, gz=i % 2 == 1)  # torchvision keeps both forms; accept either
    return arrays


def make_usps(root: Path, n_train=9, n_test=4):
    out = []
    for name, n in (("usps.bz2", n_train), ("usps.t.bz2", n_test)):
        v = RNG.uniform(-1, 1, size=(n, 256)).astype(np.float32)
        v[:, 0] = -1.0  # the darkest value
        y = RNG.integers(1, 11, n)  # LIBSVM labels 1..10
        lines = [f"{lab} " + " ".join(f"{j + 1}:{val:.6f}" for j, val in enumerate(row)) for lab, row in zip(y, v)]
        root.mkdir(parents=True, exist_ok=True)
        with bz2.open(root / name, "wt") as f:
            f.write("\n".join(lines) + "\n")
        expected = np.floor((np.asarray([[float(f"{val:.6f}") for val in row] for row in v], np.float32) + 1) / 2 * 255)
        out.append((expected.reshape(n, 16, 16).astype(np.uint8), y - 1))
    return out


def make_mnist_m(root: Path, n_train=6, n_test=3):
    out = []
    for split, n in (("train", n_train), ("test", n_test)):
        x, y = images(n, 32, 32, 3), RNG.integers(0, 10, n)
        folder = root / "mnist_m" / f"mnist_m_{split}"
        folder.mkdir(parents=True, exist_ok=True)
        for i in range(n):
            Image.fromarray(x[i]).save(folder / f"{i:08d}.png")
        labels = "".join(f"{i:08d}.png {y[i]}\n" for i in range(n))
        (root / "mnist_m" / f"mnist_m_{split}_labels.txt").write_text(labels)
        out.append((x, y))
    return out


def test_mnist_idx(tmp_path):
    xtr, ytr, xte, yte = make_mnist(tmp_path)
    ds = load_dataset("mnist", tmp_path)
    assert ds.x_train.shape == (12, 1, 28, 28) and ds.x_test.shape == (5, 1, 28, 28)
    assert torch.equal(ds.x_train[:, 0], torch.from_numpy(xtr)) and ds.y_test.tolist() == yte.tolist()
    assert ds.meta.class_names == tuple("0123456789") and ds.meta.input_shape == (1, 28, 28)


def test_usps_bz2_libsvm(tmp_path):
    (xtr, ytr), (xte, yte) = make_usps(tmp_path)
    ds = load_dataset("usps", tmp_path)
    assert ds.x_train.shape == (9, 1, 16, 16) and ds.x_test.shape == (4, 1, 16, 16)
    assert torch.equal(ds.x_train[:, 0], torch.from_numpy(xtr)) and torch.equal(ds.x_test[:, 0], torch.from_numpy(xte))
    assert ds.y_train.tolist() == ytr.tolist() and int(ds.x_train[:, 0, 0, 0].max()) == 0


def test_mnist_m_png_folder(tmp_path):
    (xtr, ytr), (xte, yte) = make_mnist_m(tmp_path)
    ds = load_dataset("mnist_m", tmp_path)
    assert ds.x_train.shape == (6, 3, 32, 32) and ds.x_train.dtype == torch.uint8
    assert torch.equal(ds.x_test, torch.from_numpy(xte.transpose(0, 3, 1, 2))) and ds.y_train.tolist() == ytr.tolist()


def test_digit_domains_from_published_layouts(tmp_path):
    make_mnist(tmp_path)
    make_usps(tmp_path)
    make_mnist_m(tmp_path)
    ds = load_dataset("digit_domains", tmp_path, size=20, per_domain=5)
    # train: min(5, 12, 6, 9) = 5 per domain; test: min(5, 5, 3, 4) = 3 per domain
    assert ds.x_train.shape == (15, 3, 20, 20) and ds.x_test.shape == (9, 3, 20, 20)
    assert ds.groups_train["domain"].tolist() == [0] * 5 + [1] * 5 + [2] * 5
    assert ds.meta.group_names["domain"] == ("mnist", "mnist_m", "usps")
    gray = ds.x_train[ds.groups_train["domain"] != 1]
    assert torch.equal(gray[:, 0], gray[:, 1]) and torch.equal(gray[:, 1], gray[:, 2])  # gray repeated to RGB
    full = load_dataset("digit_domains", tmp_path, domains=("usps", "mnist"))
    assert full.x_train.shape == (9 + 12, 3, 32, 32) and full.meta.group_names["domain"] == ("usps", "mnist")
    with pytest.raises(ValueError, match="domains"):
        load_dataset("digit_domains", tmp_path, domains=("svhn",))


# ---------------------------------------------------------------- Omniglot folders


def make_omniglot(root: Path, set_name="images_background"):
    base = root / "omniglot-py" / set_name
    ink = {}
    char_id = 0
    for alphabet in ("Zeta_script", "Alpha_script"):
        for c in (1, 2):
            char_id += 1
            for drawer in (1, 2, 3):
                mask = np.zeros((105, 105), bool)
                mask[10 * c : 10 * c + 30, 5 * drawer : 5 * drawer + 40] = True
                path = base / alphabet / f"character{c:02d}" / f"{char_id:04d}_{drawer:02d}.png"
                path.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(~mask).convert("1").save(path)  # black ink (0) on white (1), like the originals
                ink[(alphabet, c, drawer)] = mask
    return ink


def test_omniglot_folders(tmp_path):
    ink = make_omniglot(tmp_path)
    ds = load_dataset("omniglot", tmp_path, size=None)
    assert ds.x_train.shape == (12, 1, 105, 105) and ds.x_test.shape == (0, 1, 105, 105) and len(ds.y_test) == 0
    assert ds.meta.superclass_names == ("Alpha_script", "Zeta_script")  # sorted alphabets
    assert ds.meta.class_names[:2] == ("Alpha_script/character01", "Alpha_script/character02")
    assert ds.meta.superclass == (0, 0, 1, 1)
    assert ds.y_train.tolist() == [0, 0, 0, 1, 1, 1, 2, 2, 2, 3, 3, 3]
    assert ds.groups_train["drawer"].tolist() == [0, 1, 2] * 4
    assert ds.groups_train["alphabet"].tolist() == [0] * 6 + [1] * 6
    assert ds.meta.group_names["drawer"][:2] == ("drawer01", "drawer02")
    assert torch.equal(ds.x_train[4, 0], torch.from_numpy(ink[("Alpha_script", 2, 2)].astype(np.uint8) * 255))
    assert set(ds.groups_test) == {"alphabet", "drawer"}
    small = load_dataset("omniglot", tmp_path)  # default size 28, antialiased
    assert small.x_train.shape == (12, 1, 28, 28) and small.meta.input_shape == (1, 28, 28)
    assert int(small.x_train.max()) == 255 and int(small.x_train[:, :, 0, :].max()) == 0  # no ink at the top rows
    with pytest.raises(DatasetNotFoundError, match="omniglot"):
        load_dataset("omniglot", tmp_path, sets="evaluation")
    with pytest.raises(ValueError, match="sets"):
        load_dataset("omniglot", tmp_path, sets="everything")


# ---------------------------------------------------------------- npz files and errors


@needs_shared
@pytest.mark.parametrize("name, n_train, n_test, shape, subset", [
    ("cifar10", 10000, 2000, (3, 32, 32), True),
    ("mnist", 60000, 10000, (1, 28, 28), False),
    ("usps", 7291, 2007, (1, 16, 16), False),
    ("mnist_m", 5000, 1000, (3, 32, 32), True),
])
def test_shared_npz(name, n_train, n_test, shape, subset):
    ds = load_dataset(name, SHARED)
    assert ds.x_train.shape == (n_train,) + shape and ds.x_test.shape == (n_test,) + shape
    assert ds.x_train.dtype == torch.uint8 and ds.y_train.dtype == torch.int64
    assert ds.meta.num_classes == 10 and set(ds.y_test.unique().tolist()) == set(range(10))
    assert ("(subset)" in ds.meta.source) == subset and str(SHARED) in ds.meta.source


@needs_shared
def test_shared_omniglot_and_digit_domains():
    om = load_dataset("omniglot", SHARED)
    assert om.x_train.shape == (4840, 1, 28, 28) and om.meta.num_classes == 242
    assert len(om.meta.superclass_names) == 8 and len(om.meta.group_names["drawer"]) == 20
    assert np.bincount(om.groups_train["drawer"]).tolist() == [242] * 20
    assert om.meta.superclass[int(om.y_train[-1])] == int(om.groups_train["alphabet"][-1])
    dd = load_dataset("digit_domains", SHARED, per_domain=300)
    assert dd.x_train.shape == (900, 3, 32, 32) and np.bincount(dd.groups_test["domain"]).tolist() == [300] * 3
    assert "mnist_m_small.npz (subset)" in dd.meta.source


def test_explicit_root_wins_then_full_before_subset(tmp_path, monkeypatch):
    a, b, c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    for d in (a, b, c):
        d.mkdir()
    small = dict(x_train=images(4, 32, 32, 3), y_train=np.arange(4), x_test=images(2, 32, 32, 3), y_test=np.arange(2))
    full = dict(small, x_train=images(7, 32, 32, 3), y_train=np.arange(7))
    np.savez(a / "cifar10_small.npz", **small)
    np.savez(b / "cifar10.npz", **full)
    np.savez(c / "cifar10_small.npz", **small)
    monkeypatch.setenv("PFLKIT_DATA", str(b))
    ds = load_dataset("cifar10", a)  # the explicit root's subset beats a full copy in $PFLKIT_DATA
    assert len(ds.y_train) == 4 and ds.meta.source == f"{a / 'cifar10_small.npz'} (subset)"
    # without an explicit root: a full copy in any root beats a subset in an earlier one
    monkeypatch.setenv("PFLKIT_DATA", str(c))
    monkeypatch.setenv("PFLKIT_CACHE", str(b))
    assert load_dataset("cifar10").meta.source == str(b / "cifar10.npz")


def test_missing_dataset_error_lists_searched_paths(tmp_path):
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("mnist", tmp_path)
    msg = str(err.value)
    assert "'mnist'" in msg and str(tmp_path / "mnist.npz") in msg and str(tmp_path / "MNIST" / "raw") in msg
    assert str(Path(os.environ["HOME"]) / ".cache" / "pflkit" / "data" / "mnist.npz") in msg
    assert "download=True" in msg and err.value.name == "mnist"
    with pytest.raises(DatasetNotFoundError, match="cannot download 'office_caltech10'"):
        load_dataset("office_caltech10", tmp_path, download=True)  # no public source to download from
    make_mnist_m(tmp_path)
    (tmp_path / "mnist_m" / "mnist_m_test" / "00000001.png").unlink()  # listed in the labels file, now missing
    with pytest.raises(DatasetNotFoundError, match="incomplete.*00000001.png"):
        load_dataset("mnist_m", tmp_path)


@pytest.mark.parametrize("name", ["cifar10", "usps", "omniglot"])
def test_offline_download_ends_in_clear_error(tmp_path, monkeypatch, name):
    def offline(*args, **kwargs):
        raise socket.gaierror(-2, "Name or service not known")

    monkeypatch.setattr(socket, "getaddrinfo", offline)  # no network, whatever machine runs the test
    monkeypatch.delenv("PFLKIT_OFFLINE")  # let the download be tried (and fail on the name lookup)
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset(name, tmp_path, download=True)
    assert f"{name!r}" in str(err.value) and "download into" in str(err.value) and str(tmp_path) in str(err.value)
    assert err.value.__cause__ is not None  # the torchvision error is chained, not lost


def test_pack_round_trip(tmp_path):
    make_mnist(tmp_path / "raw")
    out = pack("mnist", tmp_path / "raw", tmp_path / "out" / "mnist.npz")
    with np.load(out, allow_pickle=False) as z:
        assert set(z.files) == {"x_train", "y_train", "x_test", "y_test"} and z["x_train"].shape == (12, 28, 28)
    from_npz, from_idx = load_dataset("mnist", tmp_path / "out"), load_dataset("mnist", tmp_path / "raw")
    assert from_npz.meta.source == str(out)
    assert torch.equal(from_npz.x_train, from_idx.x_train) and torch.equal(from_npz.y_test, from_idx.y_test)
    make_omniglot(tmp_path / "raw")
    written = pack("omniglot", tmp_path / "raw")  # default: <first root>/omniglot.npz, found first afterwards
    assert written == tmp_path / "raw" / "omniglot.npz" and not list((tmp_path / "raw").glob(".*.tmp"))
    again = load_dataset("omniglot", tmp_path / "raw")
    assert again.meta.source == str(written) and torch.equal(again.x_train, load_dataset("omniglot", tmp_path / "raw",
                                                                                       sets="background").x_train)
    with pytest.raises(ValueError, match="cannot pack 'digit_domains'"):
        pack("digit_domains", tmp_path)
    with pytest.raises(TypeError, match="no option 'size_'"):
        pack("omniglot", tmp_path / "raw", size_=3)
