"""Fine-tuning baselines of FedL2P sec. 4.1.2: FT (BN C), FT (BN G), FT (BN I).

Each client fine-tunes the pretrained global model on its train split (``personalize_on``:
``"train"``, the default, or ``"train_val"``, its whole training partition with the validation
part, as the authors' client does: ``classification_client.py`` lines 213-222 fine-tune on
``partition='train'``) for ``epochs`` epochs of SGD and is tested on its own split. The three baselines
differ only in the statistics their BatchNorm layers normalize with
(`pflkit.models.mixed_bn`):

* ``bn="client"``, FT (BN C): beta = 1 in Eq. 2 -- batch statistics in training,
  the client's running statistics at test time; as FedBN / Ditto / Per-FedAvg. Where
  those statistics start is ``client_stats_init`` (`STATS_INIT`):

  - ``"pretrained"`` (FT (BN C)'s default): at the pretrained model's running statistics, moved toward the
    client's by BatchNorm's momentum (0.1) during fine-tuning -- what the authors' baseline
    client does (github.com/royson/fedl2p, ``src/apps/clients/classification_client.py``:
    ``evaluate`` (line 176) loads the whole pretrained state dict, BN buffers included, via
    ``set_parameters`` (lines 114-119), ``train`` (lines 17-36) fine-tunes in train mode,
    which updates the running statistics, and ``test`` evaluates in eval mode with them);
  - ``"reset"`` (pflkit's earlier default): mean 0 / variance 1, then tracked with momentum 0.1. This is the authors' start for FedL2P's mixed
    BN (``src/models/model_utils.py`` lines 102-110: the pretrained statistics are kept aside
    for Eq. 2 and the running ones reset), not for their FT baselines; with the few steps of
    the ``cpu`` rows (about 10), 0.9^10 = 35% of the reset values remain in the statistics
    FT (BN C) is tested with (docs/fidelity.md);
  - ``"pass"``: one pass over the train split (`pflkit.models.mixed_bn.init_client_stats`).
* ``bn="global"``, FT (BN G): beta = 0 -- the pretrained model's statistics throughout.
* ``bn="batch"``, FT (BN I): the incoming batch's statistics, also at test time (FedBABU).
* ``bn="none"``: plain fine-tuning for models without BatchNorm.

There is no federated training (``rounds = 0``): the whole method is the
personalization step inside ``evaluate``.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

import numpy as np
import torch

from pflkit.config import OMIT_DEFAULT, one_of, require
from pflkit.fl.algorithm import Algorithm, FLConfig, Update
from pflkit.fl.train import client_batches, evaluate_model, finetune_sgd, get_state, set_state
from pflkit.models.mixed_bn import CLIENT_STATS_INIT, FT_MODES, convert_bn, mixed_bn_layers, set_bn_mode, \
    start_client_stats

BN_CHOICES = ("client", "global", "batch", "none")
STATS_INIT = (*CLIENT_STATS_INIT, "pretrained")  # where FT (BN C)'s client statistics start (module docstring)
PERSONALIZE_ON = ("train", "train_val")  # the data a client fine-tunes on


@dataclass(frozen=True)
class FineTuneConfig(FLConfig):
    """Attributes: bn (see module docstring), epochs = e of FedL2P (5 or 15); lr 1e-3 (App. D);
    client_stats_init: ``"pretrained"`` (the authors' FT baselines), ``"reset"`` or ``"pass"``, where
    the client's BN running statistics start. They matter for FT (BN C) only: left empty, the field
    resolves to ``"pretrained"`` for ``bn="client"`` and to ``"reset"`` for the other modes, whose
    numbers it does not touch (so their settings, and their stages' fingerprints, stay as they were);
    personalize_on: ``"train"`` (default) or ``"train_val"`` (the authors': the whole training
    partition)."""

    rounds: int = 0
    bn: str = "client"
    epochs: int = 5
    lr: float = 1e-3
    client_stats_init: str = ""  # "": "pretrained" for bn="client", else "reset" (__post_init__)
    personalize_on: str = field(default="train", metadata=OMIT_DEFAULT)  # added after results were made

    def __post_init__(self):
        super().__post_init__()
        one_of("bn", self.bn, set(BN_CHOICES))
        if not self.client_stats_init:
            object.__setattr__(self, "client_stats_init", "pretrained" if self.bn == "client" else "reset")
        one_of("client_stats_init", self.client_stats_init, set(STATS_INIT))
        one_of("personalize_on", self.personalize_on, set(PERSONALIZE_ON))
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
        if client_stats_init == "pretrained":
            with torch.no_grad():
                for layer in mixed_bn_layers(model):
                    layer.client_mean.copy_(layer.running_mean)
                    layer.client_var.copy_(layer.running_var)
        else:
            start_client_stats(model, client_stats_init, lambda: client_batches(client, "train", device=env.device))
    return model


def personalization_client(client, personalize_on: str = "train"):
    """``client`` whose train split is the data it fine-tunes on: its train split, or with ``"train_val"`` its
    train and validation splits together (the authors' whole training partition)."""
    if personalize_on == "train" or "val" not in client.splits:
        return client
    return dataclasses.replace(client, splits={**client.splits, "train": np.concatenate(
        [client.splits["train"], client.splits["val"]])})


def finetune(weights, client, cfg, env):
    """Fine-tune the pretrained ``weights`` on the client's personalization data (``cfg.personalize_on``);
    returns the model."""
    client = personalization_client(client, cfg.personalize_on)
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
