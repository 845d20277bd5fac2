"""Omniglot (Lake et al., 2015): 1,623 handwritten characters from 50 alphabets, 20 drawers each.

Published layout (torchvision's and the authors' ``python/`` zips), in a data root:
``omniglot-py/images_background/<Alphabet>/character<NN>/<id>_<drawer>.png`` (30 alphabets)
and ``omniglot-py/images_evaluation/...`` (20 alphabets); the authors' small sets
``images_background_small1`` / ``images_background_small2`` are accepted as well.
The images are 105x105 black-on-white; pflkit stores ink as the bright value (like MNIST).
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np
import torch

from ..base import Dataset, data_roots
from ..download import fetcher
from ..provenance import folder_record
from .common import Found, check_choice, check_positive_int, first_match, names_array, provenance, resolve
from .images import image_dataset, open_image, resize_images, to_nchw

# Which published folders each ``sets`` value reads.
SETS = {
    "background": ("images_background",),
    "evaluation": ("images_evaluation",),
    "all": ("images_background", "images_evaluation"),
    "background_small": ("images_background_small1", "images_background_small2"),
    "background_small1": ("images_background_small1",),
    "background_small2": ("images_background_small2",),
}
NATIVE_SIZE = 105

HOW = (
    "Extract images_background.zip / images_evaluation.zip (and for the small sets "
    "images_background_small1/2.zip) from https://github.com/brendenlake/omniglot/tree/master/python into "
    "<data root>/omniglot-py/, or put omniglot.npz / omniglot_small.npz in a data root."
)
DOWNLOADABLE = ("images_background", "images_evaluation")  # what pflkit.data.download fetches


def _read_sets(base: Path, folders: Sequence[str]) -> dict[str, np.ndarray]:
    """Every png under the given set folders, in sorted (alphabet, character, file) order."""
    xs, chars, alphabets, drawers, alphabet_names, char_names = [], [], [], [], [], []
    for folder in folders:
        for alphabet in sorted(p for p in (base / folder).iterdir() if p.is_dir()):
            if alphabet.name in alphabet_names:  # the small sets share alphabets; keep the first copy
                continue
            alphabet_names.append(alphabet.name)
            for character in sorted(p for p in alphabet.iterdir() if p.is_dir()):
                char_names.append(f"{alphabet.name}/{character.name}")
                for png in sorted(character.glob("*.png")):
                    xs.append(open_image(png, "L") < 128)  # dark pixels are ink
                    chars.append(len(char_names) - 1)
                    alphabets.append(len(alphabet_names) - 1)
                    drawers.append(int(png.stem.rsplit("_", 1)[-1]))
    if not xs:
        raise ValueError(f"no Omniglot images under {[str(base / f) for f in folders]}")
    return {
        "x": np.stack(xs).astype(np.uint8), "y_char": np.asarray(chars, np.int64),
        "y_alphabet": np.asarray(alphabets, np.int64), "drawer": np.asarray(drawers, np.int64),
        "alphabet_names": names_array(alphabet_names), "char_names": names_array(char_names),
    }


def read_omniglot(roots: Sequence[Path], *, download: bool = False, use_npz: bool = True,
                  sets: str | None = None) -> Found:
    """Omniglot arrays (``x`` 1 = ink, ``y_char``, ``y_alphabet``, ``drawer`` 1..20, names).

    Args:
        sets: which published folders to read (a key of `SETS`). None reads an npz
            (``omniglot.npz``, then the ``omniglot_small.npz`` subset) if there is one,
            else ``images_background``. Naming a set skips npz files, whose
            alphabets could be any set.
    """
    if sets is not None:
        check_choice("sets", sets, SETS)
    folders = SETS[sets or "background"]
    ok = lambda p: p.is_dir() and all((p / f).is_dir() for f in folders)  # noqa: E731
    return resolve(
        "omniglot", roots, npz_files=("omniglot.npz", "omniglot_small.npz"),
        find_raw=lambda rs: first_match(rs, ("omniglot-py",), ok),
        read_raw=lambda base: _read_sets(base, folders), how=HOW,
        fetch=fetcher("omniglot") if set(folders) <= set(DOWNLOADABLE) else None, download=download,
        use_npz=use_npz and sets is None, files_of=lambda base: [folder_record(base / f, (".png",)) for f in folders],
    )


def load_omniglot(root=None, *, download: bool = False, size: int | None = 28, sets: str | None = None) -> Dataset:
    """Omniglot as uint8 (N, 1, size, size), ink = 255: y = character, superclass = alphabet.

    Images are resized from the native 105x105 to ``size`` x ``size`` (default 28, the
    usual few-shot / pFedHN size) with antialiased bilinear interpolation; ``size=None``
    (or 105) keeps them native. Groups ``alphabet`` and ``drawer`` (0..19) per sample.
    Omniglot has no official test split, so the test tensors are empty (0 samples)
    and federations split each client's pool.

    Args:
        root: data root searched first (then ``$PFLKIT_DATA``, then ``~/.cache/pflkit/data``).
        download: download the background and evaluation zips into the cache when no copy is found.
        size: output side length, or None for 105.
        sets: published folders to read; see `read_omniglot`.
    """
    check_positive_int("size", size, allow_none=True)
    found = read_omniglot(data_roots(root), download=download, sets=sets)
    a = found.arrays
    x = to_nchw((np.asarray(a["x"]) > 0).astype(np.uint8) * 255)
    x = resize_images(x, size or NATIVE_SIZE)
    y_char, y_alpha = np.asarray(a["y_char"], np.int64), np.asarray(a["y_alphabet"], np.int64)
    num_chars = len(a["char_names"])
    superclass = np.zeros(num_chars, np.int64)
    superclass[y_char] = y_alpha
    drawer = np.asarray(a["drawer"], np.int64) - 1
    empty_x = torch.zeros((0,) + tuple(x.shape[1:]), dtype=torch.uint8)
    empty_g = np.zeros(0, np.int64)
    return image_dataset(
        "omniglot", x, y_char, empty_x, empty_g, class_names=[str(c) for c in a["char_names"]],
        **provenance(found), superclass=superclass, superclass_names=[str(n) for n in a["alphabet_names"]],
        groups_train={"alphabet": y_alpha, "drawer": drawer},
        groups_test={"alphabet": empty_g, "drawer": empty_g},
        group_names={"alphabet": [str(n) for n in a["alphabet_names"]],
                     "drawer": [f"drawer{d + 1:02d}" for d in range(int(drawer.max(initial=19)) + 1)]},
    )
