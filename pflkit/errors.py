"""Errors any room of pflkit may raise.

This module imports nothing of pflkit, so the meta-learning math (`pflkit.meta`) can stop a
run as diverged without importing the federated machinery that catches it (`pflkit.fl.loop`).
"""

__all__ = ["Diverged"]


class Diverged(RuntimeError):
    """A loss became NaN or infinite; the run is marked ``diverged``."""
