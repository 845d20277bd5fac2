"""The progress bar: the widget bar only where ipywidgets imports, and no warning where it does not."""
import importlib.util
import warnings

import pytest
import tqdm.std

from pflkit import io


def _without_ipywidgets(monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a, **k: None if name == "ipywidgets" else real(name, *a, **k))


def test_without_ipywidgets_the_text_bar_is_chosen_and_nothing_warns(monkeypatch):
    _without_ipywidgets(monkeypatch)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tqdm.auto's IProgress warning would raise here
        assert io._bar_class() is tqdm.std.tqdm
        with io.progress_bar(range(3), disable=True) as bar:
            assert isinstance(bar, tqdm.std.tqdm) and list(bar) == [0, 1, 2]


def test_with_ipywidgets_tqdm_auto_decides():
    if importlib.util.find_spec("ipywidgets") is None:
        pytest.skip("ipywidgets is not installed here")
    import tqdm.auto
    assert io._bar_class() is tqdm.auto.tqdm
