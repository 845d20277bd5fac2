"""pFedMe (Dinh et al., 2020): personalized models through Moreau envelopes.

Each client's personalized model theta_i solves the Moreau-envelope problem
``min_theta f_i(theta) + lam / 2 ||theta - w_i||^2`` around its local copy w_i of
the global model. Client round (pFedMe Alg. 1), ``local_steps`` = R times:

1. draw a mini-batch D and take ``inner_steps`` (K) gradient steps of rate
   ``personal_lr`` on ``f_i(theta; D) + lam / 2 ||theta - w_i||^2`` (theta is warm
   started from the previous local step; it starts at the global model);
2. move the local model toward it: ``w_i <- w_i - lr * lam * (w_i - theta)``.

The client returns w_i; the server sets ``w <- (1 - beta) w + beta * sum_i p_i w_i``
with sample weights p_i (pFedMe Alg. 1 line 11). pFedHN App. B uses K = 3 with 20
local rounds (60 local steps).

The personalized model that is evaluated is theta_i. pFedMe's code re-trains
every client every round, so each theta_i comes from the latest global model;
``eval_mode="fresh"`` (default) reproduces that by running the same client
procedure from the current global model at evaluation time (deterministic per
client), ``"last"`` reuses the theta_i a client kept from its last round.

Participation (``participation``, `pflkit.fl.sampling`): ``"sampled"`` (default)
trains only the clients the loop samples; ``"broadcast"`` is pFedMe's own protocol
(Alg. 1: every client computes theta_i and w_i from the broadcast w each round, a
subset S^t sends w_i back), with each client reporting with probability
``report_fraction``. With ``eval_mode="last"`` every client then keeps the theta_i of
the latest round, which is what pFedMe's code evaluates; with ``"fresh"`` a
non-reporting client's work leaves nothing behind, so it is skipped (`silent_update`).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from pflkit.algorithms import fedavg
from pflkit.algorithms.fedavg import FEDAVG, FedAvgConfig
from pflkit.config import one_of, positive, require
from pflkit.fl.algorithm import Update, replace
from pflkit.fl.train import check_finite, evaluate_model, get_state, make_sgd, set_state


@dataclass(frozen=True)
class PFedMeConfig(FedAvgConfig):
    """Attributes: lam (15 in pFedMe), personal_lr (inner rate), inner_steps K = 3,
    local_steps R = 20, lr (rate of the local-model update), beta (server mixing, 1 = FedAvg-like),
    eval_mode ("fresh" or "last"); participation / report_fraction: FedAvg's protocol (default "sampled")."""

    lr: float = 0.01
    local_steps: int = 20
    lam: float = 15.0
    personal_lr: float = 0.01
    inner_steps: int = 3
    beta: float = 1.0
    eval_mode: str = "fresh"

    def __post_init__(self):
        super().__post_init__()
        positive("lam", self.lam)
        positive("personal_lr", self.personal_lr)
        require(self.inner_steps >= 1, "inner_steps", self.inner_steps, "must be >= 1")
        require(self.local_steps >= 1, "local_steps", self.local_steps, "pFedMe counts local rounds R >= 1")
        positive("beta", self.beta)
        one_of("eval_mode", self.eval_mode, {"fresh", "last"})


def _prox(theta_params, w_params):
    return sum(((p - w) ** 2).sum() for p, w in zip(theta_params, w_params))


def personalize(weights: dict, client, cfg, env, generator: torch.Generator, lr: float):
    """R rounds of (K prox steps on theta, one step of w toward theta) from ``weights``.

    Returns:
        ``(theta_state, w_state, mean loss)``: the personalized model, the local model.
    """
    model = set_state(env.scratch_model(), weights)
    names = [n for n, p in model.named_parameters() if p.requires_grad]
    params = [dict(model.named_parameters())[n] for n in names]
    w = [p.detach().clone() for p in params]
    opt = make_sgd(params, cfg.personal_lr)
    model.train()
    total = 0.0
    for _ in range(cfg.local_steps):
        xb, yb = client.random_batch("train", cfg.batch_size, generator, env.device, True)
        for _ in range(cfg.inner_steps):
            opt.zero_grad(set_to_none=True)
            loss = F.cross_entropy(model(xb), yb)
            (loss + cfg.lam / 2 * _prox(params, w)).backward()
            if cfg.max_grad_norm > 0:
                torch.nn.utils.clip_grad_norm_(params, cfg.max_grad_norm)
            opt.step()
        total += check_finite(float(loss.detach()), f"pFedMe client {client.id}")
        with torch.no_grad():
            for wi, p in zip(w, params):
                wi.sub_(lr * cfg.lam * (wi - p))
    theta = get_state(model)
    local = {**theta, **dict(zip(names, w))}  # buffers (BN statistics) follow theta
    return theta, local, total / cfg.local_steps


def client_update(msg, client, client_state, cfg, env):
    theta, local, loss = personalize(msg, client, cfg, env, env.generator("client", client.id, env.round),
                                     cfg.lr_at(env.round))
    keep = theta if cfg.eval_mode == "last" else None
    return Update(client.id, client.num("train"), local, {"loss": loss}), keep


def silent_update(msg, client, client_state, cfg, env):
    """A client that does not report (``participation="broadcast"``): with ``eval_mode="last"`` the whole
    update, keeping theta_i (w_i is not sent); with ``"fresh"`` nothing it would compute is kept: skipped."""
    if cfg.eval_mode == "fresh":
        return Update(client.id, 0, None), client_state
    return client_update(msg, client, client_state, cfg, env)


def aggregate(state, updates, cfg, env):
    """w <- (1 - beta) w + beta * (FedAvg's sample-weighted mean of the reported w_i); none reported: unchanged."""
    averaged = fedavg.aggregate(state, updates, cfg, env)
    if cfg.beta == 1.0 or averaged is state:
        return averaged
    old, mean = state["weights"], averaged["weights"]
    mixed = {k: ((1 - cfg.beta) * old[k] + cfg.beta * mean[k]) if old[k].is_floating_point() else mean[k]
             for k in old}
    return {**state, "weights": mixed}


def evaluate(state, client, client_state, cfg, env, split):
    if cfg.eval_mode == "last" and client_state is not None:
        theta = client_state
    else:
        theta, _, _ = personalize(state["weights"], client, cfg, env, env.generator("pfedme-eval", client.id),
                                  cfg.lr)
    return evaluate_model(set_state(env.scratch_model(), theta), client, split, device=env.device)


# FedAvg's server state, broadcast (with its participation protocol) and exported global model
PFEDME = replace(FEDAVG, name="pfedme", label="pFedMe", config=PFedMeConfig, client_update=client_update,
                 aggregate=aggregate, evaluate=evaluate, vectorizable=False, silent_update=silent_update)
