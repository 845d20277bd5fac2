"""FedAvg (McMahan et al., 2017): local SGD epochs, sample-weighted averaging.

The global model's training in every FedL2P table (FedL2P sec. 3.1:
theta_g^t = sum_i N_i / sum N_i' * theta_i^{t-1}) and a baseline row of every
other paper. Evaluation tests the global model on each client's split.

This file also holds the participation protocol shared by the methods of pFedVEM's
tables (FedAvg, FedPer, pFedMe, pFedVEM, pFedMAP), a config field ``participation``:

* ``"sampled"`` (default here): the loop's sampling (``sampling``, ``fraction``) picks the
  round's clients; each of them trains and reports, the others do nothing.
* ``"broadcast"`` (pFedVEM sec. 3.1, after pFedMe Alg. 1; pFedVEM's Alg. 1 lines 2-8): the
  server broadcasts to every client (run with ``fraction = 1``), every client runs its
  local update, and each reports with probability ``report_fraction`` (0.1). The reporters
  are the loop's own Bernoulli draw (`reporters`), so with one seed they are the very
  clients ``"sampled"`` with ``sampling="bernoulli", fraction=report_fraction`` would
  train. A non-reporting client keeps what it keeps across rounds (a personal head, a
  posterior, a personalized model) and sends nothing. Work whose only product is the
  report (FedAvg's local model, overwritten by the next broadcast) is skipped for
  non-reporters: the numbers are the same.
"""
from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

from pflkit.config import one_of, require
from pflkit.fl.aggregate import weighted_mean
from pflkit.fl.algorithm import Algorithm, FLConfig, Update
from pflkit.fl.loop import sample_clients
from pflkit.fl.train import evaluate_model, get_state, round_sgd, set_state

# ---------------------------------------------------------------- participation protocol

PARTICIPATION = ("sampled", "broadcast")


def check_participation(cfg) -> None:
    """Validate ``participation`` and ``report_fraction`` of a config (one-line errors naming the key)."""
    one_of("participation", cfg.participation, set(PARTICIPATION))
    r = cfg.report_fraction
    require(isinstance(r, (int, float)) and 0 <= r <= 1, "report_fraction", r, "must be in [0, 1]")
    if cfg.participation == "broadcast":
        require(r > 0, "report_fraction", r, "participation='broadcast' needs a reporting probability > 0")
        require(cfg.fraction == 1 and cfg.sampling == "fraction", "fraction", cfg.fraction,
                "participation='broadcast' hands every client the broadcast: use fraction=1 and "
                "sampling='fraction' (report_fraction draws who reports)")


def broadcasting(cfg) -> bool:
    """Whether ``cfg`` runs the broadcast protocol (configs without the field: no)."""
    return getattr(cfg, "participation", "sampled") == "broadcast"


def roster(fed, cfg) -> dict:
    """Server-state entry of the broadcast protocol: the client ids the reporters are drawn from."""
    return {"ids": [int(i) for i in fed.seen_ids]} if broadcasting(cfg) else {}


def reporters(ids, cfg, env) -> list[int]:
    """The clients that report in round ``env.round`` of the broadcast protocol.

    Each client with probability ``report_fraction``, redrawn if nobody is drawn: the loop's
    Bernoulli sampling (`pflkit.fl.loop.sample_clients`), from the same (seed, round) key.
    """
    rule = SimpleNamespace(sampling="bernoulli", fraction=cfg.report_fraction)
    return sample_clients(list(ids), rule, env, env.round)


def flag(msg, state, client_id, cfg, env):
    """The broadcast message; under ``"broadcast"`` wrapped as ``{"msg": msg, "report": bool}``."""
    if not broadcasting(cfg):
        return msg
    return {"msg": msg, "report": client_id in reporters(state["ids"], cfg, env)}


def unflag(msg, cfg) -> tuple[Any, bool]:
    """(message, does this client report) from what `flag` sent."""
    return (msg["msg"], bool(msg["report"])) if broadcasting(cfg) else (msg, True)


def report_metrics(cfg, report: bool) -> dict:
    """``{"reported": 0 / 1}`` under the broadcast protocol: the loop logs the round's share."""
    return {"reported": float(report)} if broadcasting(cfg) else {}


def reported(updates: list[Update]) -> list[Update]:
    """The updates that carry a report (non-reporting clients send ``payload=None``)."""
    return [u for u in updates if u.payload is not None]


# ---------------------------------------------------------------- FedAvg


@dataclass(frozen=True)
class FedAvgConfig(FLConfig):
    """FedAvg: the shared settings (rounds, fraction, local SGD) plus the participation protocol.

    Attributes:
        participation: ``"sampled"`` (default) or ``"broadcast"`` (module docstring).
        report_fraction: a client's probability of reporting under ``"broadcast"`` (0.1).
    """

    participation: str = "sampled"
    report_fraction: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        check_participation(self)


def init(model, fed, cfg, env) -> dict:
    return {"weights": get_state(model), **roster(fed, cfg)}


def broadcast(state, client_id, cfg, env):
    return flag(state["weights"], state, client_id, cfg, env)


def train_from(weights, client, cfg, env, **kw) -> tuple[dict, dict]:
    """Load ``weights`` into the scratch model, run the round's local SGD, return (state, stats)."""
    model = set_state(env.scratch_model(), weights)
    stats = round_sgd(model, client, cfg, env, **kw)
    return get_state(model), stats


def client_update(msg, client, client_state, cfg, env):
    msg, report = unflag(msg, cfg)
    if not report:  # its local model would be replaced by the next broadcast: nothing to compute
        return Update(client.id, 0, None, report_metrics(cfg, False)), client_state
    weights, stats = train_from(msg, client, cfg, env)
    return Update(client.id, client.num("train"), weights, {"loss": stats["loss"], **report_metrics(cfg, True)}), \
        client_state


def aggregate(state, updates, cfg, env) -> dict:
    """Sample-weighted mean of the reported models (none reported: unchanged)."""
    got = reported(updates)
    if not got:
        return state
    return {**state, "weights": weighted_mean([u.payload for u in got], [u.num_samples for u in got])}


def evaluate(state, client, client_state, cfg, env, split):
    return evaluate_model(set_state(env.scratch_model(), state["weights"]), client, split, device=env.device)


FEDAVG = Algorithm(
    name="fedavg", label="FedAvg", config=FedAvgConfig, init=init, broadcast=broadcast,
    client_update=client_update, aggregate=aggregate, evaluate=evaluate,
    global_model=lambda state: state["weights"], exports_global=True, vectorizable=True,
    plain_sgd=client_update,  # plain local SGD: the vectorized engine runs its rounds without client threads
)
