"""FedAvg (McMahan et al., 2017): local SGD epochs, sample-weighted averaging.

The global model's training in every FedL2P table (FedL2P sec. 3.1:
theta_g^t = sum_i N_i / sum N_i' * theta_i^{t-1}) and a baseline row of every
other paper. Evaluation tests the global model on each client's split.

Participation (``participation``, shared by the methods of pFedVEM's tables: FedAvg, FedPer,
pFedMe, pFedVEM, pFedMAP; `pflkit.fl.sampling`): ``"sampled"`` (default here) trains the
clients the loop samples; ``"broadcast"`` hands every client the broadcast and the reporters'
models are averaged. A FedAvg client that does not report computes nothing: its local model
would be replaced by the next broadcast (no ``silent_update``), so the numbers are the same.
"""
from __future__ import annotations

from dataclasses import dataclass

from pflkit.fl.aggregate import weighted_mean
from pflkit.fl.algorithm import Algorithm, FLConfig, Update
from pflkit.fl.sampling import check_participation, reported
from pflkit.fl.train import evaluate_model, get_state, round_sgd, set_state


@dataclass(frozen=True)
class FedAvgConfig(FLConfig):
    """FedAvg: the shared settings (rounds, fraction, local SGD) plus the participation protocol.

    Attributes:
        participation: ``"sampled"`` (default) or ``"broadcast"`` (`pflkit.fl.sampling`).
        report_fraction: a client's probability of reporting under ``"broadcast"`` (0.1).
    """

    participation: str = "sampled"
    report_fraction: float = 0.1

    def __post_init__(self):
        super().__post_init__()
        check_participation(self)


def init(model, fed, cfg, env) -> dict:
    return {"weights": get_state(model)}


def broadcast(state, client_id, cfg, env):
    return state["weights"]


def train_from(weights, client, cfg, env, **kw) -> tuple[dict, dict]:
    """Load ``weights`` into the scratch model, run the round's local SGD, return (state, stats)."""
    model = set_state(env.scratch_model(), weights)
    stats = round_sgd(model, client, cfg, env, **kw)
    return get_state(model), stats


def client_update(msg, client, client_state, cfg, env):
    weights, stats = train_from(msg, client, cfg, env)
    return Update(client.id, client.num("train"), weights, {"loss": stats["loss"]}), client_state


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
