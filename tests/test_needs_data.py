"""The shared ``needs_data`` marker (tests/conftest.py): a missing dataset skips, naming it."""
from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture
def missing_data(request):
    root = Path(__file__).parent / "conftest.py"
    [conftest] = [p for p in request.config.pluginmanager.get_plugins()
                  if Path(getattr(p, "__file__", "") or "").resolve() == root.resolve()]
    return conftest.missing_data


def test_a_missing_dataset_is_named_and_a_present_one_is_not(missing_data, tmp_path, monkeypatch):
    monkeypatch.setenv("PFLKIT_DATA", str(tmp_path / "empty"))
    monkeypatch.setenv("PFLKIT_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("PFLKIT_OFFLINE", "1")
    reason = missing_data("digits", "cifar10")
    assert reason is not None and "'cifar10'" in reason and "may not be downloaded" in reason
    assert missing_data("digits") is None  # embedded (scikit-learn): never missing
    assert "'cifar10'" in missing_data(experiments=["fedselect_table1_s2"])
    assert missing_data(experiments=["demo"]) is None


def test_a_dataset_in_the_data_folder_is_not_missing(missing_data, shared_data):
    if not (shared_data / "cifar10_small.npz").is_file():
        pytest.skip(f"no cifar10_small.npz in {shared_data}")
    assert missing_data("cifar10") is None
