"""Every algorithm pflkit knows, by name: the CLI, notebooks and Flower adapter read this dict."""
from pflkit.algorithms.ditto import DITTO
from pflkit.algorithms.fedalt import FEDALT
from pflkit.algorithms.fedavg import FEDAVG
from pflkit.algorithms.fedbabu import FEDBABU
from pflkit.algorithms.fedl2p import VARIANTS as FEDL2P_VARIANTS
from pflkit.algorithms.fedper import FEDPER
from pflkit.algorithms.fedrep import FEDREP
from pflkit.algorithms.fedselect import FEDSELECT, FEDSELECT_V2
from pflkit.algorithms.finetune import FINETUNE
from pflkit.algorithms.lgfedavg import LGFEDAVG
from pflkit.algorithms.local import LOCAL
from pflkit.algorithms.lotteryfl import LOTTERYFL
from pflkit.algorithms.perfedavg import PERFEDAVG, PERFEDAVG_HF
from pflkit.algorithms.pfedhn import PFEDHN, PFEDHN_PC
from pflkit.algorithms.pfedme import PFEDME
from pflkit.algorithms.pfedvem import PFEDMAP, PFEDVEM
from pflkit.fl.algorithm import Algorithm, Env, FLConfig, Update, replace

ALGORITHMS: dict[str, Algorithm] = {a.name: a for a in (FEDAVG, LOCAL, FINETUNE, PFEDVEM, PFEDMAP, FEDPER, LGFEDAVG, PERFEDAVG, PERFEDAVG_HF, PFEDHN, PFEDHN_PC, PFEDME, FEDSELECT, FEDSELECT_V2, FEDALT, FEDREP, FEDBABU, DITTO, LOTTERYFL, *FEDL2P_VARIANTS)}


def get_algorithm(name: str) -> Algorithm:
    """The algorithm registered as ``name``; a clear error listing the known ones otherwise."""
    if name not in ALGORITHMS:
        raise ValueError(f"unknown algorithm {name!r}; known: {', '.join(sorted(ALGORITHMS))}")
    return ALGORITHMS[name]


__all__ = ["ALGORITHMS", "Algorithm", "Env", "FLConfig", "Update", "get_algorithm", "replace"]
