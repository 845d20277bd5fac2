"""FedPer (Arivazhagan et al., 2019): a shared body averaged by FedAvg, a personal head per client.

The model is split into base layers, trained by every client and averaged by the
server with sample weights, and personalization layers (``model.head`` by default,
any module-name prefixes via ``personal``) that never leave the client. Each
round a client loads the global base and its own head, trains the whole model
for ``local_epochs`` (or ``local_steps``), sends the base back and keeps the head.

The same machinery, with the roles of the two parts swapped, is LG-FedAvg
(`pflkit.algorithms.lgfedavg`): `is_personal` is the only difference.

A client's first download also carries the starting values of its personal part
(it has nothing of its own yet); the server remembers who has been served
(``state["served"]``), so the bytes in the history are what really travels.
Clients never sampled are evaluated with those starting values.

Participation (``participation``, `pflkit.fl.sampling`): ``"sampled"`` (default)
trains only the clients the loop samples; ``"broadcast"`` (pFedVEM sec. 3.1, after
pFedMe) trains every client every round (each keeps its newly trained head) while only
the reporters' bases are averaged (``silent_update``: the whole update, the base not sent).
"""
from __future__ import annotations

from dataclasses import dataclass

from pflkit.algorithms.fedavg import FedAvgConfig
from pflkit.config import require
from pflkit.fl.aggregate import weighted_mean
from pflkit.fl.algorithm import Algorithm, Update
from pflkit.fl.sampling import reported
from pflkit.fl.train import evaluate_model, get_state, round_sgd, set_state


def _under(name: str, prefixes) -> bool:
    return any(name == p or name.startswith(p + ".") for p in prefixes)


@dataclass(frozen=True)
class FedPerConfig(FedAvgConfig):
    """Attributes: personal = module-name prefixes kept on the client (default: the head);
    participation, report_fraction: FedAvg's protocol (`pflkit.fl.sampling`; default ``"sampled"``)."""

    personal: tuple[str, ...] = ("head",)

    def __post_init__(self):
        super().__post_init__()
        require(len(self.personal) > 0, "personal", self.personal, "name at least one personal module")

    def is_personal(self, name: str) -> bool:
        return _under(name, self.personal)


def split_state(state: dict, cfg) -> tuple[dict, dict]:
    """(shared, personal) parts of a model state dict, by ``cfg.is_personal``."""
    shared = {k: v for k, v in state.items() if not cfg.is_personal(k)}
    personal = {k: v for k, v in state.items() if cfg.is_personal(k)}
    if not personal or not shared:
        raise ValueError(f"{type(cfg).__name__}: the split leaves an empty part "
                         f"(personal={sorted(personal)[:3]}..., shared={sorted(shared)[:3]}...)")
    return shared, personal


def init(model, fed, cfg, env) -> dict:
    shared, personal = split_state(get_state(model), cfg)
    return {"weights": shared, "init_personal": personal, "served": []}


def broadcast(state, client_id, cfg, env):
    first = client_id not in state["served"]
    return {"shared": state["weights"], "personal": state["init_personal"] if first else None}


def _model(shared, personal, env):
    return set_state(env.scratch_model(), {**shared, **personal})


def client_update(msg, client, client_state, cfg, env):
    personal = client_state if client_state is not None else msg["personal"]
    if personal is None:
        raise ValueError(f"client {client.id} holds no personal layers and received none")
    model = _model(msg["shared"], personal, env)
    stats = round_sgd(model, client, cfg, env)
    shared, personal = split_state(get_state(model), cfg)
    return Update(client.id, client.num("train"), shared, {"loss": stats["loss"]}), personal


def aggregate(state, updates, cfg, env):
    """Sample-weighted mean of the reported bases; every client that got the broadcast has been served."""
    served = sorted(set(state["served"]) | {u.client_id for u in updates})
    got = reported(updates)
    if not got:
        return {**state, "served": served}
    weights = weighted_mean([u.payload for u in got], [u.num_samples for u in got])
    return {**state, "weights": weights, "served": served}


def evaluate(state, client, client_state, cfg, env, split):
    personal = client_state if client_state is not None else state["init_personal"]
    return evaluate_model(_model(state["weights"], personal, env), client, split, device=env.device)


FEDPER = Algorithm(
    name="fedper", label="FedPer", config=FedPerConfig, init=init, broadcast=broadcast,
    client_update=client_update, aggregate=aggregate, evaluate=evaluate, vectorizable=True,
    silent_update=client_update,  # a non-reporter trains and keeps its head; its base stays home
)
