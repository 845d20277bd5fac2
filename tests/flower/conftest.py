"""Flower adapter tests need flwr (``pip install -e ".[flower]"``, also in the ``dev`` extra)."""
import importlib.util

if importlib.util.find_spec("flwr") is None:
    collect_ignore_glob = ["test_*.py"]
