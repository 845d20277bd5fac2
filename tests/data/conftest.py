"""Data tests see only the roots they make: no user cache, no $PFLKIT_DATA, no network."""
import pytest


@pytest.fixture(autouse=True)
def isolated_roots(tmp_path, monkeypatch):
    """No user cache or $PFLKIT_DATA may leak into these tests, and none may reach the network.

    Real offline data stays reachable through the `shared_data` fixture (read when the session starts).
    """
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.delenv("PFLKIT_DATA", raising=False)
    monkeypatch.delenv("PFLKIT_CACHE", raising=False)
    monkeypatch.setenv("PFLKIT_OFFLINE", "1")
