"""Local: every client trains its own model alone; nothing is communicated.

Each client starts from the run's initial model, rebuilt on the client from the
run seed (so no weights travel), and keeps its model as client state. A "round"
is ``local_epochs`` of local training; with ``fraction = 1`` every client trains
every round.
"""
from __future__ import annotations

from dataclasses import dataclass

from pflkit.fl.algorithm import Algorithm, FLConfig, Update
from pflkit.fl.train import evaluate_model, get_state, round_sgd, set_state


@dataclass(frozen=True)
class LocalConfig(FLConfig):
    fraction: float = 1.0


def init(model, fed, cfg, env) -> dict:
    return {"init": get_state(model)}


def broadcast(state, client_id, cfg, env):
    return None


def _start(state, client_state):
    return client_state if client_state is not None else state["init"]


def client_update(msg, client, client_state, cfg, env):
    # the initial weights are the run's seeded init, which the client rebuilds itself
    if client_state is None:
        client_state = get_state(_fresh(env))
        env.seed_torch("client", client.id, env.round)
    model = set_state(env.scratch_model(), client_state)
    stats = round_sgd(model, client, cfg, env)
    return Update(client.id, client.num("train"), None, {"loss": stats["loss"]}), get_state(model)


def _fresh(env):
    """The run's initial model, rebuilt from the run seed exactly as the runner builds it."""
    with env.torch_rng("init"):  # this thread's seeded draws, also in the threads engine
        return env.model_fn()


def aggregate(state, updates, cfg, env):
    return state


def evaluate(state, client, client_state, cfg, env, split):
    model = set_state(env.scratch_model(), _start(state, client_state))
    return evaluate_model(model, client, split, device=env.device)


LOCAL = Algorithm(
    name="local", label="Local", config=LocalConfig, init=init, broadcast=broadcast,
    client_update=client_update, aggregate=aggregate, evaluate=evaluate, vectorizable=True,
)
