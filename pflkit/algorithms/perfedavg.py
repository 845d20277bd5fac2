"""Per-FedAvg (Fallah et al., 2020): FedAvg of a MAML objective, FO and HF variants.

Each client minimizes the one-step-adapted loss ``F_i(w) = f_i(w - alpha grad f_i(w))``.
A local step (Per-FedAvg Alg. 1) draws three independent batches D, D', D'':

1. ``w_tmp = w - alpha grad f(w; D)``;
2. ``g = grad f(w_tmp; D')``;
3. FO: ``w <- w - beta g``;
   HF: ``w <- w - beta (g - alpha H(w; D'') g)``, the Hessian-vector product
   by the central difference ``(grad f(w + delta g) - grad f(w - delta g)) / (2 delta)``
   on D'' (``hvp="finite_difference"``, the paper's Hessian-free estimate) or by
   double backpropagation (``hvp="exact"``).

``beta`` is the config's ``lr``, ``local_steps`` = tau. The server averages the
clients' models (FedAvg). Evaluation personalizes the global model with
``personalize_steps`` SGD steps of rate ``alpha`` on the client's train split (one
step in the paper). `global_model` exports the meta-learned w, the starting point
that FedL2P's Table 1 pretrains with Per-FedAvg (HF).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch.func import functional_call

from pflkit.algorithms.fedavg import FEDAVG
from pflkit.config import one_of, positive, require
from pflkit.fl.algorithm import FLConfig, Update, replace
from pflkit.fl.train import check_finite, evaluate_model, local_sgd, set_state
from pflkit.meta.hypergrad import maml_direction


@dataclass(frozen=True)
class PerFedAvgConfig(FLConfig):
    """Attributes: variant ("fo" / "hf"), alpha (inner / personalization rate), lr = beta (outer
    rate), local_steps = tau, hvp ("finite_difference" / "exact"), delta (finite-difference step),
    personalize_steps (SGD steps at evaluation)."""

    variant: str = "fo"
    alpha: float = 0.01
    lr: float = 0.001
    local_steps: int = 10
    hvp: str = "finite_difference"
    delta: float = 1e-3
    personalize_steps: int = 1

    def __post_init__(self):
        super().__post_init__()
        one_of("variant", self.variant, {"fo", "hf"})
        positive("alpha", self.alpha)
        require(self.local_steps >= 1, "local_steps", self.local_steps, "Per-FedAvg counts local steps tau >= 1")
        one_of("hvp", self.hvp, {"finite_difference", "exact"})
        positive("delta", self.delta)
        require(self.personalize_steps >= 0, "personalize_steps", self.personalize_steps, "must be >= 0")


@dataclass(frozen=True)
class PerFedAvgHFConfig(PerFedAvgConfig):
    variant: str = "hf"


def _loss_on(model, names, buffers, batch):
    """``theta -> `` the cross-entropy of ``model`` with parameters ``theta`` (in ``names`` order) on ``batch``."""
    xb, yb = batch

    def loss(theta):
        return F.cross_entropy(functional_call(model, (dict(zip(names, theta)), buffers), (xb,)), yb)
    return loss


def meta_step(model, params, buffers, batches, cfg, beta: float):
    """One Per-FedAvg local step on batches (D, D', D'') (its Eq. 8-9, `pflkit.meta.hypergrad.maml_direction`);
    returns (new params, loss on D)."""
    d1, d2, d3 = (_loss_on(model, list(params), buffers, b) for b in batches)
    hessian = "none" if cfg.variant == "fo" else cfg.hvp
    step, loss = maml_direction(d1, d2, list(params.values()), alpha=cfg.alpha, hessian=hessian, delta=cfg.delta,
                                hessian_loss=d3)
    return {k: (p - beta * g).detach() for (k, p), g in zip(params.items(), step)}, float(loss)


def client_update(msg, client, client_state, cfg, env):
    model = set_state(env.scratch_model(), msg)
    model.train()
    names = {n for n, _ in model.named_parameters()}
    params = {k: v for k, v in msg.items() if k in names}
    buffers = {k: v.clone() for k, v in msg.items() if k not in names}
    gen = env.generator("client", client.id, env.round)
    losses = []
    for _ in range(cfg.local_steps):
        batches = [client.random_batch("train", cfg.batch_size, gen, env.device, True) for _ in range(3)]
        params, loss = meta_step(model, params, buffers, batches, cfg, cfg.lr_at(env.round))
        losses.append(check_finite(loss, f"Per-FedAvg client {client.id}"))
    new = {**msg, **params, **buffers}
    return Update(client.id, client.num("train"), new, {"loss": sum(losses) / len(losses)}), client_state


def personalized(weights, client, cfg, env):
    """The global model after ``personalize_steps`` SGD steps of rate alpha on the client's data."""
    model = set_state(env.scratch_model(), weights)
    if cfg.personalize_steps > 0:
        local_sgd(model, client, lr=cfg.alpha, batch_size=cfg.batch_size, steps=cfg.personalize_steps,
                  generator=env.generator("perfedavg-eval", client.id), device=env.device,
                  where=f"Per-FedAvg personalization, client {client.id}")
    return model


def evaluate(state, client, client_state, cfg, env, split):
    return evaluate_model(personalized(state["weights"], client, cfg, env), client, split, device=env.device)


# FedAvg's server (state, broadcast, sample-weighted averaging, exported global model) with a MAML
# client step and a personalizing evaluation
PERFEDAVG = replace(FEDAVG, name="perfedavg", label="Per-FedAvg (FO)", config=PerFedAvgConfig,
                    client_update=client_update, evaluate=evaluate, vectorizable=False)

PERFEDAVG_HF = replace(PERFEDAVG, name="perfedavg_hf", label="Per-FedAvg (HF)", config=PerFedAvgHFConfig)
