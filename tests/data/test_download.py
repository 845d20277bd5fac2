"""Downloads through a local HTTP server serving tiny archives in each dataset's published format:
checksums, atomic installation into the cache, interrupted and corrupt downloads, offline mode,
the lookup order and the provenance records."""
from __future__ import annotations

import dataclasses
import hashlib
import http.server
import io
import tarfile
import threading
import zipfile
from pathlib import Path

import numpy as np
import pytest
import torch

from pflkit.data import download as dl
from pflkit.data.base import DatasetNotFoundError
from pflkit.data.datasets import load_dataset
from tests.helpers_data import PUBLISHED


class Server:
    """Files served from memory on 127.0.0.1; counts requests; can cut a response short."""

    def __init__(self):
        self.files: dict[str, bytes] = {}
        self.requests: list[str] = []
        self.truncate: set[str] = set()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_GET(self):  # noqa: N802  (http.server's naming)
                name = self.path.lstrip("/")
                server.requests.append(name)
                if name not in server.files:
                    self.send_error(404)
                    return
                body = server.files[name]
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                # an interrupted transfer: the full length announced, half the body sent, then the connection closes
                self.wfile.write(body[: len(body) // 2] if name in server.truncate else body)
                self.close_connection = True

            def log_message(self, *args):
                pass

        self.httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.base = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)
        self.thread.start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


@pytest.fixture
def server():
    s = Server()
    yield s
    s.close()


@pytest.fixture
def cache(tmp_path, monkeypatch) -> Path:
    """An empty cache, no other data root, network allowed only to 127.0.0.1."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("PFLKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.delenv("PFLKIT_DATA", raising=False)
    monkeypatch.delenv("PFLKIT_OFFLINE", raising=False)
    for var in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(var, raising=False)
    return tmp_path / "cache"


def serve(server: Server, monkeypatch, name: str, seed: int = 0, algo: str = "sha256"):
    """Serve ``name``'s published files and point its resource table at them with their real digests."""
    files, expected = PUBLISHED[name](np.random.default_rng(seed))
    spec = dl.RESOURCES[name]
    resources = []
    for res in spec.resources:
        data = files[res.filename]
        server.files[res.filename] = data
        checksum = f"{algo}:{hashlib.new(algo, data).hexdigest()}"
        resources.append(dataclasses.replace(res, url=server.base + res.filename, checksum=checksum))
    monkeypatch.setitem(dl.RESOURCES, name, dataclasses.replace(spec, resources=tuple(resources)))
    return files, expected


def cache_entries(cache: Path) -> list[str]:
    """Everything in the cache, relative, sorted (an empty list: nothing left behind)."""
    return sorted(p.relative_to(cache).as_posix() for p in cache.rglob("*")) if cache.exists() else []


def assert_images(x: torch.Tensor, nhwc: np.ndarray):
    assert torch.equal(x, torch.from_numpy(np.ascontiguousarray(nhwc.transpose(0, 3, 1, 2) if nhwc.ndim == 4
                                                                else nhwc[:, None])))


# ---------------------------------------------------------------- every dataset with a public source


def check_cifar10(ds, exp):
    assert_images(ds.x_train, exp["x_train"])
    assert_images(ds.x_test, exp["x_test"])
    assert ds.y_train.tolist() == exp["y_train"].tolist() and ds.y_test.tolist() == exp["y_test"].tolist()
    assert ds.meta.class_names[-1] == "truck"


def check_cifar100(ds, exp):
    check_plain(ds, exp)
    assert ds.meta.superclass == tuple(exp["superclass"].tolist()) and ds.meta.num_classes == 100


def check_plain(ds, exp):
    assert_images(ds.x_train, exp["x_train"])
    assert_images(ds.x_test, exp["x_test"])
    assert ds.y_train.tolist() == exp["y_train"].tolist() and ds.y_test.tolist() == exp["y_test"].tolist()


def check_omniglot(ds, exp):
    assert ds.x_train.shape == (4, 1, 105, 105) and len(ds.y_test) == 0
    assert torch.equal(ds.x_train[:, 0], torch.from_numpy(exp["x_train"]))
    assert ds.y_train.tolist() == exp["y_train"].tolist()
    assert ds.groups_train["drawer"].tolist() == exp["drawer"].tolist()
    assert ds.meta.superclass_names == exp["alphabets"]  # background only: Gamma is in the evaluation set


def check_audio(ds, exp):
    assert ds.x_train.shape == (len(exp["y_train"]), 1, 40, 101) and ds.x_test.shape[0] == len(exp["y_test"])
    assert sorted(ds.y_train.tolist()) == sorted(exp["y_train"].tolist())
    assert sorted(ds.y_test.tolist()) == sorted(exp["y_test"].tolist())
    assert ds.meta.group_names["speaker"] == exp["speakers"]


CHECKS = {"cifar10": check_cifar10, "cifar100": check_cifar100, "mnist": check_plain, "usps": check_plain,
          "mnist_m": check_plain, "omniglot": check_omniglot, "fsdd": check_audio, "speech_commands": check_audio}
OPTIONS = {"omniglot": {"size": None}}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_download_verifies_extracts_into_cache_and_is_reused(name, server, cache, monkeypatch):
    files, expected = serve(server, monkeypatch, name)
    ds = load_dataset(name, download=True, **OPTIONS.get(name, {}))
    CHECKS[name](ds, expected)
    layout = cache / dl.RESOURCES[name].layout
    assert layout.is_dir() and not [p for p in cache.iterdir() if p.name.startswith(dl.TMP_PREFIX)]
    assert sorted(server.requests) == sorted(files)  # each published file fetched exactly once
    # provenance: where the files were read from, and the download they came from
    assert ds.meta.files and all(Path(f["path"]).is_relative_to(layout) for f in ds.meta.files)
    note = ds.meta.download
    assert note["urls"] == [r.url for r in dl.RESOURCES[name].resources]
    assert {f["filename"]: f["sha256"] for f in note["files"]} == {
        n: hashlib.sha256(b).hexdigest() for n, b in files.items()}
    # a second load reads the cache: no request at all, same arrays, same provenance
    again = load_dataset(name, download=True, **OPTIONS.get(name, {}))
    assert len(server.requests) == len(files)
    assert torch.equal(again.x_train, ds.x_train) and again.meta.files == ds.meta.files
    assert again.meta.download == note


def test_md5_checksums_are_verified_too(server, cache, monkeypatch):
    _, expected = serve(server, monkeypatch, "usps", algo="md5")
    ds = load_dataset("usps", download=True)
    check_plain(ds, expected)
    assert all(f["checksum"].startswith("md5:") for f in ds.meta.download["files"])


def test_missing_published_checksum_records_sha256_and_warns(server, cache, monkeypatch, caplog):
    files, _ = serve(server, monkeypatch, "fsdd")
    spec = dl.RESOURCES["fsdd"]
    monkeypatch.setitem(dl.RESOURCES, "fsdd", dataclasses.replace(
        spec, resources=tuple(dataclasses.replace(r, checksum=None) for r in spec.resources)))
    with caplog.at_level("WARNING", logger="pflkit.data.download"):
        ds = load_dataset("fsdd", download=True)
    (name, data), = files.items()
    assert "no published checksum" in caplog.text and hashlib.sha256(data).hexdigest() in caplog.text
    assert ds.meta.download["files"][0] == {"url": server.base + name, "filename": name, "bytes": len(data),
                                            "sha256": hashlib.sha256(data).hexdigest(), "checksum": None}


# ---------------------------------------------------------------- failures leave nothing behind


def test_corrupt_download_raises_leaves_nothing_and_can_be_retried(server, cache, monkeypatch):
    files, expected = serve(server, monkeypatch, "mnist")
    good = files["t10k-images-idx3-ubyte.gz"]
    server.files["t10k-images-idx3-ubyte.gz"] = good[:-1] + bytes([good[-1] ^ 1])  # one flipped bit
    want = hashlib.sha256(good).hexdigest()
    got = hashlib.sha256(server.files["t10k-images-idx3-ubyte.gz"]).hexdigest()
    with pytest.raises(dl.ChecksumError) as err:
        load_dataset("mnist", download=True)
    msg = str(err.value)
    assert "\n" not in msg and server.base + "t10k-images-idx3-ubyte.gz" in msg and want in msg and got in msg
    assert cache_entries(cache) == []  # not even the three good files
    server.files["t10k-images-idx3-ubyte.gz"] = good
    check_plain(load_dataset("mnist", download=True), expected)


def test_interrupted_download_raises_leaves_nothing_and_a_retry_succeeds(server, cache, monkeypatch):
    files, expected = serve(server, monkeypatch, "cifar10")
    server.truncate.add("cifar-10-python.tar.gz")
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("cifar10", download=True)
    assert "closed after" in str(err.value) and isinstance(err.value.__cause__, dl.IncompleteDownload)
    assert cache_entries(cache) == []
    server.truncate.clear()
    check_cifar10(load_dataset("cifar10", download=True), expected)
    assert server.requests == ["cifar-10-python.tar.gz"] * 2


def test_stale_temporary_folders_are_ignored_and_cleaned(server, cache, monkeypatch):
    _, expected = serve(server, monkeypatch, "usps")
    stale = cache / f"{dl.TMP_PREFIX}999999999-abc" / "stage"  # a pid no process has
    stale.mkdir(parents=True)
    (stale / "usps.bz2").write_bytes(b"half a file")
    with pytest.raises(DatasetNotFoundError):  # a half-written temp folder is never taken for the dataset
        load_dataset("usps")
    check_plain(load_dataset("usps", download=True), expected)
    assert not stale.parent.exists()


def test_offline_makes_no_request(server, cache, monkeypatch):
    serve(server, monkeypatch, "mnist")
    monkeypatch.setenv("PFLKIT_OFFLINE", "1")
    with pytest.raises(DatasetNotFoundError, match=r"downloads are disabled \(PFLKIT_OFFLINE=1\)") as err:
        load_dataset("mnist", download=True)
    assert server.requests == [] and cache_entries(cache) == []
    assert str(cache / "MNIST" / "raw") in str(err.value)  # the cache was searched and is named
    with pytest.raises(dl.DownloadsDisabled):
        dl.fetch("mnist", cache)


def test_not_found_error_says_how_to_download(cache):
    with pytest.raises(DatasetNotFoundError) as err:
        load_dataset("cifar100")
    msg = str(err.value)
    assert "--download" in msg and "notebooks download by default" in msg and str(cache) in msg


def test_unsafe_archive_members_are_refused(tmp_path):
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as zf:
        zf.writestr("ok/a.txt", b"a")
        zf.writestr("../escape.txt", b"evil")
    (tmp_path / "bad.zip").write_bytes(buf.getvalue())
    (tmp_path / "out").mkdir()
    with pytest.raises(ValueError, match=r"refusing zip member '\.\./escape\.txt'"):
        dl.extract_zip(tmp_path / "bad.zip", tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists() and not (tmp_path / "out" / "ok").exists()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        info = tarfile.TarInfo("../escape.txt")
        info.size = 4
        tar.addfile(info, io.BytesIO(b"evil"))
    (tmp_path / "bad.tar.gz").write_bytes(buf.getvalue())
    with pytest.raises(tarfile.TarError):
        dl.extract_tar(tmp_path / "bad.tar.gz", tmp_path / "out")
    assert not (tmp_path / "escape.txt").exists()


def test_resource_table_is_well_formed():
    for name, spec in dl.RESOURCES.items():
        for res in spec.resources:
            algo, value = dl.parse_checksum(res.checksum)
            assert res.url.startswith(("https://", "http://")) and res.extract in ("none", "tar", "zip")
            if algo is not None:
                assert len(value) == {"md5": 32, "sha256": 64}[algo] and int(value, 16) >= 0
    assert dl.RESOURCES["fsdd"].resources[0].checksum is None  # GitHub tag archives publish none


# ---------------------------------------------------------------- lookup order and provenance


def write_npz(path: Path, n_train: int) -> None:
    rng = np.random.default_rng(n_train)
    path.parent.mkdir(parents=True, exist_ok=True)
    np.savez(path, x_train=rng.integers(0, 256, (n_train, 28, 28), dtype=np.uint8), y_train=np.arange(n_train) % 10,
             x_test=rng.integers(0, 256, (2, 28, 28), dtype=np.uint8), y_test=np.arange(2))


def test_explicit_root_beats_pflkit_data_and_files_record_it(tmp_path, cache, monkeypatch):
    write_npz(tmp_path / "explicit" / "mnist.npz", 5)
    write_npz(tmp_path / "env" / "mnist.npz", 8)
    write_npz(cache / "mnist.npz", 9)
    monkeypatch.setenv("PFLKIT_DATA", str(tmp_path / "env"))
    ds = load_dataset("mnist", tmp_path / "explicit")
    path = tmp_path / "explicit" / "mnist.npz"
    assert len(ds.y_train) == 5 and ds.meta.source == str(path)
    assert ds.meta.files == ({"path": str(path.absolute()), "bytes": path.stat().st_size,
                              "sha256": hashlib.sha256(path.read_bytes()).hexdigest()},)
    assert ds.meta.download is None
    assert len(load_dataset("mnist").y_train) == 8  # then $PFLKIT_DATA, before the cache
    monkeypatch.delenv("PFLKIT_DATA")
    assert len(load_dataset("mnist").y_train) == 9


def test_explicit_root_layout_beats_npz_elsewhere_and_records_each_file(tmp_path, cache, monkeypatch, server):
    files, expected = serve(server, monkeypatch, "mnist")
    raw = tmp_path / "explicit" / "MNIST" / "raw"
    raw.mkdir(parents=True)
    for name, data in files.items():
        (raw / name).write_bytes(data)
    write_npz(cache / "mnist.npz", 9)
    ds = load_dataset("mnist", tmp_path / "explicit")
    check_plain(ds, expected)
    assert [Path(f["path"]).name for f in ds.meta.files] == list(files)
    assert [f["sha256"] for f in ds.meta.files] == [hashlib.sha256(b).hexdigest() for b in files.values()]
    assert ds.meta.download is None and server.requests == []
