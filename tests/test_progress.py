"""The progress bar: the widget bar only where ipywidgets imports, and no warning where it does not."""
import importlib
import importlib.util
import warnings

import pytest
import tqdm.std

import pflkit.progress


def _reload_with_ipywidgets(monkeypatch, present: bool):
    real = importlib.util.find_spec

    def find_spec(name, *args, **kwargs):
        if name == "ipywidgets" and not present:
            return None
        return real(name, *args, **kwargs)

    monkeypatch.setattr(importlib.util, "find_spec", find_spec)
    return importlib.reload(pflkit.progress)


def test_without_ipywidgets_the_text_bar_is_chosen_and_nothing_warns(monkeypatch):
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # tqdm.auto's IProgress warning would raise here
        mod = _reload_with_ipywidgets(monkeypatch, present=False)
    assert mod.tqdm is tqdm.std.tqdm
    monkeypatch.undo()
    importlib.reload(pflkit.progress)


def test_with_ipywidgets_tqdm_auto_decides(monkeypatch):
    if importlib.util.find_spec("ipywidgets") is None:
        pytest.skip("ipywidgets is not installed here")
    import tqdm.auto
    mod = _reload_with_ipywidgets(monkeypatch, present=True)
    assert mod.tqdm is tqdm.auto.tqdm
