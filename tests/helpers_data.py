"""Small real datasets built in memory for fast tests (sklearn digits)."""
from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits

from pflkit.data.base import Dataset, DatasetMeta
from pflkit.fl.algorithm import Env
from pflkit.models import build_model


def digits_dataset(n_train: int = 1400) -> Dataset:
    d = load_digits()
    x = torch.tensor(np.round(d.images * 255 / 16), dtype=torch.uint8).unsqueeze(1)
    y = torch.tensor(d.target, dtype=torch.long)
    meta = DatasetMeta("digits", 10, tuple(map(str, range(10))), (1, 8, 8), (0.3,), (0.4,),
                       superclass=tuple(int(c >= 5) for c in range(10)), superclass_names=("low", "high"))
    groups_tr = {"writer": np.arange(n_train) % 4}
    groups_te = {"writer": np.arange(len(y) - n_train) % 4}
    return Dataset(meta, x[:n_train], y[:n_train], x[n_train:], y[n_train:], groups_tr, groups_te)


def digits_env(seed: int = 0, model: str = "digits_cnn", num_classes: int = 10) -> Env:
    return Env(model_fn=lambda: build_model(model, num_classes=num_classes, input_shape=(1, 8, 8)), seed=seed)


# ---------------------------------------------------------------- tiny copies of published archives
# Each writer returns ({filename: bytes} as the dataset's source publishes them, the arrays a loader
# must return). The download tests serve these from a local HTTP server.

def _tar_gz(members: dict[str, bytes]) -> bytes:
    import io
    import tarfile

    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, data in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return buf.getvalue()


def _zip(members: dict[str, bytes]) -> bytes:
    import io
    import zipfile

    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        for name, data in members.items():
            zf.writestr(name, data)
    return buf.getvalue()


def _png(array: np.ndarray, mode: str | None = None) -> bytes:
    import io

    from PIL import Image

    buf = io.BytesIO()
    img = Image.fromarray(array)
    (img.convert(mode) if mode else img).save(buf, format="PNG")
    return buf.getvalue()


def _wav(samples: np.ndarray, rate: int) -> bytes:
    import io
    import wave

    buf = io.BytesIO()
    with wave.open(buf, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.clip(samples * 32767, -32768, 32767).astype("<i2").tobytes())
    return buf.getvalue()


def _tone(rate: int, seconds: float, freq: float) -> np.ndarray:
    t = np.arange(int(rate * seconds)) / rate
    return 0.4 * np.sin(2 * np.pi * freq * t)


def _pickle(obj) -> bytes:
    import pickle

    return pickle.dumps(obj, protocol=2)


def _cifar_rows(x_nhwc: np.ndarray) -> np.ndarray:
    return x_nhwc.transpose(0, 3, 1, 2).reshape(len(x_nhwc), -1)  # R plane, G plane, B plane


def cifar10_published(rng: np.random.Generator):
    """cifar-10-python.tar.gz: cifar-10-batches-py/{data_batch_1..5,test_batch,batches.meta}, 2 images a batch."""
    names = [n.encode() for n in ("airplane", "automobile", "bird", "cat", "deer", "dog", "frog", "horse", "ship",
                                  "truck")]
    x = rng.integers(0, 256, (12, 32, 32, 3), dtype=np.uint8)
    y = rng.integers(0, 10, 12)
    members = {f"cifar-10-batches-py/data_batch_{i + 1}": _pickle(
        {b"labels": y[2 * i: 2 * i + 2].tolist(), b"data": _cifar_rows(x[2 * i: 2 * i + 2])}) for i in range(5)}
    members["cifar-10-batches-py/test_batch"] = _pickle({b"labels": y[10:].tolist(), b"data": _cifar_rows(x[10:])})
    members["cifar-10-batches-py/batches.meta"] = _pickle({b"label_names": names})
    expected = {"x_train": x[:10], "y_train": y[:10], "x_test": x[10:], "y_test": y[10:]}
    return {"cifar-10-python.tar.gz": _tar_gz(members)}, expected


