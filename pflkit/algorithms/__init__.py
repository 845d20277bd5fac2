"""Every algorithm pflkit knows, by name: the CLI, notebooks and Flower adapter read this dict."""
from pflkit.algorithms.base import Algorithm, Env, FLConfig, Update, replace
from pflkit.algorithms.fedavg import FEDAVG
from pflkit.algorithms.finetune import FINETUNE
from pflkit.algorithms.local import LOCAL

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (FEDAVG, LOCAL, FINETUNE)}


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``; a clear error listing the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]


__all__ = ["ALGORITHMS", "Algorithm", "Env", "FLConfig", "Update", "get_algorithm", "replace"]
