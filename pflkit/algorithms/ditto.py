"""Ditto (Li et al., 2021, "Ditto: fair and robust federated learning through personalization").

Two models per client: the global model w, trained by FedAvg, and a personal model
v_k that minimizes the client's loss plus the proximal term (lambda / 2) ||v_k - w^t||^2
toward the global model it received this round (Ditto Alg. 1). Each round a sampled
client runs ``local_epochs`` of SGD on a copy of w^t (sent back and averaged by
sample count) and ``local_epochs`` of SGD on v_k (kept). v_k starts as the first
global model the client receives; a client never sampled is evaluated with w.

lambda: Ditto tunes it per dataset over {0.05, 0.1, 0.2, 0.5, 1, 2}; ``lam = 0.1`` is
our default (FedSelect's Table 1 sets 1, the value of the authors' clean-data scripts). The personal model's BN running statistics are its own.
"""
from __future__ import annotations

from dataclasses import dataclass

from pflkit.algorithms.fedavg import aggregate, broadcast, init, train_from
from pflkit.config import non_negative
from pflkit.fl.algorithm import Algorithm, FLConfig, Update
from pflkit.fl.train import evaluate_model, get_state, proximal_penalty, round_sgd, set_state


@dataclass(frozen=True)
class DittoConfig(FLConfig):
    """Attributes: lam (the proximal weight lambda of Ditto's h_k)."""

    fraction: float = 1.0
    local_epochs: int = 5
    lam: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        non_negative("lam", self.lam)


def proximal_term(model, anchor: dict, lam: float):
    """Ditto's h_k regularizer as an ``extra_loss``: (lam / 2) * sum ||p - anchor||^2 over the model's parameters
    (`local_sgd`'s ``prox`` adds the same term in a form the vectorized engine can batch)."""
    return lambda _model: proximal_penalty(model.named_parameters(), anchor, lam)


def personal_step(global_weights: dict, personal: dict, client, cfg, env) -> tuple[dict, dict]:
    """``local_epochs`` of SGD on v_k with the proximal pull toward the received w^t."""
    model = set_state(env.scratch_model(), personal)
    prox = (cfg.lam, global_weights) if cfg.lam > 0 else None
    stats = round_sgd(model, client, cfg, env, key=("personal",), prox=prox, where=f"client {client.id} (personal)")
    return get_state(model), stats


def client_update(msg, client, client_state, cfg, env):
    personal, pstats = personal_step(msg, msg if client_state is None else client_state, client, cfg, env)
    weights, stats = train_from(msg, client, cfg, env)
    return (Update(client.id, client.num("train"), weights, {"loss": stats["loss"], "personal_loss": pstats["loss"]}),
            personal)


def evaluate(state, client, client_state, cfg, env, split):
    weights = state["weights"] if client_state is None else client_state
    return evaluate_model(set_state(env.scratch_model(), weights), client, split, device=env.device)


DITTO = Algorithm(
    name="ditto", label="Ditto", config=DittoConfig, init=init, broadcast=broadcast,
    client_update=client_update, aggregate=aggregate, evaluate=evaluate,
    global_model=lambda state: state["weights"], exports_global=True, vectorizable=True,
)