def cifar100_published(rng: np.random.Generator):
    """cifar-100-python.tar.gz: cifar-100-python/{train,test,meta} with fine and coarse labels."""
    x = rng.integers(0, 256, (103, 32, 32, 3), dtype=np.uint8)
    fine = np.concatenate([np.arange(100), [7, 8, 9]])
    coarse = fine % 20
    members = {
        "cifar-100-python/train": _pickle({b"fine_labels": fine[:100].tolist(), b"coarse_labels": coarse[:100].tolist(),
                                           b"data": _cifar_rows(x[:100])}),
        "cifar-100-python/test": _pickle({b"fine_labels": fine[100:].tolist(), b"coarse_labels": coarse[100:].tolist(),
                                          b"data": _cifar_rows(x[100:])}),
        "cifar-100-python/meta": _pickle({b"fine_label_names": [f"f{i}".encode() for i in range(100)],
                                          b"coarse_label_names": [f"c{i}".encode() for i in range(20)]}),
    }
    expected = {"x_train": x[:100], "y_train": fine[:100], "x_test": x[100:], "y_test": fine[100:],
                "superclass": np.arange(100) % 20}
    return {"cifar-100-python.tar.gz": _tar_gz(members)}, expected


def _idx(arr: np.ndarray) -> bytes:
    import struct

    return bytes([0, 0, 0x08, arr.ndim]) + struct.pack(f">{arr.ndim}I", *arr.shape) + arr.astype(np.uint8).tobytes()


def mnist_published(rng: np.random.Generator):
    """The four gzipped idx files as LeCun publishes them."""
    import gzip

    x_tr, x_te = rng.integers(0, 256, (6, 28, 28), dtype=np.uint8), rng.integers(0, 256, (3, 28, 28), dtype=np.uint8)
    y_tr, y_te = rng.integers(0, 10, 6), rng.integers(0, 10, 3)
    files = {f"{stem}.gz": gzip.compress(_idx(a)) for stem, a in (
        ("train-images-idx3-ubyte", x_tr), ("train-labels-idx1-ubyte", y_tr),
        ("t10k-images-idx3-ubyte", x_te), ("t10k-labels-idx1-ubyte", y_te))}
    return files, {"x_train": x_tr, "y_train": y_tr, "x_test": x_te, "y_test": y_te}


def usps_published(rng: np.random.Generator):
    """usps.bz2 / usps.t.bz2 in LIBSVM format: labels 1..10, 256 values in [-1, 1]."""
    import bz2

    files, expected = {}, {}
    for fname, split, n in (("usps.bz2", "train", 5), ("usps.t.bz2", "test", 3)):
        v = np.round(rng.uniform(-1, 1, (n, 256)), 6)
        y = rng.integers(1, 11, n)
        text = "".join(f"{lab} " + " ".join(f"{j + 1}:{val:.6f}" for j, val in enumerate(row)) + "\n"
                       for lab, row in zip(y, v))
        files[fname] = bz2.compress(text.encode())
        expected[f"x_{split}"] = np.floor((v.astype(np.float32) + 1) / 2 * 255).astype(np.uint8).reshape(n, 16, 16)
        expected[f"y_{split}"] = y - 1
    return files, expected


