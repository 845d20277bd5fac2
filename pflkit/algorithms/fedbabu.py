"""FedBABU (Oh et al., ICLR 2022, "Toward enhanced representation for federated image classification").

Federated training updates only the body: the head ``model.head`` keeps its random
initialization, frozen and identical on every client, while the body is trained
locally and averaged by sample count as in FedAvg (FedBABU Alg. 1). Personalization
happens at evaluation: each client fine-tunes the global model on its train split for
``finetune_epochs`` (FedBABU's tau; 5 in its main tables) and is tested with the
result. ``finetune_part="full"`` fine-tunes body and head (the paper's default);
``"head"`` only the head.

FedBABU is also a pretraining algorithm (FedL2P Table 1): ``exports_global`` is set
and `FEDBABU.global_model(state)` returns the learned global model (body trained,
head at its initialization).

What travels: down, the global model (the head is needed once and is small); up,
the body and the BN buffers only, since the head never changes.
"""
from __future__ import annotations

from dataclasses import dataclass

from pflkit.algorithms.fedavg import FEDAVG
from pflkit.config import non_negative, one_of, require
from pflkit.fl.aggregate import weighted_mean
from pflkit.fl.algorithm import FLConfig, Update, replace
from pflkit.fl.train import evaluate_model, finetune_sgd, get_state, round_sgd, set_state
from pflkit.models.introspect import body_param_names, head_param_names


@dataclass(frozen=True)
class FedBABUConfig(FLConfig):
    """Attributes: finetune_epochs (tau), finetune_lr (0: the training ``lr``), finetune_part."""

    local_epochs: int = 5
    finetune_epochs: int = 5
    finetune_lr: float = 0.0
    finetune_part: str = "full"

    def __post_init__(self):
        super().__post_init__()
        require(self.finetune_epochs >= 0, "finetune_epochs", self.finetune_epochs, "must be >= 0")
        non_negative("finetune_lr", self.finetune_lr)
        one_of("finetune_part", self.finetune_part, {"full", "head"})


def client_update(msg, client, client_state, cfg, env):
    """Local SGD of the body with the head frozen; only the body and buffers are sent."""
    model = set_state(env.scratch_model(), msg)
    body = set(body_param_names(model))
    stats = round_sgd(model, client, cfg, env, params=[p for n, p in model.named_parameters() if n in body])
    head = set(head_param_names(model))
    payload = {k: v for k, v in get_state(model).items() if k not in head}
    return Update(client.id, client.num("train"), payload, {"loss": stats["loss"]}), client_state


def aggregate(state, updates, cfg, env) -> dict:
    body = weighted_mean([u.payload for u in updates], [u.num_samples for u in updates])
    return {**state, "weights": {**state["weights"], **body}}


def finetune(weights, client, cfg, env):
    """The global model fine-tuned on the client's train split (FedBABU's personalization)."""
    model = set_state(env.scratch_model(), weights)
    if cfg.finetune_epochs > 0:
        params = None
        if cfg.finetune_part == "head":
            head = set(head_param_names(model))
            params = [p for n, p in model.named_parameters() if n in head]
        finetune_sgd(model, client, cfg, env, lr=cfg.finetune_lr or cfg.lr, epochs=cfg.finetune_epochs, params=params)
    return model


def evaluate(state, client, client_state, cfg, env, split):
    return evaluate_model(finetune(state["weights"], client, cfg, env), client, split, device=env.device)


# FedAvg's server state, broadcast and exported global model; only the body trains and travels
FEDBABU = replace(FEDAVG, name="fedbabu", label="FedBABU", config=FedBABUConfig, client_update=client_update,
                  aggregate=aggregate, evaluate=evaluate)
