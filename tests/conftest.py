"""Shared test settings: one thread per worker, the offline data folder, tolerances."""
from __future__ import annotations

import functools
import json
import os
from pathlib import Path

import pytest
import torch

torch.set_num_threads(1)
# Triton's interpreter runs the kernels on CPU tensors; it must be switched on before anything
# (torchvision does) imports triton, so it is set here rather than in tests/kernels/
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")
os.environ.setdefault("MPLBACKEND", "Agg")

# one place for numerical tolerances, by dtype
TOL = {
    torch.float64: {"atol": 1e-10, "rtol": 1e-8},
    torch.float32: {"atol": 1e-5, "rtol": 1e-4},
    torch.float16: {"atol": 2e-2, "rtol": 2e-2},
    torch.bfloat16: {"atol": 5e-2, "rtol": 5e-2},
}


@pytest.fixture
def one_intra_op_thread():
    """One intra-op thread for the test, whatever an earlier test set (engine equivalences are checked at it)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


# tests never reach the network: a missing dataset is an error, not a download attempt
os.environ.setdefault("PFLKIT_OFFLINE", "1")


# read once at start-up: tests that isolate themselves from data roots unset the variable
_SHARED = os.environ.get("PFLKIT_DATA")


def shared_data_dir() -> Path | None:
    """The folder of real offline datasets the tests may use: ``$PFLKIT_DATA`` (CI sets it), else None."""
    return Path(_SHARED) if _SHARED else None


# ------------------------------------------------ tests that need a dataset which may be missing
# One marker for them all: ``@pytest.mark.needs_data("cifar10", ...)`` names datasets (with
# ``options={...}`` for `load_dataset`'s options), ``@pytest.mark.needs_data(experiments=["NAME"])``
# the datasets an experiment reads at preset smoke (``[data]`` and ``[pretrain.data]``). A dataset
# that cannot be loaded without a download (none is ever made here) skips the test, the reason naming
# it; a parametrized case takes it as ``pytest.param(..., marks=pytest.mark.needs_data(...))``.

def pytest_configure(config):
    config.addinivalue_line("markers", "needs_data(*datasets, options=None, experiments=()): skip, naming the "
                                       "dataset, when one of them is missing and may not be downloaded")


@functools.cache
def _missing_dataset(name: str, options: str, roots: tuple) -> str | None:
    """The name of the dataset that cannot be loaded offline (``options``: json; ``roots``: the
    data-root variables, so that a test that moves them is not answered from the cache), else None."""
    from pflkit.data import DatasetNotFoundError
    from pflkit.data.datasets import load_dataset

    try:
        load_dataset(name, download=False, **json.loads(options))
    except DatasetNotFoundError as e:
        return e.name
    return None


def _experiment_datasets(name: str) -> list[tuple[str, dict]]:
    from pflkit.run.experiments import resolve

    cfg = resolve(name, "smoke")
    data = [cfg.data] + ([cfg.pretrain.data] if cfg.pretrain is not None and cfg.pretrain.data is not None else [])
    return [(d.dataset, dict(d.options)) for d in data]


def missing_data(*datasets: str, options: dict | None = None, experiments=()) -> str | None:
    """Why a test marked ``needs_data(...)`` cannot run here (a skip reason), or None when it can."""
    wanted = [(name, dict(options or {})) for name in datasets]
    wanted += [pair for exp in experiments for pair in _experiment_datasets(exp)]
    for name, opts in wanted:
        roots = tuple(os.environ.get(k) for k in ("PFLKIT_DATA", "PFLKIT_CACHE"))
        missing = _missing_dataset(name, json.dumps(opts, sort_keys=True), roots)
        if missing is not None:
            where = f"$PFLKIT_DATA={roots[0]}" if roots[0] else "no $PFLKIT_DATA"
            return f"dataset {missing!r} is missing ({where}) and may not be downloaded (PFLKIT_OFFLINE)"
    return None


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Skips before any fixture is set up, so a module fixture that trains on the data never starts."""
    for mark in item.iter_markers("needs_data"):
        reason = missing_data(*mark.args, **mark.kwargs)
        if reason:
            pytest.skip(reason)


@pytest.fixture
def shared_data() -> Path:
    path = shared_data_dir()
    if path is None or not path.is_dir():
        pytest.skip(f"no offline data folder: set $PFLKIT_DATA (now {path})")
    return path


@pytest.fixture
def tol():
    return TOL
