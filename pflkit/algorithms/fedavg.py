"""FedAvg (McMahan et al., 2017): local SGD epochs, sample-weighted averaging.

The global model's training in every FedL2P table (FedL2P sec. 3.1:
theta_g^t = sum_i N_i / sum N_i' * theta_i^{t-1}) and a baseline row of every
other paper. Evaluation tests the global model on each client's split.
"""
from __future__ import annotations

from dataclasses import dataclass

from pflkit.algorithms.base import Algorithm, FLConfig, Update
from pflkit.fl.aggregate import weighted_mean
from pflkit.fl.train import evaluate_model, get_state, local_sgd, set_state


@dataclass(frozen=True)
class FedAvgConfig(FLConfig):
    """FedAvg uses only the shared settings (rounds, fraction, local SGD)."""


def init(model, fed, cfg, env) -> dict:
    return {"weights": get_state(model)}


def broadcast(state, client_id, cfg, env):
    return state["weights"]


def train_from(weights, client, cfg, env, **kw) -> tuple[dict, dict]:
    """Load ``weights`` into the scratch model, run the round's local SGD, return (state, stats)."""
    model = set_state(env.scratch_model(), weights)
    stats = local_sgd(model, client, lr=cfg.lr_at(env.round), batch_size=cfg.batch_size,
                      generator=env.generator("client", client.id, env.round), epochs=cfg.local_epochs,
                      steps=cfg.local_steps, momentum=cfg.momentum, weight_decay=cfg.weight_decay,
                      max_grad_norm=cfg.max_grad_norm, device=env.device, where=f"client {client.id}", **kw)
    return get_state(model), stats


def client_update(msg, client, client_state, cfg, env):
    weights, stats = train_from(msg, client, cfg, env)
    return Update(client.id, client.num("train"), weights, {"loss": stats["loss"]}), client_state


def aggregate(state, updates, cfg, env) -> dict:
    return {**state, "weights": weighted_mean([u.payload for u in updates], [u.num_samples for u in updates])}


def evaluate(state, client, client_state, cfg, env, split):
    return evaluate_model(set_state(env.scratch_model(), state["weights"]), client, split, device=env.device)


FEDAVG = Algorithm(
    name="fedavg", label="FedAvg", config=FedAvgConfig, init=init, broadcast=broadcast,
    client_update=client_update, aggregate=aggregate, evaluate=evaluate,
    global_model=lambda state: state["weights"], exports_global=True,
)
