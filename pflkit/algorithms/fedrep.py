"""FedRep (Collins et al., 2021, "Exploiting shared representations for personalized FL").

The body (representation) is shared, the head ``model.head`` is personal. Each round a
sampled client loads the global body and its own head, trains **the head first** with the
body frozen, **then the body** with the head frozen, and sends the body; the server
averages it by sample count (FedRep Alg. 1).

**How many epochs of each** (``epoch_budget``). FedSelect sec. 3: "we fix the number of
local epochs across all methods to 5. All other hyperparameters ... follow the recommended
settings by the authors of the respective works." In FedRep's own code the number of local
epochs counts both phases: of its ``local_ep`` epochs the last ``local_rep_ep`` (1 by default)
train the body and the others the head (its paper's 10 head epochs + 1 body epoch are
``local_ep`` = 11). So by default (``epoch_budget="total"``) ``local_epochs`` is the round's
whole budget of passes over the client's data: ``local_epochs - body_epochs`` head epochs,
then ``body_epochs`` body epochs (FedSelect's 5 with FedRep's 1: 4 head + 1 body), the same
5 passes every other method of Table 1 makes. ``epoch_budget="separate"`` is pflkit's earlier
reading: ``head_epochs`` head epochs, then ``local_epochs`` body epochs (10 + 5 = 15 passes);
FedRep's own setting is ``separate`` with ``head_epochs=10, local_epochs=1``.

Server, messages and evaluation are FedSelect's partial-model exchange
(`pflkit.algorithms.fedselect`) with the head as a whole-tensor personal mask. A
client never sampled uses the global body with the initial head.
"""
from __future__ import annotations

from dataclasses import dataclass

from pflkit.algorithms.fedselect import FEDSELECT, ExchangeConfig, filled, finish_update, masked_sgd, receive
from pflkit.config import one_of, require
from pflkit.fl.algorithm import replace
from pflkit.fl.train import set_state
from pflkit.models.introspect import head_param_names


@dataclass(frozen=True)
class FedRepConfig(ExchangeConfig):
    """FedRep's settings.

    Attributes:
        local_epochs: ``"total"``: the round's epochs, head and body together; ``"separate"``:
            the body's epochs.
        body_epochs: ``"total"`` only: how many of the ``local_epochs`` train the body (the last
            ones; FedRep's ``local_rep_ep``).
        head_epochs: ``"separate"`` only: head epochs before the ``local_epochs`` body epochs.
        epoch_budget: ``"total"`` (default, module docstring) or ``"separate"``.
        bn_stats: as FedSelect's (`ExchangeConfig`), like ``fraction`` and ``local_epochs``' defaults.
    """

    method = "FedRep"

    body_epochs: int = 1
    head_epochs: int = 10
    epoch_budget: str = "total"

    def __post_init__(self):
        super().__post_init__()
        one_of("epoch_budget", self.epoch_budget, {"total", "separate"})
        require(self.head_epochs >= 0, "head_epochs", self.head_epochs, "must be >= 0")
        require(self.body_epochs >= 0, "body_epochs", self.body_epochs, "must be >= 0")
        require(self.epoch_budget == "separate" or self.body_epochs <= self.local_epochs, "body_epochs",
                self.body_epochs, f"must be <= local_epochs ({self.local_epochs}) with epoch_budget='total'")

    def phases(self) -> tuple[int, int]:
        """(head epochs, body epochs) of one round."""
        if self.epoch_budget == "total":
            return self.local_epochs - self.body_epochs, self.body_epochs
        return self.head_epochs, self.local_epochs


def client_update(msg, client, client_state, cfg, env):
    model = set_state(env.scratch_model(), receive(msg, client_state))
    head = set(head_param_names(model))
    personal = {n: m | (n in head) for n, m in filled(model, False).items()}
    body = {n: ~m for n, m in personal.items()}
    head_epochs, body_epochs = cfg.phases()
    head_stats = masked_sgd(model, client, personal, cfg, env, head_epochs, ("head",))
    body_stats = masked_sgd(model, client, body, cfg, env, body_epochs, ("body",))
    loss = body_stats["loss"] if body_stats["samples"] else head_stats["loss"]
    return finish_update(model, client, personal, loss, cfg)


FEDREP = replace(FEDSELECT, name="fedrep", label="FedRep", config=FedRepConfig, client_update=client_update)
