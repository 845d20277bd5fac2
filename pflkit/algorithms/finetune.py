"""Fine-tuning baselines of FedL2P sec. 4.1.2: FT (BN C), FT (BN G), FT (BN I).

Each client fine-tunes the pretrained global model on its train split for
``epochs`` epochs of SGD and is tested on its own split. The three baselines
differ only in the statistics their BatchNorm layers normalize with
(`pflkit.models.mixed_bn`):

* ``bn="client"``, FT (BN C): beta = 1 in Eq. 2 -- batch statistics in training,
  the client's running statistics at test time; as FedBN / Ditto / Per-FedAvg. Those
  statistics start at mean 0 / variance 1 and are tracked during fine-tuning
  (``client_stats_init="reset"``, the authors' code) or start from one pass over the
  train split (``"pass"``); see `pflkit.models.mixed_bn`.
* ``bn="global"``, FT (BN G): beta = 0 -- the pretrained model's statistics throughout.
* ``bn="batch"``, FT (BN I): the incoming batch's statistics, also at test time (FedBABU).
* ``bn="none"``: plain fine-tuning for models without BatchNorm.

There is no federated training (``rounds = 0``): the whole method is the
personalization step inside ``evaluate``.
"""
from __future__ import annotations

from dataclasses import dataclass

from pflkit.config import one_of, require
from pflkit.fl.algorithm import Algorithm, FLConfig, Update
from pflkit.fl.train import client_batches, evaluate_model, finetune_sgd, get_state, set_state
from pflkit.models.mixed_bn import CLIENT_STATS_INIT, FT_MODES, convert_bn, mixed_bn_layers, set_bn_mode, \
    start_client_stats

BN_CHOICES = ("client", "global", "batch", "none")


@dataclass(frozen=True)
class FineTuneConfig(FLConfig):
    """Attributes: bn (see module docstring), epochs = e of FedL2P (5 or 15); lr 1e-3 (App. D);
    client_stats_init: ``"reset"`` (default, the authors' code) or ``"pass"``, where the
    client's BN running statistics start (they only matter for FT (BN C))."""

    rounds: int = 0
    bn: str = "client"
    epochs: int = 5
    lr: float = 1e-3
    client_stats_init: str = "reset"

    def __post_init__(self):
        super().__post_init__()
        one_of("bn", self.bn, set(BN_CHOICES))
        one_of("client_stats_init", self.client_stats_init, set(CLIENT_STATS_INIT))
        require(self.epochs >= 0, "epochs", self.epochs, "must be >= 0")


def init(model, fed, cfg, env) -> dict:
    return {"weights": get_state(model)}


def broadcast(state, client_id, cfg, env):
    return state["weights"]


def client_update(msg, client, client_state, cfg, env):
    return Update(client.id, client.num("train"), None, {}), client_state


def aggregate(state, updates, cfg, env):
    return state


def prepare(weights, client, bn: str, env, client_stats_init: str = "reset"):
    """The pretrained model, BN layers set to ``bn`` mode, client statistics started."""
    model = env.scratch_model("finetune-bn") if bn != "none" else env.scratch_model()
    if bn != "none" and not mixed_bn_layers(model):
        convert_bn(model)
        if not mixed_bn_layers(model):
            raise ValueError(f"bn={bn!r} needs a model with BatchNorm layers; use bn='none'")
    set_state(model, weights)
    if bn != "none":
        set_bn_mode(model, bn)
        start_client_stats(model, client_stats_init, lambda: client_batches(client, "train", device=env.device))
    return model


def finetune(weights, client, cfg, env):
    """Fine-tune the pretrained ``weights`` on the client's train split; returns the model."""
    model = prepare(weights, client, cfg.bn, env, cfg.client_stats_init)
    if cfg.epochs > 0:
        finetune_sgd(model, client, cfg, env, lr=cfg.lr, epochs=cfg.epochs)
    return model


def evaluate(state, client, client_state, cfg, env, split):
    return evaluate_model(finetune(state["weights"], client, cfg, env), client, split, device=env.device)


FINETUNE = Algorithm(
    name="finetune", label="FT", config=FineTuneConfig, init=init, broadcast=broadcast,
    client_update=client_update, aggregate=aggregate, evaluate=evaluate, needs_pretrained=True,
    vectorizable=True,
)

LABELS = FT_MODES
