"""Downloads into the cache: a resource table, checksums and atomic installation.

`fetch(name)` downloads every resource of a dataset into a private temporary
folder inside the cache (``.pflkit-tmp-<pid>-*``), verifies each file's published
checksum while it streams (or, where none is published, records the sha256 and
logs a warning), extracts archives there (refusing members that would land
outside the folder), writes a download note (`pflkit.data.provenance.NOTE_NAME`)
and only then renames the finished folder into place with one ``os.replace``.
So a killed process, a dropped connection or a corrupt file never leaves a
half-written dataset where the loaders look; a later `fetch` removes the
temporary folders of processes that no longer run. ``$PFLKIT_OFFLINE=1`` forbids
any network access (`DownloadsDisabled`).
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import tarfile
import tempfile
import time
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pflkit.io import progress_bar

from .base import ENV_OFFLINE, cache_dir, offline
from .provenance import NOTE_NAME

log = logging.getLogger(__name__)

TMP_PREFIX = ".pflkit-tmp-"
TIMEOUT_S = 60
CHUNK = 1 << 20


@dataclass(frozen=True)
class Resource:
    """One file to download.

    Attributes:
        url: where it is published.
        filename: the name it is saved under.
        checksum: ``"md5:<hex>"`` or ``"sha256:<hex>"`` as published; None where the
            source publishes none (the computed sha256 is then recorded and a warning logged).
        extract: ``"none"`` (keep the file as is), ``"tar"`` (tar, .tar.gz, .tar.bz2) or ``"zip"``.
        strip: the folder inside the archive whose contents form the layout ("" = the archive's top).
    """

    url: str
    filename: str
    checksum: str | None
    extract: str = "none"
    strip: str = ""


@dataclass(frozen=True)
class Download:
    """A dataset's resources and the folder (relative to the cache) they install as."""

    layout: str
    resources: tuple[Resource, ...]


def _side_by_side(base: str, md5s: dict[str, str], extract: str = "none") -> tuple[Resource, ...]:
    """Files published under one URL prefix, each saved under its own name: ``{filename: md5}``."""
    return tuple(Resource(base + name, name, "md5:" + md5, extract) for name, md5 in md5s.items())


_FSDD_TAG = "v1.0.10"
_MNIST = "https://ossci-datasets.s3.amazonaws.com/mnist/"  # torchvision's first MNIST mirror
_LIBSVM = "https://www.csie.ntu.edu.tw/~cjlin/libsvmtools/datasets/multiclass/"
_OMNIGLOT = "https://raw.githubusercontent.com/brendenlake/omniglot/master/python/"
_MNIST_M = "https://github.com/liyxi/mnist-m/releases/download/data/"

# Checksums: torchvision's tables (CIFAR, MNIST, USPS, Omniglot, SUN397), torchaudio's (Speech
# Commands), the liyxi/mnist-m loader's (MNIST-M). GitHub's tag archives (FSDD) have none.
RESOURCES: dict[str, Download] = {
    "cifar10": Download("cifar-10-batches-py", (
        Resource("https://www.cs.toronto.edu/~kriz/cifar-10-python.tar.gz", "cifar-10-python.tar.gz",
                 "md5:c58f30108f718f92721af3b95e74349a", "tar", "cifar-10-batches-py"),)),
    "cifar100": Download("cifar-100-python", (
        Resource("https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz", "cifar-100-python.tar.gz",
                 "md5:eb9058c3a382ffc7106e4002c42a8d85", "tar", "cifar-100-python"),)),
    "mnist": Download("MNIST/raw", _side_by_side(_MNIST, {
        "train-images-idx3-ubyte.gz": "f68b3c2dcbeaaa9fbdd348bbdeb94873",
        "train-labels-idx1-ubyte.gz": "d53e105ee54ea40749a09fcbcd1e9432",
        "t10k-images-idx3-ubyte.gz": "9fb629c4189551a2d022fa330f9573f3",
        "t10k-labels-idx1-ubyte.gz": "ec29112dd5afa0611ce80d1b7f02629c"})),
    "usps": Download("usps", _side_by_side(_LIBSVM, {
        "usps.bz2": "ec16c51db3855ca6c91edd34d0e9b197",
        "usps.t.bz2": "8ea070ee2aca1ac39742fdd1ef5ed118"})),
    "omniglot": Download("omniglot-py", _side_by_side(_OMNIGLOT, {
        "images_background.zip": "68d2efa1b9178cc56df9314c21c6e718",
        "images_evaluation.zip": "6b91aef0f799c5bb55b94e3f2daec811"}, "zip")),
    "fsdd": Download("free-spoken-digit-dataset", (
        Resource(f"https://github.com/Jakobovski/free-spoken-digit-dataset/archive/refs/tags/{_FSDD_TAG}.tar.gz",
                 f"free-spoken-digit-dataset-{_FSDD_TAG}.tar.gz", None, "tar",
                 f"free-spoken-digit-dataset-{_FSDD_TAG[1:]}"),)),
    "mnist_m": Download("MNISTM/processed", _side_by_side(_MNIST_M, {
        "mnist_m_train.pt.tar.gz": "191ed53db9933bd85cc9700558847391",
        "mnist_m_test.pt.tar.gz": "e11cb4d7fff76d7ec588b1134907db59"}, "tar")),
    "speech_commands": Download("speech_commands_v0.02", (
        Resource("https://storage.googleapis.com/download.tensorflow.org/data/speech_commands_v0.02.tar.gz",
                 "speech_commands_v0.02.tar.gz", "md5:6b74f3901214cb2c2934e98196829835", "tar"),)),
    "sun397": Download("SUN397", (
        Resource("http://vision.princeton.edu/projects/2010/SUN/SUN397.tar.gz", "SUN397.tar.gz",
                 "md5:8ca2778205c41d23104230ba66911c7a", "tar", "SUN397"),)),
}


class ChecksumError(OSError):
    """A downloaded file's digest differs from the published one."""


class IncompleteDownload(OSError):
    """The connection closed before the announced number of bytes arrived."""


class DownloadsDisabled(OSError):
    """``$PFLKIT_OFFLINE`` forbids network access."""


def fetcher(name: str) -> Callable[[Path], Path]:
    """``cache -> installed folder``: what `pflkit.data.sources.common.resolve` calls to download ``name``."""
    if name not in RESOURCES:
        raise ValueError(f"no download is known for dataset {name!r}; known: {', '.join(RESOURCES)}")
    return lambda cache: fetch(name, cache)


def fetch(name: str, cache: str | os.PathLike | None = None) -> Path:
    """Download, verify, extract and atomically install dataset ``name`` into ``cache``.

    Args:
        name: a key of `RESOURCES`.
        cache: the cache folder (default `pflkit.data.base.cache_dir`).

    Returns:
        The installed folder, ``cache / RESOURCES[name].layout``.

    Raises:
        DownloadsDisabled: ``$PFLKIT_OFFLINE`` is set.
        ChecksumError: a file's digest is not the published one.
        IncompleteDownload, urllib.error.URLError, OSError: network or disk failures.
    """
    if offline():
        raise DownloadsDisabled(f"downloads are disabled ({ENV_OFFLINE}=1); not downloading {name!r}")
    spec = RESOURCES[name]
    cache = Path(cache) if cache is not None else cache_dir()
    cache.mkdir(parents=True, exist_ok=True)
    clean_stale(cache)
    tmp = Path(tempfile.mkdtemp(prefix=f"{TMP_PREFIX}{os.getpid()}-", dir=cache))
    try:
        stage = tmp / "stage"
        stage.mkdir()
        records = []
        for i, res in enumerate(spec.resources):
            path, record = download_file(res, tmp)
            place(res, path, stage, tmp / f"x{i}")
            records.append(record)
        note = {"dataset": name, "urls": [r.url for r in spec.resources], "files": records,
                "installed": time.strftime("%Y-%m-%dT%H:%M:%S%z")}
        (stage / NOTE_NAME).write_text(json.dumps(note, indent=1))
        dest = cache / spec.layout
        install(stage, dest, tmp / "replaced")
        log.info("%s: installed %s", name, dest)
        return dest
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def download_file(res: Resource, folder: Path) -> tuple[Path, dict]:
    """Stream ``res.url`` into ``folder / res.filename`` with a progress bar; verify it.

    Returns:
        The file and its record ``{"url", "filename", "bytes", "sha256", "checksum"}``.
    """
    algo, expected = parse_checksum(res.checksum)
    digests = {"sha256": hashlib.sha256(), **({algo: hashlib.new(algo)} if algo else {})}
    path = folder / res.filename
    request = urllib.request.Request(res.url, headers={"User-Agent": "pflkit"})
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as resp, open(path, "wb") as out:
        length = resp.headers.get("Content-Length")
        total = int(length) if length and length.isdigit() else None
        size = 0
        with progress_bar(total=total, unit="B", unit_scale=True, desc=res.filename, leave=False) as bar:
            for block in iter(lambda: resp.read(CHUNK), b""):
                out.write(block)
                for d in digests.values():
                    d.update(block)
                size += len(block)
                bar.update(len(block))
    if total is not None and size != total:
        raise IncompleteDownload(f"{res.url}: the connection closed after {size} of {total} bytes")
    sha256 = digests["sha256"].hexdigest()
    if algo is None:
        log.warning("%s has no published checksum; recorded sha256 %s", res.url, sha256)
    elif digests[algo].hexdigest() != expected:
        raise ChecksumError(f"checksum mismatch for {res.url}: expected {algo} {expected}, "
                            f"got {digests[algo].hexdigest()}")
    return path, {"url": res.url, "filename": res.filename, "bytes": size, "sha256": sha256,
                  "checksum": res.checksum}


def parse_checksum(checksum: str | None) -> tuple[str | None, str | None]:
    """``"md5:abc"`` -> ``("md5", "abc")``; None -> ``(None, None)``."""
    if checksum is None:
        return None, None
    algo, _, value = checksum.partition(":")
    if algo not in ("md5", "sha256") or not value:
        raise ValueError(f"checksum must be 'md5:<hex>' or 'sha256:<hex>', got {checksum!r}")
    return algo, value.lower()


def place(res: Resource, path: Path, stage: Path, scratch: Path) -> None:
    """Move a verified file, or its archive's contents under ``res.strip``, into ``stage``."""
    if res.extract == "none":
        os.replace(path, stage / res.filename)
        return
    scratch.mkdir()
    if res.extract == "tar":
        extract_tar(path, scratch)
    elif res.extract == "zip":
        extract_zip(path, scratch)
    else:
        raise ValueError(f"unknown extract kind {res.extract!r} for {res.url}")
    path.unlink()  # the archive is no longer needed; halves the peak disk use
    src = scratch / res.strip if res.strip else scratch
    if not src.is_dir():
        raise ValueError(f"{res.url}: the archive has no folder {res.strip!r}")
    for entry in src.iterdir():
        os.replace(entry, stage / entry.name)


def extract_tar(path: Path, target: Path) -> None:
    """Extract a tar archive with tarfile's ``data`` filter (no absolute paths, ``..``, links out, devices)."""
    with tarfile.open(path) as tar:
        tar.extractall(target, filter="data")


def extract_zip(path: Path, target: Path) -> None:
    """Extract a zip archive after checking that no member would land outside ``target``."""
    root = target.resolve()
    with zipfile.ZipFile(path) as zf:
        for member in zf.namelist():
            dest = (root / member).resolve()
            if member.startswith(("/", "\\")) or (dest != root and root not in dest.parents):
                raise ValueError(f"{path}: refusing zip member {member!r}, which escapes {target}")
        zf.extractall(root)


def install(stage: Path, dest: Path, aside: Path) -> None:
    """Rename the finished ``stage`` to ``dest``; an existing (incomplete) ``dest`` is moved to ``aside`` first."""
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.exists():
        log.warning("replacing %s, which did not hold a usable copy", dest)
        os.replace(dest, aside)
    os.replace(stage, dest)


def clean_stale(cache: Path) -> None:
    """Remove temporary download folders left by processes that no longer run."""
    for tmp in cache.glob(f"{TMP_PREFIX}*"):
        pid = tmp.name[len(TMP_PREFIX):].split("-", 1)[0]
        if pid.isdigit() and not _alive(int(pid)):
            log.info("removing the stale download folder %s", tmp)
            shutil.rmtree(tmp, ignore_errors=True)


def _alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:  # exists but belongs to someone else
        return True
    return True
