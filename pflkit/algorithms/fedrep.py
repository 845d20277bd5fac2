"""FedRep (Collins et al., 2021, "Exploiting shared representations for personalized FL").

The body (representation) is shared, the head ``model.head`` is personal. Each round a
sampled client loads the global body and its own head, trains **the head first** for
``head_epochs`` with the body frozen, **then the body** for ``local_epochs`` with the
head frozen, and sends the body; the server averages it by sample count (FedRep
Alg. 1). FedRep's paper trains the head for 10 epochs and the representation for 1;
FedSelect fixes 5 local epochs for every method, which we apply to the body.

Server, messages and evaluation are FedSelect's partial-model exchange
(`pflkit.algorithms.fedselect`) with the head as a whole-tensor personal mask. A
client never sampled uses the global body with the initial head.
"""
from __future__ import annotations

from dataclasses import dataclass

from pflkit.algorithms.base import FLConfig, replace
from pflkit.algorithms.fedselect import FEDSELECT, filled, finish_update, masked_sgd, receive
from pflkit.config import one_of, require
from pflkit.fl.train import set_state
from pflkit.models.introspect import head_param_names


@dataclass(frozen=True)
class FedRepConfig(FLConfig):
    """Attributes: head_epochs (head-only epochs per round), local_epochs (body epochs), bn_stats."""

    fraction: float = 1.0
    local_epochs: int = 5
    head_epochs: int = 10
    bn_stats: str = "shared"

    def __post_init__(self):
        super().__post_init__()
        require(self.head_epochs >= 0, "head_epochs", self.head_epochs, "must be >= 0")
        require(self.local_steps == 0, "local_steps", self.local_steps, "FedRep trains by epochs; use 0")
        one_of("bn_stats", self.bn_stats, {"shared", "local"})


def client_update(msg, client, client_state, cfg, env):
    model = set_state(env.scratch_model(), receive(msg, client_state))
    head = set(head_param_names(model))
    personal = {n: m | (n in head) for n, m in filled(model, False).items()}
    body = {n: ~m for n, m in personal.items()}
    head_stats = masked_sgd(model, client, personal, cfg, env, cfg.head_epochs, ("head",))
    body_stats = masked_sgd(model, client, body, cfg, env, cfg.local_epochs, ("body",))
    loss = body_stats["loss"] if body_stats["samples"] else head_stats["loss"]
    return finish_update(model, client, personal, loss, cfg)


FEDREP = replace(FEDSELECT, name="fedrep", label="FedRep", config=FedRepConfig, client_update=client_update)