def omniglot_published(rng: np.random.Generator):
    """images_background.zip / images_evaluation.zip: <set>/<Alphabet>/characterNN/<id>_<drawer>.png (ink black)."""
    files, ink = {}, []
    for set_name, alphabets in (("images_background", ("Beta", "Alpha")), ("images_evaluation", ("Gamma",))):
        members = {}
        for alphabet in alphabets:
            for drawer in (1, 2):
                mask = rng.random((105, 105)) < 0.2
                members[f"{set_name}/{alphabet}/character01/0001_{drawer:02d}.png"] = _png(~mask, "1")
                if set_name == "images_background":
                    ink.append((alphabet, drawer, mask))
        files[f"{set_name}.zip"] = _zip(members)
    ink.sort(key=lambda t: (t[0], t[1]))  # the loader's sorted (alphabet, character, file) order
    x = np.stack([m for _, _, m in ink]).astype(np.uint8) * 255
    return files, {"x_train": x, "y_train": np.asarray([0, 0, 1, 1]), "drawer": np.asarray([0, 1, 0, 1]),
                   "alphabets": ("Alpha", "Beta")}


def fsdd_published(rng: np.random.Generator, tag: str = "1.0.10"):
    """GitHub's tag archive: free-spoken-digit-dataset-<tag>/recordings/<digit>_<speaker>_<take>.wav."""
    members, labels = {}, []
    for speaker in ("theo", "ana"):
        for digit, take in ((3, 0), (3, 7), (8, 2), (8, 9)):
            members[f"free-spoken-digit-dataset-{tag}/recordings/{digit}_{speaker}_{take}.wav"] = _wav(
                _tone(8000, 0.25, 300 + 100 * digit), 8000)
            labels.append((speaker, digit, take))
    members[f"free-spoken-digit-dataset-{tag}/README.md"] = b"# FSDD"
    labels.sort()
    y_test = [d for _, d, t in labels if t < 5]
    y_train = [d for _, d, t in labels if t >= 5]
    return {f"free-spoken-digit-dataset-v{tag}.tar.gz": _tar_gz(members)}, {
        "y_train": np.asarray(y_train), "y_test": np.asarray(y_test), "speakers": ("ana", "theo")}


def mnist_m_published(rng: np.random.Generator):
    """The liyxi/mnist-m release: mnist_m_{train,test}.pt.tar.gz, each a torch-saved (uint8 NHWC, int64) pair."""
    import io

    files, expected = {}, {}
    for split, n in (("train", 5), ("test", 2)):
        x = rng.integers(0, 256, (n, 28, 28, 3), dtype=np.uint8)
        y = rng.integers(0, 10, n)
        buf = io.BytesIO()
        torch.save((torch.from_numpy(x), torch.from_numpy(y)), buf)
        files[f"mnist_m_{split}.pt.tar.gz"] = _tar_gz({f"mnist_m_{split}.pt": buf.getvalue()})
        expected[f"x_{split}"], expected[f"y_{split}"] = x, y
    return files, expected


def speech_commands_published(rng: np.random.Generator):
    """speech_commands_v0.02.tar.gz: <word>/<speaker>_nohash_<n>.wav and the split lists at the top."""
    clips = {"yes/aaaa1111_nohash_0.wav": 0.5, "no/bbbb2222_nohash_0.wav": 0.4, "bed/cccc3333_nohash_1.wav": 0.6,
             "no/aaaa1111_nohash_1.wav": 0.5}
    members = {f"./{rel}": _wav(_tone(16000, s, 300 + 200 * i), 16000) for i, (rel, s) in enumerate(clips.items())}
    members["./validation_list.txt"] = b"no/aaaa1111_nohash_1.wav\n"
    members["./testing_list.txt"] = b"no/bbbb2222_nohash_0.wav\n"
    members["./LICENSE"] = b"CC BY 4.0"
    return {"speech_commands_v0.02.tar.gz": _tar_gz(members)}, {
        "y_train": np.asarray([0, 1, 10]), "y_test": np.asarray([1]),
        "speakers": ("aaaa1111", "bbbb2222", "cccc3333")}


PUBLISHED = {
    "cifar10": cifar10_published, "cifar100": cifar100_published, "mnist": mnist_published,
    "usps": usps_published, "omniglot": omniglot_published, "fsdd": fsdd_published,
    "mnist_m": mnist_m_published, "speech_commands": speech_commands_published,
}
