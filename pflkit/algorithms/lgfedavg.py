"""LG-FedAvg (Liang et al., 2020): local representations, a global head.

The mirror image of FedPer: each client keeps its own feature extractor (every
layer except the ``global_layers``, by default ``model.head``) and the server
averages only the global layers, so only the small top of the network travels.
As in pFedHN's comparison (sec. 5), training starts from a FedAvg model: the
experiment's ``[pretrain]`` stage (``needs_pretrained``), and each client's first
download carries its copy of that model's body. Phases are FedPer's
(`pflkit.algorithms.fedper`) with the split reversed.
"""
from __future__ import annotations

from dataclasses import dataclass

from pflkit.algorithms import fedper
from pflkit.config import require
from pflkit.fl.algorithm import FLConfig, replace


@dataclass(frozen=True)
class LGFedAvgConfig(FLConfig):
    """Attributes: global_layers = module-name prefixes averaged by the server (default: the head)."""

    global_layers: tuple[str, ...] = ("head",)

    def __post_init__(self):
        super().__post_init__()
        require(len(self.global_layers) > 0, "global_layers", self.global_layers, "name at least one layer")

    def is_personal(self, name: str) -> bool:
        return not fedper._under(name, self.global_layers)


LGFEDAVG = replace(fedper.FEDPER, name="lgfedavg", label="LG-FedAvg", config=LGFedAvgConfig,
                   needs_pretrained=True)
