"""Small real datasets built in memory for fast tests (sklearn digits)."""
from __future__ import annotations

import numpy as np
import torch
from sklearn.datasets import load_digits

from pflkit.algorithms.base import Env
from pflkit.data.base import Dataset, DatasetMeta
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
